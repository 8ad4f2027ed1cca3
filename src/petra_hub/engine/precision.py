"""Mixed precision for PETRA: what runs in low precision, what stays float32, and fp16 loss scaling per stage.

The policy (`Precision`):

* `compute`: the dtype stages compute in, under `torch.autocast` (bf16 or fp16; None: autocast off). Parameters,
  gradients and optimizer states stay float32 (autocast casts weights per operation).
* `streams`: the dtype of the activations that leave a stage (the two streams of a RevNet). float32 by default
  under autocast: the coupling `y1 = x2 + F(x1)` and its inversion `x2 = y1 - F(y2)` then round in float32, and
  only F itself runs in low precision. A reversible stage must return its streams in the dtype it received them
  in (it decides what runs in low precision; the contract test checks it); the worker casts the outputs of the
  other stages.
* `messages`: the dtype activations and gradients travel in between stages (None: the stream dtype). The output
  a stage sends back for its predecessor's reconstruction always travels in the stream dtype. The rounding is
  applied at every stage boundary, between ranks or inside one process alike, so a one-process run stays
  bit-identical to a multi-process one.

fp16 loss scaling (`LossScale`, one per stage): stages update at different ticks, so there is no single step to
skip. Each stage scales the gradient it receives by its own scale before backpropagating through itself, unscales
the gradient it sends and its parameter gradients, and checks them; messages carry true (unscaled) gradients. A
stage whose own backward overflowed skips the update of the accumulation group holding that micro-batch (no
optimizer or scheduler step) and halves its scale. A non-finite gradient travels on down the pipeline: every
stage below sees it arrive and skips its update of that group too. Such a stage backpropagates the gradient's
finite entries (the others zeroed), so that its own overflow, if its scale is too high too, is still seen and
halves its scale, while an overflow born above leaves it alone; it sends NaN on in its place. The stages
above the overflow had already applied that micro-batch's gradient (they never wait for the stages below; that is
PETRA's point), and keep it. So no NaN or inf reaches a weight, a micro-batch is dropped from the stage where it
overflowed downwards, and each stage's scale adapts to its own gradients. With data parallelism the replicas of a
stage agree (one all-reduce of the flag) before skipping.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .options import OptionError
from .tensors import Activation, as_tuple, like

DTYPE_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
LOW_PRECISION = (torch.bfloat16, torch.float16)


def parse_dtype(value: torch.dtype | str | None, what: str) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in DTYPE_NAMES:
        raise OptionError(what, f"one of {sorted(DTYPE_NAMES)} (or a torch.dtype)", value)
    return DTYPE_NAMES[value]


def short_name(dtype: torch.dtype | None) -> str:
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}
    return "native" if dtype is None else names.get(dtype, str(dtype).replace("torch.", ""))


@dataclass(frozen=True)
class Precision:
    """See the module docstring. `Precision.of("bf16")` is bf16 compute with float32 streams and messages."""

    compute: torch.dtype | None = None
    streams: torch.dtype | None = None
    messages: torch.dtype | None = None
    initial_scale: float = 2.0**16  # fp16 only
    growth_interval: int = 2000  # fp16 only: clean updates of a stage before its scale doubles

    def __post_init__(self):
        if self.compute not in (None, *LOW_PRECISION):
            raise OptionError("compute", "bf16, fp16 or None (autocast off)", self.compute)
        if self.streams not in (None, torch.float32, torch.bfloat16):
            raise OptionError("streams", "fp32 or bf16", self.streams)
        if self.messages not in (None, torch.float32, *LOW_PRECISION):
            raise OptionError("messages", "fp32, bf16 or fp16", self.messages)
        if self.initial_scale <= 0 or self.growth_interval < 1:
            raise ValueError("initial_scale must be > 0 and growth_interval >= 1")

    @classmethod
    def of(cls, compute: str | torch.dtype | None = None, streams: str | torch.dtype | None = None,
           messages: str | torch.dtype | None = None, **scaling) -> "Precision":
        """A policy from names ("bf16", "fp16", "fp32"). Under autocast the streams default to float32."""
        compute = parse_dtype(compute, "compute")
        compute = None if compute == torch.float32 else compute
        streams = parse_dtype(streams, "streams")
        if streams is None and compute is not None:
            streams = torch.float32
        return cls(compute, streams, parse_dtype(messages, "messages"), **scaling)

    @property
    def scales_loss(self) -> bool:
        return self.compute == torch.float16

    def autocast(self, device: torch.device):
        if self.compute is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=self.compute)

    def cast_streams(self, value: Activation) -> Activation:
        """`value` with its floating tensors in the stream dtype (unchanged when the policy sets none)."""
        if self.streams is None:
            return value
        tensors = as_tuple(value)
        if all(t.dtype == self.streams or not t.is_floating_point() for t in tensors):
            return value
        return like(value, tuple(t.to(self.streams) if t.is_floating_point() else t for t in tensors))

    def describe(self) -> str:
        text = f"compute {short_name(self.compute)}, streams {short_name(self.streams)}"
        text += f", messages {short_name(self.messages)}" if self.messages is not None else ""
        return text + (f", loss scale {self.initial_scale:g} per stage" if self.scales_loss else "")


class LossScale:
    """One stage's dynamic fp16 loss scale and what its open accumulation group has seen: halved on an overflow
    of its own backward, doubled after `growth_interval` clean updates. Kept a power of two, so scaling and
    unscaling are exact. The worker calls `scale_incoming` / `unscale_outgoing` around each backward and
    `group_overflowed` before each update."""

    def __init__(self, initial: float, growth_interval: int):
        self.scale = float(initial)
        self.growth_interval = growth_interval
        self.clean_updates = 0
        self.overflows = 0
        self._own = self._upstream = False  # a non-finite gradient in the open group, born here / arrived
        self._arrived_now = False  # the gradient being backpropagated arrived non-finite

    def scale_incoming(self, grads: Activation) -> Activation:
        """The gradient to backpropagate through the stage: scaled, its non-finite entries (an overflow above)
        zeroed."""
        tensors = as_tuple(grads)
        self._arrived_now = not all_finite(tensors)
        if self._arrived_now:
            self._upstream = True
            tensors = tuple(torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0) for g in tensors)
        return like(grads, tuple(g * self.scale for g in tensors))

    def unscale_outgoing(self, grads: Activation) -> Activation:
        """The true gradient to send on; NaN where a non-finite one arrived, so the stages below drop it too."""
        grads = like(grads, tuple(g / self.scale for g in as_tuple(grads)))
        if not all_finite(as_tuple(grads)):
            self._own = True
        if self._arrived_now:
            grads = like(grads, tuple(torch.full_like(g, float("nan")) for g in as_tuple(grads)))
        return grads

    def group_overflowed(self, params, agree: Callable[[bool], bool] | None = None) -> bool:
        """Whether to drop the group whose (unscaled) gradients `params` hold; halves the scale if the overflow
        was born here. `agree` makes data-parallel replicas reach the same answer (any of them skips)."""
        own = self._own or not all_finite(p.grad for p in params)
        skip = own or self._upstream
        if agree is not None:
            skip = agree(skip)
        self._own = self._upstream = False
        if own:
            self.overflowed()
        return skip

    def overflowed(self) -> None:
        self.scale = max(self.scale / 2.0, 2.0**-24)
        self.clean_updates = 0
        self.overflows += 1

    def updated(self) -> None:
        self.clean_updates += 1
        if self.clean_updates == self.growth_interval:
            self.scale = min(self.scale * 2.0, 2.0**24)
            self.clean_updates = 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_updates": self.clean_updates, "overflows": self.overflows}

    def load_state_dict(self, state: dict) -> None:
        self.scale = float(state["scale"])
        self.clean_updates = int(state["clean_updates"])
        self.overflows = int(state.get("overflows", 0))

    def group_state(self) -> dict:
        """Whether the open accumulation group has met a non-finite gradient (born here, or arrived)."""
        return {"own": self._own, "upstream": self._upstream}

    def load_group_state(self, state: dict) -> None:
        self._own, self._upstream = bool(state["own"]), bool(state["upstream"])


def all_finite(tensors) -> bool:
    """One synchronisation for any number of tensors."""
    tensors = [t for t in tensors if t is not None]
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())
