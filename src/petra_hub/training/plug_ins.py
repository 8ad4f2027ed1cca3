"""What a `Trainer` user plugs in besides `TrainingArguments` (constructor arguments, overridden methods), and how
`PetraTrainer` honours it or refuses it.

Honoured: `compute_loss_func` (the loss of the last stage and of evaluation), `optimizer_cls_and_kwargs` (one
optimizer per stage), `preprocess_logits_for_metrics`, `model_init`, `compute_metrics`, `callbacks`,
`data_collator`, `processing_class`. Refused: what assumes one optimizer over the whole model or one training
step through it, which PETRA's per-stage schedule does not have.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import Trainer
from transformers.modeling_outputs import ImageClassifierOutput

_PER_STAGE_OPTIMIZERS = (
    "every pipeline stage has its own optimizer and LR scheduler, built per stage from TrainingArguments (optim, "
    "optim_args, learning_rate, lr_scheduler_type, ...) or from optimizer_cls_and_kwargs=(cls, kwargs)"
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
}


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


def loss_function(trainer: Trainer) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss of a micro-batch's logits, for the last stage and for evaluation: `compute_loss_func` if given, else
    cross-entropy with `label_smoothing_factor`, else the model's own `compute_loss`, else cross-entropy.

    `compute_loss_func` receives `ImageClassifierOutput(logits=...)`, the labels and, as `num_items_in_batch`, the
    micro-batch's size: each stage averages the micro-batch gradients of a step itself, so a loss summed over the
    items and divided by `num_items_in_batch` gives the step's mean, as in Trainer."""
    custom, smoothing, model = trainer.compute_loss_func, trainer.args.label_smoothing_factor, trainer.model

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if custom is not None:
            return custom(ImageClassifierOutput(logits=logits), labels, num_items_in_batch=labels.shape[0])
        if smoothing:
            return torch.nn.functional.cross_entropy(logits, labels, label_smoothing=smoothing)
        if hasattr(model, "compute_loss"):
            return model.compute_loss(logits, labels)
        return torch.nn.functional.cross_entropy(logits, labels)

    return loss
