"""Reading each source: embedded digits, CIFAR / ImageNet32 files, image folders, the Hub.

Everything is offline: CIFAR / ImageNet32 / ImageNet files are written here in their original
formats (petra_hub.testing.data_files); the Hub path uses a local parquet folder.
"""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from petra_hub.data import DATASETS, load_image_dataset
from petra_hub.data.sources.digits import digits_arrays
from petra_hub.testing.data_files import random_rows as _rows
from petra_hub.testing.data_files import solid_image as _solid
from petra_hub.testing.data_files import tar_folder as _tar
from petra_hub.testing.data_files import write_cifar10 as _write_cifar10
from petra_hub.testing.data_files import write_cifar100 as _write_cifar100
from petra_hub.testing.data_files import write_file as _write
from petra_hub.testing.data_files import write_imagenet32 as _write_imagenet32
from tests.data.helpers import _expected_from_row, _matches_shifted, _normalise, _unnormalise


def test_digits_sizes_shapes_labels(digits_train, digits_test):
    assert (len(digits_train), len(digits_test)) == (1437, 360)
    item = digits_test[0]
    assert set(item) == {"pixel_values", "labels"}
    assert item["pixel_values"].shape == (3, 16, 16) and item["pixel_values"].dtype == torch.float32
    assert isinstance(item["labels"], int)
    for ds in (digits_train, digits_test):
        assert ds.info is DATASETS["digits"]
        assert ds.labels.dtype == torch.int64 and ds.labels.shape == (len(ds),)
        assert int(ds.labels.min()) == 0 and int(ds.labels.max()) == 9
    assert digits_train.augment and not digits_test.augment
    assert [digits_test[i]["labels"] for i in range(20)] == digits_test.labels[:20].tolist()
    # stratified: every class has ~20% of its images in the test split
    tr = torch.bincount(digits_train.labels, minlength=10)
    te = torch.bincount(digits_test.labels, minlength=10)
    assert (te - 0.2 * (tr + te)).abs().max() <= 1.0


def test_digits_split_is_sklearn_stratified_split(digits_test, sk_digits):
    d, _, te = sk_digits
    assert digits_test.labels.tolist() == d.target[te].tolist()


def test_digits_normalisation_stats(digits_test):
    train = load_image_dataset("digits", "train", augment=False)
    info = DATASETS["digits"]
    x = torch.stack([train[i]["pixel_values"] for i in range(len(train))])
    raw = _unnormalise(x, info)  # back to [0, 1] pixels
    for c in range(3):
        assert abs(raw[:, c].mean().item() - info.mean[c]) < 1e-3
        assert abs(raw[:, c].std(unbiased=False).item() - info.std[c]) < 1e-3
    assert raw.min() > -1e-5 and raw.max() < 1 + 1e-5
    xt = torch.stack([digits_test[i]["pixel_values"] for i in range(len(digits_test))])
    for c in range(3):
        assert abs(xt[:, c].mean().item()) < 0.15
        assert abs(xt[:, c].std().item() - 1.0) < 0.15


def test_digits_unaugmented_matches_reference(digits_test, sk_digits):
    d, _, te = sk_digits
    info = DATASETS["digits"]
    for k in (0, 1, 359):
        img = torch.tensor(d.data[te[k]], dtype=torch.float32).view(1, 1, 8, 8) / 16
        up = torch.nn.functional.interpolate(img, size=(16, 16), mode="bilinear",
                                             align_corners=False)[0].expand(3, -1, -1)
        a, b = digits_test[k]["pixel_values"], digits_test[k]["pixel_values"]
        assert torch.equal(a, b)
        torch.testing.assert_close(a, _normalise(up, info), atol=1e-5, rtol=0)
    # train split with augment=False is deterministic too
    plain = load_image_dataset("digits", "train", augment=False)
    assert torch.equal(plain[5]["pixel_values"], plain[5]["pixel_values"])


