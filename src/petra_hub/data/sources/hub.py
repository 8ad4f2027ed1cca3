"""Any registered data set through the ``datasets`` library (a Hub repository or a local copy).

``hub_id`` is a Hub repository id, a local repository folder (e.g. parquet files), or a
``save_to_disk`` folder (holding ``dataset_dict.json``).  The split is the first of the
spec's aliases that exists (``DatasetSpec.hub_splits``: "test" is "validation" first for
ImageNet, whose Hub "test" split has no labels).  The image and label columns are the
first of the spec's preferred names present, else the first ``Image`` / ``ClassLabel``
feature; ``ClassLabel`` names replace the default label names.  Labels must be integers
in ``0..num_labels-1`` (floats are an error, never truncated); an empty split, and an
image that cannot be decoded, are ValueErrors naming the source, split (and item).
Images are decoded here, not by ``datasets``, through ``open_image``: an image above PIL's
decompression-bomb limit is refused, as in the folder reader.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from . import check_class_count, check_label_range, int_labels, open_image, pil_to_uint8

if TYPE_CHECKING:
    from ..registry import DatasetSpec
    from . import Loaded


def names_a_missing_path(name: str) -> bool:
    """Whether ``name`` is a local path (``.``, ``..``, or starting ``/``, ``./``, ``../``, ``~``: no Hub id) that
    does not exist (`datasets` would look it up on the Hub instead)."""
    local = name in (".", "..") or name.startswith(("/", "./", "../", "~"))
    return local and not os.path.exists(os.path.expanduser(name))


def load_from_hub(hub_id: str, *args, remedy: str, **kwargs):
    """``datasets.load_dataset(hub_id, *args, **kwargs)``; a set that cannot be found or reached is a
    FileNotFoundError naming it, saying whether offline mode is why, and what to do (``remedy``), where `datasets`
    says only that it could not reach the Hub."""
    import datasets

    if names_a_missing_path(hub_id):
        raise FileNotFoundError(f"{hub_id!r} is a local path, but there is no such file or folder: expected a folder "
                                f"(save_to_disk output, or data files) or a Hub id such as uoft-cs/cifar10")
    try:
        return datasets.load_dataset(hub_id, *args, **kwargs)
    except (ConnectionError, FileNotFoundError) as exc:  # DatasetNotFoundError is a FileNotFoundError
        if datasets.config.HF_HUB_OFFLINE or datasets.config.HF_DATASETS_OFFLINE:
            reason = ("it is not in the datasets cache, and offline mode is on (HF_HUB_OFFLINE or "
                      "HF_DATASETS_OFFLINE): run once with network access to cache it")
        else:
            reason = "it is neither a local folder nor a data set the Hub serves (or the Hub cannot be reached)"
        raise FileNotFoundError(f"cannot load the data set {hub_id!r}: {reason}; or {remedy} "
                                f"({type(exc).__name__}: {exc})") from None


def _open_split(hub_id: str, candidates: tuple[str, ...], remedy: str):
    """``(dataset, split name)`` of the first of ``candidates`` that loads."""
    import datasets

    dict_json = os.path.join(hub_id, "dataset_dict.json")
    if os.path.isfile(dict_json):  # save_to_disk output: open the one split needed
        try:
            with open(dict_json, encoding="utf-8") as fh:
                splits = [str(s) for s in json.load(fh)["splits"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{dict_json}: unreadable ({type(exc).__name__}: {exc})") from None
        s = next((s for s in candidates if s in splits), None)
        if s is None:
            raise ValueError(f"{hub_id}: none of the splits {candidates} in {splits}")
        try:
            return datasets.load_from_disk(os.path.join(hub_id, s)), s
        except IndexError:  # what datasets raises for a split saved with no rows
            raise ValueError(f"{hub_id}: split {s!r} has no items") from None
    errors = []
    for s in candidates:
        try:
            return load_from_hub(hub_id, split=s, remedy=remedy), s
        except ValueError as exc:  # unknown split name, or no data: try the next alias
            errors.append(f"{s!r}: {exc}")
    raise ValueError(f"{hub_id}: no split {' / '.join(map(repr, candidates))} with items "
                     f"({'; '.join(errors)})")


def load_hub(spec: DatasetSpec, split: str, hub_id: str) -> Loaded:
    """``(source, labels, info)`` of split ``split`` ("train" / "test") of ``hub_id``."""
    import datasets

    remedy = f"pass data_dir (the recipe's --data_dir): {spec.reader.layout}"
    ds, used = _open_split(hub_id, spec.hub_splits(split), remedy)
    where = f"{hub_id} split {used!r}"
    if len(ds) == 0:
        raise ValueError(f"{where}: no items")
    image_pref, label_pref = spec.hub_image_columns, spec.hub_label_columns
    feats = ds.features
    image_col = next((c for c in image_pref if c in feats), None) or next(
        (c for c, f in feats.items() if isinstance(f, datasets.Image)), None)
    label_col = next((c for c in label_pref if c in feats), None) or next(
        (c for c, f in feats.items() if isinstance(f, datasets.ClassLabel)), None)
    if image_col is None or label_col is None:
        raise ValueError(f"{hub_id}: expected an image column ({'/'.join(image_pref)}) and a "
                         f"label column ({'/'.join(label_pref)}), found {list(feats)}")
    info = spec.info
    if isinstance(feats[label_col], datasets.ClassLabel):
        check_class_count(feats[label_col].num_classes, f"{where}: column {label_col!r} (a ClassLabel)")
        names = tuple(feats[label_col].names)
        info = replace(info, num_labels=len(names), label_names=names)
    raw = ds.select_columns([label_col]).with_format("numpy")[:][label_col]
    labels = torch.from_numpy(int_labels(raw, f"{where}: column {label_col!r}"))
    check_label_range(labels, 0, info.num_labels - 1, f"{where}: column {label_col!r}")
    images = ds.select_columns([image_col])
    encoded = isinstance(feats[image_col], datasets.Image)
    if encoded:  # the file's bytes (or path), decoded by open_image below
        images = images.cast_column(image_col, datasets.Image(decode=False))

    def source(index: int) -> torch.Tensor:
        try:
            item = images[index][image_col]
            if not encoded:
                return pil_to_uint8(item)
            with open_image(item["path"] if item["bytes"] is None else io.BytesIO(item["bytes"])) as img:
                return pil_to_uint8(img)
        except MemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - name the item whatever went wrong
            raise ValueError(f"{where}: item {index}: cannot decode the image "
                             f"({type(exc).__name__}: {exc})") from exc

    return source, labels, info
