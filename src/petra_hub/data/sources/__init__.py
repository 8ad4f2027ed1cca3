"""Readers of the data sets' files, one module per format.

A reader is the ``reader`` of a :class:`~petra_hub.data.registry.DatasetSpec`: an object
with two attributes and a call (see :class:`LocalReader`):

``embedded``  None for data read from ``data_dir``; else where the embedded data comes
              from (e.g. "scikit-learn"), and the data set then takes no ``data_dir``
              nor ``hub_id``.
``layout``    what ``data_dir`` must hold, for error messages.
``reader(spec, split, data_dir, keep_images=True)`` with ``split`` "train" or "test" and
              ``data_dir`` an existing path (None for an embedded set) returns
              ``(source, labels, info)``:
              ``source(i)`` the raw [C, H, W] image i (uint8, or float in [0, 1]),
              ``labels`` an int64 tensor of all labels (read without decoding any image)
              and ``info`` the spec's :class:`DatasetInfo`, with ``label_names`` /
              ``num_labels`` replaced where the files say otherwise.  With
              ``keep_images=False`` a reader that would hold every image in memory
              (CIFAR, ImageNet32 batches) holds none and reads one when asked instead;
              the image folders always read on demand, and the embedded digits (115 KB)
              are always held.

Modules: :mod:`.digits` (scikit-learn's digits), :mod:`.pickles` (CIFAR folders and
tarballs, ImageNet32 pickles / .npz), :mod:`.folders` (image-folder layout),
:mod:`.hub` (any data set through the ``datasets`` library; not a reader, the fallback
when no ``data_dir`` is given) and :mod:`.safe_io` (size-capped reads, tar members,
.npz and the restricted unpickler).

Labels are checked by :func:`int_labels` (a flat list or 1-D array of integers, never
a float rounded or truncated, nothing converted before its length is known) and
:func:`check_label_range`; the number of classes a data set may declare (one output of the
model each) by :func:`check_class_count`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from ..registry import DatasetInfo, DatasetSpec

    Loaded = tuple[Callable[[int], torch.Tensor], torch.Tensor, DatasetInfo]


class LocalReader(Protocol):
    embedded: str | None
    layout: str

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None, keep_images: bool = True) -> Loaded: ...


# The most classes a data set may declare: each is an output of the classifier, so a file naming a huge class index
# (or declaring a huge ClassLabel) would make the model allocate that many rows. ImageNet-21k has 21,841.
MAX_CLASSES = 100_000


def check_class_count(count: int, where: str) -> None:
    """ValueError naming ``where`` when a data set would make more than ``MAX_CLASSES`` classes."""
    if count > MAX_CLASSES:
        raise ValueError(f"{where}: {count:,} classes, more than the {MAX_CLASSES:,} supported (each class is an "
                         "output of the classifier)")


SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")


def open_image(source):
    """`PIL.Image.open`, with PIL's decompression-bomb warning (an image of more than `PIL.Image.MAX_IMAGE_PIXELS`,
    89 million pixels by default) raised as an error: a file of a few hundred kilobytes can decode to gigabytes. Raise
    `PIL.Image.MAX_IMAGE_PIXELS` to read larger images on purpose."""
    from PIL import Image

    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        return Image.open(source)


def to_rgb(img):
    """A PIL image in mode RGB. 16-bit images (modes I;16*, and I holding 0..65535, as 16-bit PNGs open) are
    scaled to 0..255 (divided by 257), float images (mode F) in [0, 1] multiplied by 255, instead of being
    saturated by ``convert("RGB")``; ValueError naming the mode and the range for an I or F image outside those."""
    from PIL import Image

    if img.mode == "RGB":
        return img
    if img.mode in SIXTEEN_BIT_MODES or img.mode in ("I", "F"):
        values = np.asarray(img)
        low, high = (values.min(), values.max()) if values.size else (0, 0)
        if img.mode == "F" and not (np.isfinite(values).all() and 0 <= low and high <= 1):
            raise ValueError(f"a float image (mode F) with values in {low:g}..{high:g}: expected values in [0, 1]")
        if img.mode == "I" and (low < 0 or high > 65535):
            raise ValueError(f"a 32-bit integer image (mode I) with values in {low}..{high}: expected 16-bit "
                             "values (0..65535)")
        scaled = np.rint(values * 255) if img.mode == "F" else values.astype(np.int64) // 257
        img = Image.fromarray(scaled.astype(np.uint8))  # 2-D uint8: mode L
    return img.convert("RGB")


def pil_to_uint8(img) -> torch.Tensor:
    """A PIL image as a [3, H, W] uint8 tensor (through :func:`to_rgb`: 16-bit and float images scaled)."""
    from torchvision.transforms.v2 import functional as TF

    return TF.pil_to_tensor(to_rgb(img))


def _describe(value) -> str:
    if isinstance(value, (float, np.floating)):
        return f"float labels (e.g. {value!r}); they are neither rounded nor truncated"
    if isinstance(value, (list, tuple, np.ndarray)):
        return f"a nested {type(value).__name__}: labels must be a flat list"
    return f"a {type(value).__name__} ({value!r:.40})"


def int_labels(values, where: str, max_count: int | None = None) -> np.ndarray:
    """``values`` (a list / tuple of ints or a 1-D integer array) as a 1-D int64 array.

    ValueError naming ``where`` for anything else: floats (never rounded or truncated),
    nested lists, booleans, other types, or more than ``max_count`` values (checked
    before any conversion, so a small nested structure cannot expand in memory).
    """
    if not isinstance(values, (np.ndarray, list, tuple)):
        raise ValueError(f"{where}: expected a list of integer labels, got {type(values).__name__}")
    if max_count is not None and len(values) > max_count:
        raise ValueError(f"{where}: {len(values):,} labels, more than the {max_count:,} expected "
                         "at most")
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError(f"{where}: expected a flat list of integer labels, "
                             f"got an array of shape {values.shape}")
        if values.dtype.kind == "f" and len(values):
            odd = values[~np.isclose(values, np.round(values))]  # NaN included
            sample = float(odd[0] if len(odd) else values[0])
            raise ValueError(f"{where}: expected integer labels, got {_describe(sample)}")
        if values.dtype.kind not in "iu":
            raise ValueError(f"{where}: expected integer labels, got an array of {values.dtype}")
    else:
        for v in values:
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise ValueError(f"{where}: expected a flat list of integer labels, found "
                                 f"{_describe(v)}")
    if isinstance(values, np.ndarray) and values.dtype == np.uint64 and len(values) \
            and values.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{where}: label {values.max()} does not fit in int64")
    try:
        return np.array(values, dtype=np.int64)  # a writable copy (pickled arrays are read-only)
    except OverflowError:
        raise ValueError(f"{where}: a label does not fit in int64") from None


def check_label_range(labels, lo: int, hi: int, where: str) -> None:
    """ValueError naming ``where`` unless every label lies in ``lo..hi``."""
    labels = torch.as_tensor(labels)
    if len(labels) and (int(labels.min()) < lo or int(labels.max()) > hi):
        raise ValueError(f"{where}: labels must lie in {lo}..{hi}, "
                         f"found {int(labels.min())}..{int(labels.max())}")
