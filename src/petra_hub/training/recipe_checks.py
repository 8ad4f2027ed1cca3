"""Checks of a `datasets` set the recipe reads (see `recipe_data`): its labels and the image processor's
normalisation, refused with an error naming the column / setting before anything is allocated from them."""

from __future__ import annotations

import math

from ..data import dataset_spec
from ..data.sources import MAX_CLASSES, check_class_count

__all__ = ["check_class_indices", "label_names_of", "normalisation"]

# Plain integer labels name the classes 0..max: refused when max+1 is far more than the distinct values seen (a
# stray huge index would otherwise make that many classes), beyond this many classes.
SPARSE_CLASSES = 1_000
SPARSE_RATIO = 10


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
