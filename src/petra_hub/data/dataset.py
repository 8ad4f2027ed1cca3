"""The map-style dataset of a named data set, and its helpers.

``load_image_dataset(name, split)`` returns a ``torch.utils.data.Dataset`` whose items are
``{"pixel_values": float32 [3, S, S] (normalised), "labels": int}`` (the Hugging Face
``Trainer`` convention).  Each item is read by the spec's reader (or from the Hub),
transformed by the spec's train or test transform (seeded per item, see
:mod:`petra_hub.data.transforms`), then normalised as ``(x / 255 - mean) / std`` with the
per-channel :class:`DatasetInfo` statistics (float images are already in [0, 1]).
"""

from __future__ import annotations

import operator
import os
import random
from typing import Any, Callable, Sequence

import torch
from torch.utils.data import Dataset, Subset

from .registry import DatasetInfo, dataset_spec
from .sources import check_label_range
from .sources.hub import load_hub
from .transforms import Transform, item_seed

__all__ = ["load_image_dataset", "take", "collate_image_batch", "image_processor_for"]

_SPLITS = {"train": "train", "test": "test", "validation": "test", "val": "test"}


def _canonical_split(split: str) -> str:
    try:
        return _SPLITS[split]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown split {split!r}; expected 'train' or 'test' "
            "('validation' and 'val' are aliases of 'test')"
        ) from None


