"""Named image-classification data sets with the transforms of the PETRA paper.

``load_image_dataset(name, split)`` returns a map-style ``torch.utils.data.Dataset``
whose items are ``{"pixel_values": float32 [3, S, S] (normalised), "labels": int}``
(the Hugging Face ``Trainer`` convention).  Each data set also carries ``info``
(its :class:`DatasetInfo`) and ``labels`` (an int64 tensor of all labels, read
without decoding any image).

Sources and formats
-------------------
``digits``      scikit-learn's 8x8 digits, embedded (works offline).  Fixed stratified
                80/20 split (``train_test_split(random_state=0)``: 1,437 / 360 images),
                values scaled to [0, 1], bilinear upscale to 16x16, grey repeated to RGB.
``cifar10``     ``data_dir`` holding ``cifar-10-batches-py/`` (``data_batch_1..5``,
                ``test_batch``, ``batches.meta``) or ``cifar-10-python.tar.gz`` (read in
                place, not extracted); else the Hub (default ``uoft-cs/cifar10``).
``cifar100``    same with ``cifar-100-python/`` (``train``, ``test``, ``meta``) or
                ``cifar-100-python.tar.gz``; Hub default ``uoft-cs/cifar100``
                (``fine_label``).
``imagenet32``  ``data_dir`` holding the downsampled-ImageNet pickles
                ``train_data_batch_1..10`` and ``val_data`` (or the same names with
                ``.npz``), labels 1..1000 made 0-based; else ``hub_id`` (no default).
``imagenet``    ``data_dir`` with ``train/<class>/*.JPEG`` and ``val/<class>/*``
                (image-folder layout, classes indexed by sorted ``train/`` folder
                names); else the Hub (default ``ILSVRC/imagenet-1k``, split
                ``validation`` for "test").

The pickles (CIFAR, ImageNet32) are dicts with ``data``: N x 3072 uint8, channel-major
(the 1024 red values of the 32x32 image row by row, then green, then blue).  They are
read with a restricted unpickler that accepts numpy arrays and plain containers only.

Transforms (train, i.e. ``augment=True``): digits: random 16x16 crop of the image
zero-padded by 2; CIFAR / ImageNet32: random 32x32 crop with zero padding 4 and a
horizontal flip with p=0.5; ImageNet: random-resized crop to 224 (scale 0.08..1, aspect
3/4..4/3) and flip.  Test: none for the small sets; ImageNet: shorter side to 256, centre
crop 224.  Then ``(x / 255 - mean) / std`` with the per-channel ``DatasetInfo`` statistics
(zero padding is black, i.e. applied before normalisation).

Randomness: augmentation never touches the global RNG.  Item ``i`` is augmented with a
``random.Random`` seeded from ``(seed, epoch, i, n_i)``, where ``epoch`` is the value of the
last ``set_epoch(epoch)`` call (0 initially; the Trainer calls it each epoch) and ``n_i``
counts the reads of item ``i`` by this dataset object since then.  So datasets built with
the same seed give identical tensors for the same reads in any order, in any process.
"""

from __future__ import annotations

import bisect
import io
import math
import operator
import os
import pickle
import random
import tarfile
import warnings
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = [
    "DatasetInfo",
    "DATASETS",
    "dataset_info",
    "load_image_dataset",
    "collate_image_batch",
    "image_processor_for",
]


@dataclass(frozen=True)
class DatasetInfo:
    """Static description of a named data set (what the model sees)."""

    name: str
    num_labels: int
    image_size: int  # side length the model sees (train and test)
    num_channels: int  # 3 for all
    mean: tuple[float, ...]  # per-channel normalisation
    std: tuple[float, ...]
    label_names: tuple[str, ...]


_CIFAR10_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
_CIFAR100_NAMES = tuple(
    """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
    butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch
    crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo
    keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse
    mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy
    porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper
    snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television
    tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm""".split()
)


def _generic_names(n: int) -> tuple[str, ...]:
    return tuple(f"class_{i}" for i in range(n))


