"""JSON and tensors between ranks, never pickled.

torch.distributed's object collectives (`all_gather_object`, `broadcast_object_list`, `send_object_list` /
`recv_object_list`, `gather_object`) unpickle what the other ranks send, and gloo's TCP is unauthenticated: whatever
process speaks on a rank's connection would run code in it. The engine (and the trainer) exchange instead

- JSON (shapes, dtype names, error texts, settings): `all_gather_json`, `broadcast_json`, `send_json` / `recv_json`.
  A value travels as its UTF-8 JSON text in a uint8 tensor, its length first: every rank that receives a length
  checks it against `limit` (4 MiB by default) before allocating anything, and the sender checks its own the same way,
  so an oversized message raises the same error on both sides;
- tensors as tensors: `gather_tensors` / `broadcast_tensors` move a dict of named tensors as one flat byte buffer per
  rank, described by a JSON manifest (names, shapes, dtype names) that every receiving rank checks (known dtypes,
  sane shapes, and the caller's `accept`) before the buffer is allocated.

Ranks given as `src` / `dst` are global ranks, as in torch.distributed; lists come in the order of the group's ranks.
What a peer sends that breaks the format (not JSON, too long, a bad manifest) raises a `WireError` naming it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from .errors import PeerFailureError, PipelineError, StageMismatchError

JSON_LIMIT = 4 * 2**20  # bytes of one JSON message (settings, specs, error texts)
MANIFEST_LIMIT = 64 * 2**20  # bytes of the JSON manifest of a tensor dict (names of a large model's tensors)
TENSOR_LIMIT = 2**40  # bytes of one rank's tensors: beyond any model, below what an allocation would take as sane
MAX_DIMS = 32  # dimensions of a tensor a peer describes (torch allows 64; nothing here comes near)
# the dtypes a peer may name, by `dtype_name`
DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.complex64, torch.complex128, torch.int64,
    torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)}

Manifest = dict[str, tuple[tuple[int, ...], torch.dtype]]  # name -> (shape, dtype), as checked by `accept`


class WireError(PeerFailureError):
    """A message between ranks that breaks the format: longer than its limit, not JSON, a bad manifest."""


_REFUSALS = {cls.__name__: cls for cls in (WireError, StageMismatchError, PeerFailureError, PipelineError)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: Any) -> torch.dtype:
    """The dtype a peer named (`dtype_name`); a ValueError for any other value."""
    if not isinstance(name, str) or name not in DTYPES:
        raise ValueError(f"unknown dtype {str(name)[:40]!r}")
    return DTYPES[name]


def json_shape(shape: Any) -> tuple[int, ...]:
    """A shape a peer sent as a JSON list: at most `MAX_DIMS` non-negative integers; a ValueError otherwise."""
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(
            type(size) is int and 0 <= size < 2**62 for size in shape):
        raise ValueError(f"not a tensor shape: {str(shape)[:80]}")
    return tuple(shape)


# -- JSON ----------------------------------------------------------------------------------------------------------
def all_gather_json(value: Any, group: dist.ProcessGroup | None = None, limit: int = JSON_LIMIT) -> list:
    """Every rank's `value` (JSON-serialisable), on every rank of `group`, in the group's rank order."""
    data, device = _dumps(value), collective_device(group)
    world = dist.get_world_size(group)
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    dist.all_gather(lengths, torch.tensor([data.numel()], dtype=torch.int64, device=device), group=group)
    sizes = [int(length) for length in lengths]
    for rank, size in enumerate(sizes):
        _check_length(size, limit, _name(group, rank), "every rank")
    longest = max(sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: data.numel()] = data.to(device)
    buffers = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(buffers, padded, group=group)
    return [_loads(buffer[:size], _name(group, rank)) for rank, (buffer, size) in enumerate(zip(buffers, sizes))]


def broadcast_json(value: Any, src: int, group: dist.ProcessGroup | None = None, limit: int = JSON_LIMIT) -> Any:
    """`value` of global rank `src` on every rank of `group` (the others pass anything, e.g. None)."""
    mine, device = dist.get_rank() == src, collective_device(group)
    data = _dumps(value).to(device) if mine else None
    length = torch.tensor([data.numel() if mine else 0], dtype=torch.int64, device=device)
    dist.broadcast(length, src=src, group=group)
    size = int(length)
    _check_length(size, limit, f"rank {src}", "every rank")
    buffer = data if mine else torch.empty(size, dtype=torch.uint8, device=device)
    dist.broadcast(buffer, src=src, group=group)
    return value if mine else _loads(buffer, f"rank {src}")


def send_json(value: Any, dst: int, group: dist.ProcessGroup | None = None, limit: int = JSON_LIMIT,
              tag: int = 0) -> None:
    """Send `value` to global rank `dst`, which calls `recv_json` (its length first: both check it)."""
    device = collective_device(group)
    data = _dumps(value).to(device)
    dist.send(torch.tensor([data.numel()], dtype=torch.int64, device=device), dst=dst, group=group, tag=tag)
    _check_length(data.numel(), limit, f"rank {dist.get_rank()}", f"rank {dst}")
    dist.send(data, dst=dst, group=group, tag=tag)


def recv_json(src: int, group: dist.ProcessGroup | None = None, limit: int = JSON_LIMIT, tag: int = 0) -> Any:
    """What global rank `src` sent with `send_json`."""
    device = collective_device(group)
    length = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(length, src=src, group=group, tag=tag)
    size = int(length)
    _check_length(size, limit, f"rank {src}", f"rank {dist.get_rank()}")
    buffer = torch.empty(size, dtype=torch.uint8, device=device)
    dist.recv(buffer, src=src, group=group, tag=tag)
    return _loads(buffer, f"rank {src}")


# -- tensors -------------------------------------------------------------------------------------------------------
def gather_tensors(tensors: dict[str, torch.Tensor], group: dist.ProcessGroup | None = None, dst: int | None = None,
                   accept: Callable[[int, Manifest], None] | None = None) -> list[dict[str, torch.Tensor]] | None:
    """Every rank's `tensors` (name -> tensor), on global rank `dst` (None: on every rank): a list in the group's
    rank order where they arrive (CPU tensors), None elsewhere. The manifests go to every rank first, and every rank
    checks every one (`accept(group_rank, manifest)` may raise, e.g. to refuse shapes it does not expect), so all
    ranks reach the same verdict before any tensor moves."""
    device = collective_device(group)
    flat, manifest = _flatten(tensors, device)
    manifests = all_gather_json(manifest, group, limit=MANIFEST_LIMIT)
    layouts = _agreed(group, lambda: [_layout(entries, _name(group, rank), accept, rank)
                                      for rank, entries in enumerate(manifests)])
    me = dist.get_rank(group)
    received: list[torch.Tensor | None] = [None] * len(layouts)
    if dst is None:
        for rank, layout in enumerate(layouts):
            buffer = flat if rank == me else torch.empty(_total(layout), dtype=torch.uint8, device=device)
            if buffer.numel():
                dist.broadcast(buffer, src=_global(group, rank), group=group)
            received[rank] = buffer
    elif dist.get_rank() != dst:
        if flat.numel():
            dist.send(flat, dst=dst, group=group)
        return None
    else:
        for rank, layout in enumerate(layouts):
            buffer = flat if rank == me else torch.empty(_total(layout), dtype=torch.uint8, device=device)
            if rank != me and buffer.numel():
                dist.recv(buffer, src=_global(group, rank), group=group)
            received[rank] = buffer
    return [_unflatten(buffer, layout) for buffer, layout in zip(received, layouts)]


def broadcast_tensors(tensors: dict[str, torch.Tensor] | None, src: int, group: dist.ProcessGroup | None = None,
                      accept: Callable[[int, Manifest], None] | None = None) -> dict[str, torch.Tensor]:
    """The `tensors` of global rank `src` on every rank of `group` (CPU tensors; the others pass None). Every rank
    checks the manifest (`accept(group rank of src, manifest)` may raise a PipelineError), and the first refusal is
    raised on every rank before the buffer moves."""
    mine, device = dist.get_rank() == src, collective_device(group)
    flat, manifest = _flatten(tensors, device) if mine else (None, None)
    entries = broadcast_json(manifest, src, group, limit=MANIFEST_LIMIT)
    rank = dist.get_group_rank(group, src) if group is not None else src
    layout = _agreed(group, lambda: _layout(entries, f"rank {src}", accept, rank))
    buffer = flat if mine else torch.empty(_total(layout), dtype=torch.uint8, device=device)
    if buffer.numel():
        dist.broadcast(buffer, src=src, group=group)
    return _unflatten(buffer, layout)


# -- helpers -------------------------------------------------------------------------------------------------------
def _dumps(value: Any) -> torch.Tensor:
    data = json.dumps(value, separators=(",", ":"), default=_plain).encode()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a collective's tensors must be: NCCL moves CUDA tensors only (on this process's current device), gloo
    and a mixed "cpu:gloo,cuda:nccl" backend take CPU ones."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _plain(value: Any) -> Any:
    """What JSON cannot hold as it is: numpy and torch numbers (e.g. a setting given as np.int64), arrays as lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} {str(value)[:40]!r} does not travel between ranks (not JSON)")


