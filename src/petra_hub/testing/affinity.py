"""Each process of a multi-process CPU run on its own cores, for the benchmarks that compare both ways.

On a CPU machine the scheduler decides which core runs which process, and a rank that sleeps while it waits for its
neighbour may wake on another core, whose caches hold none of its data. Binding rank r to its own share of the cores
rules that out. `benchmarks/affinity.py` measures what it buys: on this project's 2-core machine, nothing (PETRA
0.96x and 1.01x the speed of free processes), so the trainer does not bind (docs/design.md). torchrun's
`--numa-binding` and accelerate's `--enable_cpu_affinity` bind processes near their GPUs; neither binds a CPU-only
run's processes, hence these few lines.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch


def cpu_share(local_rank: int, local_world_size: int, cores: Sequence[int] | None = None) -> list[int]:
    """The cores of process `local_rank` of the `local_world_size` on this machine: `cores` (default: those this
    process may run on) cut into that many contiguous shares, as equal as they can be."""
    cores = sorted(os.sched_getaffinity(0) if cores is None else cores)
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is not one of {local_world_size} processes")
    if len(cores) < local_world_size:
        raise ValueError(f"cannot give each of {local_world_size} processes a core of its own: this process may run "
                         f"on {len(cores)} ({cores})")
    return cores[local_rank * len(cores) // local_world_size:(local_rank + 1) * len(cores) // local_world_size]


def bind_to_cpu_share(local_rank: int, local_world_size: int) -> list[int]:
    """Bind this process to its `cpu_share` and use at most that many threads; returns the share."""
    share = cpu_share(local_rank, local_world_size)
    os.sched_setaffinity(0, share)
    torch.set_num_threads(min(torch.get_num_threads(), len(share)))
    return share