DATASETS: dict[str, DatasetInfo] = {
    # digits mean/std: train split, 16x16 upscaled images in [0, 1] (population std);
    # tests check them against the data to 1e-3.
    "digits": DatasetInfo(
        "digits", 10, 16, 3, (0.3054,) * 3, (0.3190,) * 3, tuple(str(d) for d in range(10))
    ),
    "cifar10": DatasetInfo(
        "cifar10", 10, 32, 3, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), _CIFAR10_NAMES
    ),
    "cifar100": DatasetInfo(
        "cifar100", 100, 32, 3, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), _CIFAR100_NAMES
    ),
    "imagenet32": DatasetInfo(
        "imagenet32", 1000, 32, 3, (0.4811, 0.4575, 0.4078), (0.2605, 0.2533, 0.2683),
        _generic_names(1000),
    ),
    "imagenet": DatasetInfo(
        "imagenet", 1000, 224, 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225),
        _generic_names(1000),
    ),
}

_SPLITS = {"train": "train", "test": "test", "validation": "test", "val": "test"}
_HUB_DEFAULTS = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100",
                 "imagenet": "ILSVRC/imagenet-1k"}
# Hub column preferences: (image columns, label columns), tried in order.
_HUB_COLUMNS = {
    "cifar10": (("img", "image"), ("label", "labels")),
    "cifar100": (("img", "image"), ("fine_label", "label", "labels")),
    "imagenet32": (("image", "img"), ("label", "labels")),
    "imagenet": (("image", "img"), ("label", "labels")),
}
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff", ".webp")


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of a named data set (ValueError for an unknown name)."""
    try:
        return DATASETS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown data set {name!r}; known names: {', '.join(sorted(DATASETS))}"
        ) from None


def _canonical_split(split: str) -> str:
    try:
        return _SPLITS[split]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown split {split!r}; expected 'train' or 'test' "
            "('validation' and 'val' are aliases of 'test')"
        ) from None


# --------------------------------------------------------------------------------------
# randomness and transforms (plain torch ops; never the global RNG)


def _item_seed(seed: int, epoch: int, index: int, draw: int) -> int:
    """Injective packing of the four counters into one non-negative integer."""
    key = seed % (1 << 64)
    key = (key << 32) | (epoch % (1 << 32))
    key = (key << 32) | (draw % (1 << 32))
    return (key << 40) | (index % (1 << 40))


def _randbelow(rng: random.Random, n: int) -> int:
    # Only rng.random() is used: its stream is guaranteed stable across Python versions.
    return min(int(rng.random() * n), n - 1)


def _pad_crop(img: torch.Tensor, size: int, padding: int, rng: random.Random) -> torch.Tensor:
    """Random ``size`` x ``size`` crop of ``img`` zero-padded by ``padding`` on each side."""
    c, h, w = img.shape
    y0 = _randbelow(rng, h + 2 * padding - size + 1) - padding  # crop origin, image coords
    x0 = _randbelow(rng, w + 2 * padding - size + 1) - padding
    out = img.new_zeros((c, size, size))
    sy0, sy1 = max(y0, 0), min(y0 + size, h)
    sx0, sx1 = max(x0, 0), min(x0 + size, w)
    if sy1 > sy0 and sx1 > sx0:
        out[:, sy0 - y0 : sy1 - y0, sx0 - x0 : sx1 - x0] = img[:, sy0:sy1, sx0:sx1]
    return out


def _maybe_flip(img: torch.Tensor, rng: random.Random) -> torch.Tensor:
    return torch.flip(img, dims=(-1,)) if rng.random() < 0.5 else img


def _resize_to(img: torch.Tensor, size: int) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as TF

    return TF.resize(img, [size, size], antialias=True)


class _SmallTrain:
    """Pad-and-crop (+ optional flip) for the small sets (digits, CIFAR, ImageNet32)."""

    def __init__(self, size: int, padding: int, flip: bool):
        self.size, self.padding, self.flip = size, padding, flip

    def __call__(self, img: torch.Tensor, rng: random.Random | None) -> torch.Tensor:
        if img.shape[-2:] != (self.size, self.size):
            img = _resize_to(img, self.size)
        img = _pad_crop(img, self.size, self.padding, rng)
        return _maybe_flip(img, rng) if self.flip else img


class _SmallTest:
    def __init__(self, size: int):
        self.size = size

    def __call__(self, img: torch.Tensor, rng: random.Random | None) -> torch.Tensor:
        if img.shape[-2:] != (self.size, self.size):
            img = _resize_to(img, self.size)
        return img


class _ResizedCropTrain:
    """Random-resized crop (scale 0.08..1, log-uniform aspect 3/4..4/3) + flip."""

    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
        self.size, self.scale, self.ratio = size, scale, ratio

    def _box(self, h: int, w: int, rng: random.Random) -> tuple[int, int, int, int]:
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            area = h * w * (self.scale[0] + (self.scale[1] - self.scale[0]) * rng.random())
            aspect = math.exp(log_lo + (log_hi - log_lo) * rng.random())
            cw = int(round(math.sqrt(area * aspect)))
            ch = int(round(math.sqrt(area / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                return _randbelow(rng, h - ch + 1), _randbelow(rng, w - cw + 1), ch, cw
        # fallback: the largest central box whose aspect lies in the allowed range
        aspect = w / h
        if aspect < self.ratio[0]:
            cw, ch = w, min(h, int(round(w / self.ratio[0])))
        elif aspect > self.ratio[1]:
            ch, cw = h, min(w, int(round(h * self.ratio[1])))
        else:
            cw, ch = w, h
        return (h - ch) // 2, (w - cw) // 2, ch, cw

    def __call__(self, img: torch.Tensor, rng: random.Random | None) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        top, left, ch, cw = self._box(img.shape[-2], img.shape[-1], rng)
        img = TF.resized_crop(img, top, left, ch, cw, [self.size, self.size], antialias=True)
        return _maybe_flip(img, rng)


class _ResizeCenterCrop:
    """Shorter side to ``resize``, then a centred ``size`` x ``size`` crop."""

    def __init__(self, size: int, resize: int):
        self.size, self.resize = size, resize

    def __call__(self, img: torch.Tensor, rng: random.Random | None) -> torch.Tensor:
        from torchvision.transforms.v2 import functional as TF

        img = TF.resize(img, [self.resize], antialias=True)
        return TF.center_crop(img, [self.size, self.size])


def _transform_for(info: DatasetInfo, augment: bool) -> Callable:
    s = info.image_size
    if info.name == "imagenet":
        return _ResizedCropTrain(s) if augment else _ResizeCenterCrop(s, round(s * 256 / 224))
    if not augment:
        return _SmallTest(s)
    if info.name == "digits":
        return _SmallTrain(s, padding=2, flip=False)  # digits are not flip-invariant
    return _SmallTrain(s, padding=4, flip=True)


# --------------------------------------------------------------------------------------
# the dataset


class _ImageDataset(Dataset):
    """Map-style dataset: ``source(i)`` gives the raw image (uint8 or float in [0, 1])."""

    def __init__(self, info: DatasetInfo, split: str, source: Callable[[int], torch.Tensor],
                 labels: torch.Tensor, augment: bool, seed: int):
        self.info = info
        self.split = split
        self.labels = torch.as_tensor(labels, dtype=torch.int64).reshape(-1)
        self.augment = bool(augment)
        self.seed = int(seed)
        self.epoch = 0
        self._source = source
        self._transform = _transform_for(info, self.augment)
        self._draws = np.zeros(len(self.labels), dtype=np.int64)
        self._mean = torch.tensor(info.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std = torch.tensor(info.std, dtype=torch.float32).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation stream of ``epoch`` (and restart the per-item counters)."""
        self.epoch = int(epoch)
        self._draws[:] = 0

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
            rng = random.Random(_item_seed(self.seed, self.epoch, index, int(self._draws[index])))
            self._draws[index] += 1
        img = self._transform(img, rng)
        img = img.float().div_(255.0) if img.dtype == torch.uint8 else img.float()
        pixel_values = (img - self._mean) / self._std
        return {"pixel_values": pixel_values.contiguous(), "labels": int(self.labels[index])}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.info.name!r}, split={self.split!r}, "
                f"size={len(self)}, augment={self.augment}, seed={self.seed})")


