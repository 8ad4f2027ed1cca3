"""What the model card of a PETRA training run says: a `TrainingSummary` filled from a `PetraTrainer`.

The trainer's entry points: `name_labels(trainer)` and `save_run_folder(trainer, output_dir)` from `save_model`
(placeholder class names LABEL_i become the data set's, as `save_for_hub` does, then the folder and its card), and
`write_run_card(trainer, output_dir, **card_kwargs)` from `create_model_card`. A card can be written for any data
set: a petra_hub one (``.info`` is a :class:`petra_hub.data.DatasetInfo`: everything comes from the registry), a
`datasets` one (name, Hub id, columns and splits from its ``info``, ``cache_files`` and ``features``; the registry's
facts where it is a known set) or any other map-style data set ("a custom data set", or the name given as
``dataset=``). What the data cannot tell (a local set's name, the split a `datasets` set was held out from: it keeps
``split == "train"``), ``PetraTrainer.model_card_kwargs`` does, as the recipe sets it: ``{"dataset": name,
"eval_split": "held-out 15% of train"}`` (`create_model_card`'s own arguments take precedence). A split nobody names
is published as none (model-index without ``split``, "evaluation set" in the body), never as a made-up name.

Which evaluation a card reports: that of the trainer's eval data set; with a dict of them
(``eval_dataset={"test": ..., "train": ...}``, which `evaluate()` evaluates set by set with prefixes
``eval_<key>_``), the first set of the dict, named by its own split where it knows one, else by its key. model-index,
the Evaluation table and the training-results table all show that set alone; a note under the Evaluation table
names the others, whose metrics stay in the log history. Only evaluations of that set count as the card's last one
(`record_evaluation`): evaluating another set (another entry of the dict, or one given to `evaluate()` while the
trainer holds a dict) changes nothing in the card.
"""

from __future__ import annotations

import math
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..data import DATASET_SPECS, DatasetInfo, DatasetSpec, dataset_spec
from ..integrations.hub import name_generic_labels
from ..integrations.model_card import TrainingSummary
from ..integrations.model_card_text import is_number, is_speed_metric, metric_key, percentage_problem
from .distributed import world_size

CUSTOM_DATASET = "a custom data set"
# `Trainer.create_model_card`'s arguments, and petra_hub's `eval_split`: the name of the evaluated split, or what it
# is when it is none ("held-out 15% of train"), for data that does not carry it.
CARD_ARGUMENTS = ("language", "license", "tags", "model_name", "finetuned_from", "tasks", "dataset_tags", "dataset",
                  "dataset_args", "eval_split")
# `datasets` builders that read local files: their name is the file format, not the data set's.
_PACKAGED_BUILDERS = {"arrow", "audiofolder", "csv", "generator", "imagefolder", "json", "pandas", "parquet", "sql",
                      "text", "videofolder", "webdataset", "xml", "hdf5"}


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


# --------------------------------------------------------------------------------------------------------------
# the data set


@dataclass
class DataFacts:
    """What the card says about the data, whatever its kind."""

    name: str = CUSTOM_DATASET  # a petra_hub.data name where the set is a known one
    dataset_id: str | None = None  # Hub data set id
    config: str | None = None
    title: str | None = None  # a name given by the user (`dataset=`)
    from_registry: bool = False  # a petra_hub data set: the registry holds its input convention
    eval_split: str | None = None  # the split's name where the data set knows it
    example_split: str | None = None
    image_column: str | None = None
    label_column: str | None = None
    label_names: list | None = None
    more_ids: list = field(default_factory=list)


def _unwrapped(dataset, depth: int = 4):
    """The data set itself, through wrappers that keep it as ``.dataset`` (torch Subset, petra_hub.data.take)."""
    for _ in range(depth):
        if dataset is None or _hf_info(dataset) is not None or isinstance(getattr(dataset, "info", None), DatasetInfo):
            return dataset
        dataset = getattr(dataset, "dataset", None)
    return dataset


def _hf_info(dataset):
    """The ``datasets.DatasetInfo`` of a `datasets` data set, else None (without importing `datasets`)."""
    info = getattr(dataset, "info", None)
    return info if hasattr(info, "builder_name") and hasattr(info, "dataset_name") else None


def _split_name(dataset) -> str | None:
    """The split a data set holds ("test", "validation", ...), also through a wrapper's ``.dataset``."""
    split = getattr(dataset, "split", None) or getattr(getattr(dataset, "dataset", None), "split", None)
    return str(split) if split else None


