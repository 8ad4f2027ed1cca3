"""What the model card of a PETRA training run says: a `TrainingSummary` filled from a `PetraTrainer` (its data:
`card_data`).

The trainer's entry points: `name_labels(trainer)` and `save_run_folder(trainer, output_dir)` from `save_model`
(placeholder class names LABEL_i become the data set's, as `save_for_hub` does, then the folder and its card), and
`write_run_card(trainer, output_dir, **card_kwargs)` from `create_model_card`.
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from pathlib import Path
from typing import Any

import torch

from ..data import dataset_spec, image_processor_for
from ..integrations.hub import name_generic_labels
from ..integrations.model_card import TrainingSummary
from ..integrations.model_card_text import (
    code_span,
    is_hub_id,
    is_number,
    is_speed_metric,
    markdown_text,
    metric_key,
    percentage_problem,
)
from .card_data import (
    apply_card_arguments,
    class_names,
    describe_data,
    processor_convention,
    reported_eval_set,
)
from ..models.families import family_named
from .distributed import world_size
from .optimization import stage_optimizer


def hardware_description() -> str:
    world = world_size()
    device = f"{world} x {torch.cuda.get_device_name()}" if torch.cuda.is_available() else f"{os.cpu_count()} CPU cores"
    return f"{device}, {'NCCL' if torch.cuda.is_available() else 'gloo'}" if world > 1 else device


# --------------------------------------------------------------------------------------------------------------
# the data set


# --------------------------------------------------------------------------------------------------------------
# hyper-parameters and results


def _optimizer_call(cls, kwargs: dict) -> str:
    """"SGD(momentum=0.9, nesterov=True)": the class and its keyword arguments, but the learning rate and the weight
    decay (the stages' parameter groups set their own: `optimization.optimizer_factory`)."""
    settings = ", ".join(f"{key}={value}" for key, value in kwargs.items() if key not in ("lr", "weight_decay"))
    return f"{getattr(cls, '__name__', str(cls))}({settings})"


def _default_learning_rate(cls) -> float | None:
    """The default of `cls`'s `lr` argument (SGD's 0.001), None when it has none."""
    try:
        default = inspect.signature(cls).parameters["lr"].default
    except (KeyError, TypeError, ValueError):
        return None
    return _learning_rate(default)


def _learning_rate(value) -> float | None:
    try:
        value = float(value)  # a number, or a one-element tensor
    except (TypeError, ValueError, RuntimeError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def optimizer_and_learning_rate(trainer) -> tuple[str, float | None]:
    """(the Optimizer row, the learning rate the stages start from) of the stages' optimizer
    (`optimization.stage_optimizer`): `args.optim`, or `optimizer_cls_and_kwargs`, and the keyword arguments it gets
    (without "lr": the class's default rate). The row is Markdown: the call is a code span, `optim_args` (the
    user's words) escaped text."""
    args = trainer.args
    name = "optimizer_cls_and_kwargs" if trainer.optimizer_cls_and_kwargs is not None else \
        getattr(args.optim, "value", args.optim)
    try:
        cls, kwargs = stage_optimizer(trainer)
    except (ImportError, RuntimeError, ValueError):  # an optimizer this environment cannot build: say what was asked
        return (f"`{name}`" + (f" ({markdown_text(args.optim_args)})" if args.optim_args else ""),
                args.micro_batch_learning_rate())
    rate = _learning_rate(kwargs["lr"]) if "lr" in kwargs else _default_learning_rate(cls)
    return f"`{name}`: {code_span(_optimizer_call(cls, kwargs))}", rate


def schedule_text(args, warmup_steps: int | None) -> str:
    """The LR schedule row (Markdown: the scheduler's keyword arguments, the user's, are escaped)."""
    milestones = args.milestones()
    warmup = "linear warm-up, then " if warmup_steps else ""
    if milestones:
        epochs = ", ".join(f"{m:g}" for m in milestones)
        return f"{warmup}x{args.petra_lr_gamma:g} at epochs {epochs} (petra_lr_milestones)"
    name = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    options = f" {markdown_text(args.lr_scheduler_kwargs)}" if args.lr_scheduler_kwargs else ""
    return f"{warmup}{name}{options}"


def _metric_prefix(metrics: dict, default: str = "eval_") -> str:
    loss = next((key for key in metrics if key.endswith("_loss")), None)
    return loss[: -len("loss")] if loss else default


def _is_metric(key: str, prefix: str) -> bool:
    return key.startswith(prefix) and not is_speed_metric(key)


def results_from_log_history(log_history: list[dict], prefix: str = "eval_") -> list[dict]:
    """One row per evaluation (epoch, step, the last training loss logged before it, every metric named
    `prefix`..., renamed eval_...); a re-evaluation at the same step replaces the row. Without evaluations: the last
    training loss of each epoch. `prefix`: "eval_<key>_" for the reported set of a dict of eval data sets."""
    rows, last_loss = [], None
    for entry in log_history:
        if "loss" in entry:
            last_loss = entry["loss"]
        metrics = {"eval_" + key[len(prefix):]: value for key, value in entry.items() if _is_metric(key, prefix)}
        if not metrics:
            continue
        row = {"epoch": entry.get("epoch"), "step": entry.get("step"), "training_loss": last_loss, **metrics}
        if rows and rows[-1]["step"] == row["step"]:
            rows[-1] = row
        else:
            rows.append(row)
    if rows:
        return rows
    by_epoch: dict[int, dict] = {}
    for entry in log_history:
        if "loss" in entry and entry.get("epoch") is not None:
            by_epoch[math.ceil(float(entry["epoch"]) - 1e-9)] = {
                "epoch": entry["epoch"], "step": entry.get("step"), "training_loss": entry["loss"]}
    return [by_epoch[key] for key in sorted(by_epoch)]


def drop_percentage_accuracies(final: dict, results: list[dict]) -> list[str]:
    """Delete from `final` and each of `results` (in place) every accuracy that compute_metrics returned as a
    percentage (97.5, not 0.975): a card publishes accuracies as fractions in [0, 1], in model-index and in its tables
    alike, and does not guess which convention a number follows (0.5 could be either). Writing the card never fails on
    a metric (it is written on one process, often inside a checkpoint); a warning and the card's notes say what was
    left out."""
    refused: dict[str, tuple] = {}  # metric -> (the first value refused, the last evaluation's if any; why)
    for metrics in [final, *results]:
        for key, value in list(metrics.items()):
            problem = percentage_problem(key, value)
            if problem is not None:
                del metrics[key]
                refused.setdefault(metric_key(key), (value, problem))
    notes = []
    for key, (value, problem) in refused.items():
        notes.append(f"compute_metrics returned {code_span(key)} = {value:g}: {problem}; this card leaves it out.")
        warnings.warn(f"model card: compute_metrics returned `{key}` = {value:g}: {problem}; this card leaves it out "
                      "(return accuracies as fractions in [0, 1])", stacklevel=2)
    return notes


def final_metrics(trainer, prefix: str = "eval_") -> dict:
    """The last evaluation's metrics: `trainer._last_eval_metrics` (see `record_evaluation`), else the last one in the
    log history with metrics named `prefix`..."""
    if trainer._last_eval_metrics:
        return dict(trainer._last_eval_metrics)
    for entry in reversed(trainer.state.log_history):
        if any(_is_metric(key, prefix) for key in entry):
            return dict(entry)
    return {}


def _other_sets_note(eval_dataset) -> list[str]:
    """The note that names the eval data sets of a dict that the card does not report (Markdown: their keys are
    escaped)."""
    if not isinstance(eval_dataset, dict) or len(eval_dataset) < 2:
        return []
    first, *others = (code_span(key) for key in eval_dataset)
    return [f"The run evaluated a dict of data sets; this card reports the first, {first}. The metrics of "
            f"{', '.join(others)} (named `eval_<key>_...`) are in the run's log history (`trainer_state.json`) only."]


def fine_tuned_from(config, repo_id: str | None = None) -> str | None:
    """The Hub model a run fine-tunes, as transformers' `TrainingSummary.from_trainer` finds it: the
    `config._name_or_path` that `from_pretrained("owner/name")` sets, when it is a Hub id (owner/name, not an
    existing local path) and not the run's own repository."""
    name = getattr(config, "_name_or_path", None)
    if not isinstance(name, str) or not is_hub_id(name) or os.path.exists(name) or name == repo_id:
        return None
    return name


def summarize_trainer(trainer, output_dir: str, **card_kwargs) -> TrainingSummary:
    """Everything the card of `trainer`'s run says (`card_kwargs`: those of `Trainer.create_model_card`, over the
    trainer's own `model_card_kwargs`, where the recipe names its data set and its evaluated split)."""
    args, model, state = trainer.args, trainer.model, trainer.state
    facts = describe_data(trainer.train_dataset, trainer.eval_dataset)
    fields: dict[str, Any] = {}
    apply_card_arguments(facts, fields, {**(getattr(trainer, "model_card_kwargs", None) or {}), **card_kwargs})

    set_key, _ = reported_eval_set(trainer.eval_dataset)
    set_prefix = "eval_" if set_key is None else f"eval_{set_key}_"
    metrics = final_metrics(trainer, set_prefix)
    prefix = _metric_prefix(metrics, set_prefix)
    metrics = {key[len(prefix):]: value for key, value in metrics.items() if _is_metric(key, prefix)}
    results = results_from_log_history(state.log_history, set_prefix)
    notes = drop_percentage_accuracies(metrics, results) + _other_sets_note(trainer.eval_dataset)
    accuracy, loss = metrics.get("accuracy"), metrics.get("loss")
    accuracy = metrics.pop("accuracy") if is_number(accuracy) else None
    loss = metrics.pop("loss") if is_number(loss) else None
    warmup = args.get_warmup_steps(state.max_steps) if state.max_steps else None
    optimizer, learning_rate = optimizer_and_learning_rate(trainer)
    extra = {}
    if args.petra_scale_lr and getattr(trainer, "optimizer_cls_and_kwargs", None) is None:
        extra["Learning rate scaling (petra_scale_lr)"] = (
            f"learning_rate {args.learning_rate:g} x micro-batch {args.per_device_train_batch_size} x k "
            f"{args.gradient_accumulation_steps} / 256")
    if args.petra_data_parallel > 1:
        extra["Pipeline replicas (petra_data_parallel)"] = args.petra_data_parallel
    if args.petra_partition:
        extra["Stages per process"] = args.petra_partition
    precision = args.precision()
    if precision.compute is not None or precision.messages is not None:
        extra["Precision"] = precision.describe()
    if args.petra_weight_prediction:
        extra["Weight prediction (petra_weight_prediction)"] = (
            f"forwards at the weights extrapolated over {args.petra_weight_prediction:g} x each stage's delay")
    if args.petra_synchronous_steps:
        extra["Synchronous start (petra_synchronous_steps)"] = (
            f"the first {args.petra_synchronous_steps} steps without delay (reversible_backprop), then petra")
    if args.petra_delay_momentum:
        extra["Delay-matched momentum (petra_delay_momentum)"] = (
            "each stage's momentum lowered so that its lag plus the stage's delay is the optimizer's own lag")
    if args.petra_memory_budget:
        extra["Memory budget per process (petra_memory_budget)"] = (
            f"{args.petra_memory_budget}: stages keep their forward graphs where they fit")
    if args.petra_delay_lr_warmup:
        extra["Delay-aware warm-up (petra_delay_lr_warmup)"] = (
            "each stage's learning rate divided by its delay in updates, for the whole run"
            if math.isinf(args.petra_delay_lr_warmup) else f"{args.petra_delay_lr_warmup:g}")
    processor = {} if facts.from_registry else processor_convention(trainer.processing_class)
    repo_id = getattr(trainer, "hub_model_id", None) or args.hub_model_id
    fields.setdefault("model_name", Path(repo_id or output_dir).name)
    base_model = fine_tuned_from(model.config, repo_id)
    if base_model is not None:
        fields.setdefault("base_model", base_model)
    epoch = state.epoch or None
    return TrainingSummary(
        preset=getattr(model.config, "preset", None),
        dataset=facts.name,
        dataset_id=facts.dataset_id,
        dataset_title=facts.title,
        dataset_config=facts.config,
        dataset_tags=facts.more_ids,
        eval_split=facts.eval_split,
        label_names=class_names(model.config, facts),
        image_column=facts.image_column,
        label_column=facts.label_column,
        example_split=facts.example_split,
        mode=args.petra_mode,
        num_stages=len(trainer.stages),
        buffered_stages=sum(not getattr(stage, "reversible", False) for stage in trainer.stages),
        accumulation_steps=args.gradient_accumulation_steps,
        num_processes=world_size(),
        epochs=(round(epoch, 4) or epoch) if epoch else None,
        global_steps=state.global_step,
        micro_batch_size=args.per_device_train_batch_size,
        learning_rate=learning_rate,
        optimizer=optimizer,
        lr_schedule=schedule_text(args, warmup),
        warmup_steps=warmup,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        label_smoothing=args.label_smoothing_factor,
        seed=args.seed,
        hardware=hardware_description(),
        eval_accuracy=accuracy,
        eval_loss=loss if is_number(loss) else None,
        eval_metrics=metrics,
        eval_notes=notes,
        results=results,
        num_parameters=sum(p.numel() for p in model.parameters()),
        extra=extra,
        image_processor=saved_processor(trainer, facts) is not None,
        **processor,
        **fields,
    )


def name_labels(trainer) -> None:
    """The model's placeholder class names LABEL_i become the data set's (its registry entry's, or its
    ``ClassLabel`` feature's), as ``save_for_hub`` does: the saved config.json, the card and a pipeline agree."""
    name_generic_labels(trainer.model.config, describe_data(trainer.train_dataset, trainer.eval_dataset).label_names)


def saved_processor(trainer, facts=None):
    """The image processor saved with the model: the trainer's `processing_class`, else, for a petra_hub data set,
    the data set's (`data.image_processor_for`, images prepared as its evaluation prepares them, as `save_for_hub`
    saves it); None for another data set without `processing_class` (the card then says that none was saved)."""
    if trainer.processing_class is not None:
        return trainer.processing_class
    facts = facts if facts is not None else describe_data(trainer.train_dataset, trainer.eval_dataset)
    if not facts.from_registry:
        return None
    spec = dataset_spec(facts.name)
    return image_processor_for(facts.info or spec.info, spec.eval_shorter_side)


def save_run_folder(trainer, output_dir: str) -> None:
    """What `PetraTrainer.save_model` writes on the process that saves: the model (safetensors), the image processor
    (`saved_processor`), the training arguments and the model card. A model of no registered family gets no card (a
    card says what the architecture is), with a warning saying how to have one."""
    os.makedirs(output_dir, exist_ok=True)
    model = trainer.model
    model.save_pretrained(output_dir)
    facts = describe_data(trainer.train_dataset, trainer.eval_dataset)
    processor = saved_processor(trainer, facts)
    if processor is not None:
        processor.save_pretrained(output_dir)
    else:
        warnings.warn(f"save_model: no image processor saved (no processing_class, and "
                      f"{facts.name} is not a petra_hub data set): give PetraTrainer the processing_class that "
                      "prepares images as the training data was, so that AutoImageProcessor and pipeline load the "
                      "model", stacklevel=3)
    torch.save(trainer.args, os.path.join(output_dir, "training_args.bin"))
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if family_named(model_type) is None:
        warnings.warn(f"save_model: no model card written to {output_dir}: {type(model).__name__} (model_type "
                      f"{model_type!r}) belongs to no registered model family; register it with "
                      "petra_hub.register_family(ModelFamily(...)) to have one", stacklevel=3)
        return
    write_run_card(trainer, output_dir)


def write_run_card(trainer, output_dir: str, **card_kwargs) -> None:
    """Write the model card of `trainer`'s run to `output_dir/README.md` (`card_kwargs`: those of
    `Trainer.create_model_card`). The snippets load the model from the Hub repository of the run, or from
    `output_dir` when it has none."""
    from ..integrations.model_card import write_model_card

    summary = summarize_trainer(trainer, output_dir, **card_kwargs)
    repo_id = getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id or str(output_dir)
    write_model_card(output_dir, summary, repo_id=repo_id, config=trainer.model.config)
