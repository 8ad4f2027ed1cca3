"""Pickled batches of 32x32 images: CIFAR-10 / CIFAR-100 and downsampled ImageNet.

Each file is a dict with ``data``: N x 3072 uint8, channel-major (the 1024 red values of
the 32x32 image row by row, then green, then blue) and a list of N labels.  Pickles are
read with a restricted unpickler that accepts numpy arrays and plain containers only
(Python-2 pickles included); ImageNet32 files may also be ``.npz`` (see :mod:`.safe_io`).

Size caps (files may come from someone else).  A batch holds at most ``max_rows`` images:
CIFAR-10 10,000 per batch; CIFAR-100 50,000 (``train``); ImageNet32 130,000 (its train
batches hold about 128,100 each, 1,281,167 in all; ``val_data`` 50,000).  A batch file
(pickle, ``.npz`` or archive member) may hold at most ``max_rows * ROW_BUDGET +
HEADROOM_BYTES`` bytes: 4,096 per image (its 3,072 pixel bytes; the rest for its label,
file name and other per-image entries, about 32 bytes in the originals) plus 1 MiB (meta
data, ImageNet32's 24 KiB mean image, framing); a meta file at most ``HEADROOM_BYTES``;
a tarball's members together at most the caps of all its batch files plus
``HEADROOM_BYTES`` (see :func:`.safe_io.read_tar_members`).  Sizes are checked before
reading; ``data`` must have 1..``max_rows`` rows and the labels must be a flat list (or
1-D array) of as many integers, checked before numpy converts them.  A full-size batch
pickled with more than one byte per pixel (protocol 0 / 1, or protocol 2 from Python 3)
exceeds its cap: re-save it with protocol >= 3, or as ``.npz``.

``CifarBatches``        ``data_dir`` holding the extracted archive folder (e.g.
                        ``cifar-10-batches-py/`` with ``data_batch_1..5``, ``test_batch``,
                        ``batches.meta``), or those files directly, or the ``.tar.gz``
                        archive (read in place, not extracted); ``data_dir`` may also name
                        the archive.  Label names come from the meta file when present.
``ImagenetBatches``     ``data_dir`` holding ``train_data_batch_1..10`` and ``val_data``
                        (or those names with ``.npz`` / ``.pkl`` / ``.pickle``), in the
                        folder or an immediate sub-folder; labels 1..1000 made 0-based.

Both hold every image in memory, unless read with ``keep_images=False`` (a process that
needs the labels and a few items): each batch file is then read for its labels and its
images dropped, and an image is read again when asked for, from its file (an ``.npz``
member a row at a time, seeking within it; a pickle, which can only be read whole, one
file at a time, the last kept).
"""

from __future__ import annotations

import bisect
import functools
import os
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from . import check_label_range, int_labels
from .safe_io import NpzRows, load_npz, read_capped, read_tar_members, unpickle

if TYPE_CHECKING:
    from ..registry import DatasetSpec
    from . import Loaded

__all__ = ["CifarBatches", "ImagenetBatches", "unpickle", "ROW_BUDGET", "HEADROOM_BYTES"]

ROW_BYTES = 3072  # one channel-major 3 x 32 x 32 uint8 image
ROW_BUDGET = 4096  # file bytes allowed per image: its pixels plus up to 1 KiB of label etc.
HEADROOM_BYTES = 1 << 20  # file bytes allowed besides the images (and the meta file's cap)


def max_file_bytes(max_rows: int) -> int:
    """The most bytes a batch file of at most ``max_rows`` images may hold."""
    return max_rows * ROW_BUDGET + HEADROOM_BYTES


def _batch_kind(name: str, max_rows: int) -> str:
    return f"a {name} batch file ({max_rows:,} images of {ROW_BYTES:,} bytes plus labels)"


def _check_batch(d: dict, label_key: str, where: str, lo: int, hi: int, max_rows: int) -> np.ndarray:
    """Validate one batch: ``data`` 1..max_rows x 3072 uint8 (an array, or the rows of an ``.npz`` member read on
    demand), labels as many ints in [lo, hi]; returns the labels."""
    if "data" not in d or label_key not in d:
        raise ValueError(f"{where}: expected keys 'data' and {label_key!r}, found {sorted(map(str, d))}")
    data = d["data"]
    if not isinstance(data, (np.ndarray, NpzRows)) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != ROW_BYTES:
        desc = (f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray)
                else type(data).__name__)
        raise ValueError(f"{where}: expected 'data' to be an N x 3072 uint8 array "
                         f"(channel-major 3x32x32 images), got {desc}")
    if len(data) == 0:
        raise ValueError(f"{where}: no images ('data' is 0 x 3072; expected at least one row)")
    if len(data) > max_rows:
        raise ValueError(f"{where}: {len(data):,} images, more than a batch holds "
                         f"(at most {max_rows:,})")
    labels = int_labels(d[label_key], f"{where}: {label_key!r}", max_count=max_rows)
    if len(labels) != len(data):
        raise ValueError(f"{where}: {len(data)} images but {len(labels)} labels")
    check_label_range(labels, lo, hi, where)
    return labels


