"""Data files from someone else cannot exhaust memory: sizes are capped from the formats.

Each bomb here is small on disk and would expand to tens of megabytes (the real ones to
gigabytes) in today's readers; the loaders must refuse it before allocating, which is
measured with ``tracemalloc`` (numpy reports its array allocations to it as well).
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import pickletools
import subprocess
import sys
import tarfile
import tracemalloc
import zipfile
from dataclasses import replace

import numpy as np
import pytest

from petra_hub.data import DATASET_SPECS, load_image_dataset
from petra_hub.data.sources.safe_io import unpickle
from petra_hub.testing.data_files import py2_pickle, random_rows, write_cifar10, write_file, write_imagenet32

MB = 1 << 20
CIFAR10_FILE_CAP = 10_000 * 4096 + MB  # 10,000 images, 4 KiB each (pixels + label etc.), 1 MiB headroom


@contextlib.contextmanager
def peak_bytes():
    """``box["peak"]``: the most bytes traced by ``tracemalloc`` inside the block."""
    box = {}
    tracemalloc.start()
    try:
        yield box
    finally:
        box["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def _cifar10_dir(tmp_path, test_batch: bytes | None = None) -> str:
    write_cifar10(str(tmp_path), np.random.default_rng(0))
    if test_batch is not None:
        write_file(str(tmp_path / "cifar-10-batches-py" / "test_batch"), test_batch)
    return str(tmp_path)


def _nested(width: int, depth: int) -> list:
    """``depth`` levels of ``width`` references to one shared list: tiny when pickled."""
    x = [0] * width
    for _ in range(depth - 1):
        x = [x] * width
    return x


def test_shared_nested_labels_are_refused_before_numpy_expands_them(tmp_path):
    # 2,000 references to one list of 2,000 zeros: ~10 KB pickled, 32 MB as an int64 array
    raw = py2_pickle({"data": np.zeros((2, 3072), np.uint8), "labels": _nested(2000, 2)})
    assert len(raw) < 20_000
    data_dir = _cifar10_dir(tmp_path, raw)
    with peak_bytes() as mem, pytest.raises(ValueError, match=r"test_batch.*'labels'.*flat list"):
        load_image_dataset("cifar10", "test", data_dir=data_dir)
    assert mem["peak"] < 4 * MB, mem
    # a hostile file: a few hundred bytes of labels that np.asarray expands to 28 GB
    bomb = py2_pickle({"data": np.zeros((1, 3072), np.uint8), "labels": _nested(9, 10)})
    assert len(bomb) < 3072 + 600
    write_file(os.path.join(data_dir, "cifar-10-batches-py", "test_batch"), bomb)
    with peak_bytes() as mem, pytest.raises(ValueError, match="nested list"):
        load_image_dataset("cifar10", "test", data_dir=data_dir)
    assert mem["peak"] < 4 * MB, mem


class _Zeros(io.RawIOBase):
    """``n`` zero bytes, read without holding them."""

    def __init__(self, n: int):
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        k = min(len(buf), self.left)
        buf[:k] = bytes(k)
        self.left -= k
        return k


def _tar_with(path, members: dict[str, int]) -> None:
    """A .tar.gz whose members (name -> size) are all zeros."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for name, size in members.items():
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BufferedReader(_Zeros(size), MB))


def test_tar_member_bomb_is_refused_before_reading(tmp_path):
    tar_path = tmp_path / "cifar-10-python.tar.gz"
    _tar_with(tar_path, {"cifar-10-batches-py/test_batch": CIFAR10_FILE_CAP + 1})
    assert os.path.getsize(tar_path) < 400_000  # ~42 MB inflated
    with peak_bytes() as mem, pytest.raises(ValueError, match=r"test_batch: 42,008,577 bytes, more than"):
        load_image_dataset("cifar10", "test", data_dir=str(tmp_path))
    assert mem["peak"] < 4 * MB, mem


