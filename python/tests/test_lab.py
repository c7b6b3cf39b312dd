"""sac's policy lab from Python: profiles, budgeted policies (exact in bytes,
on Hugging Face models), explanations and statistics."""
import ctypes
import gc
import os
import weakref

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

import torch_sac as sac
import test_models as models
from support import block, leaves, no_collection
from test_region import FALLBACK

aten = torch.ops.aten
LIBRARY = os.environ.get("SAC_COUNTING_ALLOCATOR")


def test_a_profile_lists_the_calls_and_their_bytes():
    args = leaves()
    p = sac.profile(lambda: block(*args))
    mms = [c for c in p.calls if c.op == "aten::mm"]
    assert [c.call for c in mms] == [0, 1, 2]
    assert all(c.output_bytes == 16 * 48 * 4 and c.keepable for c in mms)
    assert p.keepable_bytes() == sum(c.output_bytes for c in p.calls if c.keepable)
    assert "aten::mm" in p.table(sort="bytes", limit=3)
    assert p.csv().startswith("op,call,output_bytes")
    with pytest.raises(RuntimeError, match="sort by"):
        p.table(sort="size")


def test_a_profile_counts_flops_as_torch_flop_counter_does():
    """Each call's FLOPs, summed per op, equal FlopCounterMode's over the same
    forward: linear layers on 2-D and 3-D input, products with and without a
    batch, convolutions (strided, grouped, transposed) and fused attention
    (CPU's kernel given flop_counter's own formula, which it leaves out)."""
    from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

    torch.manual_seed(0)
    linear = torch.nn.Linear(12, 20)
    conv = torch.nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
    deconv = torch.nn.ConvTranspose2d(6, 3, 2, stride=2)
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    h = torch.randn(3, 5, 12, requires_grad=True)
    q = torch.randn(2, 4, 7, 8, requires_grad=True)
    kv = torch.randn(2, 2, 5, 8, requires_grad=True)

    def forward():
        a = deconv(conv(x)).sum()
        b = linear(h).sum() + linear(h[0]).sum()
        c = torch.baddbmm(h[:, :, :5], h, h.transpose(1, 2)).sum()
        d = torch.nn.functional.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return a + b + c + d.sum() + (q @ q.transpose(-1, -2)).sum()

    p = sac.profile(forward)
    ours = {}
    for c in p.calls:
        ours[c.op] = ours.get(c.op, 0) + c.flops
    cpu_attention = aten._scaled_dot_product_flash_attention_for_cpu
    def attention(q, k, v, *args, out_shape=None, **kwargs):
        return sdpa_flop_count(q, k, v)

    with FlopCounterMode(display=False, custom_mapping={cpu_attention: attention}) as counter:
        forward()
    theirs = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    # sac names an overload ("aten::add.Tensor"), flop_counter its packet ("aten.add").
    counted = {op.split(".")[0].replace("::", "."): n for op, n in ours.items() if n}
    assert counted == theirs
    assert len(theirs) >= 5, theirs


def test_the_recomputation_runs_only_the_calls_before_its_stop():
    """With early stop, PyTorch's checkpoint ends a recomputation once every
    tensor autograd saved is saved again: the profile marks the calls after
    the last save past the stop, and a plan neither keeps them nor counts
    their time."""
    torch.manual_seed(0)
    x, w1, w2 = (torch.randn(*shape, requires_grad=True)
                 for shape in [(8, 16), (16, 16), (16, 16)])

    def region(h):
        # mm saves its inputs before it runs, tanh its output after; the
        # second mm's inputs are the last saved, and add saves nothing.
        c = h.mm(w1).tanh().mm(w2)
        return c + c

    p = sac.profile(lambda: region(x))
    assert [(c.op, c.past_stop) for c in p.calls] == [
        ("aten::mm", False), ("aten::tanh", False), ("aten::mm", True),
        ("aten::add.Tensor", True)]
    plan = sac.budgeted_plan([p], of_everything_saveable=1.0, unchecked_regions=False)
    assert plan.recompute_seconds == 0
    e = sac.explain(plan.policies[0], lambda: region(x))
    assert [(c.profile.op, c.profile.call) for c in e.calls if c.outcome == "saved"] == [
        ("aten::mm", 0), ("aten::tanh", 0)]
    assert "past stop" in str(e)
    # The second mm, asked about and not kept, is never run again.
    stats = sac.RegionStatistics()
    checkpoint(region, x, use_reentrant=False,
               context_fn=sac.context_fn(plan.policies[0], statistics=stats)).sum().backward()
    counts = stats.read()
    assert (counts["calls_served"], counts["calls_rerun"]) == (2, 0)


