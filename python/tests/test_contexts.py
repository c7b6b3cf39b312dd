"""sac's contexts inside torch.utils.checkpoint: exact gradients, PyTorch's
arguments, clear errors, and nothing left behind by an exception."""
import copy
import functools
import os

import pytest
import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts as torch_contexts,
)

import torch_sac as sac
from support import block, leaves, on_threads

aten = torch.ops.aten


def gradients(context_fn=None, fn=block, seed=0):
    args = leaves(seed)
    if context_fn is None:
        out = fn(*args)
    else:
        out = checkpoint(fn, *args, use_reentrant=False, context_fn=context_fn)
    out.square().sum().backward()
    return [out.detach()] + [a.grad for a in args]


def assert_identical(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert torch.equal(g, e), (g - e).abs().max()


def test_mechanism_follows_sac_dispatch():
    chosen = os.environ.get("SAC_DISPATCH", "auto")
    expected = {"per_op": "per-op kernels", "fallback": "fallback"}.get(chosen)
    if expected is None:
        pytest.skip(f"SAC_DISPATCH={chosen}: sac picks the mechanism")
    assert sac.mechanism().startswith(expected), sac.mechanism()


@pytest.mark.parametrize("ops", [
    [aten.mm.default],
    [aten.mm],  # a packet: every overload
    ["aten::mm", "aten::sigmoid"],
    [aten.mm.default, aten.relu.default, aten.tanh.default],
])
def test_op_list_is_exact_and_matches_pytorch(ops):
    expected = gradients()
    assert_identical(gradients(sac.context_fn(ops)), expected)
    overloads = [op.default if isinstance(op, torch._ops.OpOverloadPacket) else
                 getattr(aten, op.split("::")[1]).default if isinstance(op, str) else op
                 for op in ops]
    assert_identical(gradients(functools.partial(torch_contexts, overloads)), expected)


@pytest.mark.parametrize("make_policy", [
    sac.nothing_saveable, sac.everything_saveable, sac.compute_intensive_ops,
    sac.torchtitan_default, sac.dots_saveable, sac.dots_with_no_batch_dims_saveable,
    lambda: sac.outputs_larger_than(16 * 48 * 4 - 1),
    lambda: sac.any_of([sac.save_ops([aten.mm.default]), sac.save_ops(["aten::relu"])]),
    lambda: sac.except_(sac.everything_saveable(), sac.save_ops(["aten::sigmoid"])),
    lambda: sac.every_nth("aten::mm", 2),
    sac.offload_dot_with_no_batch_dims,
    lambda: sac.offload_if(sac.dots_saveable(), 0),
], ids=lambda f: getattr(f, "__name__", "combinator"))
def test_sac_policies_are_exact(make_policy):
    assert_identical(gradients(sac.context_fn(make_policy())), gradients())


@pytest.mark.parametrize("make_policy", [
    lambda: sac.save_only_these_names(["hidden"]),
    lambda: sac.save_any_names_but_these(["gate"]),
    lambda: sac.save_and_offload_only_these_names(["hidden"], ["gate"]),
], ids=["save_only_these_names", "save_any_names_but_these", "save_and_offload"])
def test_name_policies_are_exact(make_policy):
    def named(x, w1, w2):
        h = sac.tag(torch.relu(x @ w1), "hidden")
        g = sac.tag(torch.sigmoid(h @ w2), "gate")
        return ((g * h) @ w2.t()).tanh().sum(dim=1)

    assert_identical(gradients(sac.context_fn(make_policy()), fn=named), gradients(fn=named))


def test_policy_function_gets_pytorch_arguments():
    calls = []

    def policy_fn(ctx, op, *args, **kwargs):
        calls.append((op, ctx.is_recompute, ctx.op_output, args))
        return CheckpointPolicy.MUST_SAVE if op == aten.mm.default else \
            CheckpointPolicy.PREFER_RECOMPUTE

    assert_identical(gradients(sac.context_fn(policy_fn)), gradients())
    mms = [c for c in calls if c[0] == aten.mm.default]
    assert len(mms) == 3, [c[0] for c in calls]
    op, is_recompute, output, args = mms[0]
    assert isinstance(op, torch._ops.OpOverload) and not is_recompute
    assert isinstance(output, torch.Tensor) and output.shape == (16, 48)
    assert len(args) == 2 and args[0].shape == (16, 32) and args[1].shape == (32, 48)
    # Asked once per call, in the forward only: PyTorch 2.13's SAC asks the
    # same calls.
    torch_calls = []

    def torch_policy(ctx, op, *args, **kwargs):
        if not ctx.is_recompute:
            torch_calls.append(op)
        return policy_fn(ctx, op, *args, **kwargs)

    calls.clear()
    gradients(functools.partial(torch_contexts, torch_policy))
    assert [c[0] for c in mms] == [op for op in torch_calls if op == aten.mm.default]


def test_bool_answers():
    assert_identical(gradients(sac.context_fn(lambda ctx, op, *a, **k: op == aten.mm.default)),
                     gradients())


def test_exception_in_policy_reaches_caller_and_leaves_nothing():
    def policy_fn(ctx, op, *args, **kwargs):
        if op == aten.sigmoid.default:
            raise ValueError("policy says no")
        return CheckpointPolicy.PREFER_RECOMPUTE

    for _ in range(3):
        with pytest.raises(ValueError, match="policy says no"):
            gradients(sac.context_fn(policy_fn))
    # Nothing of the failed regions is active any more.
    expected = gradients()
    assert_identical(gradients(sac.context_fn([aten.mm.default])), expected)
    assert_identical(gradients(), expected)


def test_wrong_answer_is_an_error_naming_the_op():
    with pytest.raises(RuntimeError, match=r"answered 'save' for aten::mm.*CheckpointPolicy"):
        gradients(sac.context_fn(lambda ctx, op, *a, **k: "save"))


def test_unknown_op_name_suggests_the_closest():
    with pytest.raises(RuntimeError, match="aten::mm"):
        sac.save_ops(["aten::mmm"])


def test_bad_list_item_is_a_type_error():
    with pytest.raises(TypeError, match="cannot name the op"):
        sac.context_fn([torch.mm])
    with pytest.raises(TypeError, match="expected a list of ops"):
        sac.context_fn(3)


def test_mode_exit_without_entry_is_an_error():
    caching, cached = sac.create_selective_checkpoint_contexts([aten.mm.default])
    with pytest.raises(RuntimeError, match="exited without being entered"):
        cached.__exit__(None, None, None)
    with caching:
        pass


def test_many_iterations():
    expected = gradients()
    fn = sac.context_fn([aten.mm.default])
    for _ in range(20):
        assert_identical(gradients(fn), expected)


@pytest.mark.parametrize("contexts", ["sac", "pytorch"])
def test_second_backward_is_refused_as_pytorch_refuses_it(contexts):
    ops = [aten.mm.default]
    fn = sac.context_fn(ops) if contexts == "sac" else functools.partial(torch_contexts, ops)
    x, w1, w2 = leaves()
    out = checkpoint(block, x, w1, w2, use_reentrant=False, context_fn=fn).sum()
    (g1,) = torch.autograd.grad(out, w1, retain_graph=True)
    assert torch.equal(g1, torch.autograd.grad(block(x, w1, w2).sum(), w1)[0])
    with pytest.raises(RuntimeError, match="backward an extra time"):
        torch.autograd.grad(out, w1)


def test_nested_checkpoints():
    def outer(x, w1, w2):
        y = checkpoint(block, x, w1, w2, use_reentrant=False,
                       context_fn=sac.context_fn([aten.mm.default]))
        return y * x.sum(dim=1)

    def plain(x, w1, w2):
        return block(x, w1, w2) * x.sum(dim=1)

    assert_identical(gradients(sac.context_fn(sac.torchtitan_default()), fn=outer),
                     gradients(fn=plain))


def test_cache_entry_mutation_is_demoted_or_allowed():
    def mutating(x, w1, w2):
        h = x @ w1
        h.add_(1.0)  # changes the saved mm output in place
        return (h @ w2).relu().sum(dim=1)

    expected = gradients(fn=mutating)
    assert_identical(gradients(sac.context_fn([aten.mm.default]), fn=mutating), expected)


def test_demotion_warning_names_both_ops():
    def mutating(x, w1, w2):
        h = (x @ w1).sin()
        h.mul_(2.0)  # the kept sin output, modified in place
        return (h @ w2).sum(dim=1)

    writer = ("SAC_DISPATCH=fallback names it" if os.environ.get("SAC_DISPATCH") == "per_op"
              else "modified in place by aten::mul_")
    with pytest.warns(UserWarning, match=r"kept the output of aten::sin \(call 0") as caught:
        got = gradients(sac.context_fn([aten.sin.default]), fn=mutating)
    assert any(writer in str(w.message) for w in caught), [str(w.message) for w in caught]
    assert_identical(got, gradients(fn=mutating))


@pytest.mark.parametrize("contexts", [sac.context_fn([aten.mm.default]),
                                      functools.partial(torch_contexts, [aten.mm.default])],
                         ids=["sac", "pytorch"])
def test_graph_exec_group_recomputes_once_for_two_backwards(contexts):
    # Two outputs on separate parts of the region, backwarded one at a time
    # inside PyTorch's GraphExecGroup: one recomputation serves both (without
    # the group, the second backward is refused by sac and PyTorch alike).
    def two_heads(x, w1, w2):
        h = torch.relu(x @ w1)
        return (h @ w2).sum(), torch.sigmoid(h).sum()

    def run(context_fn):
        args = leaves()
        if context_fn is None:
            a, b = two_heads(*args)
        else:
            a, b = checkpoint(two_heads, *args, use_reentrant=False, context_fn=context_fn)
        with torch.utils.checkpoint.GraphExecGroup():
            torch.autograd.backward([a], inputs=[args[2]], retain_graph=True)
            torch.autograd.backward([b], inputs=[args[0], args[1]])
        return [a.detach(), b.detach()] + [t.grad for t in args]

    assert_identical(run(contexts), run(None))


def test_checkpoint_wrapper_takes_sac_s_context_fn():
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, checkpoint_wrapper)

    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))
    wrapped = checkpoint_wrapper(copy.deepcopy(layer),
                                 checkpoint_impl=CheckpointImpl.NO_REENTRANT,
                                 context_fn=sac.context_fn([aten.addmm.default]))
    x = torch.randn(8, 32, requires_grad=True)
    expected = torch.autograd.grad(layer(x).square().sum(), [x, *layer.parameters()])
    got = torch.autograd.grad(wrapped(x).square().sum(), [x, *wrapped.parameters()])
    assert_identical(list(got), list(expected))


