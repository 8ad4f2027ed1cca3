"""The recipe's data: a built-in set of `petra_hub.data` by name, or any `datasets` image-classification set.

Built-in sets (`--dataset digits|cifar10|...`, and `--dataset_name` naming a built-in set's Hub id) keep the
registry's recipe: the paper's transforms, its statistics, items `{"pixel_values", "labels"}`. Any other set
(`--dataset_name` a Hub id or a local folder, or `--train_dir` / `--validation_dir` image folders) follows
transformers' `run_image_classification.py`: torchvision transforms applied lazily with `with_transform`
(RandomResizedCrop + flip for training, resize + centre crop for evaluation, normalised with the image processor's
mean and std), a collator that builds `pixel_values` and `labels`, label names from the `ClassLabel` feature.
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..data import (
    DATASET_SPECS,
    DatasetInfo,
    collate_image_batch,
    dataset_spec,
    image_processor_for,
    load_image_dataset,
)
from ..data.dataset import sample, sampled_indices
from ..data.sources import open_image, to_rgb
from ..data.sources.hub import load_from_hub
from ..training.card_data import evaluated_part, is_cut
from .checks import check_class_indices, check_dataset_path, check_image_folders, label_names_of, normalisation

__all__ = [
    "ApplyTransform",
    "DataArguments",
    "ImageClassificationCollator",
    "RecipeData",
    "check_class_indices",
    "image_transforms",
    "load_data",
    "normalisation",
]

IMAGE_COLUMNS = ("image", "img")  # tried, in order, when --image_column_name is left at its default and is absent
LABEL_COLUMNS = ("label", "labels", "fine_label")
EVAL_SPLITS = ("validation", "val", "valid", "test")
SPLIT_FOLDER_NAMES = ("train", "training", "val", "valid", "validation", "test", "eval")  # not the data's name

# The most pixels on a side taken from the first image without --image_size (as transformers' example's default
# processor, 224): one large image sorted first would otherwise set the size of every item.
MAX_INFERRED_SIZE = 224

logger = logging.getLogger(__name__)


@dataclass
class DataArguments:
    dataset: str = field(
        default="digits",
        metadata={"help": "A built-in data set: "
                          + "; ".join(f"{name}: {spec.description}" for name, spec in DATASET_SPECS.items())},
    )
    data_dir: str | None = field(default=None, metadata={"help": "Local files of the built-in --dataset."})
    hub_id: str | None = field(
        default=None, metadata={"help": "A Hub copy of the built-in --dataset instead of local files."}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Any `datasets` image-classification set instead of --dataset: a Hub id or a local folder "
                          "(save_to_disk output or data files)."},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "The configuration of --dataset_name."})
    train_dir: str | None = field(
        default=None, metadata={"help": "A folder of class sub-folders (imagefolder) to train on."}
    )
    validation_dir: str | None = field(default=None, metadata={"help": "A folder of class sub-folders to evaluate on."})
    train_val_split: float | None = field(
        default=0.15,
        metadata={"help": "Fraction of the train split held out for evaluation when there is no validation split."},
    )
    image_column_name: str = field(default="image", metadata={"help": "The image column of a `datasets` set."})
    label_column_name: str = field(default="label", metadata={"help": "The label column of a `datasets` set."})
    image_size: int | None = field(
        default=None,
        metadata={"help": "Side of the images the model sees (`datasets` sets); default: the image processor's with "
                          "--model_name_or_path, else the shorter side of the first training image, at most "
                          f"{MAX_INFERRED_SIZE} (give --image_size for larger)."},
    )
    augment: bool = field(
        default=True,
        metadata={"help": "Augment the training images (a built-in set: its own augmentation, e.g. digits' shifts "
                          "by up to 2 pixels; a `datasets` set: random resized crops and flips); false: train on "
                          "the images as evaluation sees them."},
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Use only N training images, chosen at random with --seed."})
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Use only N evaluation images, chosen at random with --seed."})
    max_predict_samples: int | None = field(
        default=None, metadata={"help": "Use only N test images for predict, chosen at random with --seed."}
    )

    def __post_init__(self):
        for key in ("max_train_samples", "max_eval_samples", "max_predict_samples", "image_size"):
            value = getattr(self, key)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"--{key} must be a positive whole number (or unset for "
                                 f"{'all of them' if key != 'image_size' else 'the data set size'}), got {value!r}")
        if self.dataset_name and (self.train_dir or self.validation_dir):
            raise ValueError("give --dataset_name or --train_dir/--validation_dir, not both")
        if self.uses_datasets and (self.data_dir or self.hub_id):
            raise ValueError("--data_dir and --hub_id belong to a built-in --dataset; with --dataset_name or "
                             "--train_dir/--validation_dir leave them unset")
        if self.train_val_split is not None and not 0.0 <= self.train_val_split < 1.0:
            raise ValueError(f"train_val_split must lie in [0, 1), got {self.train_val_split}")
        if self.uses_datasets and self.dataset != DataArguments.dataset:
            raise ValueError(f"--dataset {self.dataset} names a built-in set, but --dataset_name / --train_dir "
                             "choose another: give one of them")
        if not self.uses_datasets:
            self._refuse_what_a_builtin_set_ignores()

    _GENERIC = ("image_column_name", "label_column_name", "dataset_config_name", "train_val_split", "image_size")

    def _refuse_what_a_builtin_set_ignores(self) -> None:
        name = self.builtin_for_hub_id or self.dataset
        spec = dataset_spec(name)  # an unknown name is an error naming the known ones
        if self.dataset_name and self.dataset not in (DataArguments.dataset, name):
            raise ValueError(f"--dataset {self.dataset} and --dataset_name {self.dataset_name} (the Hub copy of "
                             f"{name}) name different sets: give one of them")
        if spec.reader.embedded and (self.data_dir or self.hub_id):
            raise ValueError(f"{name} is embedded in petra_hub: --data_dir and --hub_id do not apply to it")
        defaults = {f.name: f.default for f in fields(DataArguments)}
        changed = [key for key in self._GENERIC if getattr(self, key) != defaults[key]
                   and not (key == "image_size" and self.image_size == spec.info.image_size)]
        if changed:
            raise ValueError(f"--{changed[0]} applies to a `datasets` set (--dataset_name, --train_dir); the built-in "
                             f"{name} has its own columns, splits and image size ({spec.info.image_size} pixels)")

    @property
    def set_name(self) -> str:
        """What the run calls its data (the card, the default output folder): a built-in set's name, a Hub id's
        last part, or a local folder's name (the folder above it for a split folder such as train/ or val/)."""
        where = self.dataset_name or self.train_dir or self.validation_dir
        if not where:
            return self.dataset
        path = os.path.normpath(os.path.expanduser(str(where)))
        name = os.path.basename(path)
        if name.lower() in SPLIT_FOLDER_NAMES and os.path.basename(os.path.dirname(path)):
            name = os.path.basename(os.path.dirname(path))
        return name

    @property
    def uses_datasets(self) -> bool:
        """True for a set read through `datasets` with the generic transforms (not a built-in name)."""
        return bool(self.train_dir or self.validation_dir) or bool(self.dataset_name and not self.builtin_for_hub_id)

    @property
    def builtin_for_hub_id(self) -> str | None:
        """The built-in set whose default Hub id is --dataset_name (its registry recipe applies), if any."""
        matches = [name for name, spec in DATASET_SPECS.items() if spec.hub_id and spec.hub_id == self.dataset_name]
        return matches[0] if matches else None


