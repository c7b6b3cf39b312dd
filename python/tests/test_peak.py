"""The step's peak from Python (sac.measure_step_phases, sac/lab/peak.h) on Hugging
Face models: a step measured once under full recomputation, each layer
profiled, then plans for five peak budgets from full recomputation's peak to
keeping everything's. Each plan, run through torch.utils.checkpoint with
sac's modes, peaks at its predicted bytes (the counting allocator of
benchmarks/counting_allocator.cpp), within its budget, and gives the loss
and gradients of no checkpointing bit for bit."""
import copy
import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import torch_sac as sac
import test_models as models
from support import counting_allocator, no_collection, one_thread  # noqa: F401 (a fixture)

counting = counting_allocator()
PROBE = {"live": counting.sac_counting_live_bytes, "peak": counting.sac_counting_peak_bytes,
         "reset_peak": counting.sac_counting_reset_peak}


pytestmark = pytest.mark.usefixtures("one_thread")


def checkpointed(model, context_fn, checkpoint_fn=checkpoint):
    """A copy of `model` whose layers (Hugging Face's checkpointed layers,
    ResNet's stages) run through `checkpoint_fn` with `context_fn`."""
    model = copy.deepcopy(model)
    model.train()
    models.enable_checkpointing(model, context_fn)
    if checkpoint_fn is not checkpoint:
        kwargs = {"use_reentrant": False, "context_fn": context_fn}
        if model.supports_gradient_checkpointing:
            for module in model.modules():
                if getattr(module, "gradient_checkpointing", False):
                    module._gradient_checkpointing_func = functools.partial(checkpoint_fn,
                                                                            **kwargs)
        else:
            for stage in model.resnet.encoder.stages:
                stage.forward = functools.partial(checkpoint_fn, stage.forward.args[0],
                                                  **kwargs)
    return model


def run(model, batch):
    torch.manual_seed(7)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach()


def grads(model):
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def profiles(model, batch):
    """Each checkpointed layer's op calls, profiled as the forward reaches it."""
    m = checkpointed(model, sac.context_fn(sac.nothing_saveable()))
    torch.manual_seed(7)
    return sac.profile_layers(m, lambda: m(**batch), runs=1)


def measured(model, batch, context_fn):
    """The step's peak over what was live as it began, and what it left."""
    m = checkpointed(model, context_fn)
    with no_collection():
        before = counting.sac_counting_live_bytes()
        counting.sac_counting_reset_peak()
        loss = run(m, batch)
        peak = counting.sac_counting_peak_bytes() - before
    return peak, (loss, grads(m))


@pytest.mark.parametrize("architecture", models.ARCHITECTURES, ids=lambda f: f.__name__)
def test_peak_plans_hold_their_budgets(architecture):
    torch.manual_seed(0)
    model, batch = architecture()  # allocated by the counting allocator
    expected = models.step(model, batch, None)
    nothing = sac.context_fn(sac.nothing_saveable())
    measured(model, batch, nothing)  # one-time allocations
    m = checkpointed(model, nothing)
    with no_collection():
        phases = sac.measure_step_phases(lambda: run(m, batch), **PROBE)
    assert phases.regions > 0
    assert measured(model, batch, nothing)[0] == phases.peak()
    profiled = profiles(model, batch)
    assert len(profiled) == phases.regions
    low = phases.peak()
    high = phases.predict_peak(sac.budgeted_plan(profiled, of_everything_saveable=1.0, unchecked_regions=False))
    last = float("inf")
    for i in range(5):
        budget = low + (high - low) * i // 4
        plan = phases.plan_for_peak(profiled, budget)
        peak, got = measured(model, batch, sac.in_order(plan.policies))
        assert peak == plan.predicted_peak, f"budget {budget}: measured {peak}"
        assert peak <= budget
        assert plan.plan.recompute_seconds <= last
        last = plan.plan.recompute_seconds
        models.assert_identical(got, expected, f"the plan for {budget} bytes")


