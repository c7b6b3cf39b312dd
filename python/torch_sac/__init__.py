"""torch_sac: selective activation checkpointing in C++, for PyTorch.

    import torch
    from torch.utils.checkpoint import checkpoint
    import torch_sac as sac

    ops = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default]
    y = checkpoint(block, x, use_reentrant=False, context_fn=sac.context_fn(ops))

The distribution is torch-sac and the package torch_sac: the name `sac` on
the package index belongs to another project whose top-level package is also
`sac`, and two distributions that install one top-level package overwrite
each other's files. `import torch_sac as sac` keeps the C++ spelling
(sac::checkpoint, sac.context_fn).

`create_selective_checkpoint_contexts` takes PyTorch's arguments and means
what PyTorch's does; its two modes are sac's C++ kernels below autograd
instead of Python TorchDispatchModes, so a listed or unlisted op costs no trip
into the interpreter. A policy is an op list, a Python function
`policy_fn(ctx, op, *args, **kwargs)` returning a
`torch.utils.checkpoint.CheckpointPolicy` or a bool, or one of sac's own
policies (`save_ops`, the presets, the combinators, the name policies),
which run in C++ throughout.

`with sac.region(policy):` checkpoints the code inside it by recording and
replaying its aten ops (sac::CheckpointRegion): no function to wrap.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import sys
from typing import Any, Callable, ContextManager, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed
import torch.utils._pytree
import torch.utils.checkpoint
from torch.utils.checkpoint import CheckpointPolicy

from . import _built_with

#: sac's version and the torch release the package was built against: the
#: wheel's version (0.1.0+torch2.13.0), which pins that torch.
__version__ = f"{_built_with.sac_version}+torch{_built_with.torch_version.split('+')[0]}"

if torch.__version__ != _built_with.torch_version:
    _release = torch.__version__.split("+")[0]
    raise ImportError(
        f"torch_sac was built against torch {_built_with.torch_version} but runs beside torch "
        f"{torch.__version__}: its C++ binaries fit the one torch they were built against. "
        f"Install the torch-sac wheel built for torch {_release} (its version ends in "
        f"+torch{_release}; from a folder of wheels, pip install --no-index --find-links "
        f"FOLDER torch-sac takes it), or build torch-sac beside this torch from sac's source "
        f"tree: pip install scikit-build-core && pip install --no-build-isolation PATH_TO_SAC "
        f"(docs/install.md, \"Python\").")

from . import _C  # noqa: E402  (after torch: libtorch must be loaded first)
from ._C import (  # noqa: E402
    BudgetedPlan,
    CheckpointRegion,
    ExplainedCall,
    Explanation,
    OpCallProfile,
    PeakPlan,
    Policy,
    RegionProfile,
    RegionStatistics,
    StepPhases,
    all_of,
    any_of,
    budgeted_plan,
    budgeted_policy,
    compute_intensive_ops,
    dots_saveable,
    dots_with_no_batch_dims_saveable,
    every_nth,
    everything_saveable,
    mechanism,
    never_recompute_collectives,
    nothing_saveable,
    offload_dot_with_no_batch_dims,
    offload_if,
    outputs_larger_than,
    save_and_offload_only_these_names,
    save_any_names_but_these,
    save_only_these_names,
    shape_deciding_op_names,
    shape_deciding_ops,
    tag,
    torchtitan_default,
)

__all__ = [
    # Checkpointing: PyTorch's contexts with sac's modes, and regions.
    "CheckpointError", "CheckpointRegion", "context_fn", "create_selective_checkpoint_contexts",
    "in_order", "mechanism", "region",
    # Types of what the functions below take.
    "Op", "PolicyLike",
    # Policies, built from op lists, functions, presets and combinators.
    "Policy", "all_of", "answer_ops", "any_of", "as_policy", "compute_intensive_ops",
    "dots_saveable", "dots_with_no_batch_dims_saveable", "every_nth", "everything_saveable",
    "except_", "never_recompute_collectives", "nothing_saveable",
    "offload_dot_with_no_batch_dims", "offload_if", "op_name", "outputs_larger_than",
    "save_ops", "shape_deciding_op_names", "shape_deciding_ops", "torchtitan_default",
    # Named values.
    "save_and_offload_only_these_names", "save_any_names_but_these", "save_only_these_names",
    "tag",
    # The policy lab: profiles, explanations, budgets, a step's peak.
    "BudgetedPlan", "ExplainedCall", "Explanation", "OpCallProfile", "PeakPlan",
    "RegionProfile", "RegionStatistics", "StepPhases", "budgeted_plan", "budgeted_policy",
    "explain", "fit", "measure_peak", "measure_step_phases", "profile", "profile_layers",
]

# sac's answers are PyTorch's, in the same order (the C++ side relies on it).
if [p.name for p in CheckpointPolicy] != [
        "MUST_SAVE", "PREFER_SAVE", "MUST_RECOMPUTE", "PREFER_RECOMPUTE",
        "MUST_CPU_OFFLOAD", "PREFER_CPU_OFFLOAD"]:
    raise ImportError(f"torch_sac: torch {torch.__version__}'s CheckpointPolicy is "
                      f"{list(CheckpointPolicy)}, not the six answers sac maps by position")


class CheckpointError(torch.utils.checkpoint.CheckpointError):
    """A checkpointed region cannot be recomputed faithfully (sac::CheckpointError):
    raised where PyTorch's checkpoint raises its CheckpointError, of which this
    is a subclass, so `except torch.utils.checkpoint.CheckpointError` catches
    both. See Note [CheckpointError in Python] in sac/base/internal/check.h."""


_C._set_checkpoint_error(CheckpointError)

#: An op as torch names it (torch.ops.aten.mm.default, torch.ops.aten.mm) or
#: sac's name for it ("aten::mm", "aten::mm.default").
Op = Union["torch._ops.OpOverload", "torch._ops.OpOverloadPacket", str]
#: What PyTorch's create_selective_checkpoint_contexts takes, or a sac Policy.
PolicyLike = Union[Policy, Sequence[Op], Callable[..., Union[CheckpointPolicy, bool]]]


def op_name(op: Op) -> str:
    """sac's name for an op: "aten::mm.default" for torch.ops.aten.mm.default,
    "aten::add.*" (every overload) for the packet torch.ops.aten.add; a string
    is taken as it is ("aten::mm")."""
    if isinstance(op, torch._ops.OpOverload):
        return f"{op._schema.name}.{op._overloadname}"
    if isinstance(op, torch._ops.OpOverloadPacket):
        return f"{op._qualified_op_name}.*"
    if isinstance(op, str):
        return op
    raise TypeError(
        f"sac: cannot name the op {op!r} ({type(op).__name__}); expected an op overload "
        f"(torch.ops.aten.mm.default), a packet (torch.ops.aten.mm) or a name ('aten::mm')")


def save_ops(ops: Iterable[Op]) -> Policy:
    """Saves the outputs of the listed ops and recomputes everything else."""
    return _C.save_ops([op_name(op) for op in ops])


def answer_ops(ops: Iterable[Op], answer: CheckpointPolicy) -> Policy:
    """Answers `answer` (a CheckpointPolicy) for the listed ops and
    PREFER_RECOMPUTE for everything else."""
    return _C.answer_ops([op_name(op) for op in ops], answer)


def except_(policy: PolicyLike, excluded: PolicyLike) -> Policy:
    """`policy`, but PREFER_RECOMPUTE wherever `excluded` keeps a value."""
    return _C.except_(as_policy(policy), as_policy(excluded))


def as_policy(policy_fn_or_list: PolicyLike) -> Policy:
    """A sac.Policy from what PyTorch's create_selective_checkpoint_contexts
    takes (a list of ops, or a policy function) or a sac.Policy."""
    if isinstance(policy_fn_or_list, Policy):
        return policy_fn_or_list
    if isinstance(policy_fn_or_list, (list, tuple)):
        return save_ops(policy_fn_or_list)
    if callable(policy_fn_or_list):
        return _C.policy_from_fn(policy_fn_or_list)
    raise TypeError(
        f"sac: expected a list of ops, a policy function or a sac.Policy, got "
        f"{type(policy_fn_or_list).__name__}")


def create_selective_checkpoint_contexts(
        policy_fn_or_list: PolicyLike, allow_cache_entry_mutation: bool = False, *,
        statistics: Optional[RegionStatistics] = None,
) -> Tuple[ContextManager[Any], ContextManager[Any]]:
    """PyTorch's function of the same name, with sac's modes: returns the
    (caching, cached) pair of context managers that checkpoint's context_fn
    returns. Create one pair per checkpointed call. Under torch.compile it
    returns PyTorch's own pair with the same answers (see context_fn).
    Both modes count into `statistics` (a sac.RegionStatistics) if given."""
    return _contexts(as_policy(policy_fn_or_list), allow_cache_entry_mutation,
                     _python_fn(policy_fn_or_list), statistics)


def context_fn(
        policy_fn_or_list: PolicyLike, allow_cache_entry_mutation: bool = False, *,
        statistics: Optional[RegionStatistics] = None,
) -> Callable[[], Tuple[ContextManager[Any], ContextManager[Any]]]:
    """What `context_fn=` takes: a function returning a new pair of sac's
    modes per call. The policy is built (op names resolved) once, now. Every
    pair counts into `statistics` (a sac.RegionStatistics) if given.

    Under torch.compile, Inductor plans recomputation from the tags that
    PyTorch's own modes put on the traced graph, so there the pair is
    PyTorch's, asking the same policy: a Python function directly, any other
    policy through sac's C++ answer for each traced call."""
    return functools.partial(_contexts, as_policy(policy_fn_or_list),
                             allow_cache_entry_mutation, _python_fn(policy_fn_or_list),
                             statistics)


