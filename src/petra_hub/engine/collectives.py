"""What the pipeline ranks do together besides the tick exchange: gathering the stages onto one rank, the averages
over data-parallel replicas (gradients before each update, batch-norm statistics at each drain), and comparing
what every rank must agree on."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from .errors import peer_failure


def gather_stages(
    stages: list[nn.Module],
    local: range,
    rank: int,
    dst: int | None,
    group: dist.ProcessGroup | None,
    global_ranks: list[int],
    describe: Callable[[int], str],
) -> None:
    """Copy every stage's parameters and buffers onto the stage modules of pipeline rank `dst` (every rank when
    None). A collective failure (a peer died or left) becomes a PeerFailureError."""
    states = {i: {k: v.detach().cpu() for k, v in stages[i].state_dict().items()} for i in local}
    world = dist.get_world_size(group)
    with peer_failure(f"gather the stages onto {'every rank' if dst is None else describe(dst)}", describe(rank)):
        if dst is None:
            gathered = [None] * world
            dist.all_gather_object(gathered, states, group=group)
        else:
            gathered = [None] * world if rank == dst else None
            dist.gather_object(states, gathered, dst=global_ranks[dst], group=group)
    if gathered is not None:
        for others in gathered:
            for index, state in others.items():
                if index not in local:
                    stages[index].load_state_dict(state)


def average_gradients(params: list[nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
    """Average the parameters' gradients over the `size` replicas of `group` (one flat all_reduce)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()


def average_buffers(modules: list[nn.Module], group: dist.ProcessGroup, size: int) -> None:
    """Replicas see different data, so their batch-norm running statistics differ: after a drain (before any
    evaluation or save) every replica takes their average, so all replicas hold the same model."""
    for module in modules:
        for buffer in (b for b in module.buffers() if b.is_floating_point()):
            dist.all_reduce(buffer, group=group)
            buffer /= size


def disagreements(mine: dict, group: dist.ProcessGroup | None = None) -> tuple[list[dict], list[str]]:
    """Every rank's `mine` (gathered over `group`, a collective) and the keys whose values differ between ranks,
    sorted: the same on every rank, so that each raises the same error."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, mine, group=group)
    keys = {key for other in everyone for key in other}
    return everyone, sorted(key for key in keys if any(other.get(key) != mine.get(key) for other in everyone))
