"""The header two neighbouring ranks swap before every exchange, and what they conclude from it.

Before any payload moves between rank r and rank r+1 (every tick, every `infer`, `gather_stages` and
`gradient_fidelity` pass) both send each other a `Header`: 13 int64 (104 bytes) saying what each is doing (a step
tick, a drain tick, an inference, a gather, a reference pass), at which tick, after how many micro-batches, and
which micro-batch of how many samples each expects to cross their boundary in each direction. Both ends fill the
same fields from their own state (with a digest of the last micro-batch's targets: `digest`), so in a consistent run
the two headers are equal. Both ends then compare the same pair of headers with the same function (`check`), so a
disagreement raises the same error, with the same text, on both ranks. With the sender's own check of every payload
against the handshake's spec of its boundary (batch first, the same per-sample shapes and dtypes, the byte count the
receiver derives: `Router.check_sent`), no payload of an unexpected size is ever posted (gloo aborts the process on
a longer message and leaves the buffer's tail unwritten on a shorter)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import astuple, dataclass, replace

import torch

from .errors import PeerFailureError, StageMismatchError

STEP, DRAIN, INFER, GATHER, PROBE = 1, 2, 3, 4, 5
_ACTIONS = {STEP: "a step tick", DRAIN: "a drain tick", INFER: "infer", GATHER: "gather_stages",
            PROBE: "gradient_fidelity"}
MAGIC = 0x50455452  # "PETR": a header that does not start with it is not one of ours
NONE = -1  # no micro-batch crosses (or no batch size known)
HEADER_LENGTH = 13
FEEDING_RULE = (
    "every rank must be fed the same micro-batches and call end_group, drain, infer and gather_stages at the same "
    "points"
)


@dataclass(frozen=True)
class Moment:
    """Where a rank stands when it talks to its neighbours: what it is doing and its schedule position."""

    kind: int  # STEP, DRAIN, INFER, GATHER or PROBE
    global_tick: int  # ticks run since the pipeline started
    tick: int  # ticks since the schedule's origin (the last drain)
    fed: int  # micro-batches fed since the origin
    first: int  # the micro-batch at the origin
    group: int  # micro-batches in the open accumulation group
    extra: int = 0  # GATHER: the destination rank (-1: every rank); PROBE: the probed micro-batch


@dataclass(frozen=True)
class Header:
    kind: int
    tick: int  # global tick
    fed: int  # micro-batches fed in all
    first: int
    group: int
    forward: int  # micro-batch whose activations cross the boundary forward now (NONE: none)
    forward_batch: int
    backward: int  # micro-batch whose gradients cross backward now
    backward_batch: int
    last_batch: int  # samples of the last micro-batch fed (INFER: of the inference batch; PROBE: of the probed one)
    extra: int
    last_targets: int = NONE  # digest of the last micro-batch's targets (NONE: none, or not on the CPU: unchecked)

    def tensor(self, device: torch.device) -> torch.Tensor:
        return torch.tensor((MAGIC, *astuple(self)), dtype=torch.int64, device=device)

    @classmethod
    def parse(cls, buffer: torch.Tensor) -> "Header | None":
        values = buffer.tolist()
        if len(values) != HEADER_LENGTH or values[0] != MAGIC:
            return None
        return cls(*values[1:])

    def describe(self, with_group: bool = False) -> str:
        action = _ACTIONS.get(self.kind, f"an unknown action ({self.kind})")
        if self.kind == GATHER:
            action = f"gather_stages(dst={None if self.extra < 0 else self.extra})"
        crossing = []
        if self.forward != NONE:
            crossing.append(f"micro-batch {self.forward} forward")
        if self.backward != NONE:
            crossing.append(f"micro-batch {self.backward} backward")
        where = f"tick {self.tick}" if self.kind in (STEP, DRAIN) else f"after {self.tick} ticks"
        text = f"{action} ({where}, {self.fed} micro-batches fed"
        if with_group:
            text += f", {self.group} in the open accumulation group"
        return text + (f"; expects {' and '.join(crossing)})" if crossing else ")")


def header_for(moment: Moment, left_stage: int, schedule, batch_sizes: dict[int, int], batch: int | None,
               digests: dict[int, int | None] | None = None) -> Header:
    """The header of the boundary between stage `left_stage` and the next one, as this rank sees it. `batch` is
    the inference or probed batch (INFER and PROBE only); `digests` those of the micro-batches' targets."""
    forward = backward = NONE
    if moment.kind in (STEP, DRAIN):
        found = schedule.forward_at(left_stage, moment.tick, moment.fed)
        forward = NONE if found is None else found + moment.first
        found = schedule.backward_at(left_stage + 1, moment.tick, moment.fed)
        backward = NONE if found is None else found + moment.first
    fed = moment.first + moment.fed
    last_batch = batch if batch is not None else batch_sizes.get(fed - 1, NONE)
    return Header(
        moment.kind,
        moment.global_tick,
        fed,
        moment.first,
        moment.group,
        forward,
        batch_sizes.get(forward, NONE) if forward != NONE else NONE,
        backward,
        batch_sizes.get(backward, NONE) if backward != NONE else NONE,
        last_batch,
        moment.extra,
        NONE if digests is None or digests.get(fed - 1) is None else digests[fed - 1],
    )


