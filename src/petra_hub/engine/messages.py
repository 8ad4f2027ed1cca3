"""The byte layout of a message between two stages: activations (and gradients) packed into one uint8 buffer.

Each part of a message travels in its own dtype: the stream dtype, or a narrower wire dtype (`Precision.messages`)
for activations and gradients. An fp16 tensor on the wire is first multiplied by a power of two that brings its
largest magnitude near 2**14 (exact, and it keeps small gradients out of fp16's subnormal range); the float32
factors lead the message. Both ends derive the layout from the handshake's shapes, so only payload bytes travel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .tensors import Activation, as_tuple
from .transport import ActivationSpec

_FP16_TARGET = 2.0**14


@dataclass(frozen=True)
class Part:
    """One activation of a message: its shape and dtype (`spec`) and the dtype it travels in (None: its own)."""

    spec: ActivationSpec
    wire: torch.dtype | None = None

    def wire_dtype(self, index: int) -> torch.dtype:
        own = self.spec.tensors[index].dtype
        return own if self.wire is None or not own.is_floating_point else self.wire

    def scaled(self, index: int) -> bool:
        return self.wire_dtype(index) == torch.float16 and self.spec.tensors[index].dtype != torch.float16


def message_bytes(parts: list[Part], batch: int) -> int:
    total = 0
    for part in parts:
        for index, spec in enumerate(part.spec.tensors):
            total += spec.numel(batch) * part.wire_dtype(index).itemsize + (4 if part.scaled(index) else 0)
    return total


def narrow(tensor: torch.Tensor, part: Part, index: int) -> tuple[torch.Tensor, float | None]:
    """Tensor `index` of `part` as it travels, and its fp16 factor (None when not scaled)."""
    factor = _fp16_factor(tensor) if part.scaled(index) else None
    if factor is not None:
        tensor = tensor * factor
    return tensor.to(part.wire_dtype(index)), factor


def widen(tensor: torch.Tensor, dtype: torch.dtype, factor: float | None) -> torch.Tensor:
    """What `narrow` sent, back in `dtype`."""
    if factor is not None:
        return tensor.to(dtype) / factor
    return tensor if tensor.dtype == dtype else tensor.to(dtype)


def encode(values: list[Activation], parts: list[Part]) -> torch.Tensor:
    """One uint8 buffer holding `values` as `parts` describes them."""
    factors, payloads = [], []
    for value, part in zip(values, parts):
        for index, tensor in enumerate(as_tuple(value)):
            sent, factor = narrow(tensor, part, index)
            if factor is not None:
                factors.append(factor)
            payloads.append(sent.reshape(-1).view(torch.uint8))
    if factors:
        device = payloads[0].device
        payloads.insert(0, torch.tensor(factors, dtype=torch.float32, device=device).view(torch.uint8))
    return torch.cat(payloads) if len(payloads) > 1 else payloads[0].contiguous()


def decode(buffer: torch.Tensor, parts: list[Part], batch: int) -> list[Activation]:
    """The activations of a buffer `encode` made, each in its own dtype."""
    scaled = sum(part.scaled(i) for part in parts for i in range(len(part.spec.tensors)))
    factors = _view(buffer[: 4 * scaled], torch.float32).tolist() if scaled else []
    offset, values = 4 * scaled, []
    for part in parts:
        tensors = []
        for index, spec in enumerate(part.spec.tensors):
            wire = part.wire_dtype(index)
            size = spec.numel(batch) * wire.itemsize
            tensor = _view(buffer[offset : offset + size], wire).view(batch, *spec.shape)
            offset += size
            tensors.append(widen(tensor, spec.dtype, factors.pop(0) if part.scaled(index) else None))
        values.append(tuple(tensors) if part.spec.is_tuple else tensors[0])
    return values


def round_trip(values: list[Activation], parts: list[Part]) -> list[Activation]:
    """What the receiving stage would get, without building the buffer: `narrow` then `widen` on each tensor, as
    `encode` and `decode` do (so the values are bit-identical), laid out contiguously as `decode` lays them out
    (a strided view, such as one half of a concatenation's gradient, would otherwise reach a local stage with other
    strides than a remote one, and reductions over it, such as a per-channel gain's gradient, sum in another
    order); the identity for a contiguous tensor that travels in its own dtype."""
    result = []
    for value, part in zip(values, parts):
        tensors = tuple(_round(tensor, part, index) for index, tensor in enumerate(as_tuple(value)))
        result.append(tensors if isinstance(value, tuple) else tensors[0])
    return result


def _round(tensor: torch.Tensor, part: Part, index: int) -> torch.Tensor:
    if part.wire is None:  # it travels in its own dtype (the sender checked it is the spec's)
        return tensor.contiguous()
    sent, factor = narrow(tensor, part, index)
    return widen(sent, tensor.dtype, factor).contiguous()


def _fp16_factor(tensor: torch.Tensor) -> float:
    largest = float(tensor.detach().abs().max()) if tensor.numel() else 0.0
    if largest == 0.0 or not math.isfinite(largest):
        return 1.0  # a non-finite gradient must arrive non-finite (see precision: overflows travel down)
    return 2.0 ** max(-24, min(24, math.floor(math.log2(_FP16_TARGET / largest))))


def _view(chunk: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Reinterpret bytes as `dtype` (copying first if the chunk does not start on a multiple of its size)."""
    if chunk.storage_offset() % dtype.itemsize:
        chunk = chunk.clone()
    return chunk.view(dtype)
