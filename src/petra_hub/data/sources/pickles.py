"""Pickled batches of 32x32 images: CIFAR-10 / CIFAR-100 and downsampled ImageNet.

Each file is a dict with ``data``: N x 3072 uint8, channel-major (the 1024 red values of
the 32x32 image row by row, then green, then blue) and a list of N labels.  Pickles are
read with a restricted unpickler that accepts numpy arrays and plain containers only
(Python-2 pickles included); ImageNet32 files may also be ``.npz``.

``CifarBatches``        ``data_dir`` holding the extracted archive folder (e.g.
                        ``cifar-10-batches-py/`` with ``data_batch_1..5``, ``test_batch``,
                        ``batches.meta``), or those files directly, or the ``.tar.gz``
                        archive (read in place, not extracted); ``data_dir`` may also name
                        the archive.  Label names come from the meta file when present.
``ImagenetBatches``     ``data_dir`` holding ``train_data_batch_1..10`` and ``val_data``
                        (or those names with ``.npz`` / ``.pkl`` / ``.pickle``), in the
                        folder or an immediate sub-folder; labels 1..1000 made 0-based.
"""

from __future__ import annotations

import bisect
import io
import os
import pickle
import tarfile
import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

if TYPE_CHECKING:
    from ..registry import DatasetSpec
    from . import Loaded


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


def unpickle(raw: bytes, where: str) -> dict:
    """The dict pickled in ``raw`` (bytes keys decoded); ValueError naming ``where`` if not."""
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


def _batches(spec: DatasetSpec, named_dicts, label_key: str, first_label: int) -> Loaded:
    """Validated batches of ``(where, dict)`` pairs as a source, 0-based labels and info."""
    arrays, labels = [], []
    hi = first_label + spec.info.num_labels - 1
    for where, d in named_dicts:
        data, lab = _check_batch(d, label_key, where, first_label, hi)
        arrays.append(data)
        labels.append(lab - first_label)
    return _Chunks(arrays), torch.from_numpy(np.concatenate(labels)), spec.info


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
    embedded = None

    @property
    def layout(self) -> str:
        return f"{self.folder}/ (the extracted archive) or {self.tarball}"

    def read_files(self, data_dir: str, name: str, wanted: list[str]) -> dict[str, bytes]:
        """Raw bytes of the ``wanted`` files (and the meta file when present), folder or tarball."""
        meta, tarball = self.meta_file, self.tarball
        if os.path.isfile(data_dir):  # data_dir may name the tarball itself
            data_dir, tarball = os.path.split(data_dir)
        for d in (os.path.join(data_dir, self.folder), data_dir):
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
                raise FileNotFoundError(
                    f"{tar_path} lacks {', '.join(f'{self.folder}/{m}' for m in missing)}")
            return out
        raise FileNotFoundError(
            f"no {name} data in {data_dir!r}: expected {self.folder}/ holding {', '.join(wanted)} "
            f"(the extracted archive) or {tarball}"
        )

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None) -> Loaded:
        wanted = list(self.train_files if split == "train" else self.test_files)
        raw = self.read_files(data_dir, spec.info.name, wanted)
        source, labels, info = _batches(
            spec, ((f, unpickle(raw[f], f)) for f in wanted), self.label_key, 0)
        if self.meta_file in raw:
            names = unpickle(raw[self.meta_file], self.meta_file).get(self.names_key)
            if isinstance(names, (list, tuple)) and len(names) == info.num_labels:
                info = replace(info, label_names=tuple(
                    n.decode() if isinstance(n, bytes) else str(n) for n in names))
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


def _read_batch_file(path: str) -> dict:
    if path.endswith(".npz"):
        try:
            with np.load(path, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"{path}: unreadable .npz ({type(exc).__name__}: {exc})") from None
    with open(path, "rb") as fh:
        return unpickle(fh.read(), path)


@dataclass(frozen=True)
class ImagenetBatches:
    """Downsampled ImageNet: pickles or .npz, found in ``data_dir`` or a sub-folder."""

    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    layout: str  # for error messages
    label_key: str = "labels"
    first_label: int = 1  # labels in the files are 1-based
    embedded = None

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None) -> Loaded:
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
        return _batches(spec, ((paths[w], _read_batch_file(paths[w])) for w in wanted),
                        self.label_key, self.first_label)
