"""`with sac.region(...):`, the record-and-replay guard, on Python code and on
models this project did not write: no function to wrap, gradients
bit-identical to no checkpointing, BatchNorm's running statistics updated
once, and the guard's errors as Python exceptions."""
import copy

import pytest
import torch

import torch_sac as sac
import test_models as models
from support import block, leaves, on_threads

aten = torch.ops.aten
FALLBACK = sac.mechanism().startswith("fallback")
needs_fallback = pytest.mark.skipif(
    not FALLBACK, reason="the region guard needs the fallback key (SAC_DISPATCH=fallback)")


def region_step(model, batch, policy):
    """A training step whose whole forward, loss included, is one region."""
    model = copy.deepcopy(model)
    model.train()
    torch.manual_seed(7)
    with sac.region(policy):
        loss = model(**batch).loss
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return (loss.detach(), grads), model


@pytest.mark.skipif(FALLBACK, reason="per-op kernels only")
def test_per_op_kernels_refuse_the_region_and_say_what_to_do():
    with pytest.raises(RuntimeError, match="SAC_DISPATCH=fallback"):
        with sac.region():
            pass


@needs_fallback
@pytest.mark.parametrize("policy", [None, models.OPS, sac.torchtitan_default()],
                         ids=["full", "op_list", "torchtitan_default"])
def test_models_match_no_checkpointing(model_and_batch, policy):
    model, batch, expected = model_and_batch
    got, _ = region_step(model, batch, policy)
    models.assert_identical(got, expected, f"sac.region({policy})")


def batchnorm_statistics(model):
    return {n: b.clone() for n, b in model.named_buffers()}


@needs_fallback
def test_batchnorm_statistics_are_updated_once():
    torch.manual_seed(0)
    model, batch = models.resnet()
    plain = copy.deepcopy(model)
    plain.train()
    plain(**batch).loss.backward()
    expected = batchnorm_statistics(plain)

    _, in_region = region_step(model, batch, models.OPS)
    got = batchnorm_statistics(in_region)
    assert got.keys() == expected.keys()
    different = [n for n in got if not torch.equal(got[n], expected[n])]
    assert not different, f"running statistics differ: {different}"

    # PyTorch's checkpoint runs the stages again in backward, and with them
    # BatchNorm's updates: the test tells the two apart.
    rerun = copy.deepcopy(model)
    rerun.train()
    models.enable_checkpointing(rerun, torch.utils.checkpoint.noop_context_fn)
    rerun(**batch).loss.backward()
    tracked = [n for n in expected if n.endswith("num_batches_tracked")]
    assert tracked and any(
        not torch.equal(batchnorm_statistics(rerun)[n], expected[n]) for n in tracked)


def grads_of(run, seed=0):
    args = leaves(seed)
    out = run(args)
    out.square().sum().backward()
    return [out.detach()] + [a.grad for a in args]


def plain(args):
    return block(*args)


def in_region(policy=None):
    def run(args):
        with sac.region(policy):
            return block(*args)
    return run


def assert_identical(got, expected):
    for g, e in zip(got, expected, strict=True):
        assert torch.equal(g, e), (g - e).abs().max()


@needs_fallback
@pytest.mark.parametrize("policy", [None, [aten.mm.default], sac.nothing_saveable(),
                                    sac.everything_saveable()],
                         ids=["full", "op_list", "nothing_saveable", "everything_saveable"])
def test_many_iterations(policy):
    expected = grads_of(plain)
    for _ in range(20):
        assert_identical(grads_of(in_region(policy)), expected)


@needs_fallback
def test_an_exception_inside_reaches_the_caller_and_leaves_nothing():
    with pytest.raises(ValueError, match="inside"):
        with sac.region([aten.mm.default]):
            block(*leaves())
            raise ValueError("raised inside the region")
    assert_identical(grads_of(in_region([aten.mm.default])), grads_of(plain))


@needs_fallback
def test_an_outside_tensor_modified_before_backward_is_an_error():
    x, w1, w2 = leaves()
    outside = x * 2
    with sac.region():
        out = block(outside, w1, w2)
    with torch.no_grad():
        outside.add_(1)
    with pytest.raises(RuntimeError, match="was modified in place after the region read it"):
        out.sum().backward()