@pytest.mark.parametrize("architecture", [models.gpt2, models.llama], ids=lambda f: f.__name__)
def test_a_peak_budget_the_plain_step_fits_recomputes_nothing(architecture):
    """Not checkpointing is a plan too (sac.measure_step_phases' plain step): with
    `plain_step`, the step with checkpointing off, measure_step_phases
    measures its peak (the counting allocator's, to the byte), and a peak
    budget it fits gets the plan that checkpoints nothing; one byte under it,
    the plan checkpoints and peaks lower. Without `plain_step`, PyTorch's
    checkpoint runs each layer plainly under sac's contexts: the step a plan
    leaving every layer unchecked runs, whose peak is measured so (GPT-2's
    is lower than without checkpointing: Hugging Face skips the key-value
    cache wherever gradient checkpointing is on)."""
    torch.manual_seed(0)
    model, batch = architecture()
    nothing = sac.context_fn(sac.nothing_saveable())
    measured(model, batch, nothing)  # one-time allocations
    m = checkpointed(model, nothing)
    plain = copy.deepcopy(model)
    plain.train()

    def clearing(model):
        def step():
            run(model, batch)
            for p in model.parameters():
                p.grad = None
        return step

    # sac's C++ contexts alone cannot run a layer plainly: refused, saying why.
    raw = checkpointed(model, lambda: sac._C.create_selective_checkpoint_contexts(
        sac.nothing_saveable()))
    with no_collection():
        inside = sac.measure_step_phases(clearing(m), **PROBE)
        phases = sac.measure_step_phases(clearing(m), plain_step=clearing(plain), **PROBE)
        refused = sac.measure_step_phases(clearing(raw), **PROBE)
    assert refused.plain_peak is None
    assert "checkpointed in the plain run all the same" in refused.why_no_plain_peak
    # A plain step that runs nothing would plan for a peak of 0: refused.
    with no_collection(), pytest.raises(RuntimeError, match="the plain step allocated nothing"):
        sac.measure_step_phases(clearing(m), plain_step=lambda: None, **PROBE)
    assert phases.plain_peak is not None, phases.why_no_plain_peak
    with no_collection():
        before = counting.sac_counting_live_bytes()
        counting.sac_counting_reset_peak()
        run(plain, batch)
        plain_peak = counting.sac_counting_peak_bytes() - before
    assert phases.plain_peak == plain_peak
    assert inside.plain_peak is not None, inside.why_no_plain_peak
    profiled = profiles(model, batch)
    unchecked = inside.plan_for_peak(profiled, inside.plain_peak)
    assert not any(unchecked.plan.checkpointed)
    peak, got = measured(model, batch, sac.in_order(unchecked.policies))
    assert peak == inside.plain_peak == unchecked.predicted_peak
    models.assert_identical(got, models.step(model, batch, None), "every layer unchecked")
    at_plain = phases.plan_for_peak(profiled, plain_peak)
    assert not any(at_plain.plan.checkpointed)
    assert at_plain.plan.recompute_seconds == 0 and at_plain.predicted_peak == plain_peak
    assert phases.predict_peak(at_plain.plan) == plain_peak
    under = phases.plan_for_peak(profiled, plain_peak - 1)
    assert all(under.plan.checkpointed)
    peak, _ = measured(model, batch, sac.in_order(under.policies))
    assert peak == under.predicted_peak < plain_peak


