"""Bytes live after the forward, counted by one allocator (benchmarks/
counting_allocator.cpp, as the C++ benchmarks count them): sac's modes keep
exactly what PyTorch's SAC keeps with the same op list."""
import functools

import pytest
import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts as torch_contexts

import torch_sac as sac
import test_models as models
from support import counting_allocator, no_collection
from test_region import needs_fallback

counting = counting_allocator()


def kept_after_forward(model, batch, context_fn):
    """Bytes live after the forward (loss computed, before backward), minus
    those live before it: what the forward keeps for backward."""
    model = models.copy.deepcopy(model)
    model.train()
    models.enable_checkpointing(model, context_fn)
    torch.manual_seed(7)
    with no_collection():
        before = counting.sac_counting_live_bytes()
        loss = model(**batch).loss
        kept = counting.sac_counting_live_bytes() - before
    loss.backward()
    return kept


@pytest.mark.parametrize("architecture", models.ARCHITECTURES,
                         ids=lambda f: f.__name__)
def test_bytes_kept_equal_pytorch_sac(architecture):
    torch.manual_seed(0)
    model, batch = architecture()  # allocated by the counting allocator
    # A CNN has no matmuls to save: its convolutions are listed instead.
    ops = models.OPS if architecture is not models.resnet else \
        [torch.ops.aten.convolution.default]
    ours = kept_after_forward(model, batch, sac.context_fn(ops))
    theirs = kept_after_forward(model, batch, functools.partial(torch_contexts, ops))
    full = kept_after_forward(model, batch, torch.utils.checkpoint.noop_context_fn)
    assert ours == theirs, f"sac keeps {ours} bytes, PyTorch's SAC {theirs}"
    assert ours > full, f"saving the op list keeps no more than full recomputation ({full})"


def kept_by_one_region(model, batch, policy):
    """Bytes live after the forward when the whole forward is one region
    (policy None: sac.region(), everything recomputed), or one
    torch.utils.checkpoint call (policy a context_fn)."""
    model = models.copy.deepcopy(model)
    model.train()
    torch.manual_seed(7)
    with no_collection():
        before = counting.sac_counting_live_bytes()
        if callable(policy):
            loss = torch.utils.checkpoint.checkpoint(lambda b: model(**b).loss, batch,
                                                     use_reentrant=False, context_fn=policy)
        else:
            with sac.region(policy):
                loss = model(**batch).loss
        kept = counting.sac_counting_live_bytes() - before
    loss.backward()
    return kept


@needs_fallback
@pytest.mark.parametrize("architecture", models.ARCHITECTURES, ids=lambda f: f.__name__)
def test_a_region_keeps_what_pytorch_s_sac_keeps(architecture):
    # What the op list keeps beyond full recomputation is equal. Under full
    # recomputation PyTorch keeps the CPU generator's state as a tensor
    # (5,056 bytes, which this allocator counts), sac a clone of the
    # generator (which it does not): the two baselines differ by that.
    torch.manual_seed(0)
    model, batch = architecture()
    region = kept_by_one_region(model, batch, models.OPS)
    region_full = kept_by_one_region(model, batch, None)
    theirs = kept_by_one_region(model, batch, functools.partial(torch_contexts, models.OPS))
    theirs_full = kept_by_one_region(model, batch, torch.utils.checkpoint.noop_context_fn)
    assert region - region_full == theirs - theirs_full, (region, region_full, theirs,
                                                          theirs_full)
    assert region_full < theirs_full
