"""sac.fit: a training step planned into a peak, in one call.

    plan = sac.fit(model, step, peak=0.6)   # 60% of the step's plain peak
    print(plan)                              # per layer: what is kept, the cost
    plan.apply(model)                        # train on

The step runs twice, each time from the state it found: once with each
layer profiled alone (so no more than one layer's plain graph is alive), and
once measured with every layer recomputing everything, the smallest step
there is. The plan's peak is predicted from that one step
(sac.measure_step_phases), so a step that does not fit unchecked is
planned without being run unchecked.
"""
from __future__ import annotations

import copy
import functools
import gc
import time
import weakref
from typing import Any, Callable, Dict, List, Union

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook
import torch.utils._pytree

from . import _C


def fit(model: torch.nn.Module, step: Callable[[], Any], peak: Union[float, int],
        *, runs: int = 2) -> "Fit":
    """The plan of least recomputation for `step`, one training step of
    `model` (forward, backward, optimizer step; a function of no arguments),
    whose peak is at most `peak`: a fraction of the step's peak without
    checkpointing (0 < peak <= 1), or bytes (an int). Peaks count the CPU
    memory the step allocates over what was live when it began, on one
    intra-op thread (torch.set_num_threads(1)).

    `model` is a Hugging Face model (checkpointed through its own switch) or
    a torch.nn.Sequential (each child a region). The step runs twice, and the
    model's parameters, buffers and gradients, the optimizers' states and the
    random generator are restored after each run. Each layer is profiled
    `runs` times."""
    if isinstance(peak, bool) or not isinstance(peak, (int, float)):
        raise TypeError(f"sac.fit: peak is a fraction of the plain step's peak (a float in "
                        f"(0, 1]) or bytes (an int); got {peak!r}.")
    if isinstance(peak, float) and not 0 < peak <= 1:
        raise ValueError(f"sac.fit: a fraction of the plain step's peak is in (0, 1]; got "
                         f"{peak}. Give bytes as an int.")
    if isinstance(peak, int) and peak <= 0:
        raise ValueError(f"sac.fit: a peak in bytes must be positive; got {peak}.")
    from . import _refuse_fake_tensors, measure_step_phases, nothing_saveable, context_fn
    _refuse_fake_tensors("sac.fit")
    start = time.perf_counter()
    regions = _Regions(model)
    state = _State(model)
    collecting = gc.isenabled()
    gc.disable()
    try:
        with state.optimizers_watched():
            profiles = _profile(regions, step, runs)
            state.restore()
            regions.enable(context_fn(nothing_saveable()))
            try:
                phases = measure_step_phases(step)
            finally:
                state.restore()
    finally:
        regions.disable()
        if collecting:
            gc.enable()
    if len(profiles) != phases.regions:
        raise RuntimeError(
            f"sac.fit: the step profiled {len(profiles)} layers but ran {phases.regions} "
            "checkpointed regions: it must run the model's forward once, the same way "
            "each time.")
    plain = phases.plain_peak
    if isinstance(peak, float):
        if plain is None:
            raise RuntimeError(f"sac.fit: the plain step's peak is not known "
                               f"({phases.why_no_plain_peak}), so a fraction of it is not "
                               f"either. Give the peak in bytes.")
        budget = int(peak * plain)
    else:
        budget = peak
    # The least peak: full recomputation's, or the plain step's where that is
    # lower (a tiny step, where the generator states checkpointing keeps
    # outweigh what it spares).
    if budget < phases.peak() and (plain is None or budget < plain):
        fraction = f" ({phases.peak() / plain:.3f} of the plain step's)" if plain else ""
        raise RuntimeError(
            f"sac.fit: no plan fits {budget} bytes: recomputing everything, the step peaks at "
            f"{phases.peak()} bytes{fraction}. Raise the peak, or shrink the step (a smaller "
            f"batch, more layers checkpointed).")
    planned = phases.plan_for_peak(profiles, budget)
    everything = sum(c.seconds for p in profiles for c in p.calls if not c.past_stop)
    return Fit(model, planned, profiles, phases, budget, everything, time.perf_counter() - start)


