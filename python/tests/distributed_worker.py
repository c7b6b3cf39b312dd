"""Two training steps of tiny Hugging Face models on 2 ranks (Gloo, CPU)
under FSDP2, DDP or tensor parallelism, once per way of checkpointing (mode).
Rank 0 writes, per setup, model and mode: whether it ran, whether its losses
and gradients are bit-identical to the same setup without checkpointing, and
the bytes each rank's forward keeps (the counting allocator named by
SAC_COUNTING_ALLOCATOR; null without it). test_distributed.py runs it:

    python3 -m torch.distributed.run --standalone --nproc_per_node 2 \\
        distributed_worker.py --setup fsdp2 tp --model llama gpt2 --out results.json
"""
import argparse
import contextlib
import functools
import json
import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from support import counting_allocator, no_collection

# Installed before any tensor is made: the counting allocator counts only
# what it allocated.
counting = counting_allocator() if os.environ.get("SAC_COUNTING_ALLOCATOR") else None

import transformers  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel, RowwiseParallel, parallelize_module)
from torch.nn.parallel import DistributedDataParallel  # noqa: E402
from torch.utils.checkpoint import (  # noqa: E402
    create_selective_checkpoint_contexts, noop_context_fn)

import torch_sac as sac  # noqa: E402
from test_models import OPS, enable_checkpointing  # noqa: E402

TIMEOUT = timedelta(seconds=60)
STEPS = 2  # the second step catches state a checkpointed first step left behind


def llama():
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=101, max_position_embeddings=32,
                                      attn_implementation="eager")
    return transformers.LlamaForCausalLM(config)


def gpt2():
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=101,
                                     n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, attn_implementation="eager")
    return transformers.GPT2LMHeadModel(config)


MODELS = {"llama": llama, "gpt2": gpt2}


def layers(model):
    return model.model.layers if hasattr(model, "model") else model.transformer.h


def fsdp2(model, reshard_after_forward):
    for layer in layers(model):
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    return fully_shard(model, reshard_after_forward=reshard_after_forward)


class NotApplicable(Exception):
    pass


def tensor_parallel(model):
    if not hasattr(model, "model"):
        raise NotApplicable(
            "GPT-2's attention is one Conv1D (c_attn) whose output is q, k and v side by side, "
            "with the weight stored (in, out): ColwiseParallel/RowwiseParallel take nn.Linear "
            "only, and sharding c_attn's columns would split q/k/v, not heads")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    # Hugging Face's Llama reshapes q/k/v to (..., -1, head_dim): each rank's
    # local half of the heads, so the config needs no change.
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    for layer in layers(model):
        parallelize_module(layer, mesh, plan)
    return model


SETUPS = {"fsdp2": functools.partial(fsdp2, reshard_after_forward=True),
          "fsdp2_keep": functools.partial(fsdp2, reshard_after_forward=False),
          "ddp": DistributedDataParallel,
          "tp": tensor_parallel}


def batch(setup, step):
    # Data parallel ranks see different data; tensor parallel ranks the same.
    seed = 1 + step + (0 if setup == "tp" else 100 * dist.get_rank())
    ids = torch.randint(3, 101, (2, 12), generator=torch.Generator().manual_seed(seed))
    # No KV cache: checkpointing turns it off, and GPT-2's eager attention
    # rounds differently on the cache's copy of the keys than on the view.
    return {"input_ids": ids, "labels": ids.clone(), "use_cache": False}


def build(setup, model_name, context_fn=None, checkpoint_fn=None):
    """The model under the setup; with `context_fn`, its layers checkpointed
    by Hugging Face, through `checkpoint_fn` in place of checkpoint if given."""
    torch.manual_seed(0)  # the same weights on every rank
    model = MODELS[model_name]()
    model.train()
    if context_fn is not None:
        enable_checkpointing(model, context_fn)
    if checkpoint_fn is not None:
        for layer in layers(model):
            layer._gradient_checkpointing_func = checkpoint_fn
    return SETUPS[setup](model)