def _hub_repo(dataset, info) -> str | None:
    """The Hub repository a `datasets` data set was loaded from: its cache folder is ``<namespace>___<name>``,
    or its recorded checksums name ``hf://datasets/<namespace>/<name>@<revision>/...``."""
    name = info.dataset_name
    if name:
        pattern = re.compile(rf"[/\\]([\w.-]+)___{re.escape(name)}[/\\]")
        for cache_file in getattr(dataset, "cache_files", None) or []:
            match = pattern.search(str(cache_file.get("filename", "")))
            if match:
                return f"{match.group(1)}/{name}"
    for url in info.download_checksums or {}:
        match = re.match(r"hf://datasets/([\w.-]+/[\w.-]+)@", str(url))
        if match:
            return match.group(1)
    return None


def _registry_match(repo_id: str | None, name: str | None) -> DatasetSpec | None:
    for spec in DATASET_SPECS.values():
        if repo_id and spec.hub_id == repo_id:
            return spec
    if repo_id is None and name:
        for spec in DATASET_SPECS.values():
            if name == spec.name or (spec.hub_id and name == spec.hub_id.split("/")[-1]):
                return spec
    return None


def _columns(features) -> tuple[str | None, str | None, list | None]:
    """(image column, label column, class names) from `datasets` features."""
    image = label = names = None
    for column, feature in (features or {}).items():
        kind = type(feature).__name__
        if kind == "Image" and image is None:
            image = column
        elif kind == "ClassLabel" and label is None:
            label, names = column, list(feature.names)
    if label is None:
        label = next((c for c in ("label", "labels") if c in (features or {})), None)
    return image, label, names


def reported_eval_set(eval_dataset) -> tuple[str | None, Any]:
    """(key, data set) of the evaluation a card reports: the first set of a dict of eval data sets, else the eval
    data set itself (key None)."""
    if isinstance(eval_dataset, dict):
        return next(iter(eval_dataset.items()), (None, None))
    return None, eval_dataset


def record_evaluation(trainer, dataset, metrics: dict) -> None:
    """Keep the metrics of an evaluation of `dataset` as the card's last evaluation: any evaluation's when the
    trainer has one eval data set (or none), only those of the reported set when it has a dict of them."""
    key, reported = reported_eval_set(trainer.eval_dataset)
    if key is None or dataset is reported:
        trainer._last_eval_metrics = metrics


def describe_data(train_dataset, eval_dataset) -> DataFacts:
    """The name, Hub id, splits and columns of the training data (the eval set when there is no training set); the
    split is that of the reported eval set (the first of a dict: its own split, else its key)."""
    key, reported = reported_eval_set(eval_dataset)
    train, evaluation = _unwrapped(train_dataset), _unwrapped(reported)
    facts = DataFacts(eval_split=_split_name(evaluation) or key)
    info = dataset_of(train, evaluation)
    if info is not None:
        try:
            spec = dataset_spec(info.name)
        except ValueError:  # a DatasetInfo made by hand for a set the registry does not hold
            facts.name, facts.label_names = info.name, list(info.label_names)
            return facts
        facts.name, facts.dataset_id, facts.from_registry = spec.name, spec.hub_id, True
        facts.label_names = list(spec.info.label_names)
        return facts
    for dataset in (train, evaluation):
        hf = _hf_info(dataset)
        if hf is None:
            continue
        name = hf.dataset_name or hf.builder_name
        name = None if name in _PACKAGED_BUILDERS else name
        repo_id = _hub_repo(dataset, hf)
        spec = _registry_match(repo_id, name)
        facts.name = spec.name if spec is not None else (name or CUSTOM_DATASET)
        facts.dataset_id = repo_id or (spec.hub_id if spec is not None else None)
        facts.config = hf.config_name if hf.config_name not in (None, "default") else None
        facts.image_column, facts.label_column, facts.label_names = _columns(getattr(dataset, "features", None))
        facts.example_split = _split_name(evaluation) or _split_name(dataset)
        return facts
    return facts


def _as_list(value) -> list:
    if value is None:
        return []
    return [value] if isinstance(value, str) else [item for item in value if item]


