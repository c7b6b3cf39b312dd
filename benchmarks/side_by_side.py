#!/usr/bin/env python3
"""sac side by side with PyTorch's own selective activation checkpointing.

One run measures both on the same machine, in this order:

1. Per-op cost (unless --no-per-op): ns per aten::mul call (1-element
   tensors) and per aten::mm call (256x256) for sac under both dispatch
   mechanisms (build/benchmarks/per_op_cost, Google Benchmark, minimum of
   --repetitions), and instructions per aten::mul call (callgrind, when
   valgrind is installed); then the same cases for PyTorch's
   TorchDispatchMode-based SAC, timed here. Each side's null kernel is a do-nothing
   interposition at its own level: a boxed kernel where sac's sits, and a
   TorchDispatchMode that just calls the op.
2. The step benchmark, per GPT size: this script builds the GPT of
   examples/gpt.h in Python with the same aten calls, writes its weights and
   batch to a file, runs build/benchmarks/gpt_step on that file (sac), and
   runs the same steps through torch.utils.checkpoint(use_reentrant=False)
   with create_selective_checkpoint_contexts and the same policies. Both
   processes count CPU bytes with the same counting allocator
   (benchmarks/counting_allocator.cpp, loaded here with ctypes). It compares
   the two sides' gradients bit for bit and their bytes exactly.
3. The plot (gnuplot): peak activation memory against step time, one point per
   mode, for sac and for PyTorch.

Everything goes to --out: per_op.csv, steps.csv, side_by_side.md (every
table), frontier.png. Exit status 1 if any shared policy's gradients differ
between the sides or from no checkpointing, or its bytes differ (on the CPU).

  python3 benchmarks/side_by_side.py --build build [--sizes small,medium,large]
      [--runs 10] [--threads 1] [--dispatch fallback] [--device cpu|cuda] [--out DIR]

benchmarks/run.sh builds what it needs and runs this with the defaults.
"""

import argparse
import contextlib
import csv
import ctypes
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)
from torch.utils._python_dispatch import TorchDispatchMode

# ---- Sizes and modes ---------------------------------------------------------

# small: dispatch dominates; large: kernels do. tiny is for the tests.
SIZES = {
    "tiny": dict(layers=2, embed=32, heads=2, seq=16, batch=2, vocab=64),
    "small": dict(layers=4, embed=64, heads=4, seq=64, batch=4, vocab=256),
    "medium": dict(layers=4, embed=128, heads=4, seq=128, batch=8, vocab=512),
    "large": dict(layers=4, embed=256, heads=8, seq=256, batch=8, vocab=1024),
}

MODES = [
    "none",
    "full",
    "nothing_saveable",
    "dots_saveable",
    "compute_intensive_ops",
    "matmuls_and_attention",
    "everything_saveable",
]

# sac's presets (policy/presets.cpp) and examples/gpt.h's policy as PyTorch
# policies: the same ops (default overloads) and the same answers.
ATTENTION = [
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
]
DOTS = ["mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_scaled_mm"]
COMPUTE_INTENSIVE = [
    "mm", "bmm", "addmm", "baddbmm", "_scaled_mm", "convolution", "_convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
    "_efficient_attention_forward",
]


def aten_ops(names):
    return {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}


def answer_for(ops, answer):
    def policy(ctx, op, *args, **kwargs):
        return answer if op in ops else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


def always(answer):
    return lambda ctx, op, *args, **kwargs: answer


POLICIES = {
    "nothing_saveable": always(CheckpointPolicy.PREFER_RECOMPUTE),
    "dots_saveable": answer_for(aten_ops(DOTS), CheckpointPolicy.PREFER_SAVE),
    "compute_intensive_ops": answer_for(aten_ops(COMPUTE_INTENSIVE), CheckpointPolicy.MUST_SAVE),
    "matmuls_and_attention": answer_for(aten_ops(["addmm"] + ATTENTION), CheckpointPolicy.MUST_SAVE),
    "everything_saveable": always(CheckpointPolicy.PREFER_SAVE),
}