@pytest.mark.parametrize("policy", [[aten.mm.default], sac.torchtitan_default()],
                         ids=["op_list", "torchtitan_default"])
def test_threads_checkpoint_with_sac_s_modes_at_once(policy):
    expected = gradients()
    for got in on_threads(lambda: gradients(sac.context_fn(policy))):
        assert_identical(got, expected)



@pytest.mark.parametrize("contexts", ["sac", "pytorch"])
def test_a_mutated_cache_entry_raises_checkpoint_error(contexts):
    """sac's errors of recomputation leave torch's C++ (the cached mode runs
    inside torch.utils.checkpoint's recomputation, inside the autograd engine)
    as torch_sac.CheckpointError, a torch.utils.checkpoint.CheckpointError;
    PyTorch's modes raise a RuntimeError for the same mistake."""
    def block_and_its_mm(x, w):
        h = x @ w
        return h, h.sin()

    ops = [aten.mm.default]
    fn = sac.context_fn(ops) if contexts == "sac" else functools.partial(torch_contexts, ops)
    x, w, _ = leaves()
    h, y = checkpoint(block_and_its_mm, x, w, use_reentrant=False, context_fn=fn)
    with torch.no_grad():
        h.mul_(2.0)  # the cached mm output, after the forward
    with pytest.raises(RuntimeError, match="mutated|modified in place") as raised:
        y.sum().backward()
    if contexts == "sac":
        assert type(raised.value) is sac.CheckpointError
        assert isinstance(raised.value, torch.utils.checkpoint.CheckpointError)
