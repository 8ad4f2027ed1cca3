"""Point-to-point messages between neighbouring pipeline ranks over torch.distributed, with timeouts.

Every payload is one byte buffer: the tensors of an activation (and its gradient) packed by `messages`. Its size
follows from the schedule, the handshake's shapes, the message dtypes and the batch size, all of which the two
ranks have first confirmed to each other (the handshake, then a fixed-size header per tick: `protocol`). Every
exchange is bounded in total by the timeout: it gets one deadline, and each wait gets what is left of it. A dead or
stalled peer becomes a PeerFailureError naming both ranks.
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .errors import PeerFailureError
from .tensors import Activation, as_tuple
from .wire import dtype_name, dtype_of, json_shape

_MAX_TENSORS = 1024  # tensors of one activation a peer may describe


@dataclass(frozen=True)
class TensorSpec:
    """The per-sample shape and dtype of one tensor of an activation."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def numel(self, batch: int) -> int:
        return batch * math.prod(self.shape)


@dataclass(frozen=True)
class ActivationSpec:
    tensors: tuple[TensorSpec, ...]
    is_tuple: bool

    @classmethod
    def of(cls, value: Activation, batch: int | None = None) -> "ActivationSpec":
        """The spec of `value`, a tensor or a tuple of tensors whose first dimension is the batch (`batch`
        samples when given: a ValueError says which tensor is not batch-major)."""
        tensors = as_tuple(value)
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise ValueError(f"{describe_value(value)}, not a tensor or a tuple of tensors")
        if batch is not None and any(t.dim() == 0 or t.shape[0] != batch for t in tensors):
            raise ValueError(f"{describe_value(value)}, whose first dimension is not the batch of {batch} samples")
        specs = tuple(TensorSpec(tuple(t.shape[1:]), t.dtype) for t in tensors)
        return cls(specs, isinstance(value, tuple))

    def mismatch(self, value: Activation, batch: int) -> str | None:
        """None when `value` has this spec's structure, dtypes and per-sample shapes with `batch` samples; else what
        it is instead. Cheap (compares shapes, never data): it runs on every message."""
        tensors = value if isinstance(value, tuple) else (value,)
        if isinstance(value, tuple) != self.is_tuple or len(tensors) != len(self.tensors):
            return describe_value(value)
        for tensor, spec in zip(tensors, self.tensors):
            if not isinstance(tensor, torch.Tensor) or tensor.dtype != spec.dtype or tensor.shape != (
                    batch, *spec.shape):
                return describe_value(value)
        return None

    def to_json(self) -> dict:
        """The spec as plain JSON values (the handshake sends it so, never pickled)."""
        return {"tensors": [[list(t.shape), dtype_name(t.dtype)] for t in self.tensors], "is_tuple": self.is_tuple}

    @classmethod
    def from_json(cls, data) -> "ActivationSpec":
        """What `to_json` made, checked (a ValueError for anything else: a peer's message is not trusted)."""
        if not isinstance(data, dict) or set(data) != {"tensors", "is_tuple"} or not isinstance(data["is_tuple"], bool):
            raise ValueError("not an activation spec")
        entries = data["tensors"]
        if not isinstance(entries, list) or not 0 < len(entries) <= _MAX_TENSORS:
            raise ValueError(f"an activation spec needs 1 to {_MAX_TENSORS} tensors")
        specs = []
        for entry in entries:
            if not isinstance(entry, list) or len(entry) != 2:
                raise ValueError("not a tensor spec")
            specs.append(TensorSpec(json_shape(entry[0]), dtype_of(entry[1])))
        if not data["is_tuple"] and len(specs) != 1:
            raise ValueError("a single-tensor activation spec with several tensors")
        return cls(tuple(specs), data["is_tuple"])

    @property
    def dtype(self) -> torch.dtype:
        return self.tensors[0].dtype

    def numel(self, batch: int) -> int:
        return sum(t.numel(batch) for t in self.tensors)

    def unflatten(self, flat: torch.Tensor, batch: int) -> Activation:
        parts, offset = [], 0
        for spec in self.tensors:
            count = spec.numel(batch)
            parts.append(flat[offset : offset + count].view(batch, *spec.shape))
            offset += count
        return tuple(parts) if self.is_tuple else parts[0]

    def describe(self) -> str:
        shapes = ", ".join(
            f"[B, {', '.join(map(str, t.shape))}] {str(t.dtype).replace('torch.', '')}" for t in self.tensors
        )
        return f"({shapes})" if self.is_tuple else shapes


def describe_value(value) -> str:
    """`[8, 3] float32`, `([8, 3] float32, [8] int64)`, or the type of what is not a tensor (for errors)."""
    if isinstance(value, tuple):
        return f"({', '.join(map(describe_value, value))})"
    if isinstance(value, torch.Tensor):
        return f"[{', '.join(map(str, value.shape))}] {dtype_name(value.dtype)}"
    return f"a {type(value).__name__}"


