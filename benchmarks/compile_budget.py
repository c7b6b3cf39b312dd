"""sac's eager peak plans beside PyTorch's compile-time activation budget.

For each Hugging Face model (random weights, small configs) and each
`torch._functorch.config.activation_memory_budget`, PyTorch's compiled step
(Inductor, CPU) is run and its peak measured by the counting allocator
(benchmarks/counting_allocator.cpp). Then sac plans the eager step for that
very peak (sac.StepPhases.plan_for_peak over the model's checkpointed layers)
and runs it: its peak, measured, and its step time. One intra-op thread (what
sac's step measurement needs on the CPU; both sides alike).

Recomputation is counted in FLOPs, from the programs themselves, with
torch.utils.flop_counter's formulas (matrix products: mm, addmm, bmm,
baddbmm, convolutions, attention kernels) on both sides; attention runs
eager (matmuls) so that both sides see it as bmm:
- PyTorch: the forward calls that reappear in the partitioned backward graph
  (the nodes min_cut_rematerialization_partition puts in both graphs, as its
  own "remat" log counts them), each costed from its node's shapes. The
  AOTAutograd cache is off, so that every compile partitions.
- sac: every call that the plan's recomputation runs again in a checkpointed
  layer (sac.explain's outcome "recomputed" or "demoted", before the
  recomputation's early stop: not `past_stop`), costed from its shapes as
  the layer runs.

    SAC_COUNTING_ALLOCATOR=build/benchmarks/libsac_counting_allocator.so \\
      python3 benchmarks/compile_budget.py [--models gpt2,llama] \\
      [--budgets 0.1,0.3,0.5,0.7,1.0] [--steps 5] [--out compile_budget_out] [--plot CSV]

Writes OUT/compile_budget.csv and OUT/compile_budget.png (gnuplot).
"""
import argparse
import copy
import ctypes
import functools
import gc
import os
import statistics
import subprocess
import sys
import time

import torch
import torch._functorch.config as functorch_config
import torch._inductor.compile_fx as compile_fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import flop_registry

import torch_sac as sac

counting = ctypes.CDLL(os.environ["SAC_COUNTING_ALLOCATOR"])
counting.sac_counting_live_bytes.restype = ctypes.c_int64
counting.sac_counting_peak_bytes.restype = ctypes.c_int64
counting.sac_counting_install()
PROBE = {"live": counting.sac_counting_live_bytes, "peak": counting.sac_counting_peak_bytes,
         "reset_peak": counting.sac_counting_reset_peak}

import transformers  # noqa: E402  (after the allocator: the models are counted)


def gpt2():
    config = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, vocab_size=512,
                                     n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config)


def llama():
    config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=128,
                                      intermediate_size=352, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=128,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config)


def bert():
    config = transformers.BertConfig(num_hidden_layers=4, hidden_size=128,
                                     num_attention_heads=4, intermediate_size=512,
                                     vocab_size=512, max_position_embeddings=128,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                     attn_implementation="eager")
    return transformers.BertForMaskedLM(config)


def bart():
    config = transformers.BartConfig(encoder_layers=2, decoder_layers=2, d_model=128,
                                     encoder_attention_heads=4, decoder_attention_heads=4,
                                     encoder_ffn_dim=512, decoder_ffn_dim=512, vocab_size=512,
                                     max_position_embeddings=128, dropout=0.0,
                                     attention_dropout=0.0, activation_dropout=0.0,
                                     attn_implementation="eager")
    return transformers.BartForConditionalGeneration(config)


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert, "bart": bart}


def flops_of(op, args, kwargs, out):
    """flop_counter's FLOPs of one call (0 for ops without a formula)."""
    formula = flop_registry.get(getattr(op, "_overloadpacket", None))
    return 0 if formula is None else formula(*args, **kwargs, out_val=out)


