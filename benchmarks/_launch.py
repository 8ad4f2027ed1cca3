"""`launch`: `petra_hub.testing.ranks.run_ranks` for the benchmarks, raising on failure, with extra environment."""

from __future__ import annotations

import os
from unittest import mock

from petra_hub.testing.ranks import SINGLE_THREAD_ENV, run_ranks

__all__ = ["SINGLE_THREAD_ENV", "STABLE_MALLOC_ENV", "LaunchError", "launch"]

# glibc malloc with fixed thresholds: large blocks come from the heap and freed memory is not handed back to the
# kernel. With the default, adaptive thresholds, whether a training loop page-faults on its freshly allocated
# activations depends on its allocation history: the same schedule measured twice in one process can differ by
# ~10% (thousands of minor faults and ~20 ms of system time per micro-batch, or none). Read by glibc at start-up.
STABLE_MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(2**30), "MALLOC_TRIM_THRESHOLD_": str(2**31)}


class LaunchError(RuntimeError):
    pass


def launch(function, world_size: int, *args, deadline: float = 3600.0, pg_timeout: float = 600.0, env=None,
           bind_cores: bool = False) -> list:
    """Run `function(rank, world_size, *args)` (a module-level function) on `world_size` spawned processes, with
    `env` added to their environment (and with `bind_cores`, each on its own share of the cores), and return the
    per-rank values; raise LaunchError if a rank fails."""
    with mock.patch.dict(os.environ, env or {}):  # the children inherit it at start-up: fresh processes
        results, codes, _ = run_ranks(function, world_size, *args, deadline=deadline, pg_timeout=pg_timeout,
                                      start_method="spawn" if env else "forkserver", bind_cores=bind_cores)
    for rank, (result, code) in enumerate(zip(results, codes)):
        if result is None or "error" in result:
            detail = result["traceback"] if result else f"exit code {code} (None: killed at the {deadline:g}s deadline)"
            raise LaunchError(f"{function.__name__} failed on rank {rank} of {world_size}:\n{detail}")
    return [result["value"] for result in results]
