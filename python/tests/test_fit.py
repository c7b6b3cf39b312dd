"""sac.fit: a training step planned into a peak in one call, on Hugging Face
models and a torch.nn.Sequential trained the usual way (gradients zeroed
first and left, AdamW making its state in the step): the plan peaks where it
was predicted (the counting allocator's bytes), within its budget, gives the
loss and gradients of no checkpointing bit for bit, and a step whose plain
run does not fit in memory is planned without running it plainly."""
import collections
import copy

import pytest
import torch

import torch_sac as sac
import test_models as models
from support import counting_allocator, no_collection, one_thread  # noqa: F401 (a fixture)

counting = counting_allocator()


def llama():
    """A tiny Llama whose step's activations outweigh AdamW's state."""
    import transformers
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=176,
                                      num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=256)
    ids = torch.randint(0, 256, (4, 64))
    return transformers.LlamaForCausalLM(config), {"input_ids": ids, "labels": ids}


def longer(architecture):
    """A test model with a batch of 8 sequences as long as it takes."""
    def make():
        model, batch = architecture()
        return model, {k: v.repeat(4, 32 // v.shape[-1] or 1)[:, :32] for k, v in batch.items()}
    make.__name__ = architecture.__name__
    return make


pytestmark = pytest.mark.usefixtures("one_thread")


def training(model, batch):
    """The model, an AdamW over it, and one step of the usual loop."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step():
        optimizer.zero_grad()
        torch.manual_seed(7)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        return loss.detach()
    return optimizer, step


def counted_peak(step):
    """The step's peak by the counting allocator, over its start, and what
    the step returned."""
    with no_collection():
        before = counting.sac_counting_live_bytes()
        counting.sac_counting_reset_peak()
        result = step()
        return counting.sac_counting_peak_bytes() - before, result


@pytest.mark.parametrize("architecture", [llama, longer(models.gpt2), longer(models.bart)],
                         ids=lambda f: f.__name__)
def test_a_fitted_step_peaks_where_predicted_and_trains_alike(architecture):
    torch.manual_seed(0)
    model, batch = architecture()
    reference = copy.deepcopy(model)
    optimizer, step = training(model, batch)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with no_collection():
        whole = sac.fit(model, step, peak=1.0)  # the plain step fits its own peak
    assert not any(whole.checkpointed) and whole.predicted_peak == whole.plain_peak
    # Planning ran the step and put back what it changed.
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert not optimizer.state
    fraction = (whole.recomputation_peak + whole.plain_peak) / 2 / whole.plain_peak
    with no_collection():
        plan = sac.fit(model, step, peak=fraction)
    assert plan.predicted_peak <= plan.peak_budget == int(fraction * plan.plain_peak)
    assert plan.recomputation_peak <= plan.predicted_peak < plan.plain_peak
    assert any(plan.checkpointed)
    text = str(plan)
    assert "peak" in text and "planned in" in text and len(text.splitlines()) == \
        len(plan.policies) + 2
    plan.apply(model)
    _, reference_step = training(reference, batch)
    # The first step makes AdamW's state, as the measured one did: at the
    # prediction. The next has it already: no higher.
    for first in (True, False):
        peak, loss = counted_peak(step)
        assert peak == plan.predicted_peak if first else peak <= plan.predicted_peak
        models.assert_identical(
            (loss, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}),
            (reference_step(),
             {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}),
            "a fitted step")
    # Another model, another plan.
    with pytest.raises(ValueError, match="made for another model"):
        plan.apply(reference)


def test_a_step_that_does_not_fit_unchecked_is_planned_without_running_it():
    """Under a memory limit between recomputing everything and not
    checkpointing (a capped counting allocator: out of memory above it), the
    plain step fails; sac.fit plans the step under the same limit, and the
    planned step trains within it, at its predicted peak."""
    torch.manual_seed(0)
    model, batch = llama()
    plain_model = copy.deepcopy(model)
    _, plain_step = training(plain_model, batch)
    plain, _ = counted_peak(plain_step)
    optimizer, step = training(model, batch)
    limit = counting.sac_counting_live_bytes() + int(0.85 * plain)
    counting.sac_counting_limit(limit)
    try:
        plain_model.zero_grad(set_to_none=True)
        with pytest.raises(torch.OutOfMemoryError):
            plain_step()
        plain_model.zero_grad(set_to_none=True)
        with no_collection():
            plan = sac.fit(model, step, peak=0.8)
        assert plan.plain_peak > limit - counting.sac_counting_live_bytes()
        plan.apply(model)
        assert plan.check(step) == plan.predicted_peak
    finally:
        counting.sac_counting_limit(0)


def test_a_sequential_is_fitted_layer_by_layer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(),
                                                      torch.nn.Linear(128, 32))
                                  for _ in range(4)])
    x = torch.randn(1024, 32)
    reference = copy.deepcopy(model)

    def training_step(model):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step():
            optimizer.zero_grad()
            model(x).square().mean().backward()
            optimizer.step()
        return step

    step, reference_step = training_step(model), training_step(reference)
    with no_collection():
        plan = sac.fit(model, step, peak=0.7)
    assert len(plan.policies) == 4 and any(plan.checkpointed)
    plan.apply(model)
    assert counted_peak(step)[0] == plan.predicted_peak <= plan.peak_budget
    reference_step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad) and torch.equal(p, q)


def test_a_plan_recomputes_the_flops_it_states():
    """What a plan says it recomputes equals, by torch.utils.flop_counter, what
    PyTorch's own selective checkpoint computes beyond the plain step when
    given the plan's choices (its cache hides a kept call from the counter),
    from the plain peak down to the tightest."""
    from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                        create_selective_checkpoint_contexts)
    from torch.utils.flop_counter import FlopCounterMode

    def flops(step):
        with FlopCounterMode(display=False) as counter:
            step()
        return counter.get_total_flops()

    def keeping(saved):
        """PyTorch's policy that keeps the calls `saved` names (op, call)."""
        def context_fn():
            calls = {False: collections.Counter(), True: collections.Counter()}

            def policy(ctx, op, *args, **kwargs):
                seen = calls[ctx.is_recompute]
                call = seen[op.name()]
                seen[op.name()] += 1
                return (CheckpointPolicy.MUST_SAVE if (op.name(), call) in saved
                        else CheckpointPolicy.PREFER_RECOMPUTE)
            return create_selective_checkpoint_contexts(policy)
        return context_fn

    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.GELU(), torch.nn.Linear(96, 32))
              for _ in range(3)]
    x = torch.randn(256, 32)

    def step(forward):
        for layer in layers:
            layer.zero_grad(set_to_none=True)
        forward(x).square().mean().backward()
    plain = torch.nn.Sequential(*layers)
    stated = []
    for peak in (1.0, 0.9, 0.8, 0.7, None):
        with no_collection():
            least = sac.fit(plain, lambda: step(plain), peak=1.0).recomputation_peak
            plan = sac.fit(plain, lambda: step(plain), peak=peak or least)
        contexts = [keeping({(op, call) for op, call, _ in saved}) if checkpointed else None
                    for checkpointed, saved in zip(plan.checkpointed,
                                                   plan._planned.plan.saved_calls)]

        def planned(h):
            for layer, context_fn in zip(layers, contexts):
                h = layer(h) if context_fn is None else checkpoint(
                    layer, h, use_reentrant=False, context_fn=context_fn)
            return h
        assert flops(lambda: step(planned)) - flops(lambda: step(plain)) == plan.recompute_flops
        assert f"{plan.recompute_flops / 1e6:.3f} MFLOP" in str(plan)
        stated.append(plan.recompute_flops)
    # Recomputing every layer runs its first product again; the second is past
    # the recomputation's stop (nothing after it saves a tensor).
    assert stated[0] == 0 and stated[-1] == 3 * (2 * 256 * 32 * 96)
    assert len(set(stated)) > 2, stated


