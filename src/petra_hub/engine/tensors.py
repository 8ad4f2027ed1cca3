"""Activations between stages are a tensor or a tuple of tensors (the two streams of a RevNet)."""

from __future__ import annotations

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


def in_graph(outputs: Activation, grads: Activation) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tensors of `outputs` that are part of an autograd graph, and their gradients among `grads`. The others (an
    integer mask carried along, an input the first stage passes on unchanged) have nothing to backpropagate; the
    gradient that arrives for them is zeros, as every stage sends for an input that takes no gradient."""
    pairs = [(output, grad) for output, grad in zip(as_tuple(outputs), as_tuple(grads)) if output.requires_grad]
    return [output for output, _ in pairs], [grad for _, grad in pairs]


def backpropagate(outputs: Activation, grad_outputs: Activation) -> None:
    """Backpropagate `grad_outputs` through those of `outputs` that are part of the graph (`in_graph`)."""
    tensors, grads = in_graph(outputs, grad_outputs)
    if tensors:
        torch.autograd.backward(tensors, grads)


def to_device(value: Activation, device: torch.device | None) -> Activation:
    if device is None:
        return value
    return like(value, tuple(t.to(device, non_blocking=True) for t in as_tuple(value)))