def _loads(buffer: torch.Tensor, sender: str) -> Any:
    try:
        return json.loads(buffer.cpu().numpy().tobytes().decode())
    except (UnicodeDecodeError, ValueError) as error:
        raise WireError(f"{sender} sent a message that is not JSON ({error})") from None


def _check_length(size: int, limit: int, sender: str, receiver: str) -> None:
    """The same verdict on the sender and the receivers of a message of `size` bytes."""
    if not 0 < size <= limit:
        raise WireError(f"{sender} sent {receiver} a message of {size} bytes, outside 1 to {limit} (the limit of "
                        "its kind): refused before anything is allocated")


def _agreed(group: dist.ProcessGroup | None, check: Callable[[], Any]) -> Any:
    """`check()`, whose verdict every rank then shares (ranks may judge a manifest differently, e.g. against stages
    they built differently): the first refusal in rank order is raised on every rank, with its class and text."""
    result, refusal = None, None
    try:
        result = check()
    except PipelineError as error:
        refusal = [type(error).__name__, str(error)]
    refusals = [r for r in all_gather_json(refusal, group) if r is not None]
    if refusals:
        kind, text = refusals[0] if isinstance(refusals[0], list) and len(refusals[0]) == 2 else ("", refusals[0])
        raise _REFUSALS.get(kind, WireError)(str(text))
    return result