class _ImageDataset(Dataset):
    """Map-style dataset: ``source(i)`` gives the raw image (uint8 or float in [0, 1])."""

    def __init__(self, info: DatasetInfo, split: str, source: Callable[[int], torch.Tensor],
                 labels: torch.Tensor, transform: Transform, augment: bool, seed: int):
        self.info = info
        self.split = split
        self.labels = torch.as_tensor(labels, dtype=torch.int64).reshape(-1)
        self.augment = bool(augment)
        self.seed = int(seed)
        self._source = source
        self._transform = transform
        # The epoch and the per-item read counts live in shared memory: DataLoader workers kept alive between
        # epochs (persistent_workers) hold copies of this object, and must see set_epoch too.
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._draws = torch.zeros(len(self.labels), dtype=torch.int64).share_memory_()
        self._mean = torch.tensor(info.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std = torch.tensor(info.std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation stream of ``epoch`` (and restart the per-item counters), in this process and in
        its DataLoader workers."""
        self._epoch[0] = int(epoch)
        self._draws.zero_()

    def __getitem__(self, index) -> dict[str, Any]:
        index = operator.index(index)
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for a data set of {n} items")
        img = self._source(index)
        rng = None
        if self.augment:
            rng = random.Random(item_seed(self.seed, self.epoch, index, int(self._draws[index])))
            self._draws[index] += 1
        img = self._transform(img, self.info.image_size, rng)
        img = img.float().div_(255.0) if img.dtype == torch.uint8 else img.float()
        pixel_values = (img - self._mean) / self._std
        return {"pixel_values": pixel_values.contiguous(), "labels": int(self.labels[index])}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.info.name!r}, split={self.split!r}, "
                f"size={len(self)}, augment={self.augment}, seed={self.seed})")


def take(dataset: Dataset, count: int | None) -> Dataset:
    """The first ``count`` items of ``dataset`` (all of them for None), e.g. for quick runs and tests."""
    if count is None or count >= len(dataset):
        return dataset
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return _Part(dataset, range(count))


class _Part(Subset):
    """The items ``indices`` of a data set, in its order, keeping its ``info``, ``labels`` and ``set_epoch``
    (augmentation stays seeded by the items' own indices)."""

    def __init__(self, dataset: _ImageDataset, indices: Sequence[int]):
        super().__init__(dataset, indices)
        self.info = dataset.info
        self.labels = dataset.labels[torch.as_tensor(indices, dtype=torch.long)]

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)


def sample(dataset: Dataset, count: int | None, seed: int) -> Dataset:
    """``count`` items of ``dataset`` chosen at random with ``seed`` and kept in the data set's order (all of them for
    None): what the recipe's ``--max_train_samples`` and ``--max_eval_samples`` keep (the same ``sampled_indices`` on
    the `datasets` path), because the first items of a folder of class folders are all of one class."""
    if count is None or count >= len(dataset):
        return dataset
    return _Part(dataset, sampled_indices(len(dataset), count, seed))


def sampled_indices(size: int, count: int, seed: int) -> list[int]:
    """``count`` of the indices ``0 .. size - 1``, chosen at random with ``seed``, in increasing order."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    generator = torch.Generator().manual_seed(seed)
    return sorted(torch.randperm(size, generator=generator)[:count].tolist())


def _check_data_dir(data_dir: str, name: str) -> str:
    data_dir = os.path.expanduser(os.fspath(data_dir))
    if not os.path.exists(data_dir):
        raise FileNotFoundError(f"data_dir {data_dir!r} for {name!r} does not exist")
    return data_dir


def load_image_dataset(name: str, split: str, *, data_dir: str | None = None,
                       hub_id: str | None = None, augment: bool | None = None,
                       seed: int = 0, keep_images: bool = True) -> Dataset:
    """Load split ``split`` ("train" / "test") of data set ``name``.

    Items are ``{"pixel_values": float32 [3, S, S], "labels": int}``; the dataset has
    ``info`` (:class:`DatasetInfo`), ``labels`` (int64 tensor) and ``set_epoch(epoch)``.
    ``augment`` defaults to True for "train", False for "test"; ``seed`` fixes the
    augmentation stream.  ``data_dir`` (local files, see :mod:`petra_hub.data.sources`)
    and ``hub_id`` (Hub repo id or local dataset folder; default ``DatasetSpec.hub_id``)
    are mutually exclusive.  "validation" and "val" are aliases of "test".  A split with
    no items, or with labels outside ``0..num_labels-1``, is a ValueError naming it.
    ``keep_images=False`` is for a process that reads the labels and a few items (a
    pipeline process without the first stage): the batch-file sets (CIFAR, ImageNet32)
    then hold no image in memory and read one from its file when asked, slowly.
    """
    spec = dataset_spec(name)
    split = _canonical_split(split)
    augment = (split == "train") if augment is None else bool(augment)
    if data_dir is not None and hub_id is not None:
        raise ValueError("give data_dir (local files) or hub_id (a Hub data set), not both")
    reader = spec.reader
    if reader.embedded is not None:
        if data_dir is not None or hub_id is not None:
            raise ValueError(f"{name!r} is embedded ({reader.embedded}); it takes no data_dir / hub_id")
        source, labels, info = reader(spec, split, None, keep_images)
    elif data_dir is not None:
        source, labels, info = reader(spec, split, _check_data_dir(data_dir, name), keep_images)
    else:
        hub_id = hub_id or spec.hub_id
        if hub_id is None:
            raise ValueError(f"{name!r} needs data_dir ({reader.layout}) or hub_id (a Hub data set); "
                             "neither was given")
        source, labels, info = load_hub(spec, split, hub_id)
    _check_items(labels, info, f"{name} {split} ({data_dir or hub_id or reader.embedded})")
    return _ImageDataset(info, split, source, labels, spec.transform(augment), augment, seed)


def _check_items(labels: torch.Tensor, info: DatasetInfo, where: str) -> None:
    """Every reader's result: at least one item, labels in ``0..num_labels-1``."""
    if len(labels) == 0:
        raise ValueError(f"{where}: no items")
    check_label_range(labels, 0, info.num_labels - 1, where)


def collate_image_batch(items: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Stack items into ``{"pixel_values": [B, C, H, W] float32, "labels": [B] int64}``."""
    if not items:
        raise ValueError("collate_image_batch needs at least one item")
    labels = torch.as_tensor([it["labels"] for it in items])
    if labels.is_floating_point() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integers, got {labels[:4].tolist()}: class labels are never truncated")
    return {
        "pixel_values": torch.stack([torch.as_tensor(it["pixel_values"]) for it in items]),
        "labels": labels.to(torch.int64).reshape(-1),
    }


def image_processor_for(info: DatasetInfo, shorter_side: int | None = None):
    """The image processor saved with a model: it prepares an image as evaluation did. Without `shorter_side`, a
    ``transformers.ViTImageProcessor`` resizing to ``S`` x ``S`` (the small sets' evaluation); with it, a
    ``BitImageProcessor`` resizing the shorter side to `shorter_side`, then cropping the centred ``S`` x ``S``
    (ImageNet's 256 then 224, the recipe's Resize + CenterCrop). Both are bilinear, convert to RGB, rescale by 1/255
    and normalise with ``info.mean`` / ``info.std``."""
    from transformers import BitImageProcessor, ViTImageProcessor

    s = info.image_size
    common = dict(resample=2, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,  # resample 2: bilinear
                  image_mean=list(info.mean), image_std=list(info.std), do_convert_rgb=True)
    if shorter_side is None:
        return ViTImageProcessor(do_resize=True, size={"height": s, "width": s}, **common)
    return BitImageProcessor(do_resize=True, size={"shortest_edge": shorter_side}, do_center_crop=True,
                             crop_size={"height": s, "width": s}, **common)