@dataclass
class RecipeData:
    """What the trainer needs: data sets (None where not asked for), labels, collator and image processor."""

    train: Any
    eval: Any
    test: Any
    label_names: list[str]
    image_size: int
    collator: Callable
    processor: Any
    name: str
    card_arguments: dict = field(default_factory=dict)  # for the model card: what the data sets cannot tell


@dataclass
class ApplyTransform:
    """`dataset.with_transform(ApplyTransform(transform, "image"))`: adds `pixel_values` to each batch.
    `label_column` (the collator's) tells the trainer which column to check before training."""

    transform: Callable
    image_column: str
    label_column: str | None = None

    def __call__(self, batch: dict) -> dict:
        batch["pixel_values"] = [self.transform(self.decode(image)) for image in batch[self.image_column]]
        return batch

    def decode(self, image):
        """An RGB PIL image from a decoded one or an undecoded `datasets.Image` value ({"bytes", "path"}: the
        recipe decodes its images here, so that a file that cannot be decoded is named)."""
        try:
            return to_rgb(_open_image(image) if isinstance(image, dict) else image)
        except MemoryError:
            raise
        except Exception as error:  # noqa: BLE001 - PIL raises many types; name the file
            raise ValueError(f"{_image_name(image)} (column {self.image_column!r}): cannot decode the image "
                             f"({type(error).__name__}: {error})") from error


