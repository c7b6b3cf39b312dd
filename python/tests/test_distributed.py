"""sac inside FSDP2, DDP and tensor parallelism, on 2 ranks (Gloo, CPU):
distributed_worker.py runs every mode on tiny Hugging Face models. Each
mode's losses and gradients are bit-identical to the same setup without
checkpointing, and sac's op list keeps the bytes PyTorch's SAC keeps with
it. `-s` prints a table of the results."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch.distributed as dist

import torch_sac as sac

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with Gloo is not available", allow_module_level=True)

# What `with sac.region(ops):` around the whole forward does under each setup
# (SAC_DISPATCH=fallback): None, it runs and matches; else it refuses with an
# error that says this. Under tensor parallelism autograd saves DTensors,
# which a region (recording below them) cannot recompute.
REGION_REFUSES = {"fsdp2": None, "fsdp2_keep": None, "ddp": None,
                  "tp": "a tensor subclass with a __torch_dispatch__ in the region (a DTensor"}
SETUPS = list(REGION_REFUSES)
MODELS = ["llama", "gpt2"]
HERE = os.path.dirname(os.path.abspath(__file__))


def run_worker(out, *arguments):
    """The worker on 2 ranks: what it wrote to `out` (None if nothing), and
    its output if it failed."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", "2", "distributed_worker.py", *arguments, "--out", str(out)]
    # A session of its own: on a timeout the ranks go with the launcher.
    worker = subprocess.Popen(command, cwd=HERE, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = worker.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        output = worker.communicate()[0] + "\n(killed after 240 s)"
    results = json.loads(out.read_text()) if out.exists() else None
    return results, None if worker.returncode == 0 else output[-6000:]


@pytest.fixture(scope="module")
def launch(tmp_path_factory):
    """One launch of the worker for every setup and model (starting two
    ranks costs more than their steps): the results, and the worker's error
    output if it failed (the pairs it finished are in the results)."""
    out = tmp_path_factory.mktemp("distributed") / "results.json"
    results, failure = run_worker(out, "--setup", *SETUPS, "--model", *MODELS)
    yield results or {}, failure
    print_table(results or {})


def print_table(results):
    print(f"\n{'setup':<11}{'model':<7}{'mode':<15}{'identical':<10}{'bytes rank 0':>13}"
          f"{'rank 1':>9}  note")
    for setup, models in results.items():
        for model, modes in models.items():
            if "not_applicable" in modes:
                print(f"{setup:<11}{model:<7}{'-':<15}{'-':<10}{'':>22}  not applicable")
                continue
            for mode, r in modes.items():
                kept = r.get("bytes_after_forward") or [None, None]
                note = (r.get("skipped") or r.get("error") or r.get("first_difference")
                        or "")[:70]
                print(f"{setup:<11}{model:<7}{mode:<15}{str(r.get('identical', '-')):<10}"
                      f"{str(kept[0]):>13}{str(kept[1]):>9}  {note}")


def modes_of(launch, setup, model):
    results, failure = launch
    assert model in results.get(setup, {}), f"the worker stopped before {setup}/{model}:\n" \
                                            f"{failure}"
    modes = results[setup][model]
    if "not_applicable" in modes:
        pytest.skip(modes["not_applicable"])
    return modes


PAIRS = pytest.mark.parametrize("setup,model", [(s, m) for s in SETUPS for m in MODELS])


@PAIRS
def test_every_mode_matches_no_checkpointing(launch, setup, model):
    for mode, r in modes_of(launch, setup, model).items():
        if mode == "region":
            continue
        assert r["ok"], f"{mode}: {r['error']}"
        assert r["identical"], f"{mode}: {r['first_difference']} differs"


@PAIRS
def test_sac_keeps_what_pytorch_s_sac_keeps(launch, setup, model):
    modes = modes_of(launch, setup, model)
    ours, theirs = (modes[m]["bytes_after_forward"] for m in ("sac_context_fn", "pytorch_sac"))
    if ours is None or theirs is None:
        pytest.skip("bytes not counted (SAC_COUNTING_ALLOCATOR is not set, or a mode failed)")
    assert ours == theirs, f"per rank: sac keeps {ours} bytes, PyTorch's SAC {theirs}"


@PAIRS
def test_a_region_around_the_forward(launch, setup, model):
    modes = modes_of(launch, setup, model)
    r = modes["region"]
    if "skipped" in r:
        pytest.skip(r["skipped"])
    if REGION_REFUSES[setup] is not None:
        assert not r["ok"] and REGION_REFUSES[setup] in r["error"], r["error"]
        assert "sac.context_fn" in r["error"], r["error"]
        return
    assert r["ok"], r["error"]
    assert r["identical"], f"{r['first_difference']} differs"
    # The replay gathers parameters itself: the region keeps none of them (one
    # Llama layer's gathered parameters alone are 37,120 bytes), and keeps no
    # more than PyTorch's SAC with the same op list.
    ours, theirs = r["bytes_after_forward"], modes["pytorch_sac"]["bytes_after_forward"]
    if ours is not None and theirs is not None:
        assert all(a <= b for a, b in zip(ours, theirs)), \
            f"per rank: the region keeps {ours} bytes, PyTorch's SAC {theirs}"


def test_a_rank_replaying_another_region_fails_on_every_rank(tmp_path):
    """Rank 1's loss skips the second of two regions whose all-gathers have
    the same shape: without the ranks' agreement, rank 0 would gather the
    first layer's shards as the second's. Every rank raises sac's error."""
    if not sac.mechanism().startswith("fallback"):
        pytest.skip("sac.region needs SAC_DISPATCH=fallback")
    raised, failure = run_worker(tmp_path / "raised.json", "--divergence")
    assert raised is not None, failure
    for rank, message in enumerate(raised):
        assert message and "are about to replay different regions" in message, (rank, message)


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    """distributed_worker.py's statistics(), per rank."""
    ranks, failure = run_worker(tmp_path_factory.mktemp("counts") / "counts.json",
                                "--statistics")
    assert ranks is not None, failure
    return ranks


def test_region_statistics_count_what_the_replay_communicates(counts):
    """A region with a policy around c10d's own all-gather (FSDP's): sac
    counts the collective the forward issued, the one its replay issues
    again and the ranks' agreement before it, as the process group counts
    them."""
    if not sac.mechanism().startswith("fallback"):
        pytest.skip("sac.region needs SAC_DISPATCH=fallback")
    for rank, r in enumerate(counts):
        assert r["issued_forward"] == 1 and r["issued_backward"] == 2, (rank, r)
        assert r["forward"]["collectives_issued"] == 1, (rank, r)
        assert r["forward"]["collectives_reissued"] == 0, (rank, r)
        assert r["step"]["collectives_issued"] == 1, (rank, r)
        assert r["step"]["collectives_reissued"] == 1, (rank, r)
        assert r["step"]["agreements"] == 1, (rank, r)
        assert (r["step"]["collectives_reissued"] + r["step"]["agreements"]
                == r["issued_backward"]), (rank, r)


def test_a_profile_under_fsdp2_leaves_out_its_lazy_initialisation(counts):
    """FSDP2 initialises lazily in its first forward, which then runs more op
    calls: sac.profile says to warm up, and with warmup=1 profiles the calls
    every later run makes."""
    for rank, r in enumerate(counts):
        p = r["profile"]
        assert p["raised"] and "warmup=1" in p["raised"], (rank, p["raised"])
        assert "aten::addmm" in p["calls"] and p["calls"] == p["again"], (rank, p)


def test_a_step_one_rank_cannot_measure_is_refused_on_every_rank(counts):
    """sac.measure_step_phases on ranks: when rank 1's step allocates on
    another thread beside it (as Gloo's threads may), rank 1 cannot measure
    it, and every rank raises, naming rank 1; a clean step measures on both,
    and both take the greatest plain peak either measured."""
    for rank, r in enumerate(counts):
        if r["measure"] is None:
            pytest.skip("SAC_COUNTING_ALLOCATOR is not set")
        assert r["measure"]["clean"] is None, (rank, r["measure"]["clean"])
        refused = r["measure"]["rank_1_beside"]
        # Rank 1 refuses; rank 0 may too, if Gloo's threads allocated beside
        # its step (the race this agreement is for).
        named = re.search(r"rank\(s\) ([0-9, ]+) of the group \(of 2\)", refused or "")
        assert named and "1" in named.group(1).split(", "), (rank, refused)
        assert "no rank plans from it" in refused, (rank, refused)
        assert refused == counts[0]["measure"]["rank_1_beside"], "the ranks raised differently"
    # The plain peak is the greatest any rank measured: rank 1's, with its
    # 1 MiB, on both ranks (alone, rank 0's step peaks under 4 KiB).
    plain = [r["measure"]["plain_peak"] for r in counts]
    assert all(isinstance(p, int) for p in plain), plain
    assert plain[0] == plain[1] and plain[0] >= 1 << 20, plain