def test_an_unchecked_region_runs_plainly_under_pytorchs_checkpoint():
    """A region a plan leaves unchecked, under torch.utils.checkpoint with
    sac's contexts: autograd saves its tensors as without checkpointing, so
    nothing is recomputed, the gradients are the plain step's, and an
    in-place change to a saved tensor is caught as PyTorch catches it
    unchecked. Outside PyTorch's checkpoint the context refuses."""
    torch.manual_seed(0)
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 16, requires_grad=True)

    def region(h):
        return h.mm(w).tanh().exp()

    policy = sac.budgeted_policy(sac.profile(lambda: region(x)), of_everything_saveable=1.0)
    assert not policy.checkpoints
    stats = sac.RegionStatistics()
    out = checkpoint(region, x, use_reentrant=False,
                     context_fn=sac.context_fn(policy, statistics=stats))
    got = torch.autograd.grad(out.sum(), [x, w])
    expected = torch.autograd.grad(region(x).sum(), [x, w])
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert stats.read()["recomputations"] == 0

    def modified(h):
        y = region(h)
        z = y.sum()
        y.add_(1)  # exp saved y for backward
        return z

    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        checkpoint(modified, x, use_reentrant=False,
                   context_fn=sac.context_fn(policy)).backward()
    forward_context, _ = sac.context_fn(policy)()
    with pytest.raises(RuntimeError, match="non-reentrant checkpoint"):
        with forward_context:
            pass


def test_a_profile_holds_nothing_after_it_returns():
    """The profile hears autograd's saves through torch's saved-tensor hooks;
    a tensor it hands back as it is must not hold its own grad_fn (a cycle
    that nothing frees): what the region made is gone once it returns."""
    x = torch.randn(8, 16, requires_grad=True)
    made = []

    def region():
        y = x.exp()  # saved by exp (its output) and by tanh (its input)
        made.append(weakref.ref(y))
        return y.tanh().sum()

    for _ in range(2):
        sac.profile(region)
    gc.collect()
    assert len(made) == 6 and all(r() is None for r in made)


def test_profile_layers_profiles_each_checkpointed_region_in_order():
    """sac.profile_layers: the regions of torch.utils.checkpoint.checkpoint
    (called through the module attribute) and of Hugging Face's
    activation_checkpointing_enable, one profile per call, in order, each the
    profile of that call run alone; the forward goes on with what the region
    returned, and the checkpoint functions are back afterwards."""
    args = leaves()

    def forward():
        h = torch.utils.checkpoint.checkpoint(block, *args, use_reentrant=False)
        return torch.utils.checkpoint.checkpoint(lambda x: x.unsqueeze(0) @ args[0], h,
                                                 use_reentrant=False)

    original = torch.utils.checkpoint.checkpoint
    profiles = sac.profile_layers(torch.nn.Module(), forward, runs=1)
    assert torch.utils.checkpoint.checkpoint is original
    assert [[(c.op, c.call) for c in p.calls] for p in profiles[:1]] == [
        [(c.op, c.call) for c in sac.profile(lambda: block(*args), runs=1).calls]]
    assert len(profiles) == 2 and profiles[1].calls[-1].op == "aten::mm"

    torch.manual_seed(0)
    model, batch = models.gpt2()
    model.train()
    models.enable_checkpointing(model, sac.context_fn(sac.nothing_saveable()))
    functions = [m._gradient_checkpointing_func for m in model.modules()
                 if hasattr(m, "_gradient_checkpointing_func")]
    torch.manual_seed(7)
    layers = sac.profile_layers(model, lambda: model(**batch), runs=1)
    assert len(layers) == model.config.n_layer
    assert all(p.calls and p.plain_bytes > 0 for p in layers)
    assert functions == [m._gradient_checkpointing_func for m in model.modules()
                         if hasattr(m, "_gradient_checkpointing_func")]

    with pytest.raises(RuntimeError, match="checkpointed no region"):
        sac.profile_layers(torch.nn.Module(), lambda: block(*args))


def test_a_budget_is_bytes_or_a_fraction():
    args = leaves()
    p = sac.profile(lambda: block(*args), runs=1)
    with pytest.raises(RuntimeError, match="exactly one"):
        sac.budgeted_policy(p, bytes=100, of_everything_saveable=0.5)
    with pytest.raises(RuntimeError, match="exactly one"):
        sac.budgeted_policy(p)