class _Head(Dataset):
    """The first ``count`` items of a data set, keeping its ``info``, ``labels`` and ``set_epoch``."""

    def __init__(self, dataset: _ImageDataset, count: int):
        self.dataset = dataset
        self.count = min(count, len(dataset))
        self.info = dataset.info
        self.labels = dataset.labels[: self.count]

    def __len__(self) -> int:
        return self.count

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def __getitem__(self, index) -> dict[str, Any]:
        if not -self.count <= index < self.count:
            raise IndexError(f"index {index} out of range for a data set of {self.count} items")
        return self.dataset[index % self.count]


def take(dataset: Dataset, count: int | None) -> Dataset:
    """At most ``count`` items of ``dataset`` (all of them for None), e.g. for quick runs and tests."""
    if count is None or count >= len(dataset):
        return dataset
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return _Head(dataset, count)


# --------------------------------------------------------------------------------------
# digits


@lru_cache(maxsize=1)
def _digits_arrays() -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    labels = torch.as_tensor(bunch.target, dtype=torch.int64)
    x = torch.as_tensor(bunch.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    x = torch.nn.functional.interpolate(x, size=(16, 16), mode="bilinear", align_corners=False)
    x = x.expand(-1, 3, -1, -1).contiguous()
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=0.2, random_state=0, stratify=bunch.target
    )
    return x, labels, np.asarray(train_idx), np.asarray(test_idx)