def check(left: Header | None, right: Header | None, left_rank: int, describe: Callable[[int], str]) -> None:
    """Compare the headers of ranks `left_rank` and `left_rank + 1` for their common boundary; raise the same
    error on both ranks if they disagree (PeerFailureError: out of step; StageMismatchError: batch sizes)."""
    names = describe(left_rank), describe(left_rank + 1)
    if left is None or right is None:
        garbled = names[0] if left is None else names[1]
        raise PeerFailureError(f"{garbled} sent a message that is not a pipeline header to its neighbour")
    if NONE in (left.last_targets, right.last_targets):  # a side without a digest: the targets are not compared
        left, right = replace(left, last_targets=NONE), replace(right, last_targets=NONE)
    if left == right:
        return
    if _position(left) != _position(right):
        group = left.group != right.group
        raise PeerFailureError(
            f"{names[0]} and {names[1]} are out of step: the first runs {left.describe(group)}, the second "
            f"runs {right.describe(group)}; {FEEDING_RULE}"
        )
    for micro_batch, a, b in (
        (left.forward, left.forward_batch, right.forward_batch),
        (left.backward, left.backward_batch, right.backward_batch),
        (left.fed - 1, left.last_batch, right.last_batch),
    ):
        if a != b:
            what = "the inference batch has" if left.kind == INFER else f"micro-batch {micro_batch} has"
            what = f"probed micro-batch {left.extra} has" if left.kind == PROBE else what
            raise StageMismatchError(
                f"{what} {_samples(a)} on {names[0]} but {_samples(b)} on {names[1]}: every rank must be fed the "
                "same micro-batches, of the same size"
            )
    if left.last_targets != right.last_targets:
        raise StageMismatchError(
            f"micro-batch {left.fed - 1} has other samples (sample indices, or targets where ranks feed no indices) "
            f"on {names[0]} than on {names[1]}: every rank must be fed "
            "the same micro-batches in the same order (seed the data order alike on every rank, e.g. "
            "DataLoader(..., generator=torch.Generator().manual_seed(0)))"
        )
    raise PeerFailureError(f"{names[0]} and {names[1]} disagree: {left.describe(True)} / {right.describe(True)}")


def _position(header: Header) -> tuple:
    """Everything but the batch sizes."""
    return (header.kind, header.tick, header.fed, header.first, header.group, header.forward, header.backward,
            header.extra)


def _samples(count: int) -> str:
    return "no known size" if count == NONE else f"{count} samples"