def _image_source(value: dict):
    """What PIL opens for an undecoded `datasets.Image` value: its bytes, else its path."""
    import io

    return io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value["path"]


def _open_image(value: dict):
    image = open_image(_image_source(value))
    image.load()  # now, so that a truncated file fails here, named
    return image


def _inferred_size(first: dict, image_column: str) -> int:
    """The shorter side of the first image (read from its header: no pixels decoded), at most MAX_INFERRED_SIZE."""
    try:
        with open_image(_image_source(first)) as image:
            side = min(image.size)
    except Exception as error:  # noqa: BLE001 - PIL raises many types; name the file
        raise ValueError(f"{_image_name(first)} (column {image_column!r}), the first image, which gives the image "
                         f"size: cannot read it ({type(error).__name__}: {error})") from error
    if side > MAX_INFERRED_SIZE:
        logger.warning("%s, the first image, is %d pixels on its shorter side: the images are resized to %d, the "
                       "most inferred from an image (pass --image_size for more)", _image_name(first), side,
                       MAX_INFERRED_SIZE)
    return min(side, MAX_INFERRED_SIZE)


def _image_name(image) -> str:
    path = image.get("path") if isinstance(image, dict) else getattr(image, "filename", None)
    return f"image {path}" if path else "an image stored in the data set"


@dataclass
class ImageClassificationCollator:
    """The standard collator of image classification: `pixel_values` stacked, `labels` from the label column."""

    label_column: str = "label"

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        items = [{"pixel_values": e["pixel_values"], "labels": e[self.label_column]} for e in examples]
        return collate_image_batch(items)  # refuses float labels rather than truncating them


def image_transforms(size: int, mean, std, resize: int | tuple[int, int] | None = None) -> tuple[Callable, Callable]:
    """(train, eval) torchvision transforms from PIL images to normalised float tensors [3, size, size]. Evaluation
    resizes to `resize` (the shorter side, or (height, width); default `size`), then crops the centre `size`."""
    from torchvision.transforms import v2

    to_tensor = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean=list(mean), std=list(std)),
                 v2.ToPureTensor()]
    train = v2.Compose([v2.RandomResizedCrop(size), v2.RandomHorizontalFlip(), *to_tensor])
    evaluate = v2.Compose([v2.Resize(resize or size), v2.CenterCrop(size), *to_tensor])
    return train, evaluate


def processor_geometry(processor) -> tuple[int, int | tuple[int, int]] | None:
    """(size the model sees, what evaluation resizes to) as a pretrained image processor prepares an image: resize
    the shorter side then crop the centre (ImageNet's 256 then 224), or resize to (height, width) (ViT's); None
    when it says neither."""
    sizes, crop = getattr(processor, "size", None) or {}, getattr(processor, "crop_size", None) or {}
    resize = sizes.get("shortest_edge") or (
        (sizes["height"], sizes["width"]) if sizes.get("height") and sizes.get("width") else None)
    if resize is None:
        return None
    if getattr(processor, "do_center_crop", False) and crop.get("height"):
        return crop["height"], resize
    return (resize if isinstance(resize, int) else resize[0]), resize


