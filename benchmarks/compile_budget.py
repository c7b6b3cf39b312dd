"""sac's eager peak plans beside PyTorch's compile-time activation budget.

For each Hugging Face model (random weights, small configs) and each
`torch._functorch.config.activation_memory_budget`, PyTorch's compiled step
(Inductor, CPU) is run and its peak measured by the counting allocator
(benchmarks/counting_allocator.cpp). Then sac plans the eager step for that
very peak (sac.StepPhases.plan_for_peak over the model's checkpointed layers)
and runs it: its peak, measured, and its step time. Recomputation is what the
step pays over its own kind's step that keeps everything: PyTorch's compiled
step at budget 1.0, eager no checkpointing for sac. One intra-op thread (what
sac's step measurement needs on the CPU; both sides alike).

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
from torch.utils.checkpoint import checkpoint

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
                                     attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config)


def llama():
    config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=128,
                                      intermediate_size=352, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config)


MODELS = {"gpt2": gpt2, "llama": llama}


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
    out = []

    def profiling(fn, *args, **kwargs):
        result = []
        out.append(sac.profile(lambda: result.append(fn(*args, **kwargs)), runs=3))
        return result[0]

    m = checkpointed(model, sac.context_fn(sac.nothing_saveable()), profiling)
    torch.manual_seed(7)
    m(**inputs)
    return out


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
        start = time.perf_counter()
        timed_steps(m, inputs, 1)  # compiles
        compile_seconds = time.perf_counter() - start
        peak, seconds = timed_steps(m, inputs, steps)
        compiled[budget] = (peak, seconds, compile_seconds)
        print(f"{name} compiled at {budget}: peak {peak}, {seconds * 1e3:.1f} ms "
              f"(compiled in {compile_seconds:.0f} s)", flush=True)
    functorch_config.activation_memory_budget = 1.0
    torch._dynamo.reset()

    # sac: the eager step measured once, its layers profiled, a plan for
    # each of PyTorch's peaks.
    nothing = checkpointed(model, sac.context_fn(sac.nothing_saveable()))
    timed_steps(nothing, inputs, 1)
    nothing.zero_grad(set_to_none=True)
    gc.collect()
    gc.disable()
    try:
        torch.manual_seed(7)
        phases = sac.measure_step_phases(lambda: nothing(**inputs).loss.backward(), **PROBE)
    finally:
        gc.enable()
    profiled = profiles(model, inputs)
    keep_all = phases.predict_peak(sac.budgeted_plan(profiled, fraction=1.0))
    base_seconds = compiled[max(budgets)][1]
    for budget in budgets:
        peak, seconds, compile_seconds = compiled[budget]
        row = {"model": name, "budget": budget, "torch_peak": peak,
               "torch_ms": seconds * 1e3, "torch_recompute_ms": (seconds - base_seconds) * 1e3,
               "torch_compile_s": compile_seconds, "eager_peak": eager_peak,
               "eager_ms": eager_seconds * 1e3, "sac_full_recompute_peak": phases.peak(),
               "sac_keep_all_peak": keep_all}
        if peak < phases.peak():
            row.update(sac_peak="", sac_predicted="", sac_ms="", sac_recompute_ms="",
                       sac_plan_recompute_ms="")
        else:
            plan = phases.plan_for_peak(profiled, peak)
            m = checkpointed(model, sac.in_order(plan.policies))
            sac_peak, sac_seconds = timed_steps(m, inputs, steps)
            row.update(sac_peak=sac_peak, sac_predicted=plan.predicted_peak,
                       sac_ms=sac_seconds * 1e3,
                       sac_recompute_ms=(sac_seconds - eager_seconds) * 1e3,
                       sac_plan_recompute_ms=plan.plan.recompute_seconds * 1e3)
        rows.append(row)
        print(row, flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="gpt2,llama")
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
    """Step time against peak: PyTorch's compiled budgets and sac's plans."""
    script = [
        "set terminal pngcairo size 1100,420 font ',10' noenhanced",
        f"set output '{png}'",
        "set datafile separator ','",
        "set key top right",
        "set xlabel 'measured peak (KiB over the step start)'",
        "set ylabel 'step time (ms)'",
        f"set multiplot layout 1,{len(models)}",
    ]
    for name in models:
        script += [
            f"set title '{name}: compiled (activation_memory_budget) and sac eager plans'",
            f"plot '{csv}' using (strcol(1) eq '{name}' ? $3/1024 : 1/0):4 with linespoints "
            "pt 7 title 'torch.compile, budget 0.1 to 1.0', "
            f"'' using (strcol(1) eq '{name}' && strcol(11) ne '' ? $11/1024 : 1/0):13 "
            "with linespoints pt 5 title 'sac plan for that peak (eager)'",
        ]
    script.append("unset multiplot")
    subprocess.run(["gnuplot"], input="\n".join(script), text=True, check=True)
    print(f"wrote {png}")


if __name__ == "__main__":
    sys.exit(main())
