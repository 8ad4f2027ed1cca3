"""Errors for missing or malformed files: each names what is wrong, and bad pickles run no code."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from petra_hub.data import load_image_dataset
from petra_hub.testing.data_files import py2_pickle as _py2_pickle
from petra_hub.testing.data_files import write_cifar10 as _write_cifar10
from petra_hub.testing.data_files import write_file as _write
from petra_hub.testing.data_files import write_imagenet32 as _write_imagenet32


def test_error_missing_data_dir(tmp_path):
    missing = str(tmp_path / "nope")
    for name in ("cifar10", "cifar100", "imagenet32", "imagenet"):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            load_image_dataset(name, "train", data_dir=missing)


def test_error_data_dir_without_expected_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="data_batch_1.*test_batch|cifar-10-python.tar.gz"):
        load_image_dataset("cifar10", "test", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="cifar-100-python.tar.gz"):
        load_image_dataset("cifar100", "train", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="train_data_batch_1.*train_data_batch_10"):
        load_image_dataset("imagenet32", "train", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="val_data"):
        load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="train/ and val/"):
        load_image_dataset("imagenet", "train", data_dir=str(tmp_path))
    # a partial CIFAR-10 folder names what is missing
    rng = np.random.default_rng(7)
    _write_cifar10(str(tmp_path), rng)
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_3")
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_image_dataset("cifar10", "train", data_dir=str(tmp_path))
    assert len(load_image_dataset("cifar10", "test", data_dir=str(tmp_path))) == 4
    # image folders without images / with unknown val classes
    (tmp_path / "im" / "train" / "a").mkdir(parents=True)
    (tmp_path / "im" / "val" / "b").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no images"):
        load_image_dataset("imagenet", "train", data_dir=str(tmp_path / "im"))
    with pytest.raises(ValueError, match="do not exist in train"):
        load_image_dataset("imagenet", "val", data_dir=str(tmp_path / "im"))


def _cifar10_with_bad_test_batch(tmp_path, raw: bytes):
    _write_cifar10(str(tmp_path), np.random.default_rng(8))
    _write(str(tmp_path / "cifar-10-batches-py" / "test_batch"), raw)


@pytest.mark.parametrize("body, match", [
    (b"\x00garbage, not a pickle", "not a readable pickle"),
    ("list", "expected a pickled dict"),
    ({"data": np.zeros((4, 100), np.uint8), "labels": [0] * 4}, "N x 3072 uint8"),
    ({"data": np.zeros((4, 3072), np.float32), "labels": [0] * 4}, "N x 3072 uint8"),
    ({"data": np.zeros((4, 3072), np.uint8), "labels": [0] * 3}, "4 images but 3 labels"),
    ({"data": np.zeros((2, 3072), np.uint8), "labels": [0, 10]}, r"0\.\.9"),
    ({"pixels": np.zeros((2, 3072), np.uint8)}, "'data'"),
])
def test_error_bad_pickle_content(tmp_path, body, match):
    if body == "list":
        raw = _py2_pickle([1, 2, 3])
    elif isinstance(body, bytes):
        raw = body
    else:
        raw = _py2_pickle(body)
    _cifar10_with_bad_test_batch(tmp_path, raw)
    with pytest.raises(ValueError, match=match):
        load_image_dataset("cifar10", "test", data_dir=str(tmp_path))


def test_error_pickle_with_code_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.remove, (str(tmp_path / "canary"),))

    (tmp_path / "canary").write_text("alive")
    _cifar10_with_bad_test_batch(tmp_path, pickle.dumps({"data": Evil(), "labels": []}))
    with pytest.raises(ValueError, match="not allowed"):
        load_image_dataset("cifar10", "test", data_dir=str(tmp_path))
    assert (tmp_path / "canary").exists()


def test_error_imagenet32_bad_labels_and_archive(tmp_path):
    _write_imagenet32(str(tmp_path), np.random.default_rng(9))
    _write(str(tmp_path / "val_data"), _py2_pickle(
        {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 5]}))  # 0 is not 1-based
    with pytest.raises(ValueError, match=r"1\.\.1000"):
        load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))
    bad_tar = tmp_path / "c10"
    bad_tar.mkdir()
    (bad_tar / "cifar-10-python.tar.gz").write_bytes(b"not a gzip file at all")
    with pytest.raises(ValueError, match="unreadable archive"):
        load_image_dataset("cifar10", "test", data_dir=str(bad_tar))



def test_meta_file_with_odd_label_names(tmp_path):
    # names that are not text, or too few, or not UTF-8, never stop loading: defaults (with a warning naming the
    # file: before, silently), or replaced bytes
    _write_cifar10(str(tmp_path), np.random.default_rng(10))
    meta = tmp_path / "cifar-10-batches-py" / "batches.meta"
    for names, shown in (([1.5] * 10, "10 entries"), ([b"cat"] * 9, "9 entries"), (None, "None")):
        _write(str(meta), _py2_pickle({"label_names": names}))
        with pytest.warns(UserWarning, match=rf"batches.meta: 'label_names' should hold the 10 class names as text, "
                                             rf"holds {shown}; the class names of cifar10 are used instead"):
            loaded = load_image_dataset("cifar10", "test", data_dir=str(tmp_path))
        assert loaded.info.label_names[0] == "airplane"
    _write(str(meta), b"not a pickle")
    with pytest.raises(ValueError, match="batches.meta: not a readable pickle of a dict with 'label_names'"):
        load_image_dataset("cifar10", "test", data_dir=str(tmp_path))
    _write(str(meta), pickle.dumps({"label_names": [b"caf\xe9"] + [b"n"] * 9}))
    assert load_image_dataset("cifar10", "test", data_dir=str(tmp_path)).info.label_names[0] == "caf\ufffd"