def resized_processor(processor, size: int):
    """A copy of a pretrained image processor that prepares images as `image_transforms(size, ...)` evaluates them
    (`--image_size` given): the shorter side to `size`, then the centre `size` x `size` (or (`size`, `size`) for a
    processor that resizes to height and width), so that the processor saved with the run matches its training."""
    resized = copy.deepcopy(processor)
    sizes = getattr(resized, "size", None) or {}
    if "shortest_edge" in sizes or not ("height" in sizes and "width" in sizes):
        resized.size = {"shortest_edge": size}
        resized.crop_size = {"height": size, "width": size}
        resized.do_center_crop = True
    else:
        resized.size = {"height": size, "width": size}
    return resized


def load_data(args: DataArguments, *, seed: int, splits: set[str], processor=None, keep_images: bool = True
              ) -> RecipeData:
    """The data sets named in `splits` ("train", "eval", "test"); `processor` is a pretrained model's image
    processor (its size, mean and std serve a `datasets` set), or None. `keep_images=False` (a process that does not
    run the first stage) holds no images of a built-in set in memory (see `load_image_dataset`)."""
    if args.uses_datasets:
        return _load_datasets(args, seed, splits, processor)
    return _load_builtin(args, seed, splits, keep_images)


def _load_builtin(args: DataArguments, seed: int, splits: set[str], keep_images: bool) -> RecipeData:
    name = args.builtin_for_hub_id or args.dataset
    spec = dataset_spec(name)
    source = {} if spec.reader.embedded else {"data_dir": args.data_dir, "hub_id": args.hub_id or args.dataset_name}
    source["keep_images"] = keep_images
    train = load_image_dataset(name, "train", seed=seed, augment=args.augment, **source) if "train" in splits else None
    test = load_image_dataset(name, "test", **source) if splits & {"eval", "test"} else None
    info: DatasetInfo = (train or test).info
    return RecipeData(
        train=sample(train, args.max_train_samples, seed) if train is not None else None,
        eval=sample(test, args.max_eval_samples, seed) if "eval" in splits else None,
        test=sample(test, args.max_predict_samples, seed) if "test" in splits else None,
        label_names=list(info.label_names),
        image_size=info.image_size,
        collator=collate_image_batch,
        processor=image_processor_for(info, spec.eval_shorter_side),
        name=name,
        card_arguments=({"eval_split": evaluated_part("test", args.max_eval_samples, len(test))}
                        if "eval" in splits and is_cut(args.max_eval_samples, len(test)) else {}),
    )


def _open(args: DataArguments):
    import datasets

    if args.dataset_name:
        check_dataset_path(args.dataset_name)
        path = os.path.expanduser(args.dataset_name)
        if os.path.isfile(os.path.join(path, "dataset_dict.json")) or os.path.isfile(os.path.join(path, "state.json")):
            if args.dataset_config_name:
                raise ValueError(f"--dataset_config_name {args.dataset_config_name!r} does not apply to {path}, a "
                                 "save_to_disk folder (it holds one configuration): leave it unset")
            loaded = _load_from_disk(path)  # save_to_disk output: a DatasetDict or one Dataset (train)
            return loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict(train=loaded)
        return load_from_hub(args.dataset_name, args.dataset_config_name, remedy="give --dataset_name a local "
                             "save_to_disk folder, or --train_dir / --validation_dir folders of class folders")
    files = {split: os.path.join(folder, "**") for split, folder in (("train", args.train_dir),
                                                                      ("validation", args.validation_dir)) if folder}
    check_image_folders({flag: folder for flag, folder in (("train_dir", args.train_dir),
                                                           ("validation_dir", args.validation_dir)) if folder})
    return datasets.load_dataset("imagefolder", data_files=files)


def _load_from_disk(path: str):
    import datasets

    try:
        return datasets.load_from_disk(path)
    except IndexError:  # what datasets raises for a split saved with no rows: find which
        parts = [path]
        if os.path.isfile(os.path.join(path, "dataset_dict.json")):
            parts = [os.path.join(path, s) for s in sorted(os.listdir(path)) if os.path.isdir(os.path.join(path, s))]
        for part in parts:
            try:
                datasets.load_from_disk(part)
            except IndexError:
                split = "train" if part == path else os.path.basename(part)
                raise ValueError(f"{path}: split {split!r} has no items") from None
        raise