def test_digits_split_identical_across_loads():
    a = load_image_dataset("digits", "test", augment=False)
    digits_arrays.cache_clear()  # force a fresh read + split
    b = load_image_dataset("digits", "test", augment=False)
    assert torch.equal(a.labels, b.labels)
    for i in (0, 100, 359):
        assert torch.equal(a[i]["pixel_values"], b[i]["pixel_values"])


def test_cifar10_folder_and_tarball(tmp_path):
    rng = np.random.default_rng(0)
    src = tmp_path / "src"
    rows, labels, names = _write_cifar10(str(src), rng)
    info = DATASETS["cifar10"]
    tar_dir = tmp_path / "tar"
    tar_dir.mkdir()
    _tar(str(src), "cifar-10-batches-py", "cifar-10-python.tar.gz")
    os.replace(src / "cifar-10-python.tar.gz", tar_dir / "cifar-10-python.tar.gz")

    for root in (src, src / "cifar-10-batches-py", tar_dir, tar_dir / "cifar-10-python.tar.gz"):
        train = load_image_dataset("cifar10", "train", data_dir=str(root), augment=False)
        test = load_image_dataset("cifar10", "val", data_dir=str(root))
        assert (len(train), len(test)) == (15, 4)
        assert train.labels.tolist() == sum((labels[f"data_batch_{k}"] for k in range(1, 6)), [])
        assert test.labels.tolist() == labels["test_batch"]
        assert train.info.label_names == tuple(names) and train.info.num_labels == 10
        assert train.info.mean == info.mean
        # item 7 of train is item 1 of data_batch_3
        for ds, k, row in ((train, 7, rows["data_batch_3"][1]), (test, 3, rows["test_batch"][3])):
            item = ds[k]
            assert item["pixel_values"].shape == (3, 32, 32)
            assert item["pixel_values"].dtype == torch.float32
            torch.testing.assert_close(item["pixel_values"],
                                       _normalise(_expected_from_row(row), info),
                                       atol=1e-5, rtol=0)
    # a single marked pixel at (channel 2, row 5, col 30) comes back there
    one = rows["test_batch"][0]
    raw = _unnormalise(test[0]["pixel_values"], info)
    assert abs(raw[2, 5, 30].item() - one[2 * 1024 + 5 * 32 + 30] / 255) < 1e-5
    assert abs(raw[0, 0, 1].item() - one[1] / 255) < 1e-5


def test_cifar100_folder_and_tarball(tmp_path):
    rng = np.random.default_rng(2)
    info = DATASETS["cifar100"]
    content, fine = _write_cifar100(str(tmp_path), rng)
    tar_dir = tmp_path / "tarred"
    tar_dir.mkdir()
    _tar(str(tmp_path), "cifar-100-python", "cifar-100-python.tar.gz")
    os.replace(tmp_path / "cifar-100-python.tar.gz", tar_dir / "cifar-100-python.tar.gz")
    for root in (tmp_path, tar_dir):
        for split in ("train", "test"):
            ds = load_image_dataset("cifar100", split, data_dir=str(root), augment=False)
            rows, labels = content[split]
            assert len(ds) == len(rows) and ds.labels.tolist() == labels
            assert ds.info.num_labels == 100 and ds.info.label_names == tuple(fine)
            torch.testing.assert_close(ds[2]["pixel_values"],
                                       _normalise(_expected_from_row(rows[2]), info),
                                       atol=1e-5, rtol=0)


def test_cifar_without_meta_uses_default_names(tmp_path):
    rng = np.random.default_rng(3)
    _write_cifar10(str(tmp_path), rng)
    os.remove(tmp_path / "cifar-10-batches-py" / "batches.meta")
    ds = load_image_dataset("cifar10", "test", data_dir=str(tmp_path))
    assert ds.info.label_names == DATASETS["cifar10"].label_names


