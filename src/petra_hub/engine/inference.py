"""Inference through this rank's stages: eval mode, the precision policy, and boundaries crossed as in training."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from .messages import round_trip
from .precision import Precision
from .routing import Router
from .tensors import Activation, as_tuple


@contextlib.contextmanager
def evaluating(stages: list[nn.Module]) -> Iterator[None]:
    """The stages in eval mode (running statistics, no dropout), every module of each restored to its own mode
    afterwards: `stage.train(True)` would also put a sub-module the user keeps in eval mode (a frozen batch norm) back
    in training mode."""
    modes = [(module, module.training) for stage in stages for module in stage.modules()]
    stage_modes = [stage.training for stage in stages]
    try:
        for stage in stages:
            stage.eval()
        yield
    finally:
        for stage, training in zip(stages, stage_modes):
            stage.train(training)  # as before (a stage's own `train` runs), then each sub-module's flag as it was
        for module, training in modes:
            module.training = training


def forward_local(stages: list[nn.Module], local: range, value: Activation, precision: Precision,
                  router: Router) -> Activation:
    """`value` through the `local` stages under the policy's autocast; outputs cast to the stream dtype and, between
    two local stages, rounded as crossing to another rank would (so one process equals many) and checked against the
    handshake's spec as a message to another rank is."""
    batch = as_tuple(value)[0].shape[0]
    for index in local:
        with precision.autocast(as_tuple(value)[0].device):
            value = stages[index](value)
        if index + 1 in local:
            value, parts = precision.cast_streams(value), router.forward_parts(index)
            router.check_sent(index, [value], parts, batch, "the inference batch", ("its output",))
            (value,) = round_trip([value], parts)
        elif index < len(stages) - 1:
            value = precision.cast_streams(value)
    return value
