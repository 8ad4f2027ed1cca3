"""Readers of the data sets' files, one module per format.

A reader is the ``reader`` of a :class:`~petra_hub.data.registry.DatasetSpec`: an object
with two attributes and a call (see :class:`LocalReader`):

``embedded``  None for data read from ``data_dir``; else where the embedded data comes
              from (e.g. "scikit-learn"), and the data set then takes no ``data_dir``
              nor ``hub_id``.
``layout``    what ``data_dir`` must hold, for error messages.
``reader(spec, split, data_dir)`` with ``split`` "train" or "test" and ``data_dir`` an
              existing path (None for an embedded set) returns ``(source, labels, info)``:
              ``source(i)`` the raw [C, H, W] image i (uint8, or float in [0, 1]),
              ``labels`` an int64 tensor of all labels (read without decoding any image)
              and ``info`` the spec's :class:`DatasetInfo`, with ``label_names`` /
              ``num_labels`` replaced where the files say otherwise.

Modules: :mod:`.digits` (scikit-learn's digits), :mod:`.pickles` (CIFAR folders and
tarballs, ImageNet32 pickles / .npz), :mod:`.folders` (image-folder layout) and
:mod:`.hub` (any data set through the ``datasets`` library; not a reader, the fallback
when no ``data_dir`` is given).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

import torch

if TYPE_CHECKING:
    from ..registry import DatasetInfo, DatasetSpec

    Loaded = tuple[Callable[[int], torch.Tensor], torch.Tensor, DatasetInfo]


class LocalReader(Protocol):
    embedded: str | None
    layout: str

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None) -> Loaded: ...


def pil_to_uint8(img) -> torch.Tensor:
    """A PIL image as a [3, H, W] uint8 tensor (converted to RGB first)."""
    from torchvision.transforms.v2 import functional as TF

    if img.mode != "RGB":
        img = img.convert("RGB")
    return TF.pil_to_tensor(img)
