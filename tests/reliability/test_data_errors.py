"""Bad data files give clear errors at load time (or name the file when an item is read).

A truncated JPEG names its path; an empty data set or Hub split is a ValueError naming the
source and split; float labels are an error in every reader (never truncated: 2.7 is not
2); labels out of range are refused by every reader.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from petra_hub.data import DATASET_SPECS, load_image_dataset
from petra_hub.testing.data_files import py2_pickle, solid_image, write_cifar10, write_file, write_imagenet32


def _cifar10_dir(tmp_path, test_batch: dict) -> str:
    write_cifar10(str(tmp_path), np.random.default_rng(0))
    write_file(str(tmp_path / "cifar-10-batches-py" / "test_batch"), py2_pickle(test_batch))
    return str(tmp_path)


def test_truncated_jpeg_names_the_file(tmp_path):
    root = tmp_path / "imnet"
    solid_image(str(root / "train" / "n01" / "good.JPEG"), (200, 10, 10), (64, 48), fmt="JPEG")
    bad = root / "train" / "n02" / "bad.JPEG"
    bad.parent.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)).save(bad, format="JPEG")
    bad.write_bytes(bad.read_bytes()[: os.path.getsize(bad) // 2])  # truncated mid-scan
    not_image = root / "train" / "n02" / "zz.jpg"
    not_image.write_bytes(b"<html>an error page saved as .jpg</html>")
    ds = load_image_dataset("imagenet", "train", data_dir=str(root), augment=False)
    assert ds[0]["pixel_values"].shape == (3, 224, 224)
    with pytest.raises(ValueError, match=re.escape(str(bad)) + r": cannot decode the image \(OSError: .*truncated"):
        ds[1]
    with pytest.raises(ValueError, match=re.escape(str(not_image)) + ": cannot decode the image"):
        ds[2]


def test_empty_pickle_batch_names_the_file(tmp_path):
    data_dir = _cifar10_dir(tmp_path, {"data": np.zeros((0, 3072), np.uint8), "labels": []})
    with pytest.raises(ValueError, match=r"cifar-10-batches-py/test_batch: no images"):
        load_image_dataset("cifar10", "test", data_dir=data_dir)


def test_empty_npz_batch_names_the_file(tmp_path):
    write_imagenet32(str(tmp_path), np.random.default_rng(1), npz=True)
    np.savez(tmp_path / "val_data.npz", data=np.zeros((0, 3072), np.uint8), labels=np.zeros(0, np.int64))
    with pytest.raises(ValueError, match=r"val_data.npz: no images"):
        load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))


@pytest.mark.parametrize("labels, shown", [
    ([0, 2.7, 1], "2.7"),  # truncated to 2 before
    ([0, 2.0, 1], "2.0"),  # a float, even a whole one, is not a class index
])
def test_float_labels_in_a_pickle_are_an_error(tmp_path, labels, shown):
    data_dir = _cifar10_dir(tmp_path, {"data": np.zeros((3, 3072), np.uint8), "labels": labels})
    with pytest.raises(ValueError, match=rf"test_batch: 'labels': .*float labels \(e.g. {shown}\)"):
        load_image_dataset("cifar10", "test", data_dir=data_dir)


def test_float_labels_in_an_npz_are_an_error(tmp_path):
    write_imagenet32(str(tmp_path), np.random.default_rng(2), npz=True)
    np.savez(tmp_path / "val_data.npz", data=np.zeros((3, 3072), np.uint8), labels=np.array([1.0, 3.7, 2.0]))
    with pytest.raises(ValueError, match=r"val_data.npz: 'labels': .*float labels \(e.g. 3.7\)"):
        load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))


@pytest.fixture
def hub_repo(tmp_path, monkeypatch):
    """``make(name, {split: (images, labels)}, label_feature)``: a local parquet Hub repo."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))

    def make(name, splits, label_feature):
        feats = datasets.Features({"img": datasets.Image(), "label": label_feature})
        repo = tmp_path / name
        for split, (n, labels) in splits.items():
            imgs = [Image.new("RGB", (32, 32), (i, 0, 0)) for i in range(n)]
            ds = datasets.Dataset.from_dict({"img": imgs, "label": labels}, features=feats)
            ds.to_parquet(str(repo / "data" / f"{split}-00000-of-00001.parquet"))
        return str(repo)

    return make