class Fit:
    """A plan sac.fit made for one model's step. `policies`, one per layer in
    the order they run; `checkpointed`, per layer, whether the plan
    checkpoints it; `predicted_peak` of `peak_budget` bytes, against
    `plain_peak` (not checkpointing; None if not known) and
    `recomputation_peak` (recomputing everything); `recompute_seconds` and
    `recompute_flops` the plan's recomputation per step (FLOPs by
    torch.utils.flop_counter's formulas); `planning_seconds` what fit took."""

    def __init__(self, model: torch.nn.Module, planned: Any, profiles: List[Any], phases: Any,
                 budget: int, everything_seconds: float, seconds: float) -> None:
        self._model = weakref.ref(model)
        self._planned = planned
        self._profiles = profiles
        self.policies = list(planned.plan.policies)
        self.checkpointed = list(planned.plan.checkpointed)
        self.peak_budget = budget
        self.predicted_peak = planned.predicted_peak
        self.plain_peak = phases.plain_peak
        self.recomputation_peak = phases.peak()
        self.recompute_seconds = planned.plan.recompute_seconds
        self.recompute_flops = sum(c.flops for i in range(len(profiles))
                                   for c in self._recomputed(i))
        self.recompute_everything_seconds = everything_seconds
        self.planning_seconds = seconds

    @property
    def context_fn(self) -> Callable[[], Any]:
        """The plan as torch.utils.checkpoint's context_fn: each checkpointed
        call takes the next layer's policy."""
        from . import in_order
        return in_order(self.policies)

    def apply(self, model: torch.nn.Module) -> None:
        """Checkpoints `model`'s layers under the plan: Hugging Face's switch,
        or each child of a torch.nn.Sequential. The model must be the one
        planned for."""
        if self._model() is not model:
            raise ValueError("sac.fit: this plan was made for another model; its policies "
                             "name that model's layers, call by call. Plan this one with "
                             "sac.fit(model, step, peak).")
        _Regions(model).enable(self.context_fn)

    def check(self, step: Callable[[], Any]) -> int:
        """Runs `step` once, as sac measures it, and returns its peak; an error
        if it is over the prediction (the step is not the one planned for:
        another batch shape, more threads, another model)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            measured = _C.measure_peak(lambda: step())
        finally:
            if collecting:
                gc.enable()
        if measured > self.predicted_peak:
            raise RuntimeError(
                f"sac.fit: the step peaked at {measured} bytes, over the plan's prediction of "
                f"{self.predicted_peak}: it is not the step planned for (another batch "
                "shape or sequence length, more intra-op threads, the model changed). Plan "
                "the step as it runs with sac.fit.")
        return measured

    def _recomputed(self, layer: int) -> List[Any]:
        """The calls of `layer` the plan recomputes (none if unchecked)."""
        if not self.checkpointed[layer]:
            return []
        saved = {(op, call) for op, call, _ in self._planned.plan.saved_calls[layer]}
        return [c for c in self._profiles[layer].calls
                if not c.past_stop and (c.op, c.call) not in saved]

    def __str__(self) -> str:
        plan = self._planned.plan
        lines = [f"{'layer':>5}  {'plan':<26} {'kept bytes':>12} {'recompute us':>13} "
                 f"{'recompute MFLOP':>16}"]
        for i, profile in enumerate(self._profiles):
            calls = self._recomputed(i)
            if not self.checkpointed[i]:
                what, kept = "unchecked", profile.plain_bytes
            else:
                kept = sum(b for _, _, b in plan.saved_calls[i])
                keepable = sum(c.keepable for c in profile.calls)
                what = f"keeps {len(plan.saved_calls[i])} of {keepable} calls"
            seconds = sum(c.seconds for c in calls)
            flops = sum(c.flops for c in calls)
            lines.append(f"{i:>5}  {what:<26} {kept:>12} {seconds * 1e6:>13.1f} "
                         f"{flops / 1e6:>16.3f}")
        plain = "unknown" if self.plain_peak is None else f"{self.plain_peak}"
        lines.append(
            f"peak {self.predicted_peak} bytes predicted, budget {self.peak_budget} (plain "
            f"{plain}, recomputing everything {self.recomputation_peak}); recomputes "
            f"{self.recompute_seconds * 1e3:.2f} ms and {self.recompute_flops / 1e6:.3f} "
            f"MFLOP a step (everything: "
            f"{self.recompute_everything_seconds * 1e3:.2f} ms); planned in "
            f"{self.planning_seconds:.2f} s")
        return "\n".join(lines)


class _Regions:
    """The layers of a model that sac.fit checkpoints, switched on and off."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5
            self.kind = "hf5"
        elif getattr(model, "supports_gradient_checkpointing", False):
            self.kind = "hf"
        elif isinstance(model, torch.nn.Sequential):
            self.kind = "sequential"
        else:
            raise TypeError(
                f"sac.fit: {type(model).__name__} is neither a Hugging Face model nor a "
                "torch.nn.Sequential, so which of its layers to checkpoint is not known. "
                "Checkpoint its layers with torch.utils.checkpoint.checkpoint(layer, x, "
                "use_reentrant=False, context_fn=...) and plan with sac.profile_layers, "
                "sac.measure_step_phases and plan_for_peak.")

    def enable(self, context_fn: Callable[[], Any]) -> None:
        kwargs = {"use_reentrant": False, "context_fn": context_fn}
        if self.kind == "hf5":
            self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        elif self.kind == "hf":
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        if self.kind != "sequential":
            for layer in self.checkpoint_functions():
                layer._gradient_checkpointing_func = functools.partial(_checkpoint_rebound,
                                                                       **kwargs)
        else:
            for child in self.model:
                child.forward = _Checkpointed(type(child).forward.__get__(child), kwargs)

    def disable(self) -> None:
        if self.kind == "hf5":
            self.model.activation_checkpointing_disable()
        elif self.kind == "hf":
            self.model.gradient_checkpointing_disable()
        else:
            for child in self.model:
                child.__dict__.pop("forward", None)

    def checkpoint_functions(self) -> List[Any]:
        """Hugging Face's layers, whose `_gradient_checkpointing_func`
        checkpoints them (a Sequential's children call the checkpoint through
        its module attribute)."""
        if self.kind == "sequential":
            return []
        return [m for m in self.model.modules() if hasattr(m, "_gradient_checkpointing_func")]