# ---- The counting allocator --------------------------------------------------


class Counter:
    """The CPU allocator of examples/support.h, counting live and peak bytes."""

    def __init__(self, build):
        path = os.path.join(build, "benchmarks", "libsac_counting_allocator.so")
        if not os.path.exists(path):
            sys.exit(f"side_by_side: {path} is missing: build the target sac_counting_allocator")
        self.lib = ctypes.CDLL(path)
        for name in ("sac_counting_live_bytes", "sac_counting_peak_bytes"):
            getattr(self.lib, name).restype = ctypes.c_int64
        self.lib.sac_counting_install()

    def live(self):
        return self.lib.sac_counting_live_bytes()

    def peak(self):
        return self.lib.sac_counting_peak_bytes()

    def reset_peak(self):
        self.lib.sac_counting_reset_peak()


class CudaCounter:
    def __init__(self, device):
        self.device = device

    def live(self):
        return torch.cuda.memory_allocated(self.device)

    def peak(self):
        return torch.cuda.max_memory_allocated(self.device)

    def reset_peak(self):
        torch.cuda.reset_peak_memory_stats(self.device)


# ---- The model: examples/gpt.h, call for call --------------------------------


class Block(nn.Module):
    def __init__(self, embed, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1 = nn.LayerNorm(embed)
        self.ln2 = nn.LayerNorm(embed)
        self.qkv = nn.Linear(embed, 3 * embed)
        self.proj = nn.Linear(embed, embed)
        self.fc = nn.Linear(embed, 4 * embed)
        self.fc_out = nn.Linear(4 * embed, embed)

    def forward(self, x):
        B, T, C = x.shape
        flat = x.reshape(B * T, C)
        parts = self.qkv(self.ln1(flat)).view(B, T, 3 * C).split(C, dim=2)

        def heads_of(t):
            return t.view(B, T, self.heads, C // self.heads).transpose(1, 2)

        attn = F.scaled_dot_product_attention(heads_of(parts[0]), heads_of(parts[1]),
                                              heads_of(parts[2]), None, 0.0, is_causal=True)
        attn = attn.transpose(1, 2).reshape(B * T, C)
        h = flat + torch.dropout(self.proj(attn), self.dropout, self.training)
        m = self.fc_out(F.gelu(self.fc(self.ln2(h))))
        return (h + torch.dropout(m, self.dropout, self.training)).view(B, T, C)


class Gpt(nn.Module):
    def __init__(self, layers, embed, heads, seq, vocab, dropout):
        super().__init__()
        self.tokens = nn.Embedding(vocab, embed)
        self.positions = nn.Embedding(seq, embed)
        self.blocks = nn.ModuleList(Block(embed, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(embed)
        self.head = nn.Linear(embed, vocab, bias=False)

    def embed(self, ids):
        where = torch.arange(ids.size(1), dtype=ids.dtype, device=ids.device)
        return self.tokens(ids) + self.positions(where)

    def logits(self, h):
        return self.head(self.ln_f(h))


def loss_of(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def forward_loss(model, inputs, targets, mode, autocast):
    """The forward of gpt_step's forward_loss: each block a checkpoint."""
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        h = model.embed(inputs)
        for block in model.blocks:
            if mode == "none":
                h = block(h)
            elif mode == "full":
                h = checkpoint(block, h, use_reentrant=False)
            else:
                context_fn = partial(create_selective_checkpoint_contexts, POLICIES[mode])
                h = checkpoint(block, h, use_reentrant=False, context_fn=context_fn)
        return loss_of(model.logits(h), targets)


# ---- The step benchmark, PyTorch's side --------------------------------------


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(model, inputs, targets, mode, counter, args, device):
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(args.seed)
    sync(device)
    before = counter.live()
    counter.reset_peak()
    start = time.perf_counter()
    loss = forward_loss(model, inputs, targets, mode, args.autocast == "bf16")
    sync(device)
    forward_ms = (time.perf_counter() - start) * 1e3
    kept = counter.live() - before
    backward_start = time.perf_counter()
    loss.backward()
    sync(device)
    end = time.perf_counter()
    return dict(kept_bytes=kept, peak_bytes=counter.peak() - before,
                forward_ms=forward_ms, backward_ms=(end - backward_start) * 1e3,
                step_ms=(end - start) * 1e3)


def pytorch_steps(model, inputs, targets, counter, args, device):
    """gpt_step's protocol: a warm-up step per mode (its gradients are
    compared), then --runs rounds over the modes, round-robin. A mode whose
    warm-up raises is reported with its error and not timed."""
    first, errors = {}, {}
    for mode in MODES:
        try:
            step(model, inputs, targets, mode, counter, args, device)
        except RuntimeError as e:
            errors[mode] = str(e).splitlines()[0]
            continue
        first[mode] = {n: p.grad.detach().clone().cpu() for n, p in model.named_parameters()}
    samples = {m: [] for m in first}
    for _ in range(args.runs):
        for mode in samples:
            samples[mode].append(step(model, inputs, targets, mode, counter, args, device))
    rows = {}
    for mode, s in samples.items():
        times = sorted(x["step_ms"] for x in s)
        rows[mode] = dict(kept_bytes=s[0]["kept_bytes"], peak_bytes=s[0]["peak_bytes"],
                          step_ms_median=statistics.median(times), step_ms_min=times[0],
                          step_ms_max=times[-1],
                          forward_ms_median=statistics.median(x["forward_ms"] for x in s),
                          backward_ms_median=statistics.median(x["backward_ms"] for x in s))
    return rows, first, errors


def max_difference(a, b):
    worst = 0.0
    assert a.keys() == b.keys(), f"parameter names differ: {sorted(a.keys() ^ b.keys())}"
    for name in a:
        worst = max(worst, (a[name].double() - b[name].double()).abs().max().item())
    return worst


def run_size(name, size, counter, args, device, out):
    """Both sides on one GPT size; returns the rows of steps.csv."""
    torch.manual_seed(0)
    model = Gpt(dropout=args.dropout, **{k: v for k, v in size.items() if k != "batch"}).to(device)
    ids = torch.randint(size["vocab"], (size["batch"], size["seq"] + 1))
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    weights = os.path.join(out, f"weights_{name}.pt")
    entries = {"param." + n: p.detach().cpu() for n, p in model.named_parameters()}
    entries.update(inputs=inputs, targets=targets)
    torch.save(entries, weights)
    inputs, targets = inputs.to(device), targets.to(device)

    grads = os.path.join(out, f"grads_{name}")
    os.makedirs(grads, exist_ok=True)
    sac_csv = os.path.join(out, f"sac_{name}.csv")
    command = [os.path.join(args.build, "benchmarks", "gpt_step"), f"--weights={weights}",
               f"--grads={grads}", f"--csv={sac_csv}", f"--runs={args.runs}",
               f"--threads={args.threads}", f"--dropout={args.dropout}", f"--seed={args.seed}",
               f"--device={args.device}", f"--autocast={args.autocast}",
               f"--dispatch={args.dispatch}", "--modes=" + ",".join(MODES)]
    command += [f"--{k}={v}" for k, v in size.items()]
    print(f"\n== {name}: sac ({' '.join(command[1:])})", flush=True)
    status = subprocess.run(command).returncode
    if status not in (0, 1):
        sys.exit(f"side_by_side: gpt_step failed with status {status}")
    with open(sac_csv) as f:
        sac_rows = {r["mode"]: r for r in csv.DictReader(f)}

    print(f"== {name}: PyTorch {torch.__version__}, torch.utils.checkpoint", flush=True)
    torch_rows, torch_first, torch_errors = pytorch_steps(model, inputs, targets, counter, args, device)
    nan = float("nan")
    rows = []
    for mode in MODES:
        s = sac_rows[mode]
        row = dict(size=name, mode=mode, torch_error=torch_errors.get(mode, ""),
                   sac_identical_to_none=int(s["identical_to_none"]),
                   sac_kept_bytes=int(s["kept_bytes"]), sac_peak_bytes=int(s["peak_bytes"]),
                   sac_step_ms=float(s["step_ms_median"]), sac_step_ms_min=float(s["step_ms_min"]),
                   sac_step_ms_max=float(s["step_ms_max"]),
                   sac_forward_ms=float(s["forward_ms_median"]),
                   sac_backward_ms=float(s["backward_ms_median"]),
                   sac_recompute_ms=float(s["recompute_ms_median"]),
                   grad_max_diff=nan, torch_identical_to_none=0, torch_kept_bytes=-1,
                   torch_peak_bytes=-1, torch_step_ms=nan, torch_step_ms_min=nan,
                   torch_step_ms_max=nan, torch_forward_ms=nan, torch_backward_ms=nan)
        if mode in torch_rows:
            t = torch_rows[mode]
            # gpt_step's torch::pickle_save tags the dict's types, which
            # weights_only loading refuses; the file is this run's own.
            sac_grads = torch.load(os.path.join(grads, f"{mode}.pt"), weights_only=False)
            row.update(grad_max_diff=max_difference(sac_grads, torch_first[mode]),
                       torch_identical_to_none=int(max_difference(torch_first[mode], torch_first["none"]) == 0),
                       torch_kept_bytes=t["kept_bytes"], torch_peak_bytes=t["peak_bytes"],
                       torch_step_ms=t["step_ms_median"], torch_step_ms_min=t["step_ms_min"],
                       torch_step_ms_max=t["step_ms_max"], torch_forward_ms=t["forward_ms_median"],
                       torch_backward_ms=t["backward_ms_median"])
        rows.append(row)
    return rows


# ---- Per-op cost -------------------------------------------------------------


class NullKernel(TorchDispatchMode):
    """PyTorch's null kernel: a dispatch mode that only calls the op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def pytorch_per_op(repetitions):
    """ns per call of PyTorch's SAC modes, the cases of per_op_cost.cpp."""
    torch.manual_seed(0)
    cases = {
        "mul": (torch.mul, torch.ones(1), torch.ones(1), 4096, torch.ops.aten.mul.Tensor,
                torch.ops.aten.mm.default),
        "mm": (torch.mm, torch.randn(256, 256), torch.randn(256, 256), 64,
               torch.ops.aten.mm.default, torch.ops.aten.mul.Tensor),
    }
    results = {}
    for op_name, (fn, a, b, batch, listed, unlisted) in cases.items():
        def loop():
            for _ in range(batch):
                fn(a, b)

        def timed(setup):
            """Minimum over repetitions of ns per call; `setup` gives the
            context to time the batch in, and may run untimed work."""
            best = math.inf
            for _ in range(repetitions):
                total, calls = 0.0, 0
                deadline = time.perf_counter() + 0.05
                while time.perf_counter() < deadline or calls == 0:
                    context = setup()
                    with context:
                        start = time.perf_counter_ns()
                        loop()
                        total += time.perf_counter_ns() - start
                    calls += batch
                best = min(best, total / calls)
            return best

        def caching(policy):
            return lambda: create_selective_checkpoint_contexts(policy)[0]

        def cached():
            caching_mode, cached_mode = create_selective_checkpoint_contexts(
                answer_for({listed}, CheckpointPolicy.MUST_SAVE))
            with caching_mode:
                loop()
            return cached_mode

        results[op_name] = {
            "no_sac": timed(contextlib.nullcontext),
            "null_kernel": timed(NullKernel),
            "unlisted": timed(caching(answer_for({unlisted}, CheckpointPolicy.MUST_SAVE))),
            "listed": timed(caching(answer_for({listed}, CheckpointPolicy.MUST_SAVE))),
            "callback": timed(caching(always(CheckpointPolicy.PREFER_RECOMPUTE))),
            "replay": timed(cached),
        }
    return results


SAC_BENCHMARKS = {"NoSac": "no_sac", "NullKernel": "null_kernel", "Idle": "idle",
                  "OpListUnlisted": "unlisted", "OpListListed": "listed",
                  "Callback": "callback", "CachedReplay": "replay"}


def sac_per_op(args, mechanism):
    """ns per call from per_op_cost (Google Benchmark), by op and case."""
    binary = os.path.join(args.build, "benchmarks", "per_op_cost")
    if not os.path.exists(binary):
        sys.exit(f"side_by_side: {binary} is missing: configure with -DSAC_BUILD_BENCHMARKS=ON")
    env = dict(os.environ, SAC_DISPATCH=mechanism)
    output = subprocess.run([binary, f"--benchmark_repetitions={args.repetitions}",
                             "--benchmark_report_aggregates_only=true", "--benchmark_format=json",
                             "--benchmark_min_time=0.05"],
                            env=env, check=True, capture_output=True, text=True).stdout
    results = {"mul": {}, "mm": {}}
    for b in json.loads(output)["benchmarks"]:
        if b.get("aggregate_name") != "min":
            continue
        benchmark, arg = b["run_name"].split("/")[:2]  # "CachedReplay/1/iterations:20"
        results["mul" if arg == "0" else "mm"][SAC_BENCHMARKS[benchmark]] = 1e9 / b["items_per_second"]
    return results


def sac_instructions(args, mechanism):
    """Instructions per aten::mul call (callgrind), or None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    binary = os.path.join(args.build, "benchmarks", "per_op_instructions")
    counts = {}
    for variant in ("no_sac", "null_kernel", "idle", "unlisted", "listed", "callback", "replay"):
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", "--collect-atstart=no",
             "--toggle-collect=*measured_loop*", "--callgrind-out-file=/dev/null", binary, variant],
            env=dict(os.environ, SAC_DISPATCH=mechanism), capture_output=True, text=True)
        collected = [line for line in run.stderr.splitlines() if "Collected :" in line]
        if run.returncode != 0 or not collected:
            sys.exit(f"side_by_side: callgrind of {variant} failed:\n{run.stderr[-2000:]}")
        counts[variant] = int(collected[0].split(":")[-1]) / 1000  # per call (1000 calls)
    return counts


# ---- Reports -----------------------------------------------------------------


def rng_state_bytes(row):
    """The bytes of the generator states PyTorch's checkpoint keeps as
    tensors in `row`'s forward: one CPU state per checkpointed block."""
    if row["mode"] == "none":
        return 0
    return SIZES[row["size"]]["layers"] * torch.get_rng_state().numel()


def mib(b):
    return b / 2**20


def per_op_report(args, out, lines):
    print("\n== per-op cost", flush=True)
    mechanisms = {m: sac_per_op(args, m) for m in ("per_op", "fallback")}
    instructions = {m: sac_instructions(args, m) for m in ("per_op", "fallback")}
    pytorch = pytorch_per_op(args.repetitions)
    cases = ["no_sac", "null_kernel", "idle", "unlisted", "listed", "callback", "replay"]
    with open(os.path.join(out, "per_op.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["side", "op", "case", "ns_per_call", "instructions_per_call"])
        for m, results in mechanisms.items():
            for op, by_case in results.items():
                for case in cases:
                    ins = instructions[m][case] if instructions[m] and op == "mul" else ""
                    w.writerow([f"sac_{m}", op, case, f"{by_case[case]:.2f}", ins])
        for op, by_case in pytorch.items():
            for case, ns in by_case.items():
                w.writerow(["pytorch", op, case, f"{ns:.2f}", ""])

    lines.append("## Per-op cost\n")
    lines.append(f"ns per call, minimum of {args.repetitions} repetitions; "
                 "*added* is over the same op with nothing interposed. "
                 "sac: Google Benchmark (benchmarks/per_op_cost); PyTorch: timed in Python, "
                 "so its no_sac row includes the interpreter's loop.\n")
    for op, title in (("mul", "aten::mul, 1-element tensors"), ("mm", "aten::mm, 256x256")):
        lines.append(f"\n### {title}\n")
        lines.append("| case | sac per_op: ns (added) | sac fallback: ns (added) | PyTorch: ns (added) "
                     "| PyTorch added / sac fallback added |")
        lines.append("|---|---|---|---|---|")
        for case in cases:
            row = [case]
            added = {}
            for side, res in (("per_op", mechanisms["per_op"][op]), ("fallback", mechanisms["fallback"][op]),
                              ("pytorch", pytorch[op])):
                if case not in res:
                    row.append("-")
                    continue
                added[side] = res[case] - res["no_sac"]
                row.append(f"{res[case]:.0f} ({added[side]:+.0f})" if case != "no_sac" else f"{res[case]:.0f}")
            ratio = "-"
            if case not in ("no_sac", "idle") and "pytorch" in added and added.get("fallback", 0) > 0:
                ratio = f"{added['pytorch'] / added['fallback']:.0f}x"
            lines.append("| " + " | ".join(row + [ratio]) + " |")
        null_rows = []
        for side in ("per_op", "fallback"):
            res = mechanisms[side][op]
            null = res["null_kernel"] - res["no_sac"]
            if null > 0:
                null_rows.append(f"{side}: unlisted {(res['unlisted'] - res['no_sac']) / null:.1f}x, "
                                  f"listed {(res['listed'] - res['no_sac']) / null:.1f}x, "
                                  f"callback {(res['callback'] - res['no_sac']) / null:.1f}x")
        if null_rows:
            lines.append("\nsac's added cost as a multiple of the null kernel's: " + "; ".join(null_rows) + ".\n")
    for m in ("per_op", "fallback"):
        ins = instructions[m]
        if ins is None:
            lines.append(f"\nInstructions: valgrind is not installed; skipped.\n")
            break
        lines.append(f"\nInstructions per aten::mul call (callgrind), SAC_DISPATCH={m}: " +
                     ", ".join(f"{c} {ins[c]:.0f}" for c in cases) +
                     f"; added over the null kernel's: listed {(ins['listed'] - ins['no_sac']) / max(ins['null_kernel'] - ins['no_sac'], 1):.1f}x.\n")


def step_report(rows, args, lines):
    lines.append("\n## Steps: sac and PyTorch on the same GPT, weights and batch\n")
    lines.append("*= +N*: sac keeps N bytes fewer, exactly the CPU generator states PyTorch's checkpoint "
                 f"keeps as tensors ({torch.get_rng_state().numel()} bytes per region, from "
                 "torch.get_rng_state()); sac keeps a clone of the generator instead.\n")
    lines.append(f"Forward + backward; median [min, max] of {args.runs} steps per mode, "
                 f"modes interleaved round-robin; {args.threads} thread(s); device {args.device}"
                 f"{' (autocast bf16)' if args.autocast == 'bf16' else ''}; sac dispatch: {args.dispatch}. "
                 "Kept: bytes live after the forward over those before it; peak: during forward + "
                 "backward; both counted by the same allocator on each side.\n")
    for size in dict.fromkeys(r["size"] for r in rows):
        cfg = SIZES[size]
        lines.append(f"\n### {size}: {cfg['layers']} layers, embed {cfg['embed']}, {cfg['heads']} heads, "
                     f"seq {cfg['seq']}, batch {cfg['batch']}, vocab {cfg['vocab']}\n")
        lines.append("| mode | grad max diff sac vs PyTorch | live MiB sac / PyTorch | peak MiB sac / PyTorch "
                     "| live vs none | sac step ms | PyTorch step ms | step sac / PyTorch "
                     "| step vs none: sac / PyTorch | sac recompute ms |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        by_mode = {r["mode"]: r for r in rows if r["size"] == size}
        none = by_mode["none"]
        for mode in MODES:
            r = by_mode[mode]
            if r["torch_error"]:
                lines.append(f"| {mode} | PyTorch raises: {r['torch_error']} "
                             f"| {mib(r['sac_kept_bytes']):.3f} / - | {mib(r['sac_peak_bytes']):.3f} / - "
                             f"| {100 * r['sac_kept_bytes'] / none['sac_kept_bytes']:.0f}% "
                             f"| {r['sac_step_ms']:.2f} [{r['sac_step_ms_min']:.2f}, {r['sac_step_ms_max']:.2f}] "
                             f"| - | - | {100 * (r['sac_step_ms'] / none['sac_step_ms'] - 1):+.0f}% / - "
                             f"| {r['sac_recompute_ms']:.2f} |")
                continue
            recompute = "-" if math.isnan(r["sac_recompute_ms"]) else f"{r['sac_recompute_ms']:.2f}"
            # "= +N": equal once PyTorch's N generator-state bytes are added to sac's.
            gap = r["torch_kept_bytes"] - r["sac_kept_bytes"]
            same_bytes = ("=" if gap == 0 else f"= +{gap}") if gap == rng_state_bytes(r) else "≠"
            lines.append(
                f"| {mode} | {r['grad_max_diff']:.3g} "
                f"| {mib(r['sac_kept_bytes']):.3f} / {mib(r['torch_kept_bytes']):.3f} {same_bytes} "
                f"| {mib(r['sac_peak_bytes']):.3f} / {mib(r['torch_peak_bytes']):.3f} "
                f"| {100 * r['sac_kept_bytes'] / none['sac_kept_bytes']:.0f}% "
                f"| {r['sac_step_ms']:.2f} [{r['sac_step_ms_min']:.2f}, {r['sac_step_ms_max']:.2f}] "
                f"| {r['torch_step_ms']:.2f} [{r['torch_step_ms_min']:.2f}, {r['torch_step_ms_max']:.2f}] "
                f"| {r['sac_step_ms'] / r['torch_step_ms']:.2f} "
                f"| {100 * (r['sac_step_ms'] / none['sac_step_ms'] - 1):+.0f}% / "
                f"{100 * (r['torch_step_ms'] / none['torch_step_ms'] - 1):+.0f}% "
                f"| {recompute} |")


def plot(rows, out, size):
    """Peak activation memory against step time, sac and PyTorch, for `size`."""
    gnuplot = shutil.which("gnuplot")
    data = os.path.join(out, "frontier.dat")
    with open(data, "w") as f:
        for side in ("sac", "torch"):
            f.write(f"# {side}\n")
            for r in rows:
                if r["size"] == size and not (side == "torch" and r["torch_error"]):
                    f.write(f"{r[side + '_step_ms']:.3f} {mib(r[side + '_peak_bytes']):.4f} {r['mode']}\n")
            f.write("\n\n")
    if gnuplot is None:
        print("gnuplot is not installed: frontier.png not drawn (frontier.dat has the points)")
        return None
    png = os.path.join(out, "frontier.png")
    script = f"""
set terminal pngcairo size 960,600 noenhanced font ',11'
set output '{png}'
set title 'GPT ({size}): peak activation memory against step time, per checkpointing mode'
set xlabel 'step time, forward + backward (ms, median)'
set ylabel 'peak activation memory (MiB, exact)'
set key top right
set grid
set offsets graph 0.05, graph 0.25, graph 0.05, graph 0.05
plot '{data}' index 0 using 1:2 with points pt 7 ps 1.6 lc rgb '#1f77b4' title 'sac (C++)', \\
     '' index 0 using 1:2:3 with labels offset char 1,0.6 left font ',9' notitle, \\
     '{data}' index 1 using 1:2 with points pt 5 ps 1.4 lc rgb '#d62728' title 'PyTorch SAC (Python)'
"""
    subprocess.run([gnuplot], input=script, text=True, check=True)
    return png


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build", help="sac's CMake build folder")
    parser.add_argument("--sizes", default="small,medium,large",
                        help="comma-separated: " + ", ".join(SIZES))
    parser.add_argument("--runs", type=int, default=10, help="timed steps per mode and side")
    parser.add_argument("--repetitions", type=int, default=15, help="per-op repetitions")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42, help="set before every step on both sides")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--autocast", default="none", choices=["none", "bf16"])
    parser.add_argument("--dispatch", default="fallback", choices=["per_op", "fallback"])
    parser.add_argument("--no-per-op", action="store_true", help="skip the per-op cost")
    parser.add_argument("--plot-size", default=None, help="the size to plot (default: the middle one)")
    parser.add_argument("--out", default="benchmarks_out")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    for s in sizes:
        if s not in SIZES:
            parser.error(f"unknown size '{s}'; sizes: {', '.join(SIZES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("side_by_side: CUDA skipped: torch.cuda.is_available() is False on this machine")
        return 0
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    counter = Counter(args.build) if device.type == "cpu" else CudaCounter(device)
    lines = [f"# sac side by side with PyTorch SAC\n",
             f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}; "
             f"Python {platform.python_version()}, torch {torch.__version__}; "
             f"{args.threads} intra-op thread(s).\n"]
    if not args.no_per_op:
        per_op_report(args, args.out, lines)

    rows = []
    for name in sizes:
        rows.extend(run_size(name, SIZES[name], counter, args, device, args.out))
    with open(os.path.join(args.out, "steps.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    step_report(rows, args, lines)
    plot_size = args.plot_size or sizes[len(sizes) // 2]
    png = plot(rows, args.out, plot_size)

    failures, not_shared = [], []
    for r in rows:
        where = f"{r['size']}/{r['mode']}"
        if not r["sac_identical_to_none"]:
            failures.append(f"{where}: sac's gradients differ from no checkpointing")
        if r["torch_error"]:
            not_shared.append(f"{where}: PyTorch raises \"{r['torch_error']}\"; sac runs it "
                              f"{'bit-identical to' if r['sac_identical_to_none'] else 'DIFFERENT from'} "
                              "no checkpointing")
            continue
        if r["grad_max_diff"] != 0 and device.type == "cpu":
            failures.append(f"{where}: gradients differ between sac and PyTorch by {r['grad_max_diff']:.3g}")
        if not r["torch_identical_to_none"]:
            failures.append(f"{where}: PyTorch's gradients differ from no checkpointing")
        if device.type == "cpu":
            # PyTorch keeps each region's CPU generator state as a tensor
            # (torch.get_rng_state(), counted by the allocator); sac keeps a
            # clone of the generator, which is not a tensor.
            rng = rng_state_bytes(r)
            if r["torch_kept_bytes"] - r["sac_kept_bytes"] != rng:
                failures.append(f"{where}: bytes kept differ: {r['sac_kept_bytes']} (sac) + {rng} "
                                f"(PyTorch's generator states) != {r['torch_kept_bytes']} (PyTorch)")
            if not 0 <= r["torch_peak_bytes"] - r["sac_peak_bytes"] <= rng:
                failures.append(f"{where}: peak bytes differ by more than PyTorch's generator states: "
                                f"{r['sac_peak_bytes']} (sac), {r['torch_peak_bytes']} (PyTorch)")
    lines.append("\n## Checks\n")
    lines.extend(f"- FAILED {f}" for f in failures)
    lines.extend(f"- not shared: {n}" for n in not_shared)
    if not failures:
        lines.append(f"- every other mode on every size: gradients equal between sac and PyTorch "
                     f"{'bit for bit' if device.type == 'cpu' else '(CUDA: not compared bit for bit)'}, "
                     "each side's equal to its own no-checkpoint run; the same bytes kept once "
                     "PyTorch's generator-state tensors are counted on sac's side, and a peak at most that much apart.")
    report = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "side_by_side.md"), "w") as f:
        f.write(report)
    print("\n" + report)
    if png:
        print(f"plot: {png}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