def apply_card_arguments(facts: DataFacts, summary_fields: dict, card_kwargs: dict) -> None:
    """Fold `Trainer.create_model_card`'s arguments into the card (TypeError for any other keyword)."""
    unknown = sorted(set(card_kwargs) - set(CARD_ARGUMENTS))
    if unknown:
        raise TypeError(f"unexpected model card arguments {unknown}; expected some of {list(CARD_ARGUMENTS)}")
    given = {key: value for key, value in card_kwargs.items() if value is not None}
    if "dataset" in given:
        names = _as_list(given["dataset"])
        facts.title = ", ".join(names) or None
        if facts.name == CUSTOM_DATASET and len(names) == 1:
            facts.name = names[0]
    if "dataset_tags" in given:
        ids = _as_list(given["dataset_tags"])
        if ids:
            facts.dataset_id, facts.more_ids = ids[0], ids[1:]
    if "dataset_args" in given:
        facts.config = ", ".join(_as_list(given["dataset_args"])) or None
    if "eval_split" in given:
        facts.eval_split = str(given["eval_split"]).strip() or None
    for key, target in (("language", "language"), ("license", "license"), ("model_name", "model_name"),
                        ("finetuned_from", "base_model")):
        if key in given:
            summary_fields[target] = given[key]
    for key in ("tags", "tasks"):
        if key in given:
            summary_fields[key] = _as_list(given[key])


# --------------------------------------------------------------------------------------------------------------
# hyper-parameters and results


def optimizer_text(args, model) -> str:
    """`args.optim` and the keyword arguments it gives the optimizer (optim_args included), learning rate apart."""
    from transformers import Trainer

    name = getattr(args.optim, "value", args.optim)
    try:
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    except (ImportError, RuntimeError, ValueError):  # an optimizer this environment cannot build: say what was asked
        return f"`{name}`" + (f" ({args.optim_args})" if args.optim_args else "")
    settings = ", ".join(f"{key}={value}" for key, value in kwargs.items() if key != "lr")
    return f"`{name}`: {cls.__name__}({settings})"


def schedule_text(args, warmup_steps: int | None) -> str:
    milestones = args.milestones()
    warmup = "linear warm-up, then " if warmup_steps else ""
    if milestones:
        epochs = ", ".join(f"{m:g}" for m in milestones)
        return f"{warmup}x{args.petra_lr_gamma:g} at epochs {epochs} (petra_lr_milestones)"
    name = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
    options = f" {args.lr_scheduler_kwargs}" if args.lr_scheduler_kwargs else ""
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


def refuse_percentages(final: dict, results: list[dict]) -> list[str]:
    """Take out of the card (in place) every accuracy that compute_metrics returned as a percentage (97.5, not
    0.975): a card publishes accuracies as fractions in [0, 1], in model-index and in its tables alike, and does not
    guess which convention a number follows (0.5 could be either). Writing the card never fails on a metric (it is
    written on one process, often inside a checkpoint); a warning and the card's notes say what was left out."""
    refused: dict[str, tuple] = {}  # metric -> (the first value refused, the last evaluation's if any; why)
    for metrics in [final, *results]:
        for key, value in list(metrics.items()):
            problem = percentage_problem(key, value)
            if problem is not None:
                del metrics[key]
                refused.setdefault(metric_key(key), (value, problem))
    notes = []
    for key, (value, problem) in refused.items():
        notes.append(f"compute_metrics returned `{key}` = {value:g}: {problem}; this card leaves it out.")
        warnings.warn(f"model card: {notes[-1][:-1]} (return accuracies as fractions in [0, 1])", stacklevel=2)
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
    """The note that names the eval data sets of a dict that the card does not report."""
    if not isinstance(eval_dataset, dict) or len(eval_dataset) < 2:
        return []
    first, *others = (f"`{key}`" for key in eval_dataset)
    return [f"The run evaluated a dict of data sets; this card reports the first, {first}. The metrics of "
            f"{', '.join(others)} (named `eval_<key>_...`) are in the run's log history (`trainer_state.json`) only."]


def _per_channel(values) -> tuple | None:
    if values is None:
        return None
    return tuple(values) if isinstance(values, (list, tuple)) else (values,) * 3


