"""Start a function on N fresh CPU processes (a gloo group over TCP when N > 1) and collect what each returns.

Used by `benchmarks/throughput.py`; a thin layer over `petra_hub.engine.spawn.run_ranks` (one intra-op thread per
process, hard deadline) that raises on failure and can add variables to the children's environment.
"""

from __future__ import annotations

import os

from petra_hub.testing.ranks import SINGLE_THREAD_ENV, run_ranks

__all__ = ["SINGLE_THREAD_ENV", "STABLE_MALLOC_ENV", "LaunchError", "launch"]

# glibc malloc with fixed thresholds: large blocks come from the heap and freed memory is not handed back to the
# kernel. With the default, adaptive thresholds, whether a training loop page-faults on its freshly allocated
# activations depends on its allocation history: the same schedule measured twice in one process can differ by
# ~10% (thousands of minor faults and ~20 ms of system time per micro-batch, or none). Read by glibc at start-up.
STABLE_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**31)}


class LaunchError(RuntimeError):
    pass


def launch(
    function,
    world_size: int,
    *args,
    deadline: float = 3600.0,
    pg_timeout: float = 600.0,
    env: dict[str, str] | None = None,
) -> list:
    """Run `function(rank, world_size, *args)` (a module-level function) on `world_size` spawned processes and
    return the per-rank values. `env` is added to the children's environment (they inherit ours at start-up).
    Raises LaunchError with the first failing rank's traceback if a process fails, dies or misses the deadline."""
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        results, codes, _started = run_ranks(function, world_size, *args, deadline=deadline, pg_timeout=pg_timeout)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    for rank, (result, code) in enumerate(zip(results, codes)):
        if result is None or "error" in result:
            detail = result["traceback"] if result else f"exit code {code} (None: killed at the {deadline:g}s deadline)"
            raise LaunchError(f"{function.__name__} failed on rank {rank} of {world_size}:\n{detail}")
    return [result["value"] for result in results]
