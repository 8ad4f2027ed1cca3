"""The bytes a process really has allocated, from glibc's allocator: the reference `Pipeline.process_memory()` is
checked against (tests, `benchmarks/memory.py`).

PyTorch's CPU allocator takes every tensor's storage from malloc and returns it on free (no caching), so the
change in malloc's bytes in use between two moments is the change in live storages plus a few bytes of Python
objects per tensor.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


@functools.cache
def _mallinfo2():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    function = getattr(libc, "mallinfo2", None)
    if function is None:
        raise RuntimeError("malloc_in_use needs glibc 2.33 or later (mallinfo2)")
    function.restype = _MallInfo2
    return function


def malloc_in_use() -> int:
    """Bytes malloc has handed out and not had back, over every arena: chunks in use plus mmapped blocks."""
    info = _mallinfo2()()
    return info.uordblks + info.hblkhd


def malloc_available() -> bool:
    try:
        _mallinfo2()
    except (OSError, RuntimeError):
        return False
    return True


def steady_state_growth(pipeline, micro_batch) -> dict[str, int]:
    """What a pipeline's buffers add to this process between empty and steady state, three ways: the engine's
    process view (`process_bytes`, each storage once), its per-stage view summed (`stage_bytes`, as if each stage
    had its own device) and malloc (`malloc_bytes`). `micro_batch(step)` gives the (inputs, target) of a step.

    A first pass to steady state and a drain allocate what lives on (gradients, thread pools, caches), so that the
    second pass measures the buffers alone.
    """
    steps = pipeline.schedule.latency + 1
    for step in range(steps):
        pipeline.step(*micro_batch(step))
    pipeline.drain()
    gc.collect()
    empty = pipeline.process_memory().total_bytes, _stage_sum(pipeline), malloc_in_use()
    for step in range(steps):
        pipeline.step(*micro_batch(steps + step))
    gc.collect()
    full = pipeline.process_memory().total_bytes, _stage_sum(pipeline), malloc_in_use()
    pipeline.drain()
    keys = ("process_bytes", "stage_bytes", "malloc_bytes")
    return {key: after - before for key, before, after in zip(keys, empty, full)}


def _stage_sum(pipeline) -> int:
    return sum(stats.total_bytes for stats in pipeline.memory().values())