def test_an_explanation_and_the_statistics_agree():
    args = leaves()
    policy = [aten.mm.default]
    e = sac.explain(policy, lambda: block(*args))
    saved = [c for c in e.calls if c.outcome == "saved"]
    assert [c.profile.op for c in saved] == ["aten::mm"] * 3
    assert all(c.answer == CheckpointPolicy.MUST_SAVE for c in saved)
    assert e.saved_bytes() == 3 * 16 * 48 * 4
    assert "saved" in str(e)

    stats = sac.RegionStatistics()
    out = checkpoint(block, *args, use_reentrant=False,
                     context_fn=sac.context_fn(policy, statistics=stats))
    counts = stats.read()
    assert (counts["forwards"], counts["calls_saved"], counts["bytes_saved"]) == \
        (1, 3, e.saved_bytes())
    out.sum().backward()
    counts = stats.read()
    assert counts["recomputations"] == 1 and counts["calls_served"] == 3
    stats.reset()
    assert stats.read()["forwards"] == 0


def whole_model_step(model, batch, context_fn=None, region_policy=None, count=None):
    """One step with the whole forward checkpointed once (by PyTorch's
    checkpoint with `context_fn`, or by sac.region): loss, gradients, and the
    bytes live after the forward if `count` is the counting allocator."""
    model = models.copy.deepcopy(model)
    model.train()
    torch.manual_seed(7)
    with no_collection():
        before = count.sac_counting_live_bytes() if count else 0
        if region_policy is not None:
            with sac.region(region_policy):
                out = model(**batch).loss
        elif context_fn is not None:
            out = checkpoint(lambda b: model(**b).loss, batch, use_reentrant=False,
                             context_fn=context_fn)
        else:
            out = model(**batch).loss
        # The loss held, as a step holds it until backward: the plans count
        # its bytes as the caller's (sac.profile of a region that returns it).
        kept = count.sac_counting_live_bytes() - before if count else None
    out.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return (out.detach(), grads), kept


def whole_model_profile(model, batch):
    """sac.profile of a copy's whole forward, returning its loss."""
    profiled = models.copy.deepcopy(model)
    profiled.train()

    def forward():
        torch.manual_seed(7)
        return profiled(**batch).loss

    return sac.profile(forward, runs=1)


@pytest.fixture(scope="module")
def counting():
    if not LIBRARY:
        pytest.skip("SAC_COUNTING_ALLOCATOR names no counting allocator library")
    library = ctypes.CDLL(LIBRARY)
    library.sac_counting_live_bytes.restype = ctypes.c_int64
    library.sac_counting_install()
    return library


@pytest.mark.parametrize("architecture", [models.gpt2, models.llama], ids=lambda f: f.__name__)
def test_a_plan_is_never_worse_than_not_checkpointing(architecture, counting):
    """Issue 45: a plan at half of everything_saveable's bytes kept more than
    the step keeps unchecked on Llama, and still recomputed. The profile
    measures what the region keeps unchecked (plain_bytes, to the byte); with
    unchecked_regions a plan whose budget covers that leaves the region
    unchecked, and no plan keeps as much while recomputing. Under PyTorch's
    checkpoint such a region runs plainly: it keeps what the step keeps
    unchecked, to the byte, with the same gradients."""
    torch.manual_seed(0)
    model, batch = architecture()
    profile = whole_model_profile(model, batch)
    expected, kept_plain = whole_model_step(model, batch, count=counting)
    _, kept_full = whole_model_step(model, batch, count=counting,
                                    context_fn=sac.context_fn(sac.nothing_saveable()))
    # PyTorch's checkpoint also keeps the CPU generator's state as a tensor,
    # which leaving the region unchecked saves too.
    rng_state = torch.get_rng_state().nbytes
    assert kept_plain - (kept_full - rng_state) == profile.plain_bytes
    for fraction in [0.25, 0.5, 0.75, 1.0]:
        before = sac.budgeted_plan([profile], of_everything_saveable=fraction, unchecked_regions=False)
        plan = sac.budgeted_plan([profile], of_everything_saveable=fraction)
        assert plan.saved_bytes <= plan.budget_bytes
        if plan.budget_bytes >= profile.plain_bytes:
            assert plan.checkpointed == [False] and not plan.policies[0].checkpoints
            assert plan.saved_bytes == profile.plain_bytes
            got, kept = whole_model_step(model, batch, count=counting,
                                         context_fn=sac.context_fn(plan.policies[0]))
            models.assert_identical(got, expected, "an unchecked region under checkpoint")
            assert kept == kept_plain
        else:
            assert plan.checkpointed == [True] and plan.saved_bytes < profile.plain_bytes
        # Without the choice, a plan may keep more than unchecked and still
        # recompute (the views and in-place calls the fallback key sees).
        if before.saved_bytes >= profile.plain_bytes and before.recompute_seconds > 1e-9:
            assert plan.recompute_seconds == 0
    # A fraction is of not checkpointing: fraction=1.0 is the plain step;
    # below it the step keeps less than the plain step, counted.
    for fraction in [0.5, 1.0]:
        plan = sac.budgeted_plan([profile], fraction=fraction)
        assert plan.budget_bytes == int(fraction * profile.plain_bytes)
        assert plan.saved_bytes <= plan.budget_bytes
        got, kept = whole_model_step(model, batch, count=counting,
                                     context_fn=sac.context_fn(plan.policies[0]))
        models.assert_identical(got, expected, f"fraction={fraction}")
        if fraction == 1.0:
            assert plan.checkpointed == [False] and kept == kept_plain
        else:
            assert plan.checkpointed == [True] and kept < kept_plain
    with pytest.raises(RuntimeError, match="exactly one of them"):
        sac.budgeted_plan([profile], fraction=0.5, of_everything_saveable=0.5)


