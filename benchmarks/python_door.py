#!/usr/bin/env python3
"""sac's Python package beside PyTorch's own SAC, in one Python process.

1. Per-op added cost: a chain of --ops aten::mul calls on a 64-element
   tensor, run inside the caching mode of each side's
   create_selective_checkpoint_contexts, against the same chain with no mode;
   (time with - time without) / ops, each the minimum of --runs runs taken
   in turns (every case once per turn, after a warm-up turn). Cases: the op listed
   (saved), the op not listed, a preset (sac's everything_saveable, in C++),
   and a Python policy function (the same function for both sides).
2. Steps on two Hugging Face models (random weights from small configs):
   forward + backward under no checkpointing, full recomputation (PyTorch's
   checkpoint without a policy), PyTorch's SAC and sac with the same op list
   (every layer checkpointed by transformers' switch), the median of --steps
   steps after one warm-up, garbage collected before each; bytes live after
   the forward (the last step's) counted by the C++
   benchmarks' counting allocator (--allocator), the same for both sides.

Prints markdown tables (and writes them to --out). SAC_DISPATCH picks sac's
mechanism for the whole process: benchmarks/run.sh runs this once per
mechanism.

  python3 benchmarks/python_door.py --allocator build/benchmarks/libsac_counting_allocator.so
"""
import argparse
import copy
import ctypes
import functools
import gc
import os
import shutil
import subprocess
import statistics
import sys
import tempfile
import time

import torch
from torch.utils.checkpoint import (
    CheckpointPolicy,
    create_selective_checkpoint_contexts as torch_contexts,
    noop_context_fn,
)

import torch_sac as sac

aten = torch.ops.aten
OPS = [aten.mm.default, aten.addmm.default, aten.bmm.default,
       aten._scaled_dot_product_flash_attention_for_cpu.default]


def chain(x, ops):
    for _ in range(ops):
        x = x * 1.0001
    return x


def timed_in_turns(fns, runs):
    """The minimum time of each function over `runs` turns, each turn running
    every function once (after one warm-up turn)."""
    best = {name: float("inf") for name in fns}
    for turn in range(runs + 1):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            if turn > 0:
                best[name] = min(best[name], elapsed)
    return best


def per_op_cost(ops, runs):
    x = torch.randn(64, requires_grad=True)

    def recompute_all(ctx, op, *args, **kwargs):
        return CheckpointPolicy.PREFER_RECOMPUTE

    cases = {
        "listed (saved)": ([aten.mul.Tensor], [aten.mul.Tensor]),
        "not listed": ([aten.mm.default], [aten.mm.default]),
        "preset (everything_saveable)": (None, sac.everything_saveable()),
        "Python policy function": (recompute_all, recompute_all),
    }

    def under(contexts):
        def run():
            caching, _ = contexts()
            with caching:
                chain(x, ops)
        return run

    fns = {"plain": lambda: chain(x, ops)}
    for name, (theirs, ours) in cases.items():
        if theirs is not None:
            fns[("torch", name)] = under(functools.partial(torch_contexts, theirs))
        fns[("sac", name)] = under(sac.context_fn(ours))
    best = timed_in_turns(fns, runs)
    plain = best["plain"]

    def added(key):
        return (best[key] - plain) / ops * 1e6 if key in best else None

    rows = [(name, added(("torch", name)), added(("sac", name))) for name in cases]
    return plain / ops * 1e6, rows


def models():
    import transformers

    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=4, n_embd=256, n_head=4, vocab_size=1000, n_positions=256,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.0))
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=4, hidden_size=256, intermediate_size=688, num_attention_heads=4,
        num_key_value_heads=4, vocab_size=1000, max_position_embeddings=256))
    return {"GPT-2 (4 layers, 256 wide)": gpt2, "Llama (4 layers, 256 wide)": llama}


def step_table(steps, counting):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1000, (4, 128), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    modes = {
        "none": None,
        "full": noop_context_fn,
        "PyTorch's SAC": functools.partial(torch_contexts, OPS),
        "sac": sac.context_fn(OPS),
    }
    rows = []
    torch.manual_seed(0)
    for model_name, base in models().items():
        reference = None
        for mode, context_fn in modes.items():
            model = copy.deepcopy(base)
            model.train()
            if context_fn is not None:
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={
                    "use_reentrant": False, "context_fn": context_fn})
            times, kept = [], None
            for i in range(steps + 1):
                model.zero_grad(set_to_none=True)
                loss = None
                gc.collect()
                torch.manual_seed(7)
                before = counting.sac_counting_live_bytes()
                start = time.perf_counter()
                loss = model(**batch).loss
                kept = counting.sac_counting_live_bytes() - before
                loss.backward()
                if i > 0:
                    times.append(time.perf_counter() - start)
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            if reference is None:
                reference = grads
            same = all(torch.equal(a, b) for a, b in zip(grads, reference))
            rows.append((model_name, mode, kept / 2**20, statistics.median(times) * 1e3, same))
            del model, grads
    return rows


