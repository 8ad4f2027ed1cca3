"""Any registered data set through the ``datasets`` library (a Hub repository or a local copy).

``hub_id`` is a Hub repository id, a local repository folder (e.g. parquet files), or a
``save_to_disk`` folder (holding ``dataset_dict.json``).  The split is the first of the
spec's aliases that exists (``DatasetSpec.hub_splits``: "test" is "validation" first for
ImageNet, whose Hub "test" split has no labels).  The image and label columns are the
first of the spec's preferred names present, else the first ``Image`` / ``ClassLabel``
feature; ``ClassLabel`` names replace the default label names.
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from . import pil_to_uint8

if TYPE_CHECKING:
    from ..registry import DatasetSpec
    from . import Loaded


def _open_split(hub_id: str, candidates: tuple[str, ...]):
    import datasets

    if os.path.isfile(os.path.join(hub_id, "dataset_dict.json")):  # save_to_disk output
        dd = datasets.load_from_disk(hub_id)
        ds = next((dd[s] for s in candidates if s in dd), None)
        if ds is None:
            raise ValueError(f"{hub_id}: none of the splits {candidates} in {list(dd)}")
        return ds
    first_error = None
    for s in candidates:
        try:
            return datasets.load_dataset(hub_id, split=s)
        except ValueError as exc:  # unknown split name: try the next alias
            first_error = first_error or exc
    raise first_error


def load_hub(spec: DatasetSpec, split: str, hub_id: str) -> Loaded:
    """``(source, labels, info)`` of split ``split`` ("train" / "test") of ``hub_id``."""
    import datasets

    ds = _open_split(hub_id, spec.hub_splits(split))
    image_pref, label_pref = spec.hub_image_columns, spec.hub_label_columns
    feats = ds.features
    image_col = next((c for c in image_pref if c in feats), None) or next(
        (c for c, f in feats.items() if isinstance(f, datasets.Image)), None)
    label_col = next((c for c in label_pref if c in feats), None) or next(
        (c for c, f in feats.items() if isinstance(f, datasets.ClassLabel)), None)
    if image_col is None or label_col is None:
        raise ValueError(f"{hub_id}: expected an image column ({'/'.join(image_pref)}) and a "
                         f"label column ({'/'.join(label_pref)}), found {list(feats)}")
    labels = torch.as_tensor(
        np.asarray(ds.select_columns([label_col]).with_format("numpy")[:][label_col]),
        dtype=torch.int64)
    info = spec.info
    if isinstance(feats[label_col], datasets.ClassLabel):
        names = tuple(feats[label_col].names)
        info = replace(info, num_labels=len(names), label_names=names)
    images = ds.select_columns([image_col])

    def source(index: int) -> torch.Tensor:
        return pil_to_uint8(images[index][image_col])

    return source, labels, info
