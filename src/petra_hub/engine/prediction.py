"""Weight prediction: a stage runs each forward at an extrapolation of its weights to the time of the matching
backward (SpecTrain, Chen et al. 2018; PipeMare's discrepancy correction, Yang et al. 2021).

In a pipelined mode stage j runs the backward of a micro-batch after those of the micro-batches already in flight
there: d = (micro-batches in flight) / k more updates of its own, 2(J-1-j)/k in steady state, fewer while the
pipeline fills after a start or a drain. PETRA's backward uses the weights of that later time (to rebuild the input
and for the Jacobians) while the forward ran with the older ones. With `weight_prediction=h` the forward runs at

    theta_hat = theta + h * d * delta,    delta = theta after its last update - theta before it,

so the activations sent up (and, for reversible stages, the input rebuilt later from them) come from weights close
to those of the backward: the gradient approaches the end-to-end gradient at the backward's weights. h = 1
extrapolates over the whole delay; with momentum SGD `delta` is a smooth estimate of the coming steps. The backward
and the update are unchanged. Costs: `delta` (one copy of the stage's weights) and one multiply-add per weight and
forward; nothing for the last stage (d = 0) or in synchronous modes.
"""

from __future__ import annotations

import torch
from torch import nn


class WeightPredictor:
    """One stage's extrapolation over h times the updates ahead of each forward (h = 0: off)."""

    def __init__(self, h: float = 0.0):
        if h < 0:
            raise ValueError(f"weight_prediction must be >= 0 (0: off), got {h}")
        self.h = h
        self.delta: list[torch.Tensor] | None = None
        self._before: list[torch.Tensor] | None = None

    @property
    def active(self) -> bool:
        return self.h > 0

    def predicted(self, params: list[nn.Parameter], updates_ahead: float) -> list[torch.Tensor] | None:
        """The weights for a forward whose backward comes `updates_ahead` updates from now; None where nothing is
        predicted (off, nothing ahead, or before the first update)."""
        if not self.active or self.delta is None or updates_ahead <= 0:
            return None
        return [p.detach() + self.h * updates_ahead * d for p, d in zip(params, self.delta)]

    def held(self) -> list[torch.Tensor]:
        """What the predictor keeps between updates: `delta`, once there has been an update."""
        return list(self.delta or ())

    def before_update(self, params: list[nn.Parameter]) -> None:
        if self.active:
            self._before = [p.detach().clone() for p in params]

    def after_update(self, params: list[nn.Parameter]) -> None:
        if self._before is not None:
            self.delta = [p.detach() - before for p, before in zip(params, self._before)]
            self._before = None

    def state_dict(self) -> dict:
        return {"delta": self.delta}

    def load_state_dict(self, state: dict, params: list[nn.Parameter], where: str = "weight prediction") -> None:
        """Restore what `state_dict` returned for a stage whose (trainable) parameters are `params`: each delta cast
        to its parameter's device and dtype (as torch's `Optimizer.load_state_dict` casts its states, so that one
        saved on another device, or from stages of another dtype, loads), a count or a shape that differs from the
        parameters' a ValueError naming `where` (not an error at the first forward, or a silent broadcast)."""
        delta = state["delta"]
        if delta is None:
            self.delta = None
            return
        if not isinstance(delta, (list, tuple)) or not all(torch.is_tensor(d) for d in delta):
            raise ValueError(f"{where}: the weight-prediction delta must be a list of tensors, got "
                             f"{type(delta).__name__}")
        if len(delta) != len(params):
            raise ValueError(f"{where}: the weight-prediction state holds {len(delta)} delta tensor(s), the stage has "
                             f"{len(params)} trainable parameter(s)")
        for index, (d, p) in enumerate(zip(delta, params)):
            if d.shape != p.shape:
                raise ValueError(f"{where}: weight-prediction delta {index} has shape {list(d.shape)}, its parameter "
                                 f"{list(p.shape)}")
        self.delta = [d.detach().to(p) for d, p in zip(delta, params)]