@dataclass
class Outgoing:
    peer: int
    tag: int
    buffer: torch.Tensor
    what: str = "activations"  # for error messages


@dataclass
class Incoming:
    peer: int
    tag: int
    numel: int
    dtype: torch.dtype
    what: str  # for error messages


@dataclass
class Posted:
    """Messages started by `NeighbourTransport.post`."""

    works: list
    buffers: list[torch.Tensor]
    headers: dict = field(default_factory=dict)  # the headers sent, by neighbour (for `Router.agree`)


class NeighbourTransport:
    """Sends and receives the flat messages of one tick with the neighbouring ranks."""

    def __init__(
        self,
        global_ranks: list[int],
        group: dist.ProcessGroup | None,
        timeout: float,
        describe: Callable[[int], str],
        device: torch.device,
    ):
        self.global_ranks = global_ranks  # pipeline position -> global rank
        self.group = group
        self.timeout = timeout
        self.describe = describe
        self.device = device
        self.seconds = 0.0  # wall time spent in exchanges, waiting for the neighbours included
        self.bytes_sent = 0  # payloads and headers posted to the neighbours

    def deadline(self) -> float:
        """The `time.monotonic()` by which an exchange starting now must be over."""
        return time.monotonic() + self.timeout

    def exchange(
        self,
        position: int,
        outgoing: list[Outgoing],
        incoming: list[Incoming],
        tick: int,
        deadline: float | None = None,
    ) -> list[torch.Tensor]:
        """Post the receives, then the sends, and wait for all of them until `deadline` (default: timeout from
        now); returns the received buffers."""
        return self.wait(self.post(outgoing, incoming, position, tick), position, tick, deadline)

    def post(self, outgoing: list[Outgoing], incoming: list[Incoming], position: int, tick: int) -> "Posted":
        """Start the receives, then the sends (in a fixed order: every rank posts the same pattern); `wait` ends
        them. A peer whose connection is already closed fails here, as a PeerFailureError like `wait`'s."""
        start = time.perf_counter()
        buffers = [torch.empty(m.numel, dtype=m.dtype, device=self.device) for m in incoming]
        works = []
        try:
            for message, buffer in zip(incoming, buffers):
                peer = self.global_ranks[message.peer]
                works.append((message, dist.irecv(buffer, src=peer, group=self.group, tag=message.tag)))
            for message in outgoing:
                self.bytes_sent += message.buffer.numel() * message.buffer.element_size()
                peer = self.global_ranks[message.peer]
                works.append((message, dist.isend(message.buffer, dst=peer, group=self.group, tag=message.tag)))
        # gloo raises RuntimeError (torch.distributed.DistError included) at once when the peer's connection has
        # closed; anything else (a bad peer index, a wrong argument) is a bug of ours and propagates as it is.
        except RuntimeError as error:
            raise self._failure(position, message.peer, _action(message), tick, f"{type(error).__name__}: {error}") \
                from error
        finally:
            self.seconds += time.perf_counter() - start
        return Posted(works, buffers)

    def wait(self, posted: "Posted", position: int, tick: int, deadline: float | None = None) -> list[torch.Tensor]:
        """Wait for every message of `posted` until `deadline` (default: timeout from now); the received buffers."""
        start = time.perf_counter()
        deadline = self.deadline() if deadline is None else deadline
        try:
            for message, work in posted.works:
                self._wait(position, message, work, tick, deadline)
            return posted.buffers
        finally:
            self.seconds += time.perf_counter() - start

    def _wait(self, position: int, message, work, tick: int, deadline: float) -> None:
        action = _action(message)
        # What is left of the exchange's time (at least a millisecond, to collect a message already there).
        left = datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001))
        try:
            completed = work.wait(left)
        except RuntimeError as error:  # gloo raises on a timeout and when the peer's connection closes
            raise self._failure(position, message.peer, action, tick, f"{type(error).__name__}: {error}") from error
        if completed is False:
            raise self._failure(position, message.peer, action, tick, "timed out")

    def _failure(self, position: int, peer: int, action: str, tick: int, reason: str) -> PeerFailureError:
        seconds = self.timeout
        return PeerFailureError(
            f"{self.describe(position)} could not {action} {self.describe(peer)} at tick {tick} within "
            f"{seconds:g}s: the peer process died, stalled or failed ({reason})"
        )


def _action(message: Outgoing | Incoming) -> str:
    """What a message does, as an error says it: "receive the gradient from", "send the header to"."""
    return f"receive {message.what} from" if isinstance(message, Incoming) else f"send {message.what} to"
