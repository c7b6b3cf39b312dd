"""What the package's tests share: a small block of ops and its leaves, the
counting allocator, a window without garbage collection for counting bytes,
one intra-op thread for measuring peaks, and a function run on several
threads at once."""
import contextlib
import ctypes
import gc
import os
import threading

import pytest

import torch


@pytest.fixture
def one_thread():
    """The CPU's intra-op threads allocate scratch buffers that c10's memory
    reporting does not see from the step's thread: peaks are measured with
    one. A test module uses it with pytestmark."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def block(x, w1, w2):
    h = torch.relu(x @ w1)
    h = torch.sigmoid(h @ w2) * h
    return (h @ w2.t()).tanh().sum(dim=1)


def leaves(seed=0):
    """block's arguments, fresh leaves that require grad."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, requires_grad=True)
            for shape in [(16, 32), (32, 48), (48, 48)]]


@contextlib.contextmanager
def no_collection():
    """Python's garbage collector stays off while bytes are counted: a
    collection in the middle frees earlier tests' garbage and the count goes
    negative (seen in CI)."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def on_threads(fn, threads=4, times=10):
    """fn() called `times` times on each of `threads` threads at once: the
    results; the first exception raised on any thread is raised here."""
    results, errors = [], []

    def worker():
        try:
            for _ in range(times):
                results.append(fn())
        except Exception as e:  # raised below, on the caller's thread
            errors.append(e)

    running = [threading.Thread(target=worker) for _ in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    if errors:
        raise errors[0]
    assert len(results) == threads * times
    return results


def counting_allocator():
    """The counting allocator (benchmarks/counting_allocator.cpp, as the C++
    benchmarks count with it), installed as the CPU allocator; the calling
    test module is skipped without it."""
    library = os.environ.get("SAC_COUNTING_ALLOCATOR")
    if not library:
        pytest.skip("SAC_COUNTING_ALLOCATOR names no counting allocator library "
                    "(.ci/python sets it to the build's benchmarks/libsac_counting_allocator.so)",
                    allow_module_level=True)
    counting = ctypes.CDLL(library)
    counting.sac_counting_live_bytes.restype = ctypes.c_int64
    counting.sac_counting_peak_bytes.restype = ctypes.c_int64
    counting.sac_counting_limit.argtypes = [ctypes.c_int64]
    counting.sac_counting_install()
    return counting