def _small_caps(monkeypatch, name: str, max_rows: int, headroom: int) -> int:
    """Lower the caps of data set ``name``; returns its batch file cap."""
    from petra_hub.data.sources import pickles

    spec = DATASET_SPECS[name]
    monkeypatch.setitem(DATASET_SPECS, name, replace(spec, reader=replace(spec.reader, max_rows=max_rows)))
    monkeypatch.setattr(pickles, "HEADROOM_BYTES", headroom)
    return max_rows * 4096 + headroom


# the member order of the distributed cifar-10-python.tar.gz
_CIFAR10_ORDER = ["data_batch_4", "readme.html", "test_batch", "data_batch_3", "batches.meta",
                  "data_batch_2", "data_batch_5", "data_batch_1"]


def test_full_archive_in_distributed_order_loads_under_the_archive_cap(tmp_path, monkeypatch):
    # every batch at its full size (caps lowered to 100 images): both splits load from the
    # tarball, train batches being scanned on the way to test_batch and back
    _small_caps(monkeypatch, "cifar10", max_rows=100, headroom=64 << 10)
    rng = np.random.default_rng(4)
    folder = tmp_path / "cifar-10-batches-py"
    labels = {}
    for name in _CIFAR10_ORDER:
        if name == "readme.html":
            body = b"<html>" + bytes(30_000) + b"</html>"
        elif name == "batches.meta":
            body = py2_pickle({"label_names": [f"c{i}" for i in range(10)], "num_vis": 3072})
        else:
            labels[name] = [int(v) for v in rng.integers(0, 10, 100)]
            body = py2_pickle({"batch_label": name, "labels": labels[name], "data": random_rows(rng, 100),
                               "filenames": [f"automobile_s_{i:06d}.png" for i in range(100)]})
        write_file(str(folder / name), body)
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz", compresslevel=1) as tar:
        tar.add(str(folder), arcname="cifar-10-batches-py", recursive=False)
        for name in _CIFAR10_ORDER:
            tar.add(str(folder / name), arcname=f"cifar-10-batches-py/{name}")
    os.rename(folder, tmp_path / "extracted")
    test = load_image_dataset("cifar10", "test", data_dir=str(tmp_path))
    train = load_image_dataset("cifar10", "train", data_dir=str(tmp_path))
    assert test.labels.tolist() == labels["test_batch"] and test.info.label_names[3] == "c3"
    assert train.labels.tolist() == sum((labels[f"data_batch_{k}"] for k in range(1, 6)), [])


def test_tar_scan_stops_at_the_archive_cap(tmp_path, monkeypatch):
    # a junk member bigger than a whole genuine archive, before the wanted one: refused from
    # its header, before decompressing it to reach the next member
    cap = _small_caps(monkeypatch, "cifar10", max_rows=100, headroom=64 << 10)
    tar_path = tmp_path / "cifar-10-python.tar.gz"
    _tar_with(tar_path, {"cifar-10-batches-py/readme.html": 6 * cap + (64 << 10) + 1,
                         "cifar-10-batches-py/test_batch": 10})
    with pytest.raises(ValueError, match=r"members add up to more than 2,916,352 bytes"):
        load_image_dataset("cifar10", "test", data_dir=str(tmp_path))


def test_tar_with_too_many_members_is_refused(tmp_path):
    tar_path = tmp_path / "cifar-10-python.tar.gz"
    _tar_with(tar_path, {f"junk/{i}": 0 for i in range(1_001)} | {"cifar-10-batches-py/test_batch": 0})
    with pytest.raises(ValueError, match="more than 1,000 archive members"):
        load_image_dataset("cifar10", "test", data_dir=str(tmp_path))


def test_oversized_pickle_file_is_refused_before_reading(tmp_path):
    data_dir = _cifar10_dir(tmp_path)
    with open(os.path.join(data_dir, "cifar-10-batches-py", "test_batch"), "r+b") as fh:
        fh.truncate(CIFAR10_FILE_CAP + 1)  # sparse: no disk, no memory
    with peak_bytes() as mem, pytest.raises(ValueError, match=r"test_batch: 42,008,577 bytes, more than"):
        load_image_dataset("cifar10", "test", data_dir=data_dir)
    assert mem["peak"] < 4 * MB, mem