def _name(group: dist.ProcessGroup | None, rank: int) -> str:
    return f"rank {_global(group, rank)}"


def _global(group: dist.ProcessGroup | None, rank: int) -> int:
    return dist.get_global_rank(group, rank) if group is not None else rank


def _flatten(tensors: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, list]:
    """One uint8 buffer on `device` holding the tensors' bytes in order (each copied there once), and their manifest
    [[name, shape, dtype name], ...]."""
    chunks, manifest = [], []
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"gather_tensors / broadcast_tensors take a dict of str -> tensor, got {name!r}: "
                            f"{type(tensor).__name__}")
        if tensor.dtype not in DTYPES.values():
            raise TypeError(f"tensor {name!r} has dtype {tensor.dtype}, which does not travel: {sorted(DTYPES)}")
        tensor = tensor.detach().to(device).contiguous()
        manifest.append([name, list(tensor.shape), dtype_name(tensor.dtype)])
        chunks.append(tensor.reshape(-1).view(torch.uint8))
    flat = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.uint8, device=device)
    return flat, manifest


def _layout(entries: Any, sender: str, accept: Callable[[int, Manifest], None] | None,
            rank: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """The checked manifest of `sender` (group rank `rank`): [(name, shape, dtype)]; a WireError if malformed."""
    try:
        if not isinstance(entries, list):
            raise ValueError("not a list")
        layout, total = [], 0
        for entry in entries:
            if not isinstance(entry, list) or len(entry) != 3 or not isinstance(entry[0], str):
                raise ValueError(f"not a [name, shape, dtype] entry: {str(entry)[:80]}")
            shape, dtype = json_shape(entry[1]), dtype_of(entry[2])
            layout.append((entry[0], shape, dtype))
            total += math.prod(shape) * dtype.itemsize
            if total > TENSOR_LIMIT:
                raise ValueError(f"more than {TENSOR_LIMIT} bytes of tensors")
        if len({name for name, _, _ in layout}) != len(layout):
            raise ValueError("a name appears twice")
    except ValueError as error:
        raise WireError(f"{sender} announced tensors that cannot be received: {error}") from None
    if accept is not None:
        accept(rank, {name: (shape, dtype) for name, shape, dtype in layout})
    return layout


def _total(layout) -> int:
    return sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in layout)


def _unflatten(buffer: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    """CPU tensors, whatever device the buffer crossed on."""
    result, offset, buffer = {}, 0, buffer.cpu()
    for name, shape, dtype in layout:
        size = math.prod(shape) * dtype.itemsize
        result[name] = buffer[offset : offset + size].clone().view(dtype).reshape(shape)
        offset += size
    return result
