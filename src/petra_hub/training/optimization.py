"""One optimizer and one LR scheduler per stage, chosen by the usual `TrainingArguments` fields."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import Trainer, get_scheduler

from ..engine import Mode, Schedule
from ..engine.optim import weight_decay_groups
from .arguments import PetraTrainingArguments


def stage_optimizer(trainer: Trainer) -> tuple[type, dict]:
    """The class and keyword arguments of every stage's optimizer, chosen as `Trainer.create_optimizer` chooses the
    model's: the trainer's `optimizer_cls_and_kwargs` as given (without "lr": the class's default rate), else its
    `get_optimizer_cls_and_kwargs(args, model)` (a subclass's override included) at the learning rate per
    micro-batch. The one choice the pipeline, the checkpoint's record and the model card read."""
    if trainer.optimizer_cls_and_kwargs is not None:
        optimizer_cls, kwargs = trainer.optimizer_cls_and_kwargs
        return optimizer_cls, dict(kwargs or {})
    optimizer_cls, kwargs = trainer.get_optimizer_cls_and_kwargs(trainer.args, trainer.model)
    return optimizer_cls, {**kwargs, "lr": trainer.args.micro_batch_learning_rate()}


def optimizer_factory(trainer: Trainer) -> Callable[[int, nn.Module], torch.optim.Optimizer]:
    """One optimizer per stage (`stage_optimizer`), with weight decay on the parameters the trainer's
    `get_decay_parameter_names` names, none on the others."""
    optimizer_cls, kwargs = stage_optimizer(trainer)
    named = set(trainer.get_decay_parameter_names(trainer.model))
    decayed = {id(param) for name, param in trainer.model.named_parameters() if name in named}

    def make(index: int, stage: nn.Module) -> torch.optim.Optimizer:
        groups = weight_decay_groups(stage, trainer.args.weight_decay, lambda param: id(param) in decayed)
        return optimizer_cls(groups, **kwargs)

    return make


class StageSchedules:
    """The stages' LR schedulers (call it as `(stage_index, optimizer) -> scheduler`, a pipeline's
    `scheduler_factory`) and the rate their schedule gives at any global step (`learning_rate`), read without
    stepping any stage's scheduler.

    `lr_scheduler_type` through transformers' `get_scheduler`, or the paper's warm-up + step decay when
    `petra_lr_milestones` is set; with `petra_delay_lr_warmup`, each stage's factor is multiplied by its delay
    warm-up (`delay_warmup`)."""

    def __init__(self, args: PetraTrainingArguments, max_steps: int, steps_per_epoch: float, num_stages: int = 1):
        self.args, self.max_steps, self.num_stages = args, max_steps, num_stages
        self.warmup = args.get_warmup_steps(max_steps)
        self.milestones = [round(epoch * steps_per_epoch) for epoch in args.milestones()]
        self.made: dict[int, torch.optim.lr_scheduler.LRScheduler] = {}  # stage -> its scheduler, for its base rate
        self._factor: Callable[[int], float] | None = None

    def __call__(self, index: int, optimizer: torch.optim.Optimizer):
        scheduler = self._base(optimizer)
        if self.args.petra_delay_lr_warmup:
            if type(scheduler) is not torch.optim.lr_scheduler.LambdaLR:
                raise ValueError(
                    f"petra_delay_lr_warmup needs a schedule given by a factor per step (linear, cosine, constant, ... "
                    f"or petra_lr_milestones), not lr_scheduler_type={self.args.lr_scheduler_type!r}"
                )
            delay = delay_warmup(index, self.num_stages, self.args, self.max_steps)
            factors = [lambda step, schedule=schedule: schedule(step) * delay(step)
                       for schedule in scheduler.lr_lambdas]
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factors)
        self.made[index] = scheduler
        return scheduler

    def _base(self, optimizer: torch.optim.Optimizer):
        """The schedule without the delay warm-up."""
        if self.milestones:
            warmup, gamma, milestones = self.warmup, self.args.petra_lr_gamma, self.milestones

            def factor(step: int) -> float:
                if step < warmup:
                    return step / max(1, warmup)
                return gamma ** sum(step >= m for m in milestones)

            return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return get_scheduler(
            self.args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=self.warmup,
            num_training_steps=self.max_steps,
            scheduler_specific_kwargs=self.args.lr_scheduler_kwargs or {},
        )

    def factor(self, step: int) -> float | None:
        """The schedule's factor after `step` updates, without any stage's delay warm-up (read off a scheduler built
        once over a throwaway parameter); None for a schedule not given by a factor per step."""
        if self._factor is None:
            scheduler = self._base(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0))
            if type(scheduler) is not torch.optim.lr_scheduler.LambdaLR or len(scheduler.lr_lambdas) != 1:
                return None
            self._factor = scheduler.lr_lambdas[0]
        return self._factor(step)

    def learning_rate(self, global_step: int) -> float | None:
        """What transformers' Trainer logs at `global_step`: the rate that step's update used, its scheduler having
        been stepped `global_step - 1` times (the stages' base rate, as their schedulers hold it, times the
        schedule's factor; the stages' delay warm-up left out). None before any stage's scheduler is made, or for a
        schedule not given by a factor per step."""
        if not self.made:
            return None
        factor = self.factor(max(0, global_step - 1))
        if factor is None:
            return None
        return float(self.made[min(self.made)].base_lrs[0] * factor)


def scheduler_factory(args: PetraTrainingArguments, max_steps: int, steps_per_epoch: float,
                      num_stages: int = 1) -> StageSchedules:
    """One LR scheduler per stage (`StageSchedules`)."""
    return StageSchedules(args, max_steps, steps_per_epoch, num_stages)


def delay_warmup(index: int, num_stages: int, args: PetraTrainingArguments, max_steps: int) -> Callable[[int], float]:
    """PipeMare's learning-rate rescheduling: stage `index`, whose gradients are tau = 2(J-1-index)/k updates old,
    starts at lr / tau and reaches lr after W steps, along lr * tau^-(1 - step/W) (tau < 1 counts as 1; W =
    `petra_delay_lr_warmup` steps, or that fraction of the run if below 1)."""
    length = args.petra_delay_lr_warmup
    length = length * max_steps if length < 1 else length
    in_flight = Schedule(num_stages, Mode.parse(args.petra_mode).pipelined).in_flight(index)  # 0 when synchronous
    tau = max(1.0, in_flight / args.gradient_accumulation_steps)
    return lambda step: tau ** -max(0.0, 1.0 - step / max(1.0, length))
