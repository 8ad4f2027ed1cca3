"""Tiny data files in the original formats of the data sets, for tests (no download needed).

``write_cifar10`` / ``write_cifar100`` / ``write_imagenet32`` write random images in the
pickled batch format the originals use (Python-2 pickles, as distributed), ``tar_folder``
packs a folder as the ``.tar.gz`` archive, ``solid_image`` writes a one-colour image for
the image-folder layout.  Needs numpy (and PIL for ``solid_image``).
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile

import numpy as np

__all__ = [
    "py2_pickle",
    "write_file",
    "random_rows",
    "write_cifar10",
    "write_cifar100",
    "write_imagenet32",
    "tar_folder",
    "solid_image",
]


class _Py2Pickler(pickle._Pickler):
    """Writes str and bytes as Python-2 ``str`` (BINSTRING), like the original CIFAR files."""

    dispatch = dict(pickle._Pickler.dispatch)

    def _save_py2_str(self, obj):
        raw = obj.encode("latin1") if isinstance(obj, str) else bytes(obj)
        if len(raw) < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([len(raw)]) + raw)
        else:
            self.write(pickle.BINSTRING + len(raw).to_bytes(4, "little") + raw)
        self.memoize(obj)

    dispatch[str] = _save_py2_str
    dispatch[bytes] = _save_py2_str


def py2_pickle(obj) -> bytes:
    """``obj`` pickled as Python 2 with numpy 1.x would have (protocol 2, byte strings)."""
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    # the originals were written by numpy 1.x under Python 2
    return buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def write_file(path, raw: bytes) -> None:
    """Write ``raw`` to ``path``, creating its folder."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(raw)


def random_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random channel-major 32x32 RGB images as an n x 3072 uint8 array."""
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def write_cifar10(root, rng, n_train=3, n_test=4):
    """``root/cifar-10-batches-py/``: five train batches of ``n_train``, a test batch of
    ``n_test`` and ``batches.meta``.  Returns (rows, labels, label names), by file name."""
    folder = os.path.join(root, "cifar-10-batches-py")
    rows, labels = {}, {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        n = n_test if name == "test_batch" else n_train
        rows[name] = random_rows(rng, n)
        labels[name] = [int(v) for v in rng.integers(0, 10, size=n)]
        write_file(os.path.join(folder, name), py2_pickle({
            "batch_label": f"batch {i}", "labels": labels[name], "data": rows[name],
            "filenames": [f"img_{i}_{j}.png" for j in range(n)]}))
    names = [f"name{j}" for j in range(10)]
    write_file(os.path.join(folder, "batches.meta"), py2_pickle(
        {"num_cases_per_batch": n_train, "label_names": names, "num_vis": 3072}))
    return rows, labels, names


def write_cifar100(root, rng, n_train=6, n_test=3):
    """``root/cifar-100-python/``: ``train``, ``test`` and ``meta``.
    Returns ({split: (rows, fine labels)}, fine label names)."""
    folder = os.path.join(root, "cifar-100-python")
    content = {}
    for name, n in (("train", n_train), ("test", n_test)):
        content[name] = (random_rows(rng, n), [int(v) for v in rng.integers(0, 100, size=n)])
        write_file(os.path.join(folder, name), py2_pickle({
            "filenames": [f"f{j}.png" for j in range(n)], "batch_label": name,
            "fine_labels": content[name][1], "coarse_labels": [0] * n,
            "data": content[name][0]}))
    fine = [f"fine{j}" for j in range(100)]
    write_file(os.path.join(folder, "meta"), py2_pickle(
        {"fine_label_names": fine, "coarse_label_names": [f"c{j}" for j in range(20)]}))
    return content, fine


def write_imagenet32(root, rng, npz=False):
    """``train_data_batch_1..10`` (2 images each) and ``val_data`` (3) in ``root``, pickles or
    ``.npz``; labels 1-based, the first and last files' labels [1, 1000, 17][:n].
    Returns {file name: (rows, labels)}."""
    out = {}
    names = [f"train_data_batch_{k}" for k in range(1, 11)] + ["val_data"]
    for k, name in enumerate(names):
        n = 3 if name == "val_data" else 2
        rows = random_rows(rng, n)
        labels = [1, 1000, 17][:n] if k in (0, 10) else [int(v) for v in rng.integers(1, 1001, n)]
        out[name] = (rows, labels)
        if npz:
            np.savez(os.path.join(root, name + ".npz"), data=rows, labels=np.array(labels))
        else:
            body = {"data": rows, "labels": labels}
            if name != "val_data":
                body["mean"] = rows.mean(axis=0)
            write_file(os.path.join(root, name), py2_pickle(body))
    return out


def tar_folder(root, folder, tar_name):
    """Pack ``root/folder`` as ``root/tar_name`` (gzip), the folder as its top entry."""
    path = os.path.join(root, tar_name)
    with tarfile.open(path, "w:gz") as tar:
        tar.add(os.path.join(root, folder), arcname=folder)
    return path


def solid_image(path, colour, size, fmt=None, mode="RGB"):
    """A ``size`` (width, height) image of one ``colour`` at ``path`` (folder created)."""
    from PIL import Image

    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new(mode, size, colour).save(path, format=fmt)