def _python_fn(policy_fn_or_list: PolicyLike) -> Optional[Callable[..., Any]]:
    if callable(policy_fn_or_list) and not isinstance(policy_fn_or_list, Policy):
        return policy_fn_or_list
    return None


def _contexts(policy: Policy, allow_cache_entry_mutation: bool,
              python_fn: Optional[Callable[..., Any]],
              statistics: Optional[RegionStatistics] = None,
) -> Tuple[ContextManager[Any], ContextManager[Any]]:
    if torch.compiler.is_compiling():
        return torch.utils.checkpoint.create_selective_checkpoint_contexts(
            python_fn or _AsPyTorchPolicy(policy), allow_cache_entry_mutation)
    if not policy.checkpoints or _C._regions_run_plainly():
        return _RunsPlainly(), contextlib.nullcontext()
    forward, recompute = _C.create_selective_checkpoint_contexts(
        policy, allow_cache_entry_mutation, statistics)
    if _C._hearing():
        return _HeardForward(forward, _checkpoint_frame()), recompute
    return forward, recompute


# The function of PyTorch's non-reentrant checkpoint whose frame holds its
# arguments (2.14 and 2.15 moved its body into the _impl it calls).
_CHECKPOINT_FRAMES = ("_checkpoint_without_reentrant_generator_impl",
                      "_checkpoint_without_reentrant_generator")