def test_what_fit_cannot_do_is_an_error():
    torch.manual_seed(0)
    model, batch = models.gpt2()
    _, step = training(model, batch)
    with pytest.raises(TypeError, match="a fraction of the plain step's peak"):
        sac.fit(model, step, peak="60%")
    with pytest.raises(ValueError, match="in \\(0, 1\\]"):
        sac.fit(model, step, peak=1.5)
    with pytest.raises(RuntimeError, match="no plan fits 1 bytes: recomputing everything"):
        with no_collection():
            sac.fit(model, step, peak=1)
    with pytest.raises(TypeError, match="neither a Hugging Face model nor a"):
        sac.fit(torch.nn.Linear(2, 2), step, peak=0.5)
    with no_collection():
        plan = sac.fit(model, step, peak=1.0)
    plan.apply(model)
    more = {k: torch.cat([v, v]) for k, v in batch.items()}

    def another_step():
        model.zero_grad(set_to_none=True)
        model(**more).loss.backward()
    with pytest.raises(RuntimeError, match="over the plan's prediction"):
        plan.check(another_step)


def test_the_guide_runs_as_written():
    """The tutorial "Fit a step into memory": its script runs as written, and
    the plan it prints peaks where predicted."""
    import os
    import re
    guide = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "tutorial", "fit.md")
    with open(guide) as f:
        text = f.read()
    section = text[text.index("## From Python"):text.index("## From C++")]
    script = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len([line for line in script.splitlines() if "sac." in line]) <= 3
    scope = {}
    with no_collection():
        exec(compile(script, guide, "exec"), scope)
    plan, step = scope["plan"], scope["step"]
    assert plan.predicted_peak <= plan.peak_budget
    assert counted_peak(step)[0] <= plan.predicted_peak