def _column(features, wanted: str, default: str, fallbacks: tuple[str, ...], kind, what: str) -> str:
    if wanted in features:
        return wanted
    if wanted == default:  # left at its default: try the usual names, then the first feature of the right kind
        found = next((c for c in fallbacks if c in features), None) or next(
            (c for c, f in features.items() if isinstance(f, kind)), None)
        if found:
            return found
    raise ValueError(f"--{what}_column_name {wanted!r} is not a column of the data set "
                     f"(columns: {', '.join(features)}); pass --{what}_column_name")


def _load_datasets(args: DataArguments, seed: int, splits: set[str], processor) -> RecipeData:
    import datasets

    data = _open(args)
    eval_split = next((s for s in EVAL_SPLITS if s in data), None)
    held_out = None  # what the evaluated data is where it is no split of the set (its rows keep split "train")
    where = args.dataset_name or args.train_dir or args.validation_dir
    if "train" in data and len(data["train"]) == 0 and ("train" in splits or eval_split is None):
        raise ValueError(f"{where}: split 'train' has no items")
    if eval_split is None and "train" in data and args.train_val_split and splits & {"eval", "test"}:
        parts = data["train"].train_test_split(test_size=args.train_val_split, seed=seed)  # seeded: same on every rank
        data["train"], data["validation"], eval_split = parts["train"], parts["test"], "validation"
        held_out = f"held-out {100 * args.train_val_split:g}% of train"
    names = {"train": "train" if "train" in data else None, "eval": eval_split,
             "test": "test" if "test" in data else eval_split}
    for split in sorted(splits):
        if names[split] is None:
            raise ValueError(f"{where}: no split for {split} "
                             f"among {list(data)} (train_val_split={args.train_val_split})")
        if len(data[names[split]]) == 0:
            raise ValueError(f"{where}: split {names[split]!r} (for {split}) has no items")
    reference = data[names["train"] or eval_split or next(iter(data))]
    image_column = _column(reference.features, args.image_column_name, "image", IMAGE_COLUMNS, datasets.Image, "image")
    label_column = _column(reference.features, args.label_column_name, "label", LABEL_COLUMNS, datasets.ClassLabel,
                           "label")
    data, label_names = label_names_of(data, reference.features[label_column], label_column)
    data = data.cast_column(image_column, datasets.Image(decode=False))  # decoded by ApplyTransform, which names files

    if args.image_size and processor is not None:  # the processor saved with the run prepares images at that size
        processor = resized_processor(processor, args.image_size)
    if args.image_size and processor is None:
        size = resize = args.image_size
    elif processor is not None and (geometry := processor_geometry(processor)) is not None:
        size, resize = geometry
    else:
        size = resize = _inferred_size(data[names["train"] or eval_split or next(iter(data))][0][image_column],
                                       image_column)
    mean, std = normalisation(processor)
    name = args.set_name
    if processor is None:
        info = DatasetInfo(name, len(label_names), size, 3, tuple(mean), tuple(std), tuple(label_names))
        processor = image_processor_for(info, shorter_side=size)  # as `image_transforms` evaluates
    train_transform, eval_transform = image_transforms(size, mean, std, resize)

    def select(split: str, transform, limit: int | None):
        if split not in splits:
            return None
        dataset = data[names[split]]
        if is_cut(limit, len(dataset)):  # as `sample` chooses for the built-in data sets
            dataset = dataset.select(sampled_indices(len(dataset), limit, seed))
        return dataset.with_transform(ApplyTransform(transform, image_column, label_column))

    return RecipeData(
        train=select("train", train_transform if args.augment else eval_transform, args.max_train_samples),
        eval=select("eval", eval_transform, args.max_eval_samples),
        test=select("test", eval_transform, args.max_predict_samples),
        label_names=label_names,
        image_size=size,
        collator=ImageClassificationCollator(label_column),
        processor=processor,
        name=name,
        card_arguments={"dataset": name, **({"eval_split": evaluated_part(
            held_out or eval_split, args.max_eval_samples, len(data[eval_split]))} if eval_split else {})},
    )
