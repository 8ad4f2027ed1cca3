"""What a stage worker keeps for a micro-batch between its forward and its backward, and how it runs the stage on
other weights (weight stashing, a kept graph's weight copies)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .randomness import RngState
from .tensors import Activation, as_tuple


@dataclass
class Pending:
    """What a stage keeps between the forward and the backward of one micro-batch."""

    inputs: Activation | None = None  # stored input (non-reversible stages, input-buffer modes)
    outputs: Activation | None = None  # output with its graph (backprop)
    graph_bytes: int = 0  # what a kept graph saved besides inputs and outputs (autograd holds it)
    weights: list[torch.Tensor] | None = None  # stashed weights (weight-stashing modes)
    rng: RngState | None = None  # the RNG state before the forward, if it drew random numbers (recomputing modes)
    unit_rngs: list[RngState | None] | None = None  # the same per member of a reversible StageGroup
    reference: Activation | None = None  # a copy of the input, to measure its reconstruction (sampled check)
    nbytes: int = 0  # the bytes of all the above, each storage once (the worker's running total for its peak)

    def tensors(self) -> list[torch.Tensor]:
        held = []
        for value in (self.inputs, self.outputs, self.reference):
            if value is not None:
                held.extend(as_tuple(value))
        return held


@contextlib.contextmanager
def stashed_weights(params: list[nn.Parameter], values: list[torch.Tensor] | None) -> Iterator[None]:
    """Temporarily run with `values` as the parameters' data (weight stashing)."""
    if values is None:
        yield
        return
    current = [p.data for p in params]
    for param, value in zip(params, values):
        param.data = value
    try:
        yield
    finally:
        for param, value in zip(params, current):
            param.data = value


class ParameterSlots:
    """Every place in `module` that holds one of `params` (a tied parameter is held in several), to run the module
    with other tensors in their place: what `torch.func.functional_call` does (it too writes `_parameters`), with the
    places found once instead of at every call."""

    def __init__(self, module: nn.Module, params: list[nn.Parameter]):
        position = {id(param): index for index, param in enumerate(params)}
        self.params = params
        self.slots = [(owner, name, position[id(value)]) for owner in module.modules()
                      for name, value in owner._parameters.items() if value is not None and id(value) in position]

    @contextlib.contextmanager
    def holding(self, tensors: list[torch.Tensor]) -> Iterator[None]:
        """Run the block with `tensors[i]` wherever the module holds `params[i]`."""
        for owner, name, index in self.slots:
            owner._parameters[name] = tensors[index]
        try:
            yield
        finally:
            for owner, name, index in self.slots:
                owner._parameters[name] = self.params[index]
