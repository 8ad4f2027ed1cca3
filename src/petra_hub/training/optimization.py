"""One optimizer and one LR scheduler per stage, chosen by the usual `TrainingArguments` fields."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import Trainer, get_scheduler

from ..engine import Mode
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


def scheduler_factory(args: PetraTrainingArguments, max_steps: int, steps_per_epoch: float,
                      num_stages: int = 1) -> Callable:
    """`lr_scheduler_type` through transformers' `get_scheduler`, or the paper's warm-up + step decay when
    `petra_lr_milestones` is set; with `petra_delay_lr_warmup`, each stage's factor is multiplied by its delay
    warm-up (`delay_warmup`)."""
    warmup = args.get_warmup_steps(max_steps)
    milestones = [round(epoch * steps_per_epoch) for epoch in args.milestones()]
    if milestones:
        gamma = args.petra_lr_gamma

        def factor(step: int) -> float:
            if step < warmup:
                return step / max(1, warmup)
            return gamma ** sum(step >= m for m in milestones)

        base = lambda index, optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)  # noqa: E731
    else:
        base = lambda index, optimizer: get_scheduler(  # noqa: E731
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=max_steps,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs or {},
        )
    if not args.petra_delay_lr_warmup:
        return base

    def with_delay_warmup(index: int, optimizer):
        scheduler = base(index, optimizer)
        if type(scheduler) is not torch.optim.lr_scheduler.LambdaLR:
            raise ValueError(
                f"petra_delay_lr_warmup needs a schedule given by a factor per step (linear, cosine, constant, ... or "
                f"petra_lr_milestones), not lr_scheduler_type={args.lr_scheduler_type!r}"
            )
        delay = delay_warmup(index, num_stages, args, max_steps)
        factors = [lambda step, schedule=schedule: schedule(step) * delay(step) for schedule in scheduler.lr_lambdas]
        return torch.optim.lr_scheduler.LambdaLR(optimizer, factors)

    return with_delay_warmup


def delay_warmup(index: int, num_stages: int, args: PetraTrainingArguments, max_steps: int) -> Callable[[int], float]:
    """PipeMare's learning-rate rescheduling: stage `index`, whose gradients are tau = 2(J-1-index)/k updates old,
    starts at lr / tau and reaches lr after W steps, along lr * tau^-(1 - step/W) (tau < 1 counts as 1; W =
    `petra_delay_lr_warmup` steps, or that fraction of the run if below 1)."""
    length = args.petra_delay_lr_warmup
    length = length * max_steps if length < 1 else length
    pipelined = Mode.parse(args.petra_mode).pipelined
    tau = max(1.0, 2 * (num_stages - 1 - index) / args.gradient_accumulation_steps) if pipelined else 1.0
    return lambda step: tau ** -max(0.0, 1.0 - step / max(1.0, length))