def _load_digits(split: str) -> tuple[Callable, torch.Tensor, DatasetInfo]:
    images, labels, train_idx, test_idx = _digits_arrays()
    idx = torch.as_tensor(train_idx if split == "train" else test_idx)
    images, labels = images[idx], labels[idx]
    return images.__getitem__, labels, DATASETS["digits"]


# --------------------------------------------------------------------------------------
# pickled 32x32 batches (CIFAR, ImageNet32)


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickles dicts / lists / numpy arrays only (the CIFAR and ImageNet32 files)."""

    _ALLOWED = {
        ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
        ("numpy._core.numeric", "_frombuffer"), ("numpy", "ndarray"), ("numpy", "dtype"),
        ("_codecs", "encode"), ("copyreg", "_reconstructor"), ("builtins", "object"),
    }

    def find_class(self, module: str, name: str):
        module = {"copy_reg": "copyreg", "__builtin__": "builtins"}.get(module, module)
        if module.startswith("numpy.core"):  # files written with numpy < 2
            module = "numpy._core" + module[len("numpy.core"):]
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return super().find_class(module, name)


def _unpickle(raw: bytes, where: str) -> dict:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj = _RestrictedUnpickler(io.BytesIO(raw), encoding="latin1").load()
    except Exception as exc:  # noqa: BLE001 - any failure means a bad file
        raise ValueError(f"{where}: not a readable pickle of a dict with 'data' and labels "
                         f"({type(exc).__name__}: {exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected a pickled dict, got {type(obj).__name__}")
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _check_batch(d: dict, label_key: str, where: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Validate one batch: ``data`` N x 3072 uint8, labels N ints in [lo, hi]."""
    if "data" not in d or label_key not in d:
        raise ValueError(f"{where}: expected keys 'data' and {label_key!r}, found {sorted(map(str, d))}")
    data = d["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3072:
        desc = (f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray)
                else type(data).__name__)
        raise ValueError(f"{where}: expected 'data' to be an N x 3072 uint8 array "
                         f"(channel-major 3x32x32 images), got {desc}")
    try:
        labels = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {label_key!r} is not a list of integers") from None
    if len(labels) != len(data):
        raise ValueError(f"{where}: {len(data)} images but {len(labels)} labels")
    if len(labels) and (labels.min() < lo or labels.max() > hi):
        raise ValueError(f"{where}: labels must lie in {lo}..{hi}, "
                         f"found {labels.min()}..{labels.max()}")
    return data.reshape(-1, 3, 32, 32), labels