def plan_policies(setup, model_name):
    """A budgeted plan (half the bytes keeping everything would) over the
    layers, each profiled as the setup's forward reaches it. Each rank times
    its own calls, so the ranks' plans may differ: collectives are always
    kept, or a rank that recomputes one would wait for a peer that does not."""
    profiles = []

    def profiling(fn, *args):
        out = []
        profiles.append(sac.profile(lambda: out.append(fn(*args)), runs=1))
        return out[0]

    model = build(setup, model_name, noop_context_fn, checkpoint_fn=profiling)
    model(**batch(setup, 0))  # with autograd recording, as the step runs
    return [sac.any_of([p, sac.never_recompute_collectives()])
            for p in sac.budgeted_plan(profiles, of_everything_saveable=0.5, unchecked_regions=False).policies]


CONTEXT_FNS = {
    "pytorch_sac": lambda setup, model_name: functools.partial(
        create_selective_checkpoint_contexts, OPS),
    "sac_context_fn": lambda setup, model_name: sac.context_fn(OPS),
    "preset": lambda setup, model_name: sac.context_fn(sac.torchtitan_default()),
    "plan": lambda setup, model_name: sac.in_order(plan_policies(setup, model_name)),
}
# "none" is the reference; "region" checkpoints the whole forward with
# sac.region instead of Hugging Face's layers.
MODES = ["none", *CONTEXT_FNS, "region"]


def live_bytes():
    """Live bytes once Gloo's worker threads have let go of the tensors of
    finished collectives, which they hold for a moment after the wait returns
    (tensor parallelism's all-reduces counted 3,072 bytes now and then)."""
    last = None
    while (now := counting.sac_counting_live_bytes()) != last:
        last = now
        time.sleep(0.05)
    return now


def run_mode(setup, model_name, mode):
    """Losses, gradients (full tensors) and the bytes the last forward kept
    (the first also builds FSDP's lazy state)."""
    context_fn = CONTEXT_FNS[mode](setup, model_name) if mode in CONTEXT_FNS else None
    model = build(setup, model_name, context_fn)
    losses, kept = [], None
    for step in range(STEPS):
        inputs = batch(setup, step)
        counted = counting and step == STEPS - 1
        with no_collection():
            before = live_bytes() if counted else 0
            with sac.region(OPS) if mode == "region" else contextlib.nullcontext():
                loss = model(**inputs).loss
            if counted:
                kept = live_bytes() - before
        loss.backward()
        losses.append(loss.detach())
    grads = {}
    for name, p in model.named_parameters():  # the same order on every rank: full_tensor gathers
        if p.grad is not None:
            grads[name] = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
    return losses, grads, kept


def first_difference(got, expected):
    (losses, grads), (ref_losses, ref_grads) = got, expected
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        if not torch.equal(a, b):
            return f"loss of step {step}: {a.item()!r} != {b.item()!r}"
    if grads.keys() != ref_grads.keys():
        return f"gradients of {sorted(grads.keys() ^ ref_grads.keys())}: present in one only"
    return next((n for n in grads if not torch.equal(grads[n], ref_grads[n])), None)


FALLBACK = sac.mechanism().startswith("fallback")


