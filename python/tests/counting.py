"""Helpers of the byte-counting tests."""
import contextlib
import gc


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