@needs_fallback
@pytest.mark.parametrize("masked", ["dropout", "bernoulli_"])
def test_the_value_check_names_dropout_without_the_generators(masked):
    """Issue 44: dropout on the CPU draws its mask in place (empty_like,
    bernoulli_, div_); recomputed without the forward's generators, the
    values check names the random op instead of letting wrong gradients
    through."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(8, 16, requires_grad=True)

    def run(**options):
        torch.manual_seed(7)
        with sac.region(None, preserve_rng_state=False, **options):
            h = (x @ w).tanh()
            if masked == "dropout":
                y = torch.nn.functional.dropout(h, 0.5)
            else:
                y = h * torch.empty_like(h).bernoulli_(0.5)
        return torch.autograd.grad(y.sum(), [x, w])

    torch.manual_seed(7)
    h = (x @ w).tanh()
    plain = torch.nn.functional.dropout(h, 0.5) if masked == "dropout" else (
        h * torch.empty_like(h).bernoulli_(0.5))
    expected = torch.autograd.grad(plain.sum(), [x, w])
    unchecked = run()
    assert not torch.equal(unchecked[1], expected[1])
    with pytest.raises(torch.utils.checkpoint.CheckpointError,
                       match=r"the random op aten::bernoulli_.*preserve_rng_state\(false\)"):
        run(determinism_check="values")


@needs_fallback
def test_the_value_check_names_a_write_behind_autograds_back():
    """`.data` writes without moving the version counter: the default check
    passes with wrong gradients; determinism_check="values" names it."""
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    scale = torch.rand(16) + 0.5

    def run(**options):
        x = torch.randn(8, 16, requires_grad=True, generator=torch.Generator().manual_seed(1))
        with sac.region(**options):
            y = (x @ w).tanh() * scale
        if options:
            scale.data[3] += 1.0  # behind autograd's back
        try:
            return torch.autograd.grad(y.sum(), [x, w])
        finally:
            if options:
                scale.data[3] -= 1.0

    expected = run()
    unchecked = run(determinism_check="default")
    assert not torch.equal(unchecked[0], expected[0])
    # Raised out of the autograd engine as PyTorch's checkpoint raises its
    # errors of recomputation: a torch.utils.checkpoint.CheckpointError.
    with pytest.raises(torch.utils.checkpoint.CheckpointError,
                       match=r"recomputation of region `blk` gave a different "
                       r"value than its forward to tensor 3 of the 4 .*: not made in the region"
                       ) as raised:
        run(determinism_check="values", name="blk")
    assert type(raised.value) is sac.CheckpointError
    with pytest.raises(RuntimeError, match='must be "default", "none" or "values"'):
        sac.region(determinism_check="bits")


@needs_fallback
def test_a_region_value_is_entered_once():
    region = sac.region()
    with region:
        with pytest.raises(RuntimeError, match="make a new"):
            region.__enter__()


@needs_fallback
def test_nested_in_and_around_pytorch_s_checkpoint():
    expected = grads_of(plain)

    def region_around_checkpoint(args):
        with sac.region([aten.mm.default]):
            return torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False,
                                                     context_fn=sac.context_fn([aten.mm.default]))

    def checkpoint_around_region(args):
        return torch.utils.checkpoint.checkpoint(in_region(), args, use_reentrant=False)

    def regions_nested(args):
        x, w1, w2 = args
        with sac.region():
            h = torch.relu(x @ w1)
            with sac.region([aten.mm.default]):
                h = torch.sigmoid(h @ w2) * h
            return (h @ w2.t()).tanh().sum(dim=1)

    for run in [region_around_checkpoint, checkpoint_around_region, regions_nested]:
        assert_identical(grads_of(run), expected)


@needs_fallback
def test_retain_graph_and_a_second_backward():
    # Full recomputation replays again; a selective region's kept outputs are
    # used once, and a second backward is refused (as PyTorch's SAC refuses it).
    args = leaves()
    with sac.region():
        out = block(*args)
    out.sum().backward(retain_graph=True)
    first = [a.grad.clone() for a in args]
    out.sum().backward()
    for a, f in zip(args, first):
        assert torch.equal(a.grad, 2 * f)

    with sac.region([aten.mm.default]):
        out = block(*args)
    out.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward an extra time"):
        out.sum().backward()


def block_and_its_input_gradient(x, w1, w2):
    y = block(x, w1, w2)
    (g,) = torch.autograd.grad(y.sum(), x, create_graph=True)
    return y + g.sum(dim=1)


@needs_fallback
def test_autograd_grad_inside_the_region():
    def run(args):
        with sac.region([aten.mm.default]):
            return block_and_its_input_gradient(*args)
    assert_identical(grads_of(run), grads_of(lambda args: block_and_its_input_gradient(*args)))


@needs_fallback
def test_threads_run_their_own_regions():
    expected = grads_of(plain)
    for got in on_threads(lambda: grads_of(in_region([aten.mm.default]))):
        assert_identical(got, expected)


@pytest.fixture(scope="module", params=models.ARCHITECTURES, ids=lambda f: f.__name__)
def model_and_batch(request):
    torch.manual_seed(0)
    model, batch = request.param()
    return model, batch, models.step(model, batch, None)
