"""Where each tick's messages go: an in-process mailbox between stages of one rank, the transport between ranks.

Both ends derive from the schedule which micro-batch flows at each tick, and from the start-up handshake the shape
of each boundary (`specs`). Before the payloads, neighbouring ranks swap a fixed-size header (`protocol`) that
confirms they agree on all of it, batch sizes included. A stage gets its own output back (with the gradient) only
when it rebuilds its input from it.

Every value a stage sends (to a stage of this rank or of another) must match the boundary's spec: the same
structure, dtypes and per-sample shapes, with the micro-batch's samples first. The sender compares shapes (never
data) and raises a StageMismatchError naming the stage before anything is posted, in one process as in many, so a
stage whose output changes after the handshake can neither make gloo abort the receiver nor leave part of its
buffer unwritten.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from .digest import targets_digest
from .errors import StageMismatchError
from .messages import Part, decode, encode, message_bytes, round_trip
from .protocol import HEADER_LENGTH, Header, Moment, check, header_for
from .schedule import Schedule
from .snapshot import saved_activation
from .tensors import Activation, as_tuple, to_device
from .transport import ActivationSpec, Incoming, NeighbourTransport, Outgoing, Posted

FORWARD_TAG, BACKWARD_TAG, INFER_TAG, HEADER_TAG, PROBE_FORWARD_TAG, PROBE_BACKWARD_TAG = 1, 2, 3, 4, 5, 6
_OUTPUT, _BACKWARD = ("its output",), ("its rebuilt input", "the gradient of its input")  # what a stage sends


class Router:
    """Delivers activations forward and (input, gradient) pairs backward for the stages `local` of pipeline rank
    `rank`. `reconstructs[i]` says whether stage i rebuilds its input (and so needs its output sent back).
    `wire`: the dtype activations and gradients cross a stage boundary in (None: their own; see `messages`)."""

    def __init__(
        self,
        rank: int,
        local: range,
        num_stages: int,
        reconstructs: list[bool],
        schedule: Schedule,
        transport: NeighbourTransport | None,
        wire: torch.dtype | None = None,
    ):
        self.rank = rank
        self.wire = wire
        self.local = local
        self.num_stages = num_stages
        self.reconstructs = reconstructs
        self.schedule = schedule
        self.transport = transport
        self.specs: dict[int, ActivationSpec] = {}  # output spec of stage i, for the boundaries this rank touches
        self.batch_sizes: dict[int, int] = {}  # micro-batch -> its number of samples
        self.digests: dict[int, int | None] = {}  # micro-batch -> the digest of its targets
        self._mail: dict[tuple[int, str], dict[int, Any]] = defaultdict(dict)

    def note_fed(self, micro_batch: int, batch_size: int, key: Any) -> None:
        """A micro-batch fed: its size and, where ranks swap headers, the digest of what identifies it (`digest`:
        its sample indices, or its targets)."""
        self.batch_sizes[micro_batch] = batch_size
        if self.transport is not None:
            self.digests[micro_batch] = targets_digest(key)

    def forget(self, micro_batch: int) -> None:
        """A micro-batch that has crossed every boundary for good."""
        self.batch_sizes.pop(micro_batch, None)
        self.digests.pop(micro_batch, None)

    def forget_fed(self) -> None:
        """After a drain: every micro-batch fed has crossed every boundary."""
        self.batch_sizes.clear()
        self.digests.clear()

    # -- the mailbox ------------------------------------------------------------------------------------------------
    def put_input(self, micro_batch: int, inputs: Activation) -> None:
        """The pipeline's input for stage 0."""
        self._mail[(0, "forward")][micro_batch] = inputs

    def forward_input(self, index: int, micro_batch: int) -> Activation:
        return self._mail[(index, "forward")].pop(micro_batch)

    def backward_input(self, index: int, micro_batch: int) -> tuple[Activation | None, Activation]:
        """(this stage's output sent back, or None; the gradient of that output)."""
        return self._mail[(index, "backward")].pop(micro_batch)

    def forward_parts(self, left_stage: int) -> list[Part]:
        """The layout of the activations stage `left_stage` sends forward."""
        return [Part(self.specs[left_stage], self.wire)]

    def backward_parts(self, left_stage: int) -> list[Part]:
        """The layout of what stage `left_stage + 1` sends back: its input, exact, if `left_stage` reconstructs,
        then the gradient."""
        returned = [Part(self.specs[left_stage])] if self.reconstructs[left_stage] else []
        return returned + self.gradient_parts(left_stage)

    def gradient_parts(self, left_stage: int) -> list[Part]:
        """The layout of the gradient of stage `left_stage`'s output, as it crosses back."""
        return [Part(self.specs[left_stage], self.wire)]

    def send_forward(self, index: int, micro_batch: int, outputs: Activation, outgoing: list[Outgoing]) -> None:
        parts = self.forward_parts(index)
        batch = self.batch_sizes[micro_batch]
        self.check_sent(index, [outputs], parts, batch, f"micro-batch {micro_batch}", _OUTPUT)
        if index + 1 in self.local:
            (self._mail[(index + 1, "forward")][micro_batch],) = round_trip([outputs], parts)
        else:
            outgoing.append(Outgoing(self.rank + 1, FORWARD_TAG, encode([outputs], parts)))

    def send_backward(self, index: int, micro_batch: int, inputs, grad_inputs, outgoing: list[Outgoing]) -> None:
        if index == 0:
            return
        parts = self.backward_parts(index - 1)
        values = [inputs, grad_inputs] if self.reconstructs[index - 1] else [grad_inputs]
        batch = self.batch_sizes[micro_batch]
        self.check_sent(index, values, parts, batch, f"micro-batch {micro_batch}", _BACKWARD[-len(values):])
        if index - 1 in self.local:
            values = round_trip(values, parts)
            self._mail[(index - 1, "backward")][micro_batch] = _returned_and_gradient(values)
        else:
            outgoing.append(Outgoing(self.rank - 1, BACKWARD_TAG, encode(values, parts)))

    def check_sent(self, index: int, values: list[Activation], parts: list[Part], batch: int, which: str,
                   names: tuple[str, ...]) -> None:
        """Raise a StageMismatchError naming stage `index` if a value it sends (`values`, laid out as `parts`; what
        each is: `names`) is not what the handshake recorded for its boundary, with `batch` samples first. Compares
        shapes and dtypes only: it runs for every message."""
        for value, part, what in zip(values, parts, names):
            found = part.spec.mismatch(value, batch)
            if found is None:
                continue
            raise StageMismatchError(
                f"{self._stage(index)} sends {what} for {which} ({batch} samples) as {found}, but the start-up "
                f"handshake recorded {part.spec.describe()} for it (B = {batch}): a stage must return the same "
                "structure, dtypes and per-sample shapes for every micro-batch, with the batch as the first dimension "
                "of every tensor"
            )

    def _stage(self, index: int) -> str:
        """How errors name a stage: with its rank when there are several."""
        return f"stage {index}" + (f" on {self.transport.describe(self.rank)}" if self.transport else "")

    def waiting(self, index: int) -> list[torch.Tensor]:
        """The tensors of the messages delivered to stage `index` and not yet consumed: its device holds them."""
        forward = list(self._mail.get((index, "forward"), {}).values())
        backward = [value for pair in self._mail.get((index, "backward"), {}).values() for value in pair]
        return [t for value in forward + backward if value is not None for t in as_tuple(value)]

    def mail_for(self, index: int) -> dict:
        """The messages delivered to stage `index` for its next ticks, as CPU copies (see `snapshot`)."""
        forward = self._mail.get((index, "forward"), {})
        backward = self._mail.get((index, "backward"), {})
        return {
            "forward": {m: saved_activation(value) for m, value in forward.items()},
            "backward": {m: (saved_activation(returned), saved_activation(grad)) for m, (returned, grad) in
                         backward.items()},
        }

    def load_mail(self, index: int, saved: dict, device: torch.device | None) -> None:
        """Deliver again to stage `index` what `mail_for` gave."""
        for m, value in saved["forward"].items():
            self._mail[(index, "forward")][int(m)] = to_device(value, device)
        for m, (returned, grad) in saved["backward"].items():
            returned = None if returned is None else to_device(returned, device)
            self._mail[(index, "backward")][int(m)] = (returned, to_device(grad, device))

    def leftovers(self) -> list[tuple[int, str]]:
        return [key for key, box in self._mail.items() if box]

    # -- between ranks ------------------------------------------------------------------------------------------------
    def exchange(self, outgoing: list[Outgoing], moment: Moment, headers: Posted | None = None) -> None:
        """Swap this tick's headers (those `post_headers` started at the start of the tick, so that they travel
        during its computation), then its messages, with the neighbouring ranks, and file what arrives for the next
        tick. `moment.tick` and `moment.fed` count from the schedule's origin, where micro-batch `moment.first`
        entered. The whole exchange is bounded by one timeout."""
        deadline = self.transport.deadline()
        self.agree(moment, deadline=deadline, headers=headers)
        tick, fed, first = moment.tick, moment.fed, moment.first
        incoming, arrivals = [], []
        if self.local.start > 0:
            source = self.local.start - 1
            forward = self.schedule.forward_at(source, tick, fed)
            if forward is not None:
                micro_batch = forward + first
                batch = self.batch_sizes[micro_batch]
                size = message_bytes(self.forward_parts(source), batch)
                incoming.append(Incoming(self.rank - 1, FORWARD_TAG, size, torch.uint8, "activations"))
                arrivals.append(("forward", micro_batch, batch))
        if self.local.stop < self.num_stages:
            source = self.local.stop
            backward = self.schedule.backward_at(source, tick, fed)
            if backward is not None:
                micro_batch = backward + first
                batch = self.batch_sizes[micro_batch]
                size = message_bytes(self.backward_parts(source - 1), batch)
                incoming.append(Incoming(self.rank + 1, BACKWARD_TAG, size, torch.uint8, "gradients"))
                arrivals.append(("backward", micro_batch, batch))
        buffers = self.transport.exchange(self.rank, outgoing, incoming, moment.global_tick, deadline)
        for (kind, micro_batch, batch), buffer in zip(arrivals, buffers):
            if kind == "forward":
                first_local = self.local.start
                (value,) = decode(buffer, self.forward_parts(first_local - 1), batch)
                self._mail[(first_local, "forward")][micro_batch] = value
            else:
                last = self.local.stop - 1
                values = decode(buffer, self.backward_parts(last), batch)
                self._mail[(last, "backward")][micro_batch] = _returned_and_gradient(values)

    def post_headers(self, moment: Moment, sides: str = "both", batch: int | None = None) -> Posted:
        """Start swapping headers with the neighbouring ranks (`sides`: "both", "left" or "right"); `agree` ends it.
        `batch`: the inference batch."""
        device = self.transport.device
        mine = {
            peer: header_for(moment, self._boundary(peer), self.schedule, self.batch_sizes, batch, self.digests)
            for peer in self._neighbours(sides)
        }
        outgoing = [Outgoing(peer, HEADER_TAG, header.tensor(device), "the header") for peer, header in mine.items()]
        incoming = [Incoming(peer, HEADER_TAG, HEADER_LENGTH, torch.int64, "the header") for peer in mine]
        posted = self.transport.post(outgoing, incoming, self.rank, moment.global_tick)
        posted.headers = mine
        return posted

    def agree(self, moment: Moment, sides: str = "both", batch: int | None = None, deadline: float | None = None,
              headers: Posted | None = None) -> None:
        """Swap headers with the neighbouring ranks (or finish `headers`, already posted) and check that each pair
        agrees; a disagreement raises the same error on both ranks of the pair."""
        headers = headers if headers is not None else self.post_headers(moment, sides, batch)
        buffers = self.transport.wait(headers, self.rank, moment.global_tick, deadline)
        for (peer, mine), buffer in zip(headers.headers.items(), buffers):
            theirs = Header.parse(buffer)
            if peer < self.rank:
                check(theirs, mine, peer, self.transport.describe)
            else:
                check(mine, theirs, self.rank, self.transport.describe)

    def _neighbours(self, sides: str) -> list[int]:
        neighbours = []
        if sides in ("both", "left") and self.local.start > 0:
            neighbours.append(self.rank - 1)
        if sides in ("both", "right") and self.local.stop < self.num_stages:
            neighbours.append(self.rank + 1)
        return neighbours

    def _boundary(self, peer: int) -> int:
        """The stage on the left of the boundary with neighbouring rank `peer`."""
        return (self.local.start if peer < self.rank else self.local.stop) - 1

    def receive_for_inference(self, batch: int, moment: Moment) -> Activation:
        (value,) = self.receive_alone("left", INFER_TAG, self.forward_parts(self.local.start - 1), batch, moment)
        return value

    def send_for_inference(self, value: Activation, batch: int, moment: Moment) -> None:
        self.send_alone("right", INFER_TAG, [value], self.forward_parts(self.local.stop - 1), batch, moment)

    def receive_alone(self, side: str, tag: int, parts: list[Part], batch: int, moment: Moment) -> list[Activation]:
        """One message from the neighbouring rank on `side` ("left" or "right"), outside the tick exchange (after
        agreeing on `moment` with it)."""
        deadline = self.transport.deadline()
        self.agree(moment, side, batch, deadline)
        peer = self.rank - 1 if side == "left" else self.rank + 1
        message = Incoming(peer, tag, message_bytes(parts, batch), torch.uint8, "activations" if side == "left"
                           else "gradients")
        (buffer,) = self.transport.exchange(self.rank, [], [message], moment.global_tick, deadline)
        return decode(buffer, parts, batch)

    def send_alone(self, side: str, tag: int, values: list[Activation], parts: list[Part], batch: int,
                   moment: Moment) -> None:
        """The counterpart of `receive_alone` on the neighbouring rank on `side`."""
        index = self.local.stop - 1 if side == "right" else self.local.start
        self.check_sent(index, values, parts, batch, "the inference batch" if tag == INFER_TAG else "the probe",
                        _OUTPUT if side == "right" else _BACKWARD[-1:])
        buffer = encode(values, parts)
        deadline = self.transport.deadline()
        self.agree(moment, side, batch, deadline)
        peer = self.rank - 1 if side == "left" else self.rank + 1
        self.transport.exchange(self.rank, [Outgoing(peer, tag, buffer)], [], moment.global_tick, deadline)

def _returned_and_gradient(values: list) -> tuple:
    """(the input sent back for reconstruction or None, the gradient) from a backward message's parts."""
    return (values[0], values[1]) if len(values) == 2 else (None, values[0])


def empty_like_spec(spec: ActivationSpec, batch: int, device: torch.device) -> Activation:
    """A zero activation of `batch` samples shaped like `spec` (for dry runs)."""
    return spec.unflatten(torch.zeros(spec.numel(batch), dtype=spec.dtype, device=device), batch)