class RecomputedByThePartitioner:
    """Wraps the partitioner Inductor calls: the FLOPs of the forward calls
    that each partitioned backward graph computes again."""

    def __init__(self):
        self.flops = 0
        self.calls = 0
        self.partitions = 0
        self._partition = compile_fx.min_cut_rematerialization_partition
        compile_fx.min_cut_rematerialization_partition = self._counting

    def _counting(self, *args, **kwargs):
        fw, bw = self._partition(*args, **kwargs)
        forward = {n.name for n in fw.graph.nodes if n.op == "call_function"}
        for node in bw.graph.nodes:
            if node.op == "call_function" and node.name in forward:
                def val(a):
                    return a.meta.get("val") if isinstance(a, torch.fx.Node) else a
                flops = flops_of(node.target, tree_map(val, node.args),
                                 tree_map(val, node.kwargs), node.meta.get("val"))
                self.flops += flops
                self.calls += 1 if flops else 0
        self.partitions += 1
        return fw, bw


class CallFlops(TorchDispatchMode):
    """The FLOPs of each op call, by (op name, its index among that op's
    calls): how sac numbers calls in a region."""

    def __init__(self):
        super().__init__()
        self.flops = {}
        self._seen = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.name()
        index = self._seen.get(name, 0)
        self._seen[name] = index + 1
        self.flops[(name, index)] = flops_of(func, args, kwargs, out)
        return out


def recomputed_by_the_plan(model, inputs, policies):
    """The FLOPs of the calls `policies` (one per checkpointed layer, in
    order) recompute, and of all the layers' calls."""
    recomputed, total = [0], [0]
    layers = iter(policies)

    def explaining(fn, *args, **kwargs):
        result = []
        counted = CallFlops()

        def region():
            with counted:
                result.append(fn(*args, **kwargs))

        explanation = sac.explain(next(layers), region)
        total[0] += sum(counted.flops.values())
        for call in explanation.calls:
            if call.outcome in ("recomputed", "demoted") and not call.profile.past_stop:
                recomputed[0] += counted.flops.get((call.profile.op, call.profile.call), 0)
        return result[0]

    m = checkpointed(model, sac.context_fn(sac.nothing_saveable()), explaining)
    torch.manual_seed(7)
    m(**inputs)
    return recomputed[0], total[0]


def batch(vocab=512, size=4, length=128):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (size, length), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def timed_steps(model, inputs, steps):
    """Peak (bytes over the step's start) and median seconds of `steps` steps."""
    peaks, seconds = [], []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        gc.collect()
        gc.disable()
        try:
            before = counting.sac_counting_live_bytes()
            counting.sac_counting_reset_peak()
            start = time.perf_counter()
            torch.manual_seed(7)
            model(**inputs).loss.backward()
            seconds.append(time.perf_counter() - start)
            peaks.append(counting.sac_counting_peak_bytes() - before)
        finally:
            gc.enable()
    return max(peaks), statistics.median(seconds)


def checkpointed(model, context_fn, checkpoint_fn=checkpoint):
    model = copy.deepcopy(model)
    model.train()
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False, "context_fn": context_fn})
    if checkpoint_fn is not checkpoint:
        for module in model.modules():
            if getattr(module, "gradient_checkpointing", False):
                module._gradient_checkpointing_func = checkpoint_fn
    return model


def profiles(model, inputs):
    """Each checkpointed layer's profile, and the same with each call's FLOPs
    as its cost (counted in a run of its own: the counting mode's Python
    would weigh on the profiled times)."""
    by_time, by_flops = [], []

    def profiling(fn, *args, **kwargs):
        result = []
        profile = sac.profile(lambda: result.append(fn(*args, **kwargs)), runs=3)
        counted = CallFlops()
        with counted:
            fn(*args, **kwargs)
        by_time.append(profile)
        by_flops.append(profile.with_seconds(
            [float(counted.flops.get((c.op, c.call), 0)) for c in profile.calls]))
        return result[0]

    m = checkpointed(model, sac.context_fn(sac.nothing_saveable()), profiling)
    torch.manual_seed(7)
    m(**inputs)
    return by_time, by_flops


