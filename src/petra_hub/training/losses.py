"""The training losses between logs: produced by the last stage, collected on every rank at step ends."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from transformers.utils import logging

from ..engine import Pipeline
from .distributed import all_reduce_sum

logger = logging.get_logger(__name__)


@dataclass
class LossWindow:
    """Training losses collected since the window opened, weighted as Trainer averages them: each micro-batch's loss
    divided by the micro-batches of its step, so that `mean()` is the mean of the steps' mean losses (a step that
    closes an epoch early weighs as much as a full one)."""

    loss_sum: float = 0.0
    steps: float = 0.0  # the steps the losses make up: a micro-batch counts 1 / (micro-batches in its step)
    samples: int = 0
    opened: float = field(default_factory=time.time)

    def merge(self, other: "LossWindow") -> None:
        self.loss_sum += other.loss_sum
        self.steps += other.steps
        self.samples += other.samples

    def mean(self) -> float:
        return self.loss_sum / self.steps if self.steps else 0.0


class PendingLosses:
    """This rank's losses from the last stage, by micro-batch, until a collection takes those whose step has closed
    (a loss may come before its step closes, in the synchronous modes, or steps later, in the pipelined ones)."""

    def __init__(self) -> None:
        self.losses: dict[int, torch.Tensor] = {}  # on the last stage's device until taken: no wait per micro-batch
        self.samples = 0
        self.step_sizes: dict[int, int] = {}  # micro-batch -> micro-batches of its step, for the closed steps
        self.open_from = 0  # the first micro-batch of the open step

    def add(self, losses: list, samples: int = 0) -> None:
        self.losses.update((index, loss.detach()) for index, loss in losses)
        self.samples += samples

    def close_step(self, stop: int) -> None:
        """The open step holds the micro-batches before `stop` (the pipeline's count fed)."""
        self.step_sizes.update((index, stop - self.open_from) for index in range(self.open_from, stop))
        self.open_from = stop

    def open_steps(self) -> list[list[int]]:
        """[micro-batch, micro-batches of its step] for the closed steps whose losses have not all been taken: what a
        checkpoint taken with micro-batches in flight keeps, so that their losses count as they would have."""
        return [[index, size] for index, size in sorted(self.step_sizes.items())]

    def resume(self, open_steps: list[list[int]], fed: int) -> None:
        """Continue after `open_steps` (from `open_steps`), with `fed` micro-batches fed before the next step."""
        self.step_sizes = {int(index): int(size) for index, size in open_steps}
        self.open_from = fed

    def take(self) -> LossWindow:
        window, self.samples = LossWindow(samples=self.samples), 0
        closed = [index for index in self.losses if index in self.step_sizes]
        if not closed:
            return window
        values = torch.stack([self.losses.pop(index) for index in closed]).tolist()  # one wait, not one each
        for index, value in zip(closed, values):
            share = 1 / self.step_sizes.pop(index)
            window.loss_sum += value * share
            window.steps += share
        return window


def collect(pending: LossWindow, global_step: int, last_stage: int) -> LossWindow:
    """`pending` (this rank's) summed over all ranks, with this rank's samples (one small collective); raises on a
    NaN or infinite loss so that every rank stops at the same step."""
    bad = not math.isfinite(pending.loss_sum)
    values = torch.tensor([0.0 if bad else pending.loss_sum, pending.steps, float(bad)], dtype=torch.float64)
    loss_sum, steps, bad = all_reduce_sum(values).tolist()
    if bad:
        raise FloatingPointError(
            f"loss is NaN or infinite at global step {global_step} (computed by the last stage, stage {last_stage}); "
            "stopping before anything else is saved"
        )
    return LossWindow(loss_sum, steps, pending.samples)


def grad_norm(pipeline: Pipeline, replicas: int) -> float | None:
    """The norm over all stages of their last averaged gradients, before clipping (a collective); None before any
    stage has updated. Each stage's square travels in its own slot and the squares are summed in stage order, so the
    norm is the same to the last bit on any number of processes."""
    squares = torch.zeros(2, pipeline.num_stages, dtype=torch.float64)
    for index, counter in pipeline.counters().items():
        if counter.grad_norm is not None:
            squares[:, index] = torch.tensor([counter.grad_norm**2, 1.0], dtype=torch.float64)
    squares = all_reduce_sum(squares)
    if not squares[1].any():
        return None
    return math.sqrt(sum(float(square) for square in squares[0]) / replicas)  # replicas hold equal gradients


def reconstruction_error(pipeline: Pipeline, args) -> dict[str, float]:
    """The largest relative error among the inputs the reversible stages last rebuilt and checked (a collective),
    as a log entry; warns when it exceeds `args.petra_reconstruction_warning`."""
    stages, replicas = pipeline.num_stages, args.petra_data_parallel
    errors = torch.zeros(stages * replicas, dtype=torch.float64)
    for index, counters in pipeline.counters().items():
        if counters.reconstruction_error is not None:
            errors[pipeline.replica * stages + index] = counters.reconstruction_error
    worst = float(all_reduce_sum(errors).max())
    if worst > args.petra_reconstruction_warning:
        logger.warning(
            "reconstruction_error %.3g exceeds petra_reconstruction_warning %g: the inputs the reversible stages "
            "rebuild drift from those they received (lower the learning rate, or use float32 streams)",
            worst, args.petra_reconstruction_warning,
        )
    return {"reconstruction_error": worst}


def training_logs(window: LossWindow, pipeline: Pipeline, args, learning_rate: float | None = None) -> dict[str, float]:
    """A training log entry: the mean loss of `window`, the gradient norm, the reconstruction error (when checked),
    the learning rate and the samples per second (collectives: call on every rank).

    `learning_rate` is what transformers' Trainer logs, the schedule's rate at the logged step
    (`StageSchedules.learning_rate`); without it, the rate stage 0's last update used, which lags the logged step:
    stage i applies a step's group 2(J-1-i) micro-batches after it closes."""
    logs = {}
    if window.steps:
        logs["loss"] = window.mean()
    norm = grad_norm(pipeline, args.petra_data_parallel)  # logged clipping or not, as in Trainer
    if norm is not None:
        logs["grad_norm"] = norm
    if args.petra_check_reconstruction_every:
        logs.update(reconstruction_error(pipeline, args))
    if learning_rate is None:
        learning_rate = pipeline.last_lr()
    if learning_rate is not None:
        logs["learning_rate"] = learning_rate
    elapsed = time.time() - window.opened
    if elapsed > 0 and window.samples:
        logs["samples_per_second"] = round(window.samples / elapsed, 3)
    return logs