def test_more_rows_than_a_batch_holds_are_refused(tmp_path):
    # 10,001 images fit the byte cap but no CIFAR-10 batch holds that many
    rows = np.zeros((10_001, 3072), np.uint8)
    data_dir = _cifar10_dir(tmp_path, py2_pickle({"data": rows, "labels": [0] * 10_001}))
    with pytest.raises(ValueError, match=r"test_batch: 10,001 images, more than a batch holds \(at most 10,000\)"):
        load_image_dataset("cifar10", "test", data_dir=data_dir)


def test_genuine_size_batches_still_load(tmp_path):
    # a full-size CIFAR-10 test batch, as distributed (labels, file names), folder and tarball
    n = 10_000
    rng = np.random.default_rng(1)
    batch = {"batch_label": "testing batch 1 of 1", "labels": [int(v) for v in rng.integers(0, 10, n)],
             "data": random_rows(rng, n), "filenames": [f"domestic_cat_s_{i:06d}.png" for i in range(n)]}
    data_dir = _cifar10_dir(tmp_path, py2_pickle(batch))
    ds = load_image_dataset("cifar10", "test", data_dir=data_dir)
    assert len(ds) == n and ds.labels.tolist() == batch["labels"]
    with tarfile.open(tmp_path / "cifar-10-python.tar.gz", "w:gz", compresslevel=1) as tar:
        tar.add(os.path.join(data_dir, "cifar-10-batches-py"), arcname="cifar-10-batches-py")
    from_tar = load_image_dataset("cifar10", "test", data_dir=str(tmp_path / "cifar-10-python.tar.gz"))
    assert from_tar.labels.tolist() == batch["labels"]


def _global(module: str, name: str) -> bytes:
    return f"c{module}\n{name}\n".encode()


def _int_tuple(n: int) -> bytes:
    return b"J" + n.to_bytes(4, "little") + b"\x85"  # (n,)


# {"data": <ops>, "labels": []} at protocol 2, each <ops> allocating 16 MB in a plain unpickler
_ALLOCATING = {
    "_reconstruct of a non-empty shape": _global("numpy.core.multiarray", "_reconstruct")
    + _global("numpy", "ndarray") + _int_tuple(16_000_000) + b"U\x01b" + b"\x87R",
    "numpy.ndarray called": _global("numpy", "ndarray") + _int_tuple(2_000_000) + b"\x85R",
    "copyreg._reconstructor of an ndarray": _global("copy_reg", "_reconstructor")
    + _global("numpy", "ndarray") + _global("numpy", "ndarray") + _int_tuple(2_000_000) + b"\x87R",
}


@pytest.mark.parametrize("ops", list(_ALLOCATING.values()), ids=list(_ALLOCATING))
def test_pickle_globals_cannot_allocate_what_the_file_does_not_hold(tmp_path, ops):
    raw = b"\x80\x02}(X\x04\x00\x00\x00data" + ops + b"X\x06\x00\x00\x00labels]u."
    data_dir = _cifar10_dir(tmp_path, raw)
    with peak_bytes() as mem, pytest.raises(ValueError, match="test_batch: not a readable pickle.*(allowed|rebuild)"):
        load_image_dataset("cifar10", "test", data_dir=data_dir)
    assert mem["peak"] < 4 * MB, mem


@pytest.mark.parametrize("fortran", [False, True])
@pytest.mark.parametrize("protocol", [0, 1, 2, 3, 4, 5, "py2"])
def test_small_pickles_of_every_protocol_still_load(tmp_path, protocol, fortran):
    rows = random_rows(np.random.default_rng(7), 3)
    rows = np.asfortranarray(rows) if fortran else rows
    body = {b"data": rows, "labels": np.array([1, 0, 9]), "filenames": [b"a.png"] * 3, "mean": rows.mean(0)}
    raw = py2_pickle(body) if protocol == "py2" else pickle.dumps(body, protocol=protocol)
    ds = load_image_dataset("cifar10", "test", data_dir=_cifar10_dir(tmp_path, raw), augment=False)
    assert ds.labels.tolist() == [1, 0, 9]
    assert np.array_equal(ds._source(2).numpy().reshape(-1), rows[2])


