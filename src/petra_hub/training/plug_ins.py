"""What a `Trainer` user plugs in besides `TrainingArguments` (constructor arguments, overridden methods), and how
`PetraTrainer` honours it or refuses it.

Honoured: `compute_loss_func` (the loss of the last stage and of evaluation), `optimizer_cls_and_kwargs` (one
optimizer per stage), `preprocess_logits_for_metrics`, `model_init`, `compute_metrics`, `callbacks`,
`data_collator`, `processing_class`. Refused: what assumes one optimizer over the whole model or one training
step through it, which PETRA's per-stage schedule does not have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain

import torch
from transformers import PreTrainedModel, Trainer
from transformers.modeling_outputs import ImageClassifierOutput

from ..models.loading_checks import IGNORE_INDEX
from .distributed import all_reduce_sum

_PER_STAGE_OPTIMIZERS = (
    "every pipeline stage has its own optimizer and LR scheduler, built per stage from TrainingArguments (optim, "
    "optim_args, learning_rate, lr_scheduler_type, ...) or from optimizer_cls_and_kwargs=(cls, kwargs)"
)
_PIPELINE_INFERENCE = (
    "evaluate and predict run the batches forward through the pipeline's stages; pass compute_loss_func, "
    "compute_metrics or preprocess_logits_for_metrics to change what they compute"
)
# Trainer methods PetraTrainer never calls: overriding one would silently change nothing
_REFUSED_OVERRIDES = {
    "compute_loss": "the loss runs inside the last pipeline stage, on its logits; pass "
                    "compute_loss_func=(outputs, labels, num_items_in_batch) -> loss instead",
    "training_step": "PETRA's schedule replaces the training step: every stage runs a forward and a backward each "
                     "tick, on different micro-batches",
    "create_optimizer": _PER_STAGE_OPTIMIZERS,
    "create_scheduler": _PER_STAGE_OPTIMIZERS,
    "create_optimizer_and_scheduler": _PER_STAGE_OPTIMIZERS,
    "prediction_step": _PIPELINE_INFERENCE,
    "evaluation_loop": _PIPELINE_INFERENCE,
    "_get_train_sampler": "every rank must read the same micro-batches in the same order: PetraTrainer's "
                          "EpochSampler (seeded by data_seed or seed) draws them; override get_train_dataloader "
                          "to read them otherwise, the same on every rank",
    "_get_eval_sampler": "evaluation reads the eval set in order on every rank; override get_eval_dataloader instead",
    "get_batch_samples": "the loop feeds one micro-batch per tick to the pipeline; override get_train_dataloader "
                         "to change what the micro-batches hold",
    "_prepare_inputs": "the pipeline moves each micro-batch to its stages' devices itself",
    "compute_loss_context_manager": "each stage runs under the run's precision policy (bf16/fp16), not a context "
                                    "around a whole-model loss",
    "_maybe_log_save_evaluate": "PETRA's loop logs, evaluates and saves at step ends after draining the pipeline; "
                                "use a TrainerCallback (on_log, on_evaluate, on_save) instead",
    "_load_best_model": "the best checkpoint's weights are loaded into every rank's stages at the end of training; "
                        "use a TrainerCallback's on_train_end to act after it",
    "_load_rng_state": "each rank's generators are restored from its own rng_state_<rank>.pth before the first step",
}


def check_trainable(model) -> None:
    """PETRA trains a transformers `PreTrainedModel` whose `get_stages()` returns its pipeline stages, of a registered
    model family or not: its configuration names the labels the loss is checked against, and `save_model` writes a
    `from_pretrained` folder of it."""
    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"PetraTrainer needs a transformers PreTrainedModel with get_stages(), got "
                        f"{type(model).__name__}: subclass PreTrainedModel (with a PretrainedConfig naming num_labels) "
                        "so that the labels can be checked and save_model can write a from_pretrained folder")
    if not callable(getattr(model, "get_stages", None)):
        raise ValueError(f"PetraTrainer needs a model with get_stages(), which returns its pipeline stages; "
                         f"{type(model).__name__} has none (RevNetForImageClassification and every registered "
                         "model family's classifier have it)")


def check_plug_ins(trainer: Trainer) -> None:
    """Refuse, with the reason, what PetraTrainer cannot honour: `optimizers=(optimizer, scheduler)`, overrides of
    the Trainer methods its loop never calls, label smoothing of a loss that is not single-label."""
    smoothing = trainer.args.label_smoothing_factor
    problem = getattr(getattr(trainer.model, "config", None), "problem_type", None)
    if smoothing and trainer.compute_loss_func is None and problem not in (None, "single_label_classification"):
        raise ValueError(f"label_smoothing_factor={smoothing} needs single-label classification, but the model's "
                         f"problem_type is {problem!r}")
    if trainer.optimizer is not None or trainer.lr_scheduler is not None:
        raise ValueError(f"PetraTrainer cannot use optimizers=(optimizer, scheduler): {_PER_STAGE_OPTIMIZERS}")
    for name, reason in _REFUSED_OVERRIDES.items():
        if getattr(type(trainer), name) is not getattr(Trainer, name):
            raise TypeError(f"{type(trainer).__name__} overrides Trainer.{name}, which PetraTrainer never calls: "
                            f"{reason}")


@dataclass(frozen=True)
class StepLabels:
    """A micro-batch's labels in training with `compute_loss_func`, and what it needs to weight every item of the
    step alike, as Trainer does: the items (labels other than -100) of the step, and what the loss is multiplied by
    (the step's micro-batches, whose gradients each stage averages; times the D replicas, which average theirs, when
    the items are counted over all of them)."""

    labels: torch.Tensor
    items: int
    weight: int


def items_in(labels: torch.Tensor) -> int:
    """What Trainer counts as `num_items_in_batch`: the labels other than its ignore index -100."""
    return int(labels.ne(IGNORE_INDEX).sum())


def with_step_labels(batches: Iterable, args, counts: bool) -> Iterator:
    """The micro-batches of an epoch (`MicroBatch`es, read from a step's first on), their labels wrapped in
    `StepLabels` where this rank has them: each step's k micro-batches (fewer at the epoch's end) are read ahead, as
    Trainer's `get_batch_samples` does. `counts`: whether this rank's items are the step's, that is whether it
    runs the last stage (the one rank of a replica whose loss reads them). With `petra_data_parallel` D > 1 and
    `average_tokens_across_devices` (Trainer's default), the items are counted over the D replicas (a collective:
    every process reads its steps at the same points, each adding its replica's items if it counts them), as
    Trainer counts them over its DDP processes."""
    replicas = args.petra_data_parallel if args.average_tokens_across_devices else 1
    group: list = []
    for batch in chain(batches, [None]):
        if batch is not None:
            group.append(batch)
        if len(group) == args.gradient_accumulation_steps or (batch is None and group):
            items = sum(items_in(member.labels) for member in group) if counts else 0
            if replicas > 1:  # the last stage's rank of each replica adds its items
                items = round(float(all_reduce_sum(torch.tensor([items], dtype=torch.float64))[0]))
            for member in group:
                if member.labels is not None:
                    member.labels = StepLabels(member.labels, items, len(group) * replicas)
                yield member
            group = []


def loss_function(trainer: Trainer) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of a micro-batch's logits, for the last stage and for evaluation: `compute_loss_func` if given, else
    cross-entropy with `label_smoothing_factor`, else the model's own `compute_loss`, else cross-entropy.

    `compute_loss_func` receives `ImageClassifierOutput(logits=...)`, the labels and `num_items_in_batch` as in
    Trainer: in training, the items of the whole step (`StepLabels`, which the training loop gives the pipeline), in
    evaluation those of the batch. Each stage averages the gradients of a step's micro-batches, so a training loss is
    multiplied by their number: a loss summed over the items and divided by `num_items_in_batch` then gives Trainer's
    gradient, every item of the step weighted alike, also where micro-batches differ in size."""
    custom, smoothing, model = trainer.compute_loss_func, trainer.args.label_smoothing_factor, trainer.model

    def loss(logits: torch.Tensor, labels) -> torch.Tensor:
        if custom is not None:
            if isinstance(labels, StepLabels):
                step_labels = labels.labels.to(logits.device)
                value = custom(ImageClassifierOutput(logits=logits), step_labels, num_items_in_batch=labels.items)
                return value * labels.weight
            return custom(ImageClassifierOutput(logits=logits), labels, num_items_in_batch=items_in(labels))
        if smoothing:
            return torch.nn.functional.cross_entropy(logits, labels, label_smoothing=smoothing)
        if hasattr(model, "compute_loss"):
            return model.compute_loss(logits, labels)
        return torch.nn.functional.cross_entropy(logits, labels)

    return loss