class _Chunks:
    """Random access over a list of [n_k, 3, 32, 32] uint8 arrays without concatenating."""

    def __init__(self, arrays: Sequence[np.ndarray]):
        self.arrays = [a for a in arrays if len(a)]
        self.starts = np.cumsum([0] + [len(a) for a in self.arrays]).tolist()

    def __call__(self, index: int) -> torch.Tensor:
        k = bisect.bisect_right(self.starts, index) - 1
        return torch.from_numpy(np.array(self.arrays[k][index - self.starts[k]]))


def _check_data_dir(data_dir: str, name: str) -> str:
    data_dir = os.path.expanduser(os.fspath(data_dir))
    if not os.path.exists(data_dir):
        raise FileNotFoundError(f"data_dir {data_dir!r} for {name!r} does not exist")
    return data_dir


_CIFAR_LAYOUT = {
    # name: (folder, tarball, train files, test files, meta file, label key, meta names key)
    "cifar10": ("cifar-10-batches-py", "cifar-10-python.tar.gz",
                [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "batches.meta",
                "labels", "label_names"),
    "cifar100": ("cifar-100-python", "cifar-100-python.tar.gz", ["train"], ["test"], "meta",
                 "fine_labels", "fine_label_names"),
}


def _read_cifar_files(data_dir: str, name: str, wanted: list[str], meta: str) -> dict[str, bytes]:
    """Raw bytes of the ``wanted`` files (and ``meta`` when present), folder or tarball."""
    folder, tarball = _CIFAR_LAYOUT[name][:2]
    if os.path.isfile(data_dir):  # data_dir may name the tarball itself
        data_dir, tarball = os.path.split(data_dir)
    for d in (os.path.join(data_dir, folder), data_dir):
        if all(os.path.isfile(os.path.join(d, f)) for f in wanted):
            out = {}
            for f in wanted + [meta]:
                p = os.path.join(d, f)
                if os.path.isfile(p):
                    with open(p, "rb") as fh:
                        out[f] = fh.read()
            return out
    tar_path = os.path.join(data_dir, tarball)
    if os.path.isfile(tar_path):
        out = {}
        try:
            with tarfile.open(tar_path, "r:*") as tar:
                for member in tar:
                    base = os.path.basename(member.name)
                    if member.isfile() and base in wanted + [meta] and base not in out:
                        out[base] = tar.extractfile(member).read()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise ValueError(f"{tar_path}: unreadable archive ({exc})") from None
        missing = [f for f in wanted if f not in out]
        if missing:
            raise FileNotFoundError(f"{tar_path} lacks {', '.join(f'{folder}/{m}' for m in missing)}")
        return out
    raise FileNotFoundError(
        f"no {name} data in {data_dir!r}: expected {folder}/ holding {', '.join(wanted)} "
        f"(the extracted archive) or {tarball}"
    )


def _load_cifar_local(name: str, split: str, data_dir: str):
    folder, tarball, train_files, test_files, meta, label_key, names_key = _CIFAR_LAYOUT[name]
    info = DATASETS[name]
    wanted = train_files if split == "train" else test_files
    raw = _read_cifar_files(data_dir, name, wanted, meta)
    arrays, labels = [], []
    for f in wanted:
        data, lab = _check_batch(_unpickle(raw[f], f), label_key, f, 0, info.num_labels - 1)
        arrays.append(data)
        labels.append(lab)
    if meta in raw:
        names = _unpickle(raw[meta], meta).get(names_key)
        if isinstance(names, (list, tuple)) and len(names) == info.num_labels:
            info = replace(info, label_names=tuple(
                n.decode() if isinstance(n, bytes) else str(n) for n in names))
    return _Chunks(arrays), torch.from_numpy(np.concatenate(labels)), info


def _find_file(data_dir: str, base: str) -> str | None:
    """``base`` or ``base.npz`` in ``data_dir`` or one of its immediate sub-folders."""
    dirs = [data_dir] + sorted(
        os.path.join(data_dir, e) for e in os.listdir(data_dir)
        if os.path.isdir(os.path.join(data_dir, e)))
    for d in dirs:
        for cand in (base, base + ".npz", base + ".pkl", base + ".pickle"):
            p = os.path.join(d, cand)
            if os.path.isfile(p):
                return p
    return None


def _read_imagenet32_file(path: str) -> dict:
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{path}: unreadable .npz ({type(exc).__name__}: {exc})") from None
    with open(path, "rb") as fh:
        return _unpickle(fh.read(), path)


def _load_imagenet32_local(split: str, data_dir: str):
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data_dir {data_dir!r} for 'imagenet32' is not a folder")
    wanted = [f"train_data_batch_{i}" for i in range(1, 11)] if split == "train" else ["val_data"]
    paths = {w: _find_file(data_dir, w) for w in wanted}
    missing = [w for w, p in paths.items() if p is None]
    if missing:
        raise FileNotFoundError(
            f"no imagenet32 {split} data in {data_dir!r}: missing {', '.join(missing)} "
            f"(expected {', '.join(wanted)}, as pickles or .npz, in the folder or a sub-folder)")
    arrays, labels = [], []
    for w in wanted:
        data, lab = _check_batch(_read_imagenet32_file(paths[w]), "labels", paths[w], 1, 1000)
        arrays.append(data)
        labels.append(lab - 1)  # 1-based in the files
    return _Chunks(arrays), torch.from_numpy(np.concatenate(labels)), DATASETS["imagenet32"]


# --------------------------------------------------------------------------------------
# image folders and the Hub (PIL images)


def _pil_to_uint8(img) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as TF

    if img.mode != "RGB":
        img = img.convert("RGB")
    return TF.pil_to_tensor(img)


def _scan_split_folder(root: str, class_to_idx: dict[str, int] | None):
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    if class_to_idx is None:
        class_to_idx = {c: i for i, c in enumerate(classes)}
    unknown = [c for c in classes if c not in class_to_idx]
    if unknown:
        raise ValueError(f"{root}: class folders {unknown[:5]} do not exist in train/")
    files, labels = [], []
    for c in classes:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, c), followlinks=True):
            dirnames.sort()
            for f in sorted(filenames):
                if f.lower().endswith(_IMAGE_EXTENSIONS):
                    files.append(os.path.join(dirpath, f))
                    labels.append(class_to_idx[c])
    if not files:
        raise FileNotFoundError(
            f"no images in {root!r}: expected image-folder layout <split>/<class_name>/<image> "
            f"with extensions {', '.join(_IMAGE_EXTENSIONS)}")
    return files, labels


