"""Bytes kept after the forward, counted by one allocator (benchmarks/
counting_allocator.cpp, as the C++ benchmarks count them): sac's modes keep
exactly what PyTorch's SAC keeps with the same op list."""
import ctypes
import functools
import os

import pytest
import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts as torch_contexts

import sac
import test_models as models

LIBRARY = os.environ.get("SAC_COUNTING_ALLOCATOR")
if not LIBRARY:
    pytest.skip("SAC_COUNTING_ALLOCATOR names no counting allocator library "
                "(.ci/python sets it to the build's benchmarks/libsac_counting_allocator.so)",
                allow_module_level=True)
counting = ctypes.CDLL(LIBRARY)
counting.sac_counting_live_bytes.restype = ctypes.c_int64
counting.sac_counting_install()


def kept_after_forward(model, batch, context_fn):
    """Bytes live after the forward (loss computed, before backward), minus
    those live before it: what the forward keeps for backward."""
    model = models.copy.deepcopy(model)
    model.train()
    models.enable_checkpointing(model, context_fn)
    torch.manual_seed(7)
    before = counting.sac_counting_live_bytes()
    loss = model(**batch).loss
    kept = counting.sac_counting_live_bytes() - before
    loss.backward()
    return kept


@pytest.mark.parametrize("architecture", [models.gpt2, models.llama, models.mixtral, models.bart],
                         ids=lambda f: f.__name__)
def test_bytes_kept_equal_pytorch_sac(architecture):
    torch.manual_seed(0)
    model, batch = architecture()  # allocated by the counting allocator
    ours = kept_after_forward(model, batch, sac.context_fn(models.OPS))
    theirs = kept_after_forward(model, batch, functools.partial(torch_contexts, models.OPS))
    full = kept_after_forward(model, batch, torch.utils.checkpoint.noop_context_fn)
    assert ours == theirs, f"sac keeps {ours} bytes, PyTorch's SAC {theirs}"
    assert ours > full, f"saving the op list keeps no more than full recomputation ({full})"
