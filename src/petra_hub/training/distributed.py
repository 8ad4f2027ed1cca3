"""Process-group set-up for pipeline ranks started by `accelerate launch` or `torchrun`."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist


def launched_world_size() -> int:
    """The number of processes the launcher started (1 when run as a plain script)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(timeout: float) -> bool:
    """Join the launcher's process group: NCCL with one GPU per rank where there are GPUs, gloo otherwise.

    `timeout` bounds every collective (a dead or stalled peer becomes an error instead of a hang). Returns whether
    a multi-process group is active. Must run before `TrainingArguments` sets up accelerate, so that accelerate
    adopts this group instead of treating a CPU-only machine as a single process.
    """
    if launched_world_size() <= 1:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if dist.is_initialized():
        return True
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    return True


def world_size() -> int:
    """Processes in the default group (1 without one)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def all_reduce_sum(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Sum `values` over all processes (unchanged with one); NCCL needs them on the GPU, gloo on the CPU."""
    if world_size() <= 1:
        return values
    reduced = values.to(device if dist.get_backend() == "nccl" else torch.device("cpu"))
    dist.all_reduce(reduced)
    return reduced.cpu()