def test_cifar_python3_pickles_with_bytes_keys(tmp_path):
    """Files re-pickled under Python 3 (bytes or str keys) load as well."""
    rng = np.random.default_rng(4)
    folder = tmp_path / "cifar-10-batches-py"
    rows = _rows(rng, 2)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        _write(str(folder / name), pickle.dumps({b"data": rows, b"labels": [3, 9]}, protocol=4))
    ds = load_image_dataset("cifar10", "train", data_dir=str(tmp_path), augment=False)
    assert len(ds) == 10 and ds.labels.tolist() == [3, 9] * 5
    torch.testing.assert_close(_unnormalise(ds[1]["pixel_values"], DATASETS["cifar10"]),
                               _expected_from_row(rows[1]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("npz", [False, True])
def test_imagenet32_pickles_zero_based_labels(tmp_path, npz):
    rng = np.random.default_rng(5)
    out = _write_imagenet32(str(tmp_path), rng, npz=npz)
    info = DATASETS["imagenet32"]
    train = load_image_dataset("imagenet32", "train", data_dir=str(tmp_path), augment=False)
    val = load_image_dataset("imagenet32", "validation", data_dir=str(tmp_path))
    assert (len(train), len(val)) == (20, 3)
    assert train.labels[:2].tolist() == [0, 999]
    assert val.labels.tolist() == [0, 999, 16]
    assert train.labels.tolist() == [v - 1 for k in range(1, 11)
                                     for v in out[f"train_data_batch_{k}"][1]]
    assert train.info.num_labels == 1000 and not val.augment
    # item 13 = train_data_batch_7, row 1
    for ds, k, row in ((train, 13, out["train_data_batch_7"][0][1]), (val, 2, out["val_data"][0][2])):
        assert ds[k]["labels"] == int(ds.labels[k])
        torch.testing.assert_close(ds[k]["pixel_values"], _normalise(_expected_from_row(row), info),
                                   atol=1e-5, rtol=0)
    aug = load_image_dataset("imagenet32", "train", data_dir=str(tmp_path))
    assert _matches_shifted(_unnormalise(aug[13]["pixel_values"], info),
                            _expected_from_row(out["train_data_batch_7"][0][1]), 4, True)


def test_imagenet32_in_subfolders(tmp_path):
    rng = np.random.default_rng(6)
    (tmp_path / "Imagenet32_train").mkdir()
    (tmp_path / "Imagenet32_val").mkdir()
    _write_imagenet32(str(tmp_path / "Imagenet32_train"), rng)
    os.replace(tmp_path / "Imagenet32_train" / "val_data", tmp_path / "Imagenet32_val" / "val_data")
    assert len(load_image_dataset("imagenet32", "train", data_dir=str(tmp_path))) == 20
    assert len(load_image_dataset("imagenet32", "test", data_dir=str(tmp_path))) == 3


def test_imagenet_image_folder(tmp_path):
    root = tmp_path / "imnet"
    _solid(str(root / "train" / "n01" / "a.png"), (255, 0, 0), (40, 30))
    _solid(str(root / "train" / "n01" / "b.JPEG"), (250, 0, 0), (64, 48), fmt="JPEG")
    _solid(str(root / "train" / "n02" / "c.png"), (0, 0, 255), (30, 50))
    _solid(str(root / "train" / "n02" / "d.png"), 128, (33, 33), mode="L")
    (root / "train" / "n02" / "notes.txt").write_text("not an image")
    _solid(str(root / "val" / "n02" / "e.png"), (0, 255, 0), (300, 260))
    train = load_image_dataset("imagenet", "train", data_dir=str(root), seed=0)
    val = load_image_dataset("imagenet", "test", data_dir=str(root))
    info = val.info
    assert (len(train), len(val)) == (4, 1)
    assert train.labels.tolist() == [0, 0, 1, 1] and val.labels.tolist() == [1]
    assert info.num_labels == 2 and info.label_names == ("n01", "n02")
    assert train.info.label_names == info.label_names
    assert info.image_size == 224 and info.mean == (0.485, 0.456, 0.406)
    for ds in (train, val):
        for i in range(len(ds)):
            item = ds[i]
            assert item["pixel_values"].shape == (3, 224, 224)
            assert item["pixel_values"].dtype == torch.float32
            assert item["labels"] == int(ds.labels[i])
    # solid colours survive crop / resize: red stays red, grey (L) becomes RGB grey
    red = _unnormalise(train[0]["pixel_values"], info)
    torch.testing.assert_close(red.mean(dim=(1, 2)), torch.tensor([1.0, 0.0, 0.0]), atol=0.01, rtol=0)
    grey = _unnormalise(train[3]["pixel_values"], info)
    torch.testing.assert_close(grey.mean(dim=(1, 2)), torch.full((3,), 128 / 255), atol=0.01, rtol=0)
    green = _unnormalise(val[0]["pixel_values"], info)
    torch.testing.assert_close(green.mean(dim=(1, 2)), torch.tensor([0.0, 1.0, 0.0]), atol=0.01, rtol=0)
    assert torch.equal(val[0]["pixel_values"], val[0]["pixel_values"])
    fresh_a = load_image_dataset("imagenet", "train", data_dir=str(root), seed=0)
    fresh_b = load_image_dataset("imagenet", "train", data_dir=str(root), seed=0)
    assert torch.equal(fresh_a[2]["pixel_values"], fresh_b[2]["pixel_values"])


def test_hub_path_with_local_parquet_repo(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    repo = tmp_path / "repo"
    feats = datasets.Features({"img": datasets.Image(),
                               "label": datasets.ClassLabel(names=list("abcdefghij"))})
    colours = [(10 * i, 0, 255 - 10 * i) for i in range(4)]
    imgs = [Image.new("RGB", (32, 32), c) for c in colours]
    for split in ("train", "test"):
        ds = datasets.Dataset.from_dict({"img": imgs, "label": [0, 3, 9, 1]}, features=feats)
        ds.to_parquet(str(repo / "data" / f"{split}-00000-of-00001.parquet"))
    test = load_image_dataset("cifar10", "test", hub_id=str(repo))
    assert len(test) == 4 and test.labels.tolist() == [0, 3, 9, 1]
    assert test.info.label_names == tuple("abcdefghij")
    raw = _unnormalise(test[2]["pixel_values"], test.info)
    torch.testing.assert_close(raw[:, 5, 5], torch.tensor(colours[2]) / 255, atol=1e-5, rtol=0)
    train = load_image_dataset("cifar10", "train", hub_id=str(repo), seed=1)
    assert train.augment and train[0]["pixel_values"].shape == (3, 32, 32)
    # "test" of imagenet maps to the Hub's "validation" split
    repo2 = tmp_path / "repo2"
    feats2 = datasets.Features({"image": datasets.Image(),
                                "label": datasets.ClassLabel(names=["x", "y"])})
    for split in ("train", "validation"):
        ds = datasets.Dataset.from_dict({"image": imgs[:2], "label": [1, 0]}, features=feats2)
        ds.to_parquet(str(repo2 / "data" / f"{split}-00000-of-00001.parquet"))
    val = load_image_dataset("imagenet", "test", hub_id=str(repo2))
    assert len(val) == 2 and val.info.num_labels == 2
    assert val[0]["pixel_values"].shape == (3, 224, 224)



def test_hub_images_above_pils_bomb_limit_are_refused(tmp_path, monkeypatch):
    """PIL only warns between MAX_IMAGE_PIXELS and twice that; `datasets` decoded such an image (a 12000x12000 PNG of
    450 KB is 432 MB decoded). The Hub reader decodes through open_image, as the folder reader does."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    feats = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=list("ab"))})
    images = [Image.new("RGB", (16, 16), (200, 10, 10)), Image.new("RGB", (8, 8), (10, 10, 200))]
    datasets.Dataset.from_dict({"img": images, "label": [0, 1]}, features=feats).save_to_disk(
        str(tmp_path / "saved" / "test"))
    (tmp_path / "saved" / "dataset_dict.json").write_text('{"splits": ["test"]}')
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 200)  # 16x16 = 256: PIL warns, does not raise
    test = load_image_dataset("cifar10", "test", hub_id=str(tmp_path / "saved"))
    with pytest.raises(ValueError, match=r"split 'test': item 0: cannot decode the image \(DecompressionBombWarning"):
        test[0]
    raw = _unnormalise(test[1]["pixel_values"], test.info)  # 64 pixels: read, and decoded as before
    torch.testing.assert_close(raw[:, 5, 5], torch.tensor([10, 10, 200]) / 255, atol=1e-5, rtol=0)


def _same_items(a, b) -> None:
    assert torch.equal(a.labels, b.labels)
    for k in range(len(a)):
        assert a[k]["labels"] == b[k]["labels"]
        assert torch.equal(a[k]["pixel_values"], b[k]["pixel_values"])


@pytest.mark.parametrize("form", ["pickle", "npz", "compressed npz"])
def test_imagenet32_without_kept_images_gives_the_same_items_reading_one_file_at_a_time(tmp_path, form):
    out = _write_imagenet32(str(tmp_path), np.random.default_rng(7), npz=form != "pickle")
    if form == "compressed npz":
        for name, (rows, labels) in out.items():
            np.savez_compressed(tmp_path / f"{name}.npz", data=rows, labels=np.array(labels))
    for split in ("train", "test"):
        kept = load_image_dataset("imagenet32", split, data_dir=str(tmp_path), augment=False)
        on_demand = load_image_dataset("imagenet32", split, data_dir=str(tmp_path), augment=False,
                                       keep_images=False)
        assert on_demand._source._kept_rows is None  # nothing held until an item is asked for
        _same_items(kept, on_demand)
        if split == "train":  # the last file read is all it keeps
            assert on_demand._source._kept_file == 9


def test_cifar10_without_kept_images_gives_the_same_items_from_the_folder_and_the_tarball(tmp_path):
    _write_cifar10(str(tmp_path / "src"), np.random.default_rng(8))
    _tar(str(tmp_path / "src"), "cifar-10-batches-py", "cifar-10-python.tar.gz")
    for root in (tmp_path / "src" / "cifar-10-batches-py", tmp_path / "src" / "cifar-10-python.tar.gz"):
        kept = load_image_dataset("cifar10", "train", data_dir=str(root), augment=False)
        _same_items(kept, load_image_dataset("cifar10", "train", data_dir=str(root), augment=False,
                                             keep_images=False))


def test_an_npz_read_without_its_images_costs_no_memory_for_them(tmp_path):
    """ImageNet32's distribution format: a process that needs the labels and two items never holds the images."""
    import tracemalloc

    rng = np.random.default_rng(9)
    rows = _rows(rng, 2_000)  # 6 MB a file, 61 MB in all
    for name in [f"train_data_batch_{k}" for k in range(1, 11)]:
        np.savez(tmp_path / f"{name}.npz", data=rows, labels=rng.integers(1, 1001, len(rows)))

    def peak_of(keep_images: bool) -> int:
        tracemalloc.start()
        try:
            dataset = load_image_dataset("imagenet32", "train", data_dir=str(tmp_path), keep_images=keep_images)
            dataset[0], dataset[len(dataset) - 1]
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    held, on_demand = peak_of(True), peak_of(False)
    assert held > 60e6
    assert on_demand < 1e6, on_demand  # the labels (160 KB) and the per-item read counts, not the images


def test_a_batch_file_changed_after_its_labels_were_read_is_an_error_naming_it(tmp_path):
    _write_imagenet32(str(tmp_path), np.random.default_rng(10))
    dataset = load_image_dataset("imagenet32", "test", data_dir=str(tmp_path), keep_images=False)
    _write(str(tmp_path / "val_data"), pickle.dumps({"data": np.zeros((2, 3072), np.float32), "labels": [1, 2]}))
    with pytest.raises(ValueError, match=r"val_data changed since its labels were read: expected 3 x 3072 uint8"):
        dataset[0]