def _checkpoint_rebound(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """torch.utils.checkpoint.checkpoint of `fn` (Hugging Face's layers pass a
    functools.partial that binds their keyword arguments), with the tensors
    it binds passed as the checkpoint's arguments instead: the checkpoint
    then holds them as inputs, which sac hears, not in its closure, where
    when the program lets go of them cannot be seen (Note [A region left
    unchecked]). The layer computes what it computed."""
    inner, bound = fn, ((), {})
    if isinstance(fn, functools.partial):
        inner, bound = fn.func, (fn.args, dict(fn.keywords))
    leaves, spec = torch.utils._pytree.tree_flatten(bound)
    at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    tensors = [leaves[i] for i in at]
    for i in at:
        leaves[i] = None  # the closure below holds no tensor
    given = len(args)

    def call(*inputs: Any) -> Any:
        filled = list(leaves)
        for i, t in zip(at, inputs[given:]):
            filled[i] = t
        bound_args, bound_kwargs = torch.utils._pytree.tree_unflatten(filled, spec)
        return inner(*bound_args, *inputs[:given], **bound_kwargs)

    return torch.utils.checkpoint.checkpoint(call, *args, *tensors, **kwargs)


class _Checkpointed:
    """A Sequential child's forward, through torch.utils.checkpoint."""

    def __init__(self, forward: Callable[..., Any], kwargs: Dict[str, Any]) -> None:
        self.forward = forward
        self.kwargs = kwargs

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return torch.utils.checkpoint.checkpoint(self.forward, *args, **self.kwargs, **kwargs)


def _profile(regions: _Regions, step: Callable[[], Any], runs: int) -> List[Any]:
    """Each layer's profile, in the order the step runs them, with no more
    than one layer's plain graph alive at once."""
    from . import _profile_regions
    regions.enable(lambda: None)  # on; the checkpoint functions are replaced while profiling
    try:
        profiles = _profile_regions(regions.checkpoint_functions(), step, runs, 0, recompute=True)
    finally:
        regions.disable()
    if not profiles:
        raise RuntimeError("sac.fit: the step ran none of the model's layers. Give the step "
                           "that trains this model.")
    return profiles


class _State:
    """What a step changes and sac.fit puts back: the model's parameters,
    buffers and gradients, the optimizers' states (each optimizer is copied
    the first time it steps), and the CPU generator."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.tensors = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.grads = {n: (None if p.grad is None else p.grad.detach().clone())
                      for n, p in model.named_parameters()}
        self.rng = torch.get_rng_state()
        self.optimizers: List[Any] = []

    def optimizers_watched(self) -> Any:
        seen = self.optimizers

        def before_step(optimizer: Any, args: Any, kwargs: Any) -> None:
            if all(o is not optimizer for o, _ in seen):
                seen.append((optimizer, copy.deepcopy(optimizer.state_dict())))
        return register_optimizer_step_pre_hook(before_step)  # removed on exit

    def restore(self) -> None:
        with torch.no_grad():
            for k, v in self.model.state_dict().items():
                v.copy_(self.tensors[k])
        for n, p in self.model.named_parameters():
            g = self.grads[n]
            p.grad = None if g is None else g.clone()
        for optimizer, state in self.optimizers:
            optimizer.load_state_dict(copy.deepcopy(state))
        torch.set_rng_state(self.rng)
