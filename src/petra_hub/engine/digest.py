"""A cheap digest of a micro-batch's targets, which neighbouring ranks compare in every header: every rank must feed
the same micro-batches in the same order, and a rank whose data loader shuffles in its own order pairs the first
stage's images with other images' labels at the last stage, training on noise without any other error.

Only the targets are compared: the inputs matter on the first stage alone, so ranks whose random augmentations
differ still train correctly. The digest is exact integer arithmetic on the targets' bits (at most 4096 evenly
strided elements of each tensor, each position weighted by its own large number, so that a reordering changes it),
so equal targets give equal digests on every rank."""

from __future__ import annotations

import dataclasses

import torch

SAMPLED = 4096
MAX_TENSORS = 16  # of a micro-batch's targets (a detection batch holds a dict of tensors per image)
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def targets_digest(targets) -> int | None:
    """The digest of the CPU tensors in `targets` (a tensor, or tuples, lists, dicts or dataclasses of tensors: the
    first `MAX_TENSORS`); None where it holds none (reading a device tensor would wait for the device), which the
    neighbours then do not compare: a rank may pass no targets where it runs no last stage."""
    tensors = [tensor for tensor in _tensors_in(targets) if tensor.device.type == "cpu"][:MAX_TENSORS]
    if not tensors:
        return None
    total = 0
    for tensor in tensors:
        flat = tensor.detach().reshape(-1)
        flat = flat[:: max(1, flat.numel() // SAMPLED)][:SAMPLED].contiguous()
        if flat.is_floating_point() or flat.is_complex():
            flat = flat.view(torch.float32) if flat.is_complex() else flat
            flat = flat.view(_BITS[flat.element_size()])
        weights = torch.arange(1, flat.numel() + 1, dtype=torch.int64) * 0x9E3779B97F4A7C1  # wraps
        total = (total * 1_000_003 + int((flat.to(torch.int64) * weights).sum()) + flat.numel()) % (1 << 61)
    return total


def _tensors_in(value, depth: int = 0) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    if depth > 3:
        return []
    if isinstance(value, dict):
        value = list(value.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = [getattr(value, field.name) for field in dataclasses.fields(value)]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in _tensors_in(item, depth + 1)]
    return []