def test_object_arrays_are_refused(tmp_path):
    # an object array whose list is as long as its shape: today it reaches the readers
    labels = np.array([1, 0, 9], dtype=object)
    data_dir = _cifar10_dir(tmp_path, pickle.dumps({"data": np.zeros((3, 3072), np.uint8), "labels": labels}, 2))
    with pytest.raises(ValueError, match="test_batch: not a readable pickle.*only boolean, integer and float dtypes"):
        load_image_dataset("cifar10", "test", data_dir=data_dir)


def test_object_array_state_longer_than_its_list_cannot_crash_the_interpreter(tmp_path):
    # numpy's own ndarray.__setstate__ reads past the list: a segmentation fault. Run in a
    # child process so that a crash fails this test instead of ending the test run.
    body = {"data": np.zeros((1, 3072), np.uint8), "labels": np.array([7], dtype=object)}
    genuine = pickle.dumps(body, protocol=2)
    assert genuine.count(b"K\x01\x85") == 1  # the labels' shape (1,)
    raw = genuine.replace(b"K\x01\x85", b"J\x80\x96\x98\x00\x85")  # now (10,000,000,), list still [7]
    data_dir = _cifar10_dir(tmp_path, raw)
    refusal = _error_in_a_child("from petra_hub.data import load_image_dataset",
                                f"load_image_dataset('cifar10', 'test', data_dir={data_dir!r})")
    assert "only boolean, integer and float dtypes are allowed" in refusal, refusal


def _error_in_a_child(imports: str, call: str) -> str:
    """The ValueError `call` raises, run in a child process so that a crash fails the test instead of ending the
    test run."""
    code = f"{imports}\ntry:\n    {call}\nexcept ValueError as exc:\n    print(exc)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    return proc.stdout


