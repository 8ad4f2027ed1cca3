"""Activations between stages are a tensor or a tuple of tensors (the two streams of a RevNet)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

Activation = torch.Tensor | tuple[torch.Tensor, ...]


def as_tuple(value: Activation) -> tuple[torch.Tensor, ...]:
    return value if isinstance(value, tuple) else (value,)


def like(template: Activation, tensors: tuple[torch.Tensor, ...]) -> Activation:
    """`tensors` in the structure of `template` (a bare tensor or a tuple)."""
    return tensors if isinstance(template, tuple) else tensors[0]


def detached(value: Activation, requires_grad: bool = False) -> Activation:
    tensors = tuple(t.detach().requires_grad_(requires_grad and t.is_floating_point()) for t in as_tuple(value))
    return like(value, tensors)


def nbytes(values: Iterable[torch.Tensor]) -> int:
    """Bytes held by distinct storages among `values` (views of one storage count once)."""
    seen, total = set(), 0
    for tensor in values:
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def to_device(value: Activation, device: torch.device | None) -> Activation:
    if device is None:
        return value
    return like(value, tuple(t.to(device, non_blocking=True) for t in as_tuple(value)))