def _checkpoint_frame() -> Any:
    """The Python frame of the torch.utils.checkpoint call asking for
    contexts now, or None if it is not PyTorch's non-reentrant checkpoint."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_name not in _CHECKPOINT_FRAMES:
        frame = frame.f_back
    return frame


def _closes_over_tensors(fn: Any, kwargs: Any) -> bool:
    """Whether a checkpointed function holds tensors other than its
    module's (a functools.partial's arguments, a closure's cells, keyword
    arguments): PyTorch's checkpoint keeps those alive through its closure,
    and sac cannot tell when the rest of the program lets go of them."""
    held: List[Any] = [kwargs]
    while isinstance(fn, functools.partial):
        held += [fn.args, fn.keywords]
        fn = fn.func
    held += [cell.cell_contents for cell in getattr(fn, "__closure__", None) or ()
             if not isinstance(cell.cell_contents, torch.nn.Module)]
    return any(isinstance(leaf, torch.Tensor) and not isinstance(leaf, torch.nn.Parameter)
               for leaf in torch.utils._pytree.tree_leaves(held))


class _HeardForward:
    """sac's caching mode while sac.measure_step_phases hears the step, telling
    it what PyTorch's checkpoint does not (Note [A region left unchecked] in
    sac/lab/plan_trace.cpp): the inputs the checkpoint holds, each through one
    saved tensor, and every tensor autograd saves, through the checkpoint's
    own saved-tensor hooks wrapped so that the packed value carries a token
    that dies when autograd lets go of it."""

    def __init__(self, mode: Any, frame: Any) -> None:
        self._mode = mode
        self._frame = frame
        self._hooks: Optional[Tuple[Callable[..., Any], Callable[..., Any]]] = None

    def __enter__(self) -> None:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
        frame, self._frame = self._frame, None
        self._mode.__enter__()
        if frame is None or hooks is None or \
                getattr(hooks[0], "__module__", None) != "torch.utils.checkpoint":
            return  # not PyTorch's checkpoint: the region stays unheard
        local = frame.f_locals
        if any(name not in local for name in ("fn", "args", "kwargs", "preserve_rng_state")) or \
                (local["preserve_rng_state"] and "fwd_cpu_state" not in local):
            return  # another release's checkpoint, whose frame sac does not know: unheard
        if _closes_over_tensors(local["fn"], local["kwargs"]):
            return  # held by the checkpoint's closure: when the program lets go is not seen
        mode, (pack, unpack) = self._mode, hooks
        # The checkpoint holds each tensor argument through one saved tensor,
        # and the generator states it took through its closure alone.
        for t in local["args"]:
            if isinstance(t, torch.Tensor):
                mode._hear_input(t, 1)
        states = [local.get("fwd_cpu_state")] + list(local.get("fwd_device_states") or [])
        for t in states:
            if isinstance(t, torch.Tensor):
                mode._hear_input(t, 1)
        del frame, local

        def heard_pack(t: torch.Tensor) -> Any:
            return pack(t), mode._hear_save(t)

        def heard_unpack(packed: Any) -> torch.Tensor:
            return unpack(packed[0])

        torch._C._autograd._pop_saved_tensors_default_hooks()
        torch._C._autograd._push_saved_tensors_default_hooks(heard_pack, heard_unpack)
        self._hooks = hooks
        mode._heard_whole()

    def __exit__(self, *exception: Any) -> Any:
        if self._hooks is not None:
            torch._C._autograd._pop_saved_tensors_default_hooks()
            torch._C._autograd._push_saved_tensors_default_hooks(*self._hooks)
            self._hooks = None
        return self._mode.__exit__(*exception)


class _RunsPlainly:
    """The forward context of a region a budgeted plan leaves unchecked
    (Policy.checkpoints is False), or of any region while
    sac.measure_step_phases runs the plain step (its `plain_step`),
    under PyTorch's non-reentrant checkpoint.
    The checkpoint pushes its saved-tensor hooks just before it enters this
    context; while the region runs they are set aside, so autograd saves the
    region's tensors as it does without checkpointing (its in-place checks
    included). The checkpoint then holds none of them and never recomputes,
    and with nothing holding it, it lets go of the inputs and generator state
    it kept: the region keeps what it keeps unchecked (plain_bytes)."""

    def __enter__(self) -> None:
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
        if hooks is None or getattr(hooks[0], "__module__", None) != "torch.utils.checkpoint":
            raise RuntimeError(
                "sac: a region a budgeted plan leaves unchecked runs plainly inside PyTorch's "
                "non-reentrant checkpoint (torch.utils.checkpoint.checkpoint(..., "
                "use_reentrant=False, context_fn=...)), which sac found was not the one "
                "entering its context. Call that checkpoint, or run the region without one "
                "(BudgetedPlan.checkpointed says which).")
        torch._C._autograd._pop_saved_tensors_default_hooks()
        self._hooks = hooks

    def __exit__(self, *exception: Any) -> None:
        torch._C._autograd._push_saved_tensors_default_hooks(*self._hooks)


class _AsPyTorchPolicy:
    """A sac.Policy as PyTorch's policy_fn, for one traced region: it counts
    each op's calls (`ctx.call` of sac's policies) in the order PyTorch's
    mode asks, which under torch.compile is the traced graph's order and its
    ops (decomposed, functionalized), not eager's."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._calls: collections.Counter[Any] = collections.Counter()

    def __call__(self, ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        call = self._calls[op]
        self._calls[op] += 1
        return _C.answer_for_pytorch(self._policy, op, args, kwargs, ctx.op_output, call)


def region(policy: Optional[PolicyLike] = None, *, preserve_rng_state: bool = True,
           debug: bool = False, allow_cache_entry_mutation: bool = False,
           statistics: Optional[RegionStatistics] = None, determinism_check: str = "default",
           name: str = "") -> CheckpointRegion:
    """sac::CheckpointRegion for Python code: what runs inside

        with sac.region(policy=[torch.ops.aten.mm.default]):
            y = model(x)

    is checkpointed with nothing to wrap: its aten ops are recorded below
    autograd, and backward replays them (not the Python code), serving the
    outputs the policy saves. Buffers the region writes (BatchNorm's running
    statistics) are written once, by the forward. Needs sac's fallback-key
    mechanism (SAC_DISPATCH=fallback); under per-op kernels entering it is an
    error. Without a policy everything is recomputed. One `with` per
    sac.region(...) value. A selective region counts into `statistics` (a
    sac.RegionStatistics) if given. determinism_check="values" compares what the
    replay saves with what the forward saved, value by value, and names the
    first that differs, the op that made it and the region (`name`)."""
    if not mechanism().startswith("fallback"):
        raise RuntimeError(
            f"sac.region records every op of the region below autograd, views and in-place "
            f"ops included, which only sac's fallback-key mechanism sees; this process uses "
            f"{mechanism()}. Set SAC_DISPATCH=fallback before importing sac, or checkpoint "
            f"a function with torch.utils.checkpoint.checkpoint(fn, ..., use_reentrant=False, "
            f"context_fn=sac.context_fn(policy)), which works with either mechanism.")
    return CheckpointRegion(None if policy is None else as_policy(policy),
                     preserve_rng_state, debug, allow_cache_entry_mutation, statistics,
                     determinism_check, name)


def _refuse_fake_tensors(api: str, values: Any = None) -> None:
    """An error where a FakeTensorMode is active, or `values` hold fake
    tensors: sac profiles and measures by running, and on fake tensors the
    ops it sees are the fake mode's and nothing is allocated, so a profile,
    an explanation or a peak would be wrong without a word."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack
    active = any(isinstance(m, FakeTensorMode) for m in _get_current_dispatch_mode_stack())
    made = any(isinstance(t, FakeTensor) for t in torch.utils._pytree.tree_leaves(values))
    if active or made:
        raise RuntimeError(
            f"{api}: {'a FakeTensorMode is active' if active else 'the region made fake tensors'}. "
            "sac profiles and measures by running the code: on fake tensors it sees the fake "
            "mode's ops, and nothing is allocated, so the result would be wrong. Run it on real "
            "tensors, outside the FakeTensorMode (a smaller batch or fewer layers, if the real "
            "step does not fit).")


def profile(region: Callable[[], Any], runs: int = 3, warmup: int = 0) -> RegionProfile:
    """What the op calls of `region` (a function of no arguments, run `runs`
    times as a plain forward) cost: a sac.RegionProfile, whose calls are the
    choices of a budgeted policy. Seed and restore what the runs change. A
    region whose first run does more (FSDP's lazy initialisation, a cache
    filled once) needs `warmup=1`: warm-up runs are not profiled. The calls
    that made the tensors `region` returns (anywhere in a tuple, list, dict or
    model output) are `returned` and cost no bytes: the caller holds them.
    A region that returns None drops its graph as it returns, so what it
    keeps unchecked is not measured (`plain_bytes` is -1): return the output."""
    _refuse_fake_tensors("sac.profile")

    def returning():
        out = region()
        _refuse_fake_tensors("sac.profile", out)
        if out is None:
            return None
        return [t for t in torch.utils._pytree.tree_leaves(out)
                if isinstance(t, torch.Tensor)]
    return _C.profile(returning, runs, warmup)


# torch.utils.checkpoint.checkpoint's own keyword arguments; the others are
# the checkpointed function's.
_CHECKPOINT_KEYWORDS = ("use_reentrant", "context_fn", "determinism_check", "debug",
                        "preserve_rng_state", "early_stop")


def profile_layers(model: torch.nn.Module, forward: Callable[[], Any], runs: int = 3,
                   warmup: int = 0) -> List[RegionProfile]:
    """The profile of each region that `forward()` checkpoints, in the order
    they run (one per call: a plan's `profiles`). Regions are the calls
    of `model`'s layers that Hugging Face's activation_checkpointing_enable
    checkpoints, and the calls of torch.utils.checkpoint.checkpoint made
    through the module attribute; while `forward` runs, each is profiled as
    `profile(region, runs, warmup)` does, instead of checkpointed, and the
    forward goes on with what its first run returned. A name bound before
    (`from torch.utils.checkpoint import checkpoint`) is not seen: an error
    if no region was."""
    _refuse_fake_tensors("sac.profile_layers")
    layers = [m for m in model.modules() if hasattr(m, "_gradient_checkpointing_func")]
    profiles = _profile_regions(layers, forward, runs, warmup, recompute=False)
    if not profiles:
        raise RuntimeError(
            "torch_sac.profile_layers: forward() checkpointed no region through "
            "torch.utils.checkpoint.checkpoint or a layer of the model that Hugging Face's "
            "activation_checkpointing_enable() set up. Enable checkpointing on the model (in "
            "training mode), or call torch.utils.checkpoint.checkpoint through the module "
            "attribute, not a name imported before.")
    return profiles


def _profile_regions(layers: Sequence[torch.nn.Module], run: Callable[[], Any], runs: int,
                     warmup: int, recompute: bool) -> List[RegionProfile]:
    """Runs `run` with each region profiled instead of checkpointed: the
    calls of `layers`' `_gradient_checkpointing_func` and of
    torch.utils.checkpoint.checkpoint through the module attribute. `run`
    goes on with what each region's first profiled run returned; with
    `recompute`, with the region run again under checkpoint, keeping
    nothing: no more than one region's plain graph is alive at once, and the
    step's backward still reaches the parameters (its optimizer, or a
    GradScaler, sees gradients as in any step)."""
    profiles: List[RegionProfile] = []

    def profiling(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        for keyword in _CHECKPOINT_KEYWORDS:
            kwargs.pop(keyword, None)
        result: List[Any] = []

        def region() -> Any:
            out = fn(*args, **kwargs)
            if not result:
                result.append(out)
            return out
        # Under autocast, each run casts the weights again, as the step's one
        # forward of the region does: its cache would spare the later runs.
        cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_cache_enabled(False)
        try:
            profiles.append(profile(region, runs, warmup))
        finally:
            torch.set_autocast_cache_enabled(cache)
        if not recompute:
            return result[0]
        result.clear()
        return checkpoint_fn(fn, *args, use_reentrant=False,
                             context_fn=context_fn(nothing_saveable()), **kwargs)

    saved = [m._gradient_checkpointing_func for m in layers]
    checkpoint_fn = torch.utils.checkpoint.checkpoint
    try:
        for m in layers:
            m._gradient_checkpointing_func = profiling
        torch.utils.checkpoint.checkpoint = profiling
        run()
    finally:
        torch.utils.checkpoint.checkpoint = checkpoint_fn
        for m, fn in zip(layers, saved):
            m._gradient_checkpointing_func = fn
    return profiles


def explain(policy: PolicyLike, region: Callable[[], Any]) -> Explanation:
    """What `policy` does with `region` (a function of no arguments, run once
    under the policy's caching mode), call by call: a sac.Explanation."""
    _refuse_fake_tensors("sac.explain")

    def run() -> Any:
        out = region()
        _refuse_fake_tensors("sac.explain", out)
        return out
    return _C.explain(as_policy(policy), run)


def measure_peak(fn: Callable[[], Any]) -> int:
    """The most bytes `fn` had live at once on the CPU, over what was live
    when it began: sac hears every
    allocation and free of this thread from c10's memory reports, with no
    allocator to install. Run it on one intra-op thread
    (torch.set_num_threads(1)) and with the garbage collector off; no
    profiler may run meanwhile."""
    _refuse_fake_tensors("sac.measure_peak")

    def run() -> None:
        _refuse_fake_tensors("sac.measure_peak", fn())
    return _C.measure_peak(run)


def measure_step_phases(step: Callable[[], Any], *, live: Optional[Callable[[], int]] = None,
                        peak: Optional[Callable[[], int]] = None,
                        reset_peak: Optional[Callable[[], Any]] = None,
                        plain_step: Optional[Callable[[], Any]] = None,
                        group: Any = None) -> StepPhases:
    """One training step (`step`: a function of no arguments that runs the
    forward and the backward), recorded allocation by allocation from c10's
    memory reporting, with each checkpointed region placed in it: a
    sac.StepPhases, which predicts the step's peak under any plan
    (`predict_peak(plan)`, `predict_peak_of(explanations)`) and plans for a
    peak budget (`plan_for_peak(profiles, peak_bytes)`; see docs/lab.md).
    Every region must keep nothing: checkpoint them with
    sac.context_fn(sac.nothing_saveable()) (or sac.region()). sac hears the
    step's allocations from c10's memory reports (see measure_peak); `live`,
    `peak` and `reset_peak`, if given, read an allocator's own counters (bytes
    live now, the peak since the last reset, and resetting it), which must
    agree with the reports. Run it with the garbage collector
    off (a collection inside frees other steps' memory). No profiler may run
    during the step (torch.profiler, torch.autograd.profiler): c10 reports
    allocations to the profiler's slot of the thread, which the recording
    takes; one running when the step begins is refused, and one started
    inside refuses to start.

    `plain_peak` is the peak of the step without checkpointing, which
    `plan_for_peak` returns (recomputing nothing) where it fits. Where every
    region is sac's own (sac.region), it is predicted from the same step,
    which runs once, whatever it does with gradients and an optimizer's
    state. Regions of torch.utils.checkpoint do not tell sac what they save,
    so for them the step runs once more with every region plain, or
    `plain_step` runs (the step with checkpointing off; Hugging Face:
    gradient_checkpointing_disable() around it). That plain peak is measured
    only if the step left the live bytes as it found them (set the gradients
    to none at its end); `why_no_plain_peak` says why not otherwise. A plain
    step that allocates nothing is an error.

    On ranks (torch.distributed initialized), the ranks of `group` (default:
    the default group) measure their steps together, and a refusal on any
    rank (Gloo's threads allocate beside the step now and then) is raised on
    every rank, naming the ranks that refused: ranks that planned apart would
    run different programs. For the same reason every rank takes the
    greatest plain peak any rank measured (none if a rank has none)."""
    _refuse_fake_tensors("sac.measure_step_phases")

    def recorded(fn: Callable[[], Any]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except RuntimeError as e:
                if "Profiler is already enabled" not in str(e):
                    raise
                raise RuntimeError(
                    "torch_sac.measure_step_phases: the step started a profiler, which cannot "
                    "run while sac records the step's memory (c10 reports allocations to the "
                    "one profiler slot of the thread, which the recording takes). Measure the "
                    "step with no profiler, and profile another step.") from e
        return run

    refused = None
    try:
        phases = _C.measure_step_phases(recorded(step), live=live, peak=peak,
                                        reset_peak=reset_peak)
        if phases.plain_peak is None:
            phases = _with_measured_plain_peak(
                phases, recorded(step if plain_step is None else plain_step), live, peak,
                reset_peak)
    except RuntimeError as e:
        refused = e
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        if refused is not None:
            raise refused
        return phases
    outcomes = [None] * torch.distributed.get_world_size(group)
    mine = ((str(refused), None, "") if refused is not None else
            (None, phases.plain_peak, phases.why_no_plain_peak))
    torch.distributed.all_gather_object(outcomes, mine, group=group)
    failed = [(rank, why) for rank, (why, _, _) in enumerate(outcomes) if why is not None]
    if failed:
        ranks = ", ".join(str(rank) for rank, _ in failed)
        raise RuntimeError(
            f"torch_sac.measure_step_phases: rank(s) {ranks} of the group (of "
            f"{len(outcomes)}) could not measure the step, so no rank plans from it (ranks "
            f"that planned apart would run different programs). Rank {failed[0][0]} said: "
            f"{failed[0][1]}") from refused
    # One plain peak for all, so that a peak budget chooses alike everywhere:
    # the most any rank measured, or none if one rank has none.
    missing = [(rank, why) for rank, (_, peak, why) in enumerate(outcomes) if peak is None]
    if missing:
        return phases.with_plain_peak(
            None, f"rank {missing[0][0]} of the group measured no plain peak: {missing[0][1]}")
    return phases.with_plain_peak(max(peak for _, peak, _ in outcomes))


def _with_measured_plain_peak(phases: StepPhases, plain_step: Callable[[], None],
                              live: Optional[Callable[[], int]], peak: Optional[Callable[[], int]],
                              reset_peak: Optional[Callable[[], Any]]) -> StepPhases:
    """`phases` with the peak of `plain_step`, run with every region plain:
    for regions of torch.utils.checkpoint, whose saves sac does not hear."""
    if phases.left != 0:
        return phases.with_plain_peak(
            None, f"the recorded step left {phases.left} bytes more live than it found "
                  "(gradients it made, an optimizer's state), so a second run would start "
                  "elsewhere. Set the gradients to none at the step's end, and make the "
                  "optimizer's state before measuring")
    try:
        with _C._PlainRegions() as plain:
            if live is None or peak is None or reset_peak is None:
                measured = _C.measure_peak(plain_step)
            else:
                base = live()
                reset_peak()
                plain_step()
                measured = peak() - base
    except torch.OutOfMemoryError as e:
        return phases.with_plain_peak(
            None, f"the plain step ran out of memory ({str(e).splitlines()[0]}), so it does "
                  "not fit: plan for a peak in bytes")
    if plain.checkpointed > 0:
        return phases.with_plain_peak(
            None, f"{plain.checkpointed} region(s) checkpointed in the plain run all the same "
                  "(a checkpoint of one's own under create_selective_checkpoint_contexts, which "
                  "cannot run plainly). Give measure_step_phases a plain_step: the step with "
                  "checkpointing off")
    if measured <= 0:
        raise RuntimeError(
            f"torch_sac.measure_step_phases: the plain step allocated nothing (its peak is "
            f"{measured} bytes over its start), so it is not the step without checkpointing. "
            "Give plain_step the same training step with checkpointing off (Hugging Face: "
            "gradient_checkpointing_disable() around it), or leave it out.")
    return phases.with_plain_peak(measured)


def in_order(policies: Sequence[PolicyLike], allow_cache_entry_mutation: bool = False
             ) -> Callable[[], Tuple[ContextManager[Any], ContextManager[Any]]]:
    """A context_fn for torch.utils.checkpoint that gives each checkpointed
    call the next of `policies` (a plan's, one per region, in the order the
    regions' forwards run), starting over after the last: for a model whose
    layers are checkpointed one by one (Hugging Face's
    activation_checkpointing_enable)."""
    policies = [as_policy(p) for p in policies]
    if not policies:
        raise ValueError("sac.in_order: give at least one policy, one per region.")
    calls = itertools.count()

    def context_fn() -> Tuple[ContextManager[Any], ContextManager[Any]]:
        return _contexts(policies[next(calls) % len(policies)], allow_cache_entry_mutation,
                         None)

    return context_fn


from ._fit import fit  # noqa: E402  (it uses the functions above)