class _Chunks:
    """Random access over a list of N_k x 3072 uint8 arrays without concatenating."""

    def __init__(self, arrays: Sequence[np.ndarray]):
        self.arrays = arrays
        self.starts = np.cumsum([0] + [len(a) for a in self.arrays]).tolist()

    def __call__(self, index: int) -> torch.Tensor:
        k = bisect.bisect_right(self.starts, index) - 1
        return _image(self.arrays[k], index - self.starts[k])


class _ChunksOnDemand:
    """Random access over batch files that reads an image when it is asked for instead of holding them all
    (``keep_images=False``): ``readers[k]()`` gives file k's rows (its array read again, or an ``.npz`` member's
    `NpzRows`). The last file read is kept, so a few items cost a few reads and at most one file's memory."""

    def __init__(self, readers: Sequence[Callable[[], np.ndarray | NpzRows]], sizes: Sequence[int],
                 wheres: Sequence[str]):
        self.readers, self.sizes, self.wheres = readers, sizes, wheres
        self.starts = np.cumsum([0, *sizes]).tolist()
        self._kept_file, self._kept_rows = None, None

    def __call__(self, index: int) -> torch.Tensor:
        k = bisect.bisect_right(self.starts, index) - 1
        if self._kept_file != k:
            self._kept_file, self._kept_rows = None, None  # freed before the next file is read
            self._kept_rows, self._kept_file = self._read_again(k), k
        return _image(self._kept_rows, index - self.starts[k])

    def _read_again(self, k: int) -> np.ndarray | NpzRows:
        rows = self.readers[k]()
        shape = getattr(rows, "shape", None)
        if not isinstance(rows, (np.ndarray, NpzRows)) or rows.dtype != np.uint8 or shape != (self.sizes[k], ROW_BYTES):
            raise ValueError(f"{self.wheres[k]} changed since its labels were read: expected {self.sizes[k]:,} x "
                             f"{ROW_BYTES} uint8 images, found {getattr(rows, 'dtype', type(rows).__name__)} {shape}")
        return rows


def _image(rows: np.ndarray | NpzRows, index: int) -> torch.Tensor:
    return torch.from_numpy(np.array(rows[index]).reshape(3, 32, 32))


def _batches(spec: DatasetSpec, named_dicts, label_key: str, first_label: int, max_rows: int,
             rereaders: Sequence[Callable[[], np.ndarray | NpzRows]] | None = None) -> Loaded:
    """Validated batches of ``(where, dict)`` pairs as a source, 0-based labels and info. With ``rereaders`` (one per
    batch, giving its ``data`` again), no image is held: the source reads one when asked."""
    arrays, labels, wheres = [], [], []
    hi = first_label + spec.info.num_labels - 1
    for where, d in named_dicts:
        wheres.append(where)
        lab = _check_batch(d, label_key, where, first_label, hi, max_rows)
        if rereaders is None:
            arrays.append(d["data"])
        labels.append(lab - first_label)
        del d  # a batch's images are dropped as soon as it is checked when they are read again on demand
    source = _Chunks(arrays) if rereaders is None else \
        _ChunksOnDemand(rereaders, [len(lab) for lab in labels], wheres)
    return source, torch.from_numpy(np.concatenate(labels)), spec.info