def _load_imagenet_local(split: str, data_dir: str):
    train_root = os.path.join(data_dir, "train")
    if split == "train":
        root = train_root
    else:
        root = next((os.path.join(data_dir, d) for d in ("val", "validation", "test")
                     if os.path.isdir(os.path.join(data_dir, d))), None)
    if root is None or not os.path.isdir(root):
        raise FileNotFoundError(
            f"no imagenet {split} folder in {data_dir!r}: expected train/ and val/ "
            "(or validation/), each holding one sub-folder of images per class")
    class_root = train_root if os.path.isdir(train_root) else root
    classes = sorted(e.name for e in os.scandir(class_root) if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"no class folders in {class_root!r}: expected "
                                "<split>/<class_name>/<image> (image-folder layout)")
    files, labels = _scan_split_folder(root, {c: i for i, c in enumerate(classes)})
    info = replace(DATASETS["imagenet"], num_labels=len(classes), label_names=tuple(classes))

    def source(index: int) -> torch.Tensor:
        from PIL import Image

        with Image.open(files[index]) as im:
            return _pil_to_uint8(im)

    return source, torch.as_tensor(labels, dtype=torch.int64), info


def _hub_split_candidates(name: str, split: str) -> tuple[str, ...]:
    if split == "train":
        return ("train",)
    if name == "imagenet":  # ILSVRC's "test" split has no labels
        return ("validation", "val", "test")
    return ("test", "validation", "val")


