"""What the pipeline ranks do together besides the tick exchange: gathering the stages onto one rank, the averages
over data-parallel replicas (gradients before each update, batch-norm statistics at each drain), and comparing
what every rank must agree on."""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parameter import is_lazy

from .errors import StageMismatchError, peer_failure
from .wire import WireError, all_gather_json, gather_tensors


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
    None). Tensors travel as tensors, named by a JSON manifest that every rank checks against its own copy of the
    stages before any tensor moves (`wire.gather_tensors`; nothing is unpickled). A collective failure (a peer died
    or left) becomes a PeerFailureError."""
    mine = {f"{i}.{k}": v for i in local for k, v in stages[i].state_dict().items()}
    expected = {f"{i}.{k}": (None if is_lazy(v) else tuple(v.shape), v.dtype) for i, stage in enumerate(stages)
                for k, v in stage.state_dict().items()}  # lazy: not built here (the stage never ran on this rank)
    accept = functools.partial(_expected_states, expected, len(stages), describe, describe(rank))
    with peer_failure(f"gather the stages onto {'every rank' if dst is None else describe(dst)}", describe(rank)):
        gathered = gather_tensors(mine, group, None if dst is None else global_ranks[dst], accept)
    for position, tensors in enumerate(gathered or ()):
        if position == rank:
            continue
        states: dict[int, dict] = {}
        for key, tensor in tensors.items():
            index, name = key.split(".", 1)
            states.setdefault(int(index), {})[name] = tensor
        for index, state in states.items():
            if index not in local:
                stages[index].load_state_dict(state)


def _expected_states(expected: dict, count: int, describe: Callable[[int], str], me: str, rank: int,
                     manifest: dict) -> None:
    """Refuse (a StageMismatchError, which `gather_tensors` raises on every rank) what pipeline rank `rank` announces
    unless it is whole state dicts of stages, each entry with the shape and dtype of this rank's (`me`) copy
    (`expected`: "index.name" -> (shape, dtype), for all `count` stages)."""
    announced = set()
    for key, (shape, dtype) in manifest.items():
        index, _, name = key.partition(".")
        if not index.isdigit() or int(index) >= count:
            raise StageMismatchError(f"{describe(rank)} sent {key!r}, which names no stage of the {count}")
        ours = expected.get(key)
        if ours != (shape, dtype) and not (ours is not None and ours[0] is None and ours[1] == dtype):
            have = "nothing" if ours is None else f"{'a lazy' if ours[0] is None else list(ours[0])} {ours[1]}"
            raise StageMismatchError(f"{describe(rank)} sent stage {index}'s {name!r} as {list(shape)} {dtype}, but "
                                     f"{me} has {have} for it: every rank must build the same stages")
        announced.add(index)
    missing = [key for key in expected if key.partition(".")[0] in announced and key not in manifest]
    if missing:
        raise StageMismatchError(f"{describe(rank)} sent stages without {missing[:5]}, which {me} has: every rank "
                                 "must build the same stages")


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
    """Every rank's `mine` (a JSON object: str keys, JSON values; gathered over `group`, a collective) and the keys
    whose values differ between ranks, sorted: the same on every rank, so that each raises the same error."""
    everyone = all_gather_json(mine, group)  # JSON, never pickled (see `wire`)
    if not all(isinstance(other, dict) for other in everyone):
        raise WireError("a rank sent settings that are not a JSON object")
    mine = everyone[dist.get_rank(group)]  # as JSON has it (tuples are lists), like every other rank's
    keys = {key for other in everyone for key in other}
    return everyone, sorted(key for key in keys if any(other.get(key) != mine.get(key) for other in everyone))