def _npz_with_header(path, shape: tuple[int, ...]) -> None:
    """An .npz whose data.npy header claims ``shape`` (uint8) but holds 10 bytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "|u1", "fortran_order": False, "shape": shape})
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("data.npy", header.getvalue() + bytes(10))
        buf = io.BytesIO()
        np.save(buf, np.ones(3, np.int64))
        zf.writestr("labels.npy", buf.getvalue())


def test_npz_header_claiming_more_than_it_holds_is_refused_before_allocating(tmp_path):
    write_imagenet32(str(tmp_path), np.random.default_rng(2), npz=True)
    _npz_with_header(tmp_path / "val_data.npz", (20_000, 3072))  # 61 MB claimed
    with peak_bytes() as mem, pytest.raises(ValueError, match=r"val_data.npz: the header of data.npy claims"):
        load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))
    assert mem["peak"] < 4 * MB, mem


def test_npz_and_pickle_caps_follow_max_rows(tmp_path, monkeypatch):
    # ImageNet32's real cap (130,000 images, 533 MB) is too big to build here: lower max_rows
    cap = _small_caps(monkeypatch, "imagenet32", max_rows=10, headroom=MB)
    write_imagenet32(str(tmp_path), np.random.default_rng(3), npz=True)
    zeros = np.zeros((cap // 3072 + 1, 3072), np.uint8)  # ~1 MB, compresses to ~1 KB
    np.savez_compressed(tmp_path / "val_data.npz", data=zeros, labels=np.ones(len(zeros), np.int64))
    assert os.path.getsize(tmp_path / "val_data.npz") < 20_000
    with peak_bytes() as mem, pytest.raises(ValueError, match=r"val_data.npz \(uncompressed\): .* more than"):
        load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))
    assert mem["peak"] < cap // 2, mem
    os.remove(tmp_path / "val_data.npz")
    with open(tmp_path / "val_data", "wb") as fh:
        fh.truncate(cap + 1)
    with pytest.raises(ValueError, match=f"val_data: {cap + 1:,} bytes, more than"):
        load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))
    write_file(str(tmp_path / "val_data"), py2_pickle({"data": np.zeros((11, 3072), np.uint8), "labels": [1] * 11}))
    with pytest.raises(ValueError, match=r"11 images, more than a batch holds \(at most 10\)"):
        load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))


def test_documented_caps():
    readers = {name: DATASET_SPECS[name].reader for name in ("cifar10", "cifar100", "imagenet32")}
    assert {name: r.max_rows for name, r in readers.items()} == {
        "cifar10": 10_000, "cifar100": 50_000, "imagenet32": 130_000}
    from petra_hub.data.sources.pickles import HEADROOM_BYTES, ROW_BUDGET, max_file_bytes

    assert (ROW_BUDGET, HEADROOM_BYTES) == (4096, MB)
    assert max_file_bytes(10_000) == CIFAR10_FILE_CAP


def _pickled_scalar(code: bytes, flags: int) -> bytes:
    """{"data": scalar(dtype(code) after a BUILD with `flags`, 8 bytes of 0x41)}: numpy's dtype.__setstate__ sets
    the flags (0x21 includes the object flag), and scalar() then reads the 8 bytes as a pointer: a crash."""
    dtype = _global("numpy", "dtype") + b"X" + len(code).to_bytes(4, "little") + code + b"\x89\x88\x87R"
    state = b"(K\x03X\x01\x00\x00\x00|NNNK\x08K\x01K" + bytes([flags]) + b"tb"
    return (b"\x80\x02}X\x04\x00\x00\x00data" + _global("numpy.core.multiarray", "scalar") + dtype + state
            + b"C\x08" + b"A" * 8 + b"\x86Rs.")


@pytest.mark.parametrize("code", [b"V8", b"i8"])
def test_a_dtype_given_object_flags_by_the_pickle_cannot_crash_the_interpreter(tmp_path, code):
    write_file(str(tmp_path / "batch"), _pickled_scalar(code, 0x21))
    refusal = _error_in_a_child("from petra_hub.data.sources.safe_io import unpickle",  # was SIGSEGV
                                f"unpickle(open({str(tmp_path / 'batch')!r}, 'rb').read(), 'batch')")
    assert "batch: not a readable pickle" in refusal
    assert ("only boolean, integer and float dtypes" if code == b"V8" else "not the state of a plain dtype") \
        in refusal, refusal


class _FromBuffer:
    """Pickles as numpy's protocol-5 `_frombuffer(raw, dtype, shape, order)`."""

    def __init__(self, *args):
        self.args = args

    def __reduce__(self):
        from numpy._core.numeric import _frombuffer

        return _frombuffer, self.args


def test_a_dtype_changed_by_the_pickle_after_an_array_used_it_is_refused():
    shared = np.dtype("i8", False, True)  # not numpy's singleton: a BUILD on it would change it in place
    body = {"data": _FromBuffer(bytes(3072), np.dtype("u1"), (1, 3072), "C"),
            "labels": _FromBuffer(b"A" * 8, shared, (1,), "C"), "again": shared}
    raw = pickle.dumps(body, protocol=2)
    ops = list(pickletools.genops(raw))
    last_get = [i for i, (op, _, _) in enumerate(ops) if op.name in ("BINGET", "LONG_BINGET")][-1]
    end = ops[last_get + 1][2]  # after the memo fetch of the dtype the labels used: BUILD it with the object flag
    state = pickle.dumps((3, "<", None, None, None, -1, -1, 0x01), protocol=2)[2:-1]
    with pytest.raises(ValueError, match="not the state of a plain dtype"):
        unpickle(raw[:end] + state + b"b" + raw[end:], "batch")
    assert unpickle(raw, "batch")["labels"].dtype == np.dtype("i8")  # untouched, it loads