@pytest.mark.parametrize("architecture", [models.gpt2, models.llama, models.bart],
                         ids=lambda f: f.__name__)
@pytest.mark.parametrize("fraction", [0.25, 0.6, 1.0])
def test_a_budgeted_policy_keeps_its_plan_exactly(architecture, fraction, counting):
    torch.manual_seed(0)
    model, batch = architecture()
    expected, _ = whole_model_step(model, batch)

    profile = whole_model_profile(model, batch)
    # The loss is returned: keeping the call that made it keeps none of the
    # loss's bytes (the caller holds them).
    assert [c for c in profile.calls if c.returned], "no call made the returned loss"
    assert "returned" in profile.table()
    plan = sac.budgeted_plan([profile], of_everything_saveable=fraction, unchecked_regions=False)
    policy = plan.policies[0]
    assert plan.exact and plan.saved_bytes <= plan.budget_bytes

    runs = [("checkpoint", dict(context_fn=sac.context_fn(policy)),
             dict(context_fn=sac.context_fn(sac.nothing_saveable())))]
    if FALLBACK:
        runs.append(("region", dict(region_policy=policy),
                     dict(region_policy=sac.nothing_saveable())))
    for what, budgeted, full in runs:
        got, kept = whole_model_step(model, batch, count=counting, **budgeted)
        _, kept_full = whole_model_step(model, batch, count=counting, **full)
        models.assert_identical(got, expected, f"{what} with a budgeted policy")
        assert kept - kept_full == plan.saved_bytes, (what, kept, kept_full, plan.saved_bytes)


def test_fake_tensors_are_refused_not_measured():
    """Under FakeTensorMode sac would see the fake mode's ops and no
    allocation: every call that profiles or measures says so instead (a
    profile recorded 548 calls against 75 real ones, without a word)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    block = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(4, 8, requires_grad=True)
    calls = {
        "sac.profile": lambda: sac.profile(lambda: block(x)),
        "sac.explain": lambda: sac.explain(sac.nothing_saveable(), lambda: block(x)),
        "sac.measure_peak": lambda: sac.measure_peak(lambda: block(x)),
        "sac.measure_step_phases": lambda: sac.measure_step_phases(lambda: block(x)),
        "sac.profile_layers": lambda: sac.profile_layers(block, lambda: block(x)),
        "sac.fit": lambda: sac.fit(block, lambda: block(x).sum().backward(), peak=0.5),
    }
    for api, call in calls.items():
        with FakeTensorMode(), pytest.raises(RuntimeError, match=f"{api}: a FakeTensorMode"):
            call()
    # Fake tensors made inside the region, the mode entered there.
    mode = FakeTensorMode(allow_non_fake_inputs=True)

    def fake_region():
        with mode:
            return block(mode.from_tensor(x))
    with pytest.raises(RuntimeError, match="sac.profile: the region made fake tensors"):
        sac.profile(fake_region)
    # Real tensors are profiled as before.
    assert sac.profile(lambda: block(x)).calls
