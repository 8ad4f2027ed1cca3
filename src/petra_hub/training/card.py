"""What the model card of a PETRA training run says (the `TrainingSummary` behind `write_model_card`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..data import DatasetInfo, dataset_spec
from ..integrations.model_card import TrainingSummary
from .arguments import PetraTrainingArguments
from .distributed import world_size


def dataset_of(*datasets) -> DatasetInfo | None:
    """The petra_hub data set description carried by the first data set that has one (`.info`)."""
    for dataset in datasets:
        info = getattr(dataset, "info", None)
        if isinstance(info, DatasetInfo):
            return info
    return None


def hardware_description() -> str:
    world = world_size()
    device = f"{world} x {torch.cuda.get_device_name()}" if torch.cuda.is_available() else f"{os.cpu_count()} CPU cores"
    return f"{device}, {'NCCL' if torch.cuda.is_available() else 'gloo'}" if world > 1 else device


def summarize_run(
    args: PetraTrainingArguments, model, num_stages: int, epoch: float | None, info: DatasetInfo, metrics: dict
) -> TrainingSummary:
    return TrainingSummary(
        model_name=Path(args.hub_model_id or args.output_dir).name,
        preset=getattr(model.config, "preset", None),
        dataset=info.name,
        dataset_id=dataset_spec(info.name).hub_id,
        mode=args.petra_mode,
        num_stages=num_stages,
        accumulation_steps=args.gradient_accumulation_steps,
        num_processes=world_size(),
        epochs=round(epoch, 2) if epoch else None,
        micro_batch_size=args.per_device_train_batch_size,
        learning_rate=args.micro_batch_learning_rate(),
        hardware=hardware_description(),
        eval_accuracy=metrics.get("eval_accuracy"),
        eval_loss=metrics.get("eval_loss"),
        num_parameters=sum(p.numel() for p in model.parameters()),
    )


def write_run_card(trainer, output_dir: str, **card_kwargs) -> None:
    """Write the model card of `trainer`'s run to `output_dir/README.md` (`card_kwargs`: those of
    `Trainer.create_model_card`)."""
    from ..integrations.model_card import write_model_card

    info = dataset_of(trainer.train_dataset, trainer.eval_dataset)
    if info is None:  # a card needs to know the data: without it, save the model alone
        return
    metrics = trainer._last_eval_metrics or {}
    summary = summarize_run(trainer.args, trainer.model, len(trainer.stages), trainer.state.epoch, info, metrics)
    write_model_card(output_dir, summary, repo_id=trainer.args.hub_model_id, config=trainer.model.config)