PARTITIONER = RecomputedByThePartitioner()


def run_model(name, budgets, steps):
    torch.manual_seed(0)
    model = MODELS[name]()
    model.train()
    inputs = batch()
    rows = []
    eager_peak, eager_seconds = timed_steps(copy.deepcopy(model), inputs, steps)

    # PyTorch: the whole step compiled, at each activation budget.
    compiled = {}
    for budget in budgets:
        functorch_config.activation_memory_budget = budget
        torch._dynamo.reset()
        m = torch.compile(copy.deepcopy(model))
        PARTITIONER.flops = PARTITIONER.calls = PARTITIONER.partitions = 0
        start = time.perf_counter()
        timed_steps(m, inputs, 1)  # compiles
        compile_seconds = time.perf_counter() - start
        flops = (PARTITIONER.flops, PARTITIONER.calls, PARTITIONER.partitions)
        peak, seconds = timed_steps(m, inputs, steps)
        compiled[budget] = (peak, seconds, compile_seconds, flops)
        print(f"{name} compiled at {budget}: peak {peak}, {seconds * 1e3:.1f} ms "
              f"(compiled in {compile_seconds:.0f} s), recomputes {flops[0] / 1e6:.1f} MFLOP "
              f"in {flops[1]} calls ({flops[2]} graphs)", flush=True)
    functorch_config.activation_memory_budget = 1.0
    torch._dynamo.reset()

    # sac: the eager step measured once, its layers profiled, a plan for
    # each of PyTorch's peaks.
    # The plain step (no checkpointing) is measured too: where it fits, the
    # plan is to run it.
    nothing = checkpointed(model, sac.context_fn(sac.nothing_saveable()))
    plain = copy.deepcopy(model)
    plain.train()

    def stepping(m):
        def step():
            torch.manual_seed(7)
            m(**inputs).loss.backward()
            m.zero_grad(set_to_none=True)
        return step

    timed_steps(nothing, inputs, 1)
    timed_steps(plain, inputs, 1)
    nothing.zero_grad(set_to_none=True)
    plain.zero_grad(set_to_none=True)
    gc.collect()
    gc.disable()
    try:
        phases = sac.measure_step_phases(stepping(nothing), plain_step=stepping(plain), **PROBE)
    finally:
        gc.enable()
    assert phases.plain_peak is not None, phases.why_no_plain_peak

    def run_plan(plan):
        """The plan's step: its peak, median seconds, and recomputed FLOPs
        (with those of all the checkpointed layers' calls)."""
        if not any(plan.plan.checkpointed):
            return (*timed_steps(plain, inputs, steps), 0, 0)
        m = checkpointed(model, sac.in_order(plan.policies))
        return (*timed_steps(m, inputs, steps),
                *recomputed_by_the_plan(model, inputs, plan.policies))
    profiled, by_flops = profiles(model, inputs)
    keep_all = phases.predict_peak(sac.budgeted_plan(profiled, fraction=1.0))
    base_seconds = compiled[max(budgets)][1]
    for budget in budgets:
        peak, seconds, compile_seconds, (flops, flop_calls, graphs) = compiled[budget]
        row = {"model": name, "budget": budget, "torch_peak": peak,
               "torch_recompute_mflop": flops / 1e6, "torch_recompute_calls": flop_calls,
               "torch_graphs": graphs,
               "torch_ms": seconds * 1e3, "torch_recompute_ms": (seconds - base_seconds) * 1e3,
               "torch_compile_s": compile_seconds, "eager_peak": eager_peak,
               "eager_ms": eager_seconds * 1e3, "sac_full_recompute_peak": phases.peak(),
               "sac_plain_peak": phases.plain_peak,
               "sac_keep_all_peak": keep_all}
        if peak < phases.peak():
            row.update(sac_plain="", sac_peak="", sac_predicted="", sac_ms="", sac_recompute_ms="",
                       sac_plan_recompute_ms="", sac_recompute_mflop="", layers_mflop="",
                       sac_flops_plan_peak="", sac_flops_plan_recompute_mflop="",
                       sac_flops_plan_ms="")
        else:
            plan = phases.plan_for_peak(profiled, peak)
            sac_peak, sac_seconds, sac_flops, layers_flops = run_plan(plan)
            assert sac_peak == plan.predicted_peak <= peak, (sac_peak, plan.predicted_peak)
            row.update(sac_plain=not any(plan.plan.checkpointed),
                       sac_peak=sac_peak, sac_predicted=plan.predicted_peak,
                       sac_ms=sac_seconds * 1e3,
                       sac_recompute_ms=(sac_seconds - eager_seconds) * 1e3,
                       sac_plan_recompute_ms=plan.plan.recompute_seconds * 1e3,
                       sac_recompute_mflop=sac_flops / 1e6, layers_mflop=layers_flops / 1e6)
            # The same peak, the plan that recomputes the fewest FLOPs.
            plan = phases.plan_for_peak(by_flops, peak)
            flops_peak, flops_seconds, flops, _ = run_plan(plan)
            assert flops_peak == plan.predicted_peak <= peak, (flops_peak, plan.predicted_peak)
            row.update(sac_flops_plan_peak=flops_peak, sac_flops_plan_recompute_mflop=flops / 1e6,
                       sac_flops_plan_ms=flops_seconds * 1e3)
        rows.append(row)
        print(row, flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,llama,bert,bart")
    parser.add_argument("--budgets", default="0.1,0.3,0.5,0.7,1.0")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", default="compile_budget_out")
    parser.add_argument("--plot", metavar="CSV", help="only draw OUT/compile_budget.png from CSV")
    args = parser.parse_args()
    if args.plot:
        os.makedirs(args.out, exist_ok=True)
        plot(args.plot, os.path.join(args.out, "compile_budget.png"), args.models.split(","))
        return 0
    torch.set_num_threads(1)
    # Every compile partitions (a cached one would not count its recomputation).
    functorch_config.enable_autograd_cache = False
    budgets = [float(b) for b in args.budgets.split(",")]
    rows = []
    for name in args.models.split(","):
        rows += run_model(name, budgets, args.steps)
    os.makedirs(args.out, exist_ok=True)
    csv = os.path.join(args.out, "compile_budget.csv")
    keys = list(rows[0].keys())
    with open(csv, "w") as f:
        f.write(",".join(keys) + "\n")
        for row in rows:
            f.write(",".join(str(row[k]) for k in keys) + "\n")
    print(f"wrote {csv}")
    plot(csv, os.path.join(args.out, "compile_budget.png"), args.models.split(","))


def plot(csv, png, models):
    """Recomputed FLOPs against measured peak: PyTorch's compiled budgets and
    sac's plans for those peaks."""
    script = [
        f"set terminal pngcairo size {400 * len(models) + 200},420 font ',10' noenhanced",
        f"set output '{png}'",
        "set datafile separator ','",
        "set key top right",
        "set xlabel 'measured peak (KiB over the step start)'",
        "set ylabel 'recomputed MFLOP'",
        f"set multiplot layout 1,{len(models)}",
    ]
    for name in models:
        script += [
            f"set title '{name}'",
            f"plot '{csv}' using (strcol(1) eq '{name}' ? $3/1024 : 1/0):4 with points "
            "pt 7 title 'torch.compile, budget 0.1 to 1.0', "
            f"'' using (strcol(1) eq '{name}' && strcol(16) ne '' ? $16/1024 : 1/0):21 "
            "with points pt 5 title 'sac plan for that peak (eager)', "
            f"'' using (strcol(1) eq '{name}' && strcol(23) ne '' ? $23/1024 : 1/0):24 "
            "with points pt 9 title 'sac plan for fewest FLOPs'",
        ]
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    print(f"wrote {png}")


if __name__ == "__main__":
    sys.exit(main())