def _load_hub(name: str, split: str, hub_id: str):
    import datasets

    candidates = _hub_split_candidates(name, split)
    ds, first_error = None, None
    if os.path.isfile(os.path.join(hub_id, "dataset_dict.json")):  # save_to_disk output
        dd = datasets.load_from_disk(hub_id)
        ds = next((dd[s] for s in candidates if s in dd), None)
        if ds is None:
            raise ValueError(f"{hub_id}: none of the splits {candidates} in {list(dd)}")
    else:
        for s in candidates:
            try:
                ds = datasets.load_dataset(hub_id, split=s)
                break
            except ValueError as exc:  # unknown split name: try the next alias
                first_error = first_error or exc
        if ds is None:
            raise first_error
    image_pref, label_pref = _HUB_COLUMNS[name]
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
    info = DATASETS[name]
    if isinstance(feats[label_col], datasets.ClassLabel):
        names = tuple(feats[label_col].names)
        info = replace(info, num_labels=len(names), label_names=names)
    images = ds.select_columns([image_col])

    def source(index: int) -> torch.Tensor:
        return _pil_to_uint8(images[index][image_col])

    return source, labels, info


# --------------------------------------------------------------------------------------
# public entry points


def load_image_dataset(name: str, split: str, *, data_dir: str | None = None,
                       hub_id: str | None = None, augment: bool | None = None,
                       seed: int = 0) -> Dataset:
    """Load split ``split`` ("train" / "test") of data set ``name`` (see module docstring).

    Items are ``{"pixel_values": float32 [3, S, S], "labels": int}``; the dataset has
    ``info`` (:class:`DatasetInfo`), ``labels`` (int64 tensor) and ``set_epoch(epoch)``.
    ``augment`` defaults to True for "train", False for "test"; ``seed`` fixes the
    augmentation stream.  ``data_dir`` (local files) and ``hub_id`` (Hub repo id or local
    dataset folder) are mutually exclusive.
    """
    dataset_info(name)
    split = _canonical_split(split)
    augment = (split == "train") if augment is None else bool(augment)
    if data_dir is not None and hub_id is not None:
        raise ValueError("give data_dir (local files) or hub_id (a Hub data set), not both")
    if name == "digits":
        if data_dir is not None or hub_id is not None:
            raise ValueError("'digits' is embedded (scikit-learn); it takes no data_dir / hub_id")
        source, labels, info = _load_digits(split)
    elif data_dir is not None:
        data_dir = _check_data_dir(data_dir, name)
        if name in _CIFAR_LAYOUT:
            source, labels, info = _load_cifar_local(name, split, data_dir)
        elif name == "imagenet32":
            source, labels, info = _load_imagenet32_local(split, data_dir)
        else:
            if not os.path.isdir(data_dir):
                raise FileNotFoundError(f"data_dir {data_dir!r} for 'imagenet' is not a folder")
            source, labels, info = _load_imagenet_local(split, data_dir)
    else:
        hub_id = hub_id or _HUB_DEFAULTS.get(name)
        if hub_id is None:
            raise ValueError(f"{name!r} needs data_dir (a folder with train_data_batch_1..10 "
                             "and val_data) or hub_id (a Hub data set); neither was given")
        source, labels, info = _load_hub(name, split, hub_id)
    return _ImageDataset(info, split, source, labels, augment, seed)


def collate_image_batch(items: Sequence[dict]) -> dict[str, torch.Tensor]:
    """Stack items into ``{"pixel_values": [B, C, H, W] float32, "labels": [B] int64}``."""
    if not items:
        raise ValueError("collate_image_batch needs at least one item")
    return {
        "pixel_values": torch.stack([torch.as_tensor(it["pixel_values"]) for it in items]),
        "labels": torch.as_tensor([int(it["labels"]) for it in items], dtype=torch.int64),
    }


def image_processor_for(info: DatasetInfo):
    """A ``transformers.ViTImageProcessor`` that resizes to ``S`` x ``S`` (bilinear), converts
    to RGB, rescales by 1/255 and normalises with ``info.mean`` / ``info.std``."""
    from transformers import ViTImageProcessor

    s = info.image_size
    return ViTImageProcessor(
        do_resize=True, size={"height": s, "width": s}, resample=2,  # PIL bilinear
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        image_mean=list(info.mean), image_std=list(info.std), do_convert_rgb=True,
    )