def run_model(setup, model_name, status_group):
    results, reference = {}, None
    for mode in MODES:
        if mode == "region" and not FALLBACK:
            results[mode] = {"skipped": f"sac.region needs SAC_DISPATCH=fallback "
                                        f"(this process: {sac.mechanism()})"}
            continue
        mine = {"ok": True, "error": None, "difference": None, "bytes": None}
        try:
            losses, grads, mine["bytes"] = run_mode(setup, model_name, mode)
            if mode == "none":
                reference = (losses, grads)
            mine["difference"] = (first_difference((losses, grads), reference) if reference
                                  else "no reference: mode none failed")
        except NotApplicable as e:
            return {"not_applicable": str(e)}
        except Exception as e:  # reported, after the ranks agree they are in step
            mine.update(ok=False, error=f"{type(e).__name__}: {e}")
        ranks = [None] * dist.get_world_size()
        try:
            dist.all_gather_object(ranks, mine, group=status_group)
        except Exception as e:
            abort(f"{setup}/{model_name}/{mode}: the ranks did not all report within "
                  f"{TIMEOUT} (one stuck in a collective another left?): {e}")
        if len({r["ok"] for r in ranks}) > 1:
            abort(f"{setup}/{model_name}/{mode}: the ranks disagree on whether it ran "
                  f"({[r['error'] for r in ranks]}); their collectives may be out of step")
        differences = [f"rank {i}: {r['difference']}" for i, r in enumerate(ranks)
                       if r["difference"]]
        results[mode] = {
            "ok": ranks[0]["ok"],
            "error": ranks[0]["error"],
            "identical": ranks[0]["ok"] and not differences,
            "first_difference": differences[0] if differences else None,
            "bytes_after_forward": [r["bytes"] for r in ranks] if counting else None,
        }
    return results


