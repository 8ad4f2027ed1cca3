"""What a run's model card says about its data: which set it was (a petra_hub one, a `datasets` one, any other), its
splits, columns and class names, and which evaluation the card reports.

A card can be written for any data set: a petra_hub one (``.info`` is a :class:`petra_hub.data.DatasetInfo`:
everything comes from the registry), a `datasets` one (name, Hub id, columns and splits from its ``info``,
``cache_files`` and ``features``; the registry's facts where it is a known set) or any other map-style data set ("a
custom data set", or the name given as ``dataset=``). What the data cannot tell (a local set's name, the split a
`datasets` set was held out from: it keeps ``split == "train"``), ``PetraTrainer.model_card_kwargs`` does, as the
recipe sets it: ``{"dataset": name, "eval_split": "held-out 15% of train"}`` (`create_model_card`'s own arguments
take precedence). A split nobody names is published as none (model-index without ``split``, "evaluation set" in the
body), never as a made-up name.

Which evaluation a card reports: that of the trainer's eval data set; with a dict of them
(``eval_dataset={"test": ..., "train": ...}``, which `evaluate()` evaluates set by set with prefixes
``eval_<key>_``), the first set of the dict, named by its own split where it knows one, else by its key. model-index,
the Evaluation table and the training-results table all show that set alone; a note under the Evaluation table
names the others, whose metrics stay in the log history. Only evaluations of that set count as the card's last one
(`record_evaluation`): evaluating another set (another entry of the dict, or one given to `evaluate()` while the
trainer holds a dict) changes nothing in the card.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import Subset

from ..data import DATASET_SPECS, DatasetInfo, DatasetSpec, dataset_spec


CUSTOM_DATASET = "a custom data set"


def is_cut(limit: int | None, size: int) -> bool:
    return limit is not None and limit < size


def evaluated_part(split: str, limit: int | None, size: int, first: bool = False) -> str:
    """What the card says was evaluated: the split, or the part of it that was kept: `--max_eval_samples` images
    chosen at random, or the `first` ones (`petra_hub.data.take`)."""
    if not is_cut(limit, size):
        return split
    return f"{'first ' if first else ''}{limit} of the {size} images of {split}"


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


@dataclass
class DataFacts:
    """What the card says about the data, whatever its kind."""

    name: str = CUSTOM_DATASET  # a petra_hub.data name where the set is a known one
    dataset_id: str | None = None  # Hub data set id
    config: str | None = None
    title: str | None = None  # a name given by the user (`dataset=`)
    from_registry: bool = False  # a petra_hub data set: the registry holds its input convention
    info: DatasetInfo | None = None  # a petra_hub data set's own description
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


def _split_name(dataset, depth: int = 4) -> str | None:
    """The split a data set holds ("test", "validation", ...), also through wrappers' ``.dataset``."""
    for _ in range(depth + 1):
        split = getattr(dataset, "split", None)
        if split:
            return str(split)
        dataset = getattr(dataset, "dataset", None)
    return None


def _length(dataset) -> int | None:
    try:
        return len(dataset)
    except TypeError:  # an iterable data set
        return None


def _part(dataset, depth: int = 4) -> tuple[int, int, bool] | None:
    """(items kept, items of the data set they come from, whether they are its first ones) when `dataset` keeps
    part of the data set it wraps as ``.dataset`` (petra_hub.data.take, torch Subset, nested), else None."""
    kept, first, inner = _length(dataset), True, dataset
    for _ in range(depth):
        wrapped = getattr(inner, "dataset", None)
        outer_size, size = _length(inner), _length(wrapped)
        if wrapped is None or _hf_info(inner) is not None or outer_size is None or size is None:
            break
        if isinstance(inner, Subset):  # torch's, and petra_hub.data.take's and sample's
            first = first and all(int(index) == position for position, index in enumerate(inner.indices))
        else:  # another wrapper: which items it keeps is unknown
            first = first and outer_size >= size
        inner = wrapped
    total = _length(inner)
    if kept is None or total is None or kept >= total:
        return None
    return kept, total, first


def evaluated_split(dataset, key: str | None = None) -> str | None:
    """How the card names the evaluated data: its split ("test"; else `key`, its key in a dict of eval sets), or
    the part of it a wrapper kept, in the recipe's words (``evaluated_part``): "first 64 of the 360
    images of test"; "64 of the 360 images of test" for other items than the first."""
    split = _split_name(dataset) or key
    part = _part(dataset)
    if part is None:
        return split
    kept, total, first = part
    split = split or "the evaluation set"
    return evaluated_part(split, kept, total, first)


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
    facts = DataFacts(eval_split=evaluated_split(reported, key))
    info = dataset_of(train, evaluation)
    if info is not None:
        try:
            spec = dataset_spec(info.name)
        except ValueError:  # a DatasetInfo made by hand for a set the registry does not hold
            facts.name, facts.label_names = info.name, list(info.label_names)
            return facts
        facts.name, facts.dataset_id, facts.from_registry, facts.info = spec.name, spec.hub_id, True, info
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


def processor_convention(processor) -> dict:
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


def _per_channel(values) -> tuple | None:
    if values is None:
        return None
    return tuple(values) if isinstance(values, (list, tuple)) else (values,) * 3


def class_names(config, facts: DataFacts) -> list | None:
    """The model's class names, unless they are transformers' placeholders LABEL_i and the data names them."""
    id2label = getattr(config, "id2label", None) or {}
    names = [id2label[i] for i in sorted(id2label)]
    generic = names == [f"LABEL_{i}" for i in range(len(names))]
    if generic and facts.label_names and len(facts.label_names) == len(names):
        return list(facts.label_names)
    return names or None