def plot(per_op_rows, step_rows, png):
    """Two panels: per-op added cost (PyTorch's SAC and sac, log scale), and
    step time against bytes live after the forward, per model and mode."""
    gnuplot = shutil.which("gnuplot")
    if gnuplot is None:
        print(f"gnuplot is not installed: {png} not drawn")
        return
    with tempfile.TemporaryDirectory() as tmp:
        costs = os.path.join(tmp, "costs.dat")
        with open(costs, "w") as f:
            for name, theirs, ours in per_op_rows:
                label = name.split(" (")[0].replace(" ", "\\n", 1)
                f.write(f'"{label}" {theirs if theirs is not None else "NaN"} {ours}\n')
        steps = os.path.join(tmp, "steps.dat")
        with open(steps, "w") as f:
            for model_name in dict.fromkeys(r[0] for r in step_rows):
                f.write(f"# {model_name}\n")
                for name, mode, kept, ms, _ in step_rows:
                    if name == model_name:
                        f.write(f'{ms:.2f} {kept:.3f} "{mode}"\n')
                f.write("\n\n")
        models = list(dict.fromkeys(r[0] for r in step_rows))
        script = f"""
set terminal pngcairo size 1280,540 noenhanced font ',11'
set output '{png}'
set multiplot layout 1,2 title "sac from Python beside PyTorch's SAC ({sac.mechanism()}; torch {torch.__version__}, CPU)"
set title 'added cost per aten::mul call in the caching mode'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set ylabel 'microseconds (log scale)'
set yrange [0.1:100]
set grid ytics
set key top right
set bmargin 4
plot '{costs}' using 2:xtic(1) title "PyTorch's SAC" lc rgb '#d62728', \\
     '' using 3 title 'sac' lc rgb '#1f77b4'
unset logscale y
set yrange [*:*]
set style data points
set title 'training step: time against bytes live after the forward'
set xlabel 'ms per step (median)'
set ylabel 'MiB live after the forward (counting allocator)'
set key top right
set offsets graph 0.05, graph 0.2, graph 0.08, graph 0.08
plot '{steps}' index 0 using 1:2 with points pt 7 ps 1.5 lc rgb '#1f77b4' title '{models[0]}', \\
     '' index 0 using 1:2:3 with labels offset char 1,0.5 left font ',9' notitle, \\
     '{steps}' index 1 using 1:2 with points pt 5 ps 1.5 lc rgb '#2ca02c' title '{models[1]}', \\
     '' index 1 using 1:2:3 with labels offset char 1,-0.5 left font ',9' notitle
unset multiplot
"""
        subprocess.run([gnuplot], input=script, text=True, check=True)
    print(f"plot: {png}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--allocator", required=True,
                        help="build/benchmarks/libsac_counting_allocator.so")
    parser.add_argument("--out", default=None, help="file for the tables")
    parser.add_argument("--plot", default=None, help="PNG for the plot (gnuplot)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    counting = ctypes.CDLL(args.allocator)
    counting.sac_counting_live_bytes.restype = ctypes.c_int64
    counting.sac_counting_install()

    lines = [f"sac's mechanism: {sac.mechanism()}; torch {torch.__version__}, "
             f"{args.threads} intra-op thread(s)", ""]
    plain_us, rows = per_op_cost(args.ops, args.runs)
    lines += [f"Per-op added cost in the caching mode, us per aten::mul call "
              f"(the call itself: {plain_us:.2f} us; minimum of {args.runs} chains of {args.ops}):",
              "", "| case | PyTorch's SAC | sac | sac / PyTorch |", "| --- | ---: | ---: | ---: |"]
    for name, theirs, ours in rows:
        ratio = f"{ours / theirs:.2f}" if theirs else "-"
        theirs_text = f"{theirs:.2f}" if theirs is not None else "(no preset)"
        lines.append(f"| {name} | {theirs_text} | {ours:.2f} | {ratio} |")
    lines += ["", f"Steps (forward + backward, median of {args.steps}), bytes live after the "
              "forward (counting allocator):", "",
              "| model | mode | live after fwd (MiB) | ms/step | grads identical to none |",
              "| --- | --- | ---: | ---: | --- |"]
    steps = step_table(args.steps, counting)
    for model_name, mode, kept, ms, same in steps:
        lines.append(f"| {model_name} | {mode} | {kept:.2f} | {ms:.1f} | {'yes' if same else 'NO'} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.plot:
        plot(rows, steps, args.plot)


if __name__ == "__main__":
    sys.exit(main())