def _processor_convention(processor) -> dict:
    """The input convention of an image processor that gives the model squares: resize to S x S
    (``size={"height": S, "width": S}``, as ViTImageProcessor), or the shorter side to S, then the centred C x C crop
    (``size={"shortest_edge": S}``, ``crop_size={"height": C, "width": C}``, as BitImageProcessor); {} for any other
    (the card then points at ``preprocessor_config.json``)."""
    size = getattr(processor, "size", None) or {}
    crop = getattr(processor, "crop_size", None) or {}
    mean = _per_channel(getattr(processor, "image_mean", None))
    std = _per_channel(getattr(processor, "image_std", None))
    if mean is None or std is None or not getattr(processor, "do_resize", True):
        return {}
    if getattr(processor, "do_center_crop", False):
        side, resize, center_crop = crop.get("height"), size.get("shortest_edge"), True
        if side != crop.get("width"):
            return {}
    else:
        side, resize, center_crop = size.get("height"), size.get("height"), False
        if side != size.get("width"):
            return {}
    if not all(isinstance(value, int) and not isinstance(value, bool) for value in (side, resize)):
        return {}
    return {"image_size": side, "image_mean": mean, "image_std": std, "image_resize": resize,
            "image_center_crop": center_crop}


def _label_names(config, facts: DataFacts) -> list | None:
    """The model's class names, unless they are transformers' placeholders LABEL_i and the data names them."""
    id2label = getattr(config, "id2label", None) or {}
    names = [id2label[i] for i in sorted(id2label)]
    generic = names == [f"LABEL_{i}" for i in range(len(names))]
    if generic and facts.label_names and len(facts.label_names) == len(names):
        return list(facts.label_names)
    return names or None


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
    notes = refuse_percentages(metrics, results) + _other_sets_note(trainer.eval_dataset)
    accuracy, loss = metrics.get("accuracy"), metrics.get("loss")
    accuracy = metrics.pop("accuracy") if is_number(accuracy) else None
    loss = metrics.pop("loss") if is_number(loss) else None
    warmup = args.get_warmup_steps(state.max_steps) if state.max_steps else None
    extra = {}
    if args.petra_scale_lr:
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
    if args.petra_memory_budget:
        extra["Memory budget per process (petra_memory_budget)"] = (
            f"{args.petra_memory_budget}: stages keep their forward graphs where they fit")
    if args.petra_delay_lr_warmup:
        extra["Delay-aware warm-up (petra_delay_lr_warmup)"] = f"{args.petra_delay_lr_warmup:g}"
    processor = {} if facts.from_registry else _processor_convention(trainer.processing_class)
    repo_id = getattr(trainer, "hub_model_id", None) or args.hub_model_id
    fields.setdefault("model_name", Path(repo_id or output_dir).name)
    epoch = state.epoch or None
    return TrainingSummary(
        preset=getattr(model.config, "preset", None),
        dataset=facts.name,
        dataset_id=facts.dataset_id,
        dataset_title=facts.title,
        dataset_config=facts.config,
        dataset_tags=facts.more_ids,
        eval_split=facts.eval_split,
        label_names=_label_names(model.config, facts),
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
        learning_rate=args.micro_batch_learning_rate(),
        optimizer=optimizer_text(args, model),
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
        **processor,
        **fields,
    )


def name_labels(trainer) -> None:
    """The model's placeholder class names LABEL_i become the data set's (its registry entry's, or its
    ``ClassLabel`` feature's), as ``save_for_hub`` does: the saved config.json, the card and a pipeline agree."""
    name_generic_labels(trainer.model.config, describe_data(trainer.train_dataset, trainer.eval_dataset).label_names)


def save_run_folder(trainer, output_dir: str) -> None:
    """What `PetraTrainer.save_model` writes on the process that saves: the model (safetensors), the processor, the
    training arguments and the model card."""
    os.makedirs(output_dir, exist_ok=True)
    trainer.model.save_pretrained(output_dir)
    if trainer.processing_class is not None:
        trainer.processing_class.save_pretrained(output_dir)
    torch.save(trainer.args, os.path.join(output_dir, "training_args.bin"))
    write_run_card(trainer, output_dir)


def write_run_card(trainer, output_dir: str, **card_kwargs) -> None:
    """Write the model card of `trainer`'s run to `output_dir/README.md` (`card_kwargs`: those of
    `Trainer.create_model_card`). The snippets load the model from the Hub repository of the run, or from
    `output_dir` when it has none."""
    from ..integrations.model_card import write_model_card

    summary = summarize_trainer(trainer, output_dir, **card_kwargs)
    repo_id = getattr(trainer, "hub_model_id", None) or trainer.args.hub_model_id or str(output_dir)
    write_model_card(output_dir, summary, repo_id=repo_id, config=trainer.model.config)
