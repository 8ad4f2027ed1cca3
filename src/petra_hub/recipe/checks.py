"""Checks of a `datasets` set the recipe reads (see `petra_hub.recipe.data`): its labels and the image processor's
normalisation, refused with an error naming the column / setting before anything is allocated from them."""

from __future__ import annotations

import math
import os

from ..data import dataset_spec
from ..data.sources import MAX_CLASSES, check_class_count
from ..data.sources.hub import names_a_missing_path

__all__ = ["check_class_indices", "check_dataset_path", "check_image_folders", "label_names_of", "normalisation"]

# Plain integer labels name the classes 0..max: refused when max+1 is far more than the distinct values seen (a
# stray huge index would otherwise make that many classes), beyond this many classes.
SPARSE_CLASSES = 1_000
SPARSE_RATIO = 10
METADATA_FILES = ("metadata.csv", "metadata.jsonl", "metadata.parquet")  # imagefolder's labels without sub-folders


def check_dataset_path(name: str) -> None:
    """A --dataset_name that looks like a local path must exist (`datasets` would look it up on the Hub instead)."""
    if names_a_missing_path(name):
        raise ValueError(f"--dataset_name {name!r} is a local path, but there is no such file or folder: expected a "
                         "folder (save_to_disk output, or data files) or a Hub id such as uoft-cs/cifar10")


def check_image_folders(folders: dict[str, str]) -> None:
    """`folders` ({flag: path}, e.g. {"train_dir": ...}) must be image folders as `imagefolder` reads them: one
    sub-folder per class (its name is the label) holding images, at least two classes in all; a folder with a
    metadata file (metadata.csv, ...) labels its images there and is not checked further."""
    from datasets.packaged_modules.imagefolder.imagefolder import ImageFolder

    extensions = tuple(extension.lower() for extension in ImageFolder.EXTENSIONS)
    expected = "expected a folder of one sub-folder per class holding its images ({}/<class>/<image>; the sub-folder " \
               "names are the labels)"
    classes: dict[str, str] = {}
    with_metadata = False
    for flag, path in folders.items():
        where = f"--{flag} {path!r}"
        if not os.path.isdir(path):
            what = "is a file, not a folder" if os.path.exists(path) else "does not exist"
            raise ValueError(f"{where} {what}: {expected.format(path)}")
        entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        if any(entry.name in METADATA_FILES for entry in entries):
            with_metadata = True
            continue
        loose = [e.name for e in entries if e.is_file() and e.name.lower().endswith(extensions)]
        found = [e.name for e in entries if e.is_dir() and _holds_an_image(e.path, extensions)]
        if loose:
            beside = f"beside the class sub-folders {found[:3]}" if found else "and no class sub-folders"
            raise ValueError(f"{where} holds images at its top level ({loose[0]}, ...) {beside}: "
                             f"{expected.format(path)} (--label_column_name does not apply to an image folder)")
        if not found:
            raise ValueError(f"{where} holds no images in sub-folders: {expected.format(path)}")
        classes.update((name, flag) for name in found)
    if len(classes) == 1 and not with_metadata:
        (name, flag), = classes.items()
        raise ValueError(f"--{flag} {folders[flag]!r} has a single class sub-folder ({name!r}): an image classifier "
                         "needs at least two classes, one sub-folder each")


def _holds_an_image(folder: str, extensions: tuple[str, ...]) -> bool:
    return any(name.lower().endswith(extensions) for _, _, names in os.walk(folder) for name in names)


def label_names_of(data, feature, label_column: str):
    """(data, label names) of the `datasets` DatasetDict `data` whose label column has the feature `feature`: a
    ClassLabel's names; strings sorted (and the
    column cast to a ClassLabel, so that every split encodes them alike); plain integers named "0".."max"."""
    import datasets

    if isinstance(feature, datasets.ClassLabel):
        check_class_count(feature.num_classes, f"label column {label_column!r} (a ClassLabel)")
        return data, list(feature.names)
    values = set()
    for name, split in data.items():
        for row, value in enumerate(split[label_column]):
            if value is None:
                raise ValueError(f"label column {label_column!r} has an empty cell at row {row} of split {name!r}: "
                                 "every image needs a label (a class index from 0, a string or a ClassLabel)")
            values.add(value)
    if values and all(isinstance(v, str) for v in values):
        names = sorted(values)
        check_class_count(len(names), f"label column {label_column!r} ({len(names):,} distinct strings)")
        return data.cast_column(label_column, datasets.ClassLabel(names=names)), names
    check_class_indices(values, label_column)
    return data, [str(i) for i in range(max(values) + 1)]


def check_class_indices(values, column: str) -> None:
    """Plain label values must be class indices: integers from 0 (floats are refused, never truncated), as many
    classes (the largest + 1) as the model can have and not far more than the distinct values."""
    wrong = sorted((v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 0), key=repr)
    if wrong:
        raise ValueError(f"label column {column!r} holds {wrong[:4]}: class labels must be integers from 0 (or "
                         "strings, or a ClassLabel feature); floats are never truncated")
    if not values:
        return
    largest = max(values)
    count = largest + 1
    if count > MAX_CLASSES or (count > SPARSE_CLASSES and count > SPARSE_RATIO * len(values)):
        raise ValueError(
            f"label column {column!r} holds the class index {largest:,}: that makes {count:,} classes (one output "
            f"of the model each) for {len(values):,} distinct labels; class indices must run from 0 to the number "
            f"of classes - 1 (at most {MAX_CLASSES:,} classes, and at most {SPARSE_RATIO}x the distinct labels "
            f"beyond {SPARSE_CLASSES:,}): re-number the labels, or use strings or a ClassLabel feature"
        )


def normalisation(processor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The processor's `image_mean` / `image_std` (ImageNet's without a processor), checked: one finite number per
    channel (1 or 3), every std positive."""
    imagenet = dataset_spec("imagenet").info
    mean = getattr(processor, "image_mean", None) or imagenet.mean
    std = getattr(processor, "image_std", None) or imagenet.std
    for name, values in (("image_mean", mean), ("image_std", std)):
        numbers = values if isinstance(values, (list, tuple)) else [values]
        if len(numbers) not in (1, 3) or not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers):
            raise ValueError(
                f"the image processor's {name} must be 1 or 3 finite numbers (one per channel), got {values!r} "
                "(check preprocessor_config.json)"
            )
        if name == "image_std" and not all(v > 0 for v in numbers):
            raise ValueError(
                f"the image processor's image_std must be positive, got {values!r} (check preprocessor_config.json)"
            )
    return (
        tuple(mean) if isinstance(mean, (list, tuple)) else (mean,) * 3,
        tuple(std) if isinstance(std, (list, tuple)) else (std,) * 3,
    )