@pytest.mark.parametrize("architecture", [models.bart, models.gpt2], ids=lambda f: f.__name__)
def test_the_plain_step_is_predicted_where_sac_hears_every_region(architecture):
    """Measured once, with no probe and in the usual loop (gradients left),
    a step whose layers PyTorch's checkpoint runs with sac's contexts: where
    the checkpointed functions close over no tensors (BART's layers), sac
    hears what each saves and holds, and the plain step and plans that mix
    unchecked and checkpointed layers are predicted to the byte, the step
    run once. GPT-2's layers close over position_ids, whose release sac
    cannot see: the plain step is run and measured instead."""
    torch.manual_seed(0)
    model, batch = architecture()
    nothing = sac.context_fn(sac.nothing_saveable())
    m = checkpointed(model, nothing)
    run(m, batch)  # one-time allocations; the gradients stay, as in a loop
    runs = []

    def step():
        runs.append(1)
        m.zero_grad(set_to_none=True)
        run(m, batch)

    with no_collection():
        phases = sac.measure_step_phases(step)
    assert phases.plain_peak is not None, phases.why_no_plain_peak
    assert len(runs) == (1 if architecture is models.bart else 2)
    profiled = profiles(model, batch)
    mixed = 0
    for tenths in range(11):
        plan = sac.budgeted_plan(profiled, fraction=tenths / 10)
        mixed += 0 < sum(plan.checkpointed) < len(plan.checkpointed)
        planned = checkpointed(model, sac.in_order(plan.policies))
        run(planned, batch)
        with no_collection():
            def planned_step():
                planned.zero_grad(set_to_none=True)
                run(planned, batch)
            peak = sac.measure_peak(planned_step)
        if architecture is models.bart or all(plan.checkpointed):
            assert peak == phases.predict_peak(plan), tenths
        elif not any(plan.checkpointed):
            assert peak == phases.plain_peak, tenths
    assert mixed > 0


def test_presets_predicted_from_python():
    """Any policy's peak, from its explanations (sac.explain per layer)."""
    torch.manual_seed(0)
    model, batch = models.gpt2()
    nothing = sac.context_fn(sac.nothing_saveable())
    measured(model, batch, nothing)
    m = checkpointed(model, nothing)
    with no_collection():
        phases = sac.measure_step_phases(lambda: run(m, batch), **PROBE)
    for policy in [sac.everything_saveable(), sac.dots_saveable(), sac.torchtitan_default()]:
        explained = []

        def explaining(fn, *args, **kwargs):
            kwargs.pop("use_reentrant")
            kwargs.pop("context_fn")
            result = []
            explained.append(sac.explain(policy, lambda: result.append(fn(*args, **kwargs))))
            return result[0]

        torch.manual_seed(7)
        checkpointed(model, nothing, explaining)(**batch)
        peak, _ = measured(model, batch, sac.context_fn(policy))
        assert phases.predict_peak_of(explained) == peak, policy


def test_measuring_a_step_that_keeps_is_an_error():
    torch.manual_seed(0)
    model, batch = models.gpt2()
    m = checkpointed(model, sac.context_fn(sac.everything_saveable()))
    with pytest.raises(RuntimeError, match="kept the outputs of"):
        sac.measure_step_phases(lambda: run(m, batch), **PROBE)


def test_measuring_on_several_threads_is_an_error():
    torch.manual_seed(0)
    model, batch = models.gpt2()
    m = checkpointed(model, sac.context_fn(sac.nothing_saveable()))
    torch.set_num_threads(2)
    with pytest.raises(RuntimeError, match="intra-op threads"):
        sac.measure_step_phases(lambda: run(m, batch), **PROBE)


def test_measuring_under_a_profiler_is_an_error():
    """A profiler and the step's recording share c10's one slot (Note [The
    step's memory shares the profiler's slot]): either order is refused,
    never an abort, and both work afterwards."""
    torch.manual_seed(0)
    model, batch = models.gpt2()
    m = checkpointed(model, sac.context_fn(sac.nothing_saveable()))
    run(m, batch)
    for profiler in (torch.profiler.profile, torch.autograd.profiler.profile):
        with profiler():
            with pytest.raises(RuntimeError, match="a profiler is active on this thread"):
                sac.measure_step_phases(lambda: run(m, batch), **PROBE)

        def profiled_step():
            with profiler():
                run(m, batch)

        with pytest.raises(RuntimeError, match="the step started a profiler"):
            sac.measure_step_phases(profiled_step, **PROBE)
    with no_collection():
        phases = sac.measure_step_phases(lambda: run(m, batch), **PROBE)
    assert isinstance(phases, sac.StepPhases)
    with torch.profiler.profile(profile_memory=True) as prof:
        run(m, batch)
    assert len(prof.events()) > 0