def divergence():
    """Two regions, each all-gathering a weight of the same shape; rank 1's
    loss does not use the second, so its backward replays the first region
    while rank 0 replays the second. What each rank raised (None: nothing)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    shards = [w.chunk(world)[rank].clone().requires_grad_() for w in torch.randn(2, 8, 8)]
    h = torch.randn(4, 8, requires_grad=True)

    def layer(x, shard):
        gathered = torch.empty(8, 8)
        dist.all_gather_into_tensor(gathered, shard.detach())
        return torch.tanh(x @ (gathered + shard.sum() * 0))  # the gradient reaches shard

    outputs = []
    for shard in shards:
        with sac.region():
            h = layer(h, shard)
        outputs.append(h)
    try:
        (outputs[0] if rank == 1 else outputs[1]).sum().backward()
    except RuntimeError as e:
        return str(e)
    return None


def statistics():
    """A selective region around a layer that all-gathers its weight with
    c10d's own collective (as FSDP2 does), forward and backward: what
    sac.RegionStatistics counted after each, and what the default group
    issued in each (Gloo's sequence numbers)."""
    if not FALLBACK:
        return {"profile": profile_under_fsdp2(), "measure": measure_on_ranks()}
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.distributed_c10d._get_default_group()
    backend = group._get_backend(torch.device("cpu"))
    torch.manual_seed(0)
    shard = torch.randn(8, 8).chunk(world)[rank].clone().requires_grad_()
    h = torch.randn(4, 8, requires_grad=True)
    stats = sac.RegionStatistics()
    start = backend._get_sequence_number_for_group()
    with sac.region([torch.ops.aten.mm.default], statistics=stats):
        gathered = torch.empty(8, 8)
        dist.all_gather_into_tensor(gathered, shard.detach())
        out = torch.tanh(h @ (gathered + shard.sum() * 0))
    forward, issued_forward = stats.read(), backend._get_sequence_number_for_group() - start
    start = backend._get_sequence_number_for_group()
    out.sum().backward()
    return {"forward": forward, "issued_forward": issued_forward, "step": stats.read(),
            "issued_backward": backend._get_sequence_number_for_group() - start,
            "profile": profile_under_fsdp2(), "measure": measure_on_ranks()}


def measure_on_ranks():
    """sac.measure_step_phases on both ranks, of a step that allocates on this
    thread only, then of one during which rank 1 allocates on another thread
    too (as Gloo's threads do now and then), which rank 1 alone cannot
    measure. What each raised (None: nothing); None without the counting
    allocator."""
    if counting is None:
        return None
    probe = {"live": counting.sac_counting_live_bytes, "peak": counting.sac_counting_peak_bytes,
             "reset_peak": counting.sac_counting_reset_peak}
    torch.manual_seed(0)
    w = torch.randn(16, 16, requires_grad=True)
    x = torch.randn(4, 16)
    nothing = sac.context_fn(sac.nothing_saveable())

    def loss():  # one region, of PyTorch's checkpoint
        return torch.utils.checkpoint.checkpoint(lambda a: torch.tanh(a @ w), x,
                                                 use_reentrant=False, context_fn=nothing).sum()

    def step(beside):
        if beside:
            t = threading.Thread(target=lambda: torch.empty(1 << 20).fill_(0))
            t.start()
            t.join()
        loss().backward()

    raised = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, beside in [("clean", False), ("rank_1_beside", dist.get_rank() == 1)]:
            live_bytes()  # Gloo's threads done with the last exchange
            dist.barrier()
            live_bytes()
            try:
                with no_collection():
                    sac.measure_step_phases(lambda: step(beside), **probe)
                raised[name] = None
            except RuntimeError as e:
                raised[name] = str(e)

        # A step that leaves nothing behind, whose plain run on rank 1 holds
        # 1 MiB more: every rank gets rank 1's plain peak.
        def clean_step():
            loss().backward()
            w.grad = None

        def plain_step():
            extra = torch.empty(1 << 18) if dist.get_rank() == 1 else None
            clean_step()
            del extra

        w.grad = None  # as the step leaves it
        live_bytes()
        dist.barrier()
        live_bytes()
        try:
            with no_collection():
                phases = sac.measure_step_phases(clean_step, plain_step=plain_step, **probe)
            raised["plain_peak"] = phases.plain_peak or phases.why_no_plain_peak
        except RuntimeError as e:
            raised["plain_peak"] = str(e)
    finally:
        torch.set_num_threads(threads)
    return raised


def profile_under_fsdp2():
    """sac.profile of a fully_shard'ed layer, whose FSDP hooks run inside the
    profiled function: its first run initialises FSDP lazily. What the
    default profile raised, and the calls profiled with warmup=1."""
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    fully_shard(layer)
    x = torch.randn(4, 8)
    try:
        sac.profile(lambda: layer(x))
        raised = None
    except RuntimeError as e:
        raised = str(e)
    warm = sac.profile(lambda: layer(x), warmup=1)
    return {"raised": raised, "calls": [c.op for c in warm.calls],
            "again": [c.op for c in sac.profile(lambda: layer(x), runs=1).calls]}


def abort(message):
    print(f"distributed_worker, rank {dist.get_rank()}: {message}", file=sys.stderr, flush=True)
    os._exit(1)  # not sys.exit: a rank stuck in a collective would hang the exit


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--setup", nargs="+", choices=SETUPS, default=[])
    parser.add_argument("--model", nargs="+", choices=MODELS, default=[])
    parser.add_argument("--divergence", action="store_true",
                        help="run divergence() instead (needs SAC_DISPATCH=fallback)")
    parser.add_argument("--statistics", action="store_true",
                        help="run statistics() instead (needs SAC_DISPATCH=fallback)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=TIMEOUT)
    if args.divergence or args.statistics:
        raised = [None] * dist.get_world_size()
        dist.all_gather_object(raised, divergence() if args.divergence else statistics())
        if dist.get_rank() == 0:
            with open(args.out, "w") as f:
                json.dump(raised, f)
        dist.destroy_process_group()
        return
    # Status travels on a group of its own, so that it never pairs with a
    # collective that a failed mode left pending on the default group.
    status_group = dist.new_group(backend="gloo", timeout=TIMEOUT)
    results = {}
    for setup in args.setup:
        for model_name in args.model:
            results.setdefault(setup, {})[model_name] = run_model(setup, model_name,
                                                                  status_group)
            if dist.get_rank() == 0:  # after each pair: an abort leaves what ran
                with open(args.out, "w") as f:
                    json.dump(results, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
