"""One optimizer and one LR scheduler per stage, chosen by the usual `TrainingArguments` fields."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers import Trainer, get_scheduler

from ..engine.optim import weight_decay_groups
from .arguments import PetraTrainingArguments


def optimizer_factory(args: PetraTrainingArguments, model: nn.Module) -> Callable[[int, nn.Module], torch.optim.Optimizer]:
    """The Trainer's optimizer choice (`args.optim`, `optim_args`), one per stage; no weight decay on biases and
    norms (as in the paper)."""
    optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    kwargs = {**kwargs, "lr": args.micro_batch_learning_rate()}

    def make(index: int, stage: nn.Module) -> torch.optim.Optimizer:
        return optimizer_cls(weight_decay_groups(stage, args.weight_decay), **kwargs)

    return make


def scheduler_factory(args: PetraTrainingArguments, max_steps: int, steps_per_epoch: float) -> Callable:
    """`lr_scheduler_type` through transformers' `get_scheduler`, or the paper's warm-up + step decay when
    `petra_lr_milestones` is set."""
    warmup = args.get_warmup_steps(max_steps)
    milestones = [round(epoch * steps_per_epoch) for epoch in args.milestones()]
    if milestones:
        gamma = args.petra_lr_gamma

        def factor(step: int) -> float:
            if step < warmup:
                return step / max(1, warmup)
            return gamma ** sum(step >= m for m in milestones)

        return lambda index, optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return lambda index, optimizer: get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=max_steps,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs or {},
    )
