"""What a stage worker keeps for a micro-batch between its forward and its backward, and weight stashing."""

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