def test_float_labels_from_the_hub_are_an_error(hub_repo):
    import datasets

    repo = hub_repo("floats", {"train": (2, [0.0, 1.0]), "test": (2, [0.0, 2.7])}, datasets.Value("float32"))
    with pytest.raises(ValueError, match=re.escape(repo) + r" split 'test': column 'label': .*float labels"):
        load_image_dataset("cifar10", "test", hub_id=repo)


def test_hub_labels_out_of_range_are_an_error(hub_repo):
    import datasets

    repo = hub_repo("ints", {"train": (2, [0, 1]), "test": (3, [0, 10, 4])}, datasets.Value("int64"))
    with pytest.raises(ValueError, match=re.escape(repo) + r" split 'test': column 'label': labels must lie in 0\.\.9"):
        load_image_dataset("cifar10", "test", hub_id=repo)
    # an unlabelled split (ClassLabel -1, as ImageNet's Hub "test" split)
    names = datasets.ClassLabel(names=list("abcdefghij"))
    unlabelled = hub_repo("unlabelled", {"train": (2, [0, 1]), "test": (2, [-1, -1])}, names)
    with pytest.raises(ValueError, match=r"split 'test': column 'label': labels must lie in 0\.\.9, found -1\.\.-1"):
        load_image_dataset("cifar10", "test", hub_id=unlabelled)


def test_empty_hub_split_names_the_source_and_split(hub_repo):
    import datasets

    names = datasets.ClassLabel(names=list("abcdefghij"))
    repo = hub_repo("empty", {"train": (2, [0, 1]), "test": (0, [])}, names)
    with pytest.raises(ValueError, match=re.escape(repo) + r": no split 'test' / 'validation' / 'val' with items"):
        load_image_dataset("cifar10", "test", hub_id=repo)


def test_empty_saved_split_names_the_source_and_split(hub_repo, tmp_path):
    # a save_to_disk folder with an empty split (an IndexError inside datasets before)
    import datasets

    names = datasets.ClassLabel(names=list("abcdefghij"))
    feats = datasets.Features({"img": datasets.Image(), "label": names})
    saved = tmp_path / "saved"
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"img": [Image.new("RGB", (32, 32))], "label": [3]}, features=feats),
        "test": datasets.Dataset.from_dict({"img": [], "label": []}, features=feats),
    }).save_to_disk(str(saved))
    with pytest.raises(ValueError, match=re.escape(str(saved)) + r": split 'test' has no items"):
        load_image_dataset("cifar10", "test", hub_id=str(saved))
    train = load_image_dataset("cifar10", "train", hub_id=str(saved))  # the other split still loads
    assert train.labels.tolist() == [3]


def test_every_reader_is_checked_for_items_and_label_range(monkeypatch):
    # a backstop behind each reader's own checks (image folders derive their labels from
    # the class folders, so theirs are in range by construction)
    spec = DATASET_SPECS["digits"]

    class Reader:
        embedded, layout = "a test", "nothing"

        def __init__(self, labels):
            self.labels = torch.tensor(labels, dtype=torch.int64)

        def __call__(self, spec, split, data_dir, keep_images=True):
            return (lambda i: torch.zeros(3, 16, 16)), self.labels, spec.info

    monkeypatch.setitem(DATASET_SPECS, "digits", replace(spec, reader=Reader([0, 10])))
    with pytest.raises(ValueError, match=r"digits test \(a test\): labels must lie in 0\.\.9, found 0\.\.10"):
        load_image_dataset("digits", "test")
    monkeypatch.setitem(DATASET_SPECS, "digits", replace(spec, reader=Reader([])))
    with pytest.raises(ValueError, match=r"digits train \(a test\): no items"):
        load_image_dataset("digits", "train")