@dataclass(frozen=True)
class CifarBatches:
    """The CIFAR python archive: ``folder`` / ``tarball`` names, batch files, meta file."""

    folder: str  # the archive's top folder, e.g. "cifar-10-batches-py"
    tarball: str  # e.g. "cifar-10-python.tar.gz"
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str  # label names; optional
    label_key: str  # e.g. "labels", "fine_labels"
    names_key: str  # in the meta file, e.g. "label_names"
    max_rows: int = 10_000  # images in the largest batch file
    embedded = None

    @property
    def layout(self) -> str:
        return f"{self.folder}/ (the extracted archive) or {self.tarball}"

    def read_files(self, data_dir: str, name: str, wanted: list[str]) -> dict[str, tuple[str, bytes]]:
        """``{file: (where, raw bytes)}`` of the ``wanted`` files (and the meta file when
        present), from the folder or the tarball; each size-capped before reading."""
        meta, tarball = self.meta_file, self.tarball
        caps = {f: (max_file_bytes(self.max_rows), _batch_kind(name, self.max_rows)) for f in wanted}
        caps[meta] = (HEADROOM_BYTES, f"a {name} meta file")
        if os.path.isfile(data_dir):  # data_dir may name the tarball itself
            data_dir, tarball = os.path.split(data_dir)
        for d in (os.path.join(data_dir, self.folder), data_dir):
            if all(os.path.isfile(os.path.join(d, f)) for f in wanted):
                paths = {f: os.path.join(d, f) for f in wanted + [meta]}
                return {f: (p, read_capped(p, *caps[f])) for f, p in paths.items() if os.path.isfile(p)}
        tar_path = os.path.join(data_dir, tarball)
        if os.path.isfile(tar_path):  # the whole archive: every batch of both splits, meta, extras
            total = max_file_bytes(self.max_rows) * (len(self.train_files) + len(self.test_files)) \
                + HEADROOM_BYTES
            raw = read_tar_members(tar_path, caps, total)
            missing = [f for f in wanted if f not in raw]
            if missing:
                raise FileNotFoundError(
                    f"{tar_path} lacks {', '.join(f'{self.folder}/{m}' for m in missing)}")
            return {f: (f"{tar_path}: {f}", b) for f, b in raw.items()}
        raise FileNotFoundError(
            f"no {name} data in {data_dir!r}: expected {self.folder}/ holding {', '.join(wanted)} "
            f"(the extracted archive) or {tarball}"
        )

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None, keep_images: bool = True) -> Loaded:
        wanted = list(self.train_files if split == "train" else self.test_files)
        raw = self.read_files(data_dir, spec.info.name, wanted)

        def images_of(file: str) -> np.ndarray:
            where, raw_file = self.read_files(data_dir, spec.info.name, [file])[file]
            return unpickle(raw_file, where)["data"]

        rereaders = None if keep_images else [functools.partial(images_of, f) for f in wanted]
        source, labels, info = _batches(
            spec, ((raw[f][0], unpickle(raw[f][1], raw[f][0])) for f in wanted),
            self.label_key, 0, self.max_rows, rereaders)
        if self.meta_file in raw:
            where = raw[self.meta_file][0]
            names = unpickle(raw[self.meta_file][1], where, f"{self.names_key!r}").get(self.names_key)
            if isinstance(names, (list, tuple)) and len(names) == info.num_labels \
                    and all(isinstance(n, (str, bytes)) for n in names):
                info = replace(info, label_names=tuple(
                    n.decode("utf-8", "replace") if isinstance(n, bytes) else n for n in names))
            else:  # the names are only names: the data loads with the registry's
                shown = f"{len(names)} entries" if isinstance(names, (list, tuple)) else repr(names)[:60]
                warnings.warn(f"{where}: {self.names_key!r} should hold the {info.num_labels} class names as text, "
                              f"holds {shown}; the class names of {info.name} are used instead", stacklevel=2)
        return source, labels, info


def _find_file(data_dir: str, base: str) -> str | None:
    """``base`` (or with .npz / .pkl / .pickle) in ``data_dir`` or an immediate sub-folder."""
    dirs = [data_dir] + sorted(
        os.path.join(data_dir, e) for e in os.listdir(data_dir)
        if os.path.isdir(os.path.join(data_dir, e)))
    for d in dirs:
        for cand in (base, base + ".npz", base + ".pkl", base + ".pickle"):
            p = os.path.join(d, cand)
            if os.path.isfile(p):
                return p
    return None


def _read_batch_file(path: str, max_bytes: int, kind: str, label_key: str, keep_images: bool = True) -> dict:
    """A batch file's dict; without `keep_images`, an ``.npz``'s ``data`` stays in the file (as `NpzRows`) and only
    its labels are read."""
    if path.endswith(".npz"):
        if keep_images:
            return load_npz(path, max_bytes, kind)
        return {**load_npz(path, max_bytes, kind, only=frozenset({label_key})), "data": NpzRows(path, "data")}
    return unpickle(read_capped(path, max_bytes, kind), path)


def _batch_rows(path: str, max_bytes: int, kind: str) -> np.ndarray | NpzRows:
    """A batch file's images, read again when asked for: an ``.npz`` member's rows one at a time, a pickle whole."""
    if path.endswith(".npz"):
        return NpzRows(path, "data")
    return unpickle(read_capped(path, max_bytes, kind), path)["data"]


@dataclass(frozen=True)
class ImagenetBatches:
    """Downsampled ImageNet: pickles or .npz, found in ``data_dir`` or a sub-folder."""

    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    layout: str  # for error messages
    label_key: str = "labels"
    first_label: int = 1  # labels in the files are 1-based
    max_rows: int = 130_000  # images in the largest batch file
    embedded = None

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None, keep_images: bool = True) -> Loaded:
        name = spec.info.name
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"data_dir {data_dir!r} for {name!r} is not a folder")
        wanted = list(self.train_files if split == "train" else self.test_files)
        paths = {w: _find_file(data_dir, w) for w in wanted}
        missing = [w for w, p in paths.items() if p is None]
        if missing:
            raise FileNotFoundError(
                f"no {name} {split} data in {data_dir!r}: missing {', '.join(missing)} "
                f"(expected {', '.join(wanted)}, as pickles or .npz, in the folder or a sub-folder)")
        cap, kind = max_file_bytes(self.max_rows), _batch_kind(name, self.max_rows)
        rereaders = None if keep_images else [lambda p=paths[w]: _batch_rows(p, cap, kind) for w in wanted]
        batches = ((paths[w], _read_batch_file(paths[w], cap, kind, self.label_key, keep_images)) for w in wanted)
        return _batches(spec, batches, self.label_key, self.first_label, self.max_rows, rereaders)
