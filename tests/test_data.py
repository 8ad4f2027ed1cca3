"""Tests for petra_hub.data: named image data sets, transforms, file formats, errors.

Everything is offline: digits is embedded; CIFAR / ImageNet32 / ImageNet files are
written here in their original formats; the Hub path uses a local parquet folder.
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from petra_hub import data
from petra_hub.data import (
    DATASETS,
    DatasetInfo,
    collate_image_batch,
    dataset_info,
    image_processor_for,
    load_image_dataset,
)


# --------------------------------------------------------------------------------------
# helpers


def _unnormalise(pv: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    mean = torch.tensor(info.mean).view(-1, 1, 1)
    std = torch.tensor(info.std).view(-1, 1, 1)
    return pv * std + mean


def _normalise(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    return (x - torch.tensor(info.mean).view(-1, 1, 1)) / torch.tensor(info.std).view(-1, 1, 1)


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


def _py2_pickle(obj) -> bytes:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    # the originals were written by numpy 1.x under Python 2
    return buf.getvalue().replace(b"cnumpy._core.multiarray\n", b"cnumpy.core.multiarray\n")


def _write(path, raw: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(raw)


def _rows(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def _expected_from_row(row: np.ndarray) -> torch.Tensor:
    """[3, 32, 32] in [0, 1] from a channel-major 3072 row, by the explicit index formula."""
    c, r, col = np.indices((3, 32, 32))
    return torch.from_numpy(row[c * 1024 + r * 32 + col].astype(np.float32) / 255.0)


def _matches_shifted(aug: torch.Tensor, orig: torch.Tensor, padding: int, flips: bool) -> bool:
    """True if ``aug`` is a ``padding``-zero-padded crop (optionally flipped) of ``orig``."""
    c, h, w = orig.shape
    padded = torch.zeros(c, h + 2 * padding, w + 2 * padding)
    padded[:, padding : padding + h, padding : padding + w] = orig
    for dy in range(2 * padding + 1):
        for dx in range(2 * padding + 1):
            crop = padded[:, dy : dy + h, dx : dx + w]
            for cand in ([crop, crop.flip(-1)] if flips else [crop]):
                if torch.allclose(aug, cand, atol=1e-5):
                    return True
    return False


@pytest.fixture(scope="module")
def digits_train():
    return load_image_dataset("digits", "train")


@pytest.fixture(scope="module")
def digits_test():
    return load_image_dataset("digits", "test")


@pytest.fixture(scope="module")
def sk_digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    tr, te = train_test_split(np.arange(len(d.target)), test_size=0.2, random_state=0,
                              stratify=d.target)
    return d, tr, te


# --------------------------------------------------------------------------------------
# registry


def test_registry_and_dataset_info():
    assert set(DATASETS) == {"digits", "cifar10", "cifar100", "imagenet32", "imagenet"}
    expected = {"digits": (10, 16), "cifar10": (10, 32), "cifar100": (100, 32),
                "imagenet32": (1000, 32), "imagenet": (1000, 224)}
    for name, (n, s) in expected.items():
        info = dataset_info(name)
        assert info is DATASETS[name] and info.name == name
        assert (info.num_labels, info.image_size, info.num_channels) == (n, s, 3)
        assert len(info.mean) == len(info.std) == 3 and len(info.label_names) == n
        assert len(set(info.label_names)) == n
    assert DATASETS["cifar10"].mean == (0.4914, 0.4822, 0.4465)
    assert DATASETS["cifar100"].std == (0.2673, 0.2564, 0.2762)
    assert DATASETS["imagenet32"].mean == (0.4811, 0.4575, 0.4078)
    assert DATASETS["imagenet"].std == (0.229, 0.224, 0.225)
    with pytest.raises(ValueError, match="cifar10.*digits|digits.*cifar10"):
        dataset_info("mnist")


# --------------------------------------------------------------------------------------
# digits


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
    data._digits_arrays.cache_clear()  # force a fresh read + split
    b = load_image_dataset("digits", "test", augment=False)
    assert torch.equal(a.labels, b.labels)
    for i in (0, 100, 359):
        assert torch.equal(a[i]["pixel_values"], b[i]["pixel_values"])


def test_digits_augmentation_reproducible_and_seeded():
    a = load_image_dataset("digits", "train", seed=3)
    b = load_image_dataset("digits", "train", seed=3)
    c = load_image_dataset("digits", "train", seed=4)
    idx = list(range(32))
    xa = torch.stack([a[i]["pixel_values"] for i in idx])
    xb = torch.stack([b[i]["pixel_values"] for i in idx])
    xc = torch.stack([c[i]["pixel_values"] for i in idx])
    assert torch.equal(xa, xb)
    assert not torch.equal(xa, xc)
    # order-independent: a third copy reading in reverse order sees the same tensors
    d = load_image_dataset("digits", "train", seed=3)
    xd = torch.stack([d[i]["pixel_values"] for i in reversed(idx)]).flip(0)
    assert torch.equal(xa, xd)
    # a second pass draws fresh crops, reproducibly
    xa2 = torch.stack([a[i]["pixel_values"] for i in idx])
    xb2 = torch.stack([b[i]["pixel_values"] for i in idx])
    assert torch.equal(xa2, xb2) and not torch.equal(xa, xa2)
    # set_epoch selects a stream: same epoch -> same tensors, whatever was read before
    a.set_epoch(5)
    d.set_epoch(5)
    assert torch.equal(a[7]["pixel_values"], d[7]["pixel_values"])
    a.set_epoch(0)
    assert torch.equal(a[7]["pixel_values"], xa[7])
    # the global RNG is neither used nor disturbed
    torch.manual_seed(0)
    state = torch.get_rng_state()
    _ = a[3]
    assert torch.equal(state, torch.get_rng_state())


def test_digits_augmentation_is_pad2_crop_without_flip():
    aug = load_image_dataset("digits", "train", seed=1)
    plain = load_image_dataset("digits", "train", augment=False)
    info = DATASETS["digits"]
    shifted = 0
    for i in range(24):
        a = _unnormalise(aug[i]["pixel_values"], info)
        p = _unnormalise(plain[i]["pixel_values"], info)
        assert _matches_shifted(a, p, padding=2, flips=False)
        shifted += not torch.allclose(a, p, atol=1e-5)
    assert shifted >= 12  # 24 of 25 offsets move the image


def test_collate_image_batch(digits_test):
    batch = collate_image_batch([digits_test[i] for i in range(4)])
    assert batch["pixel_values"].shape == (4, 3, 16, 16)
    assert batch["labels"].dtype == torch.int64
    assert batch["labels"].tolist() == digits_test.labels[:4].tolist()
    loader = torch.utils.data.DataLoader(digits_test, batch_size=8, collate_fn=collate_image_batch)
    first = next(iter(loader))
    assert first["pixel_values"].shape == (8, 3, 16, 16)


def test_image_processor_matches_digits_tensor(digits_test, sk_digits):
    d, _, te = sk_digits
    info = DATASETS["digits"]
    proc = image_processor_for(info)
    assert list(proc.image_mean) == list(info.mean) and list(proc.image_std) == list(info.std)
    assert proc.size["height"] == proc.size["width"] == 16
    assert proc.do_resize and proc.do_rescale and proc.do_normalize
    for k in (0, 7):
        grey = np.round(d.data[te[k]].reshape(8, 8) * 255 / 16).astype(np.uint8)
        for pil in (Image.fromarray(grey).convert("RGB"), Image.fromarray(grey)):  # RGB and L
            pv = proc(pil, return_tensors="pt")["pixel_values"]
            assert pv.shape == (1, 3, 16, 16)
            torch.testing.assert_close(pv[0], digits_test[k]["pixel_values"], atol=0.05, rtol=0)


# --------------------------------------------------------------------------------------
# CIFAR


def _write_cifar10(root, rng, n_train=3, n_test=4):
    folder = os.path.join(root, "cifar-10-batches-py")
    rows, labels = {}, {}
    for i, name in enumerate([f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]):
        n = n_test if name == "test_batch" else n_train
        rows[name] = _rows(rng, n)
        labels[name] = [int(v) for v in rng.integers(0, 10, size=n)]
        _write(os.path.join(folder, name), _py2_pickle({
            "batch_label": f"batch {i}", "labels": labels[name], "data": rows[name],
            "filenames": [f"img_{i}_{j}.png" for j in range(n)]}))
    names = [f"name{j}" for j in range(10)]
    _write(os.path.join(folder, "batches.meta"), _py2_pickle(
        {"num_cases_per_batch": n_train, "label_names": names, "num_vis": 3072}))
    return rows, labels, names


def _tar(root, folder, tar_name):
    path = os.path.join(root, tar_name)
    with tarfile.open(path, "w:gz") as tar:
        tar.add(os.path.join(root, folder), arcname=folder)
    return path


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


def test_cifar10_train_augmentation_is_pad4_crop_flip(tmp_path):
    rng = np.random.default_rng(1)
    _write_cifar10(str(tmp_path), rng)
    info = DATASETS["cifar10"]
    aug = load_image_dataset("cifar10", "train", data_dir=str(tmp_path), seed=2)
    plain = load_image_dataset("cifar10", "train", data_dir=str(tmp_path), augment=False)
    assert aug.augment
    changed = 0
    for i in range(len(aug)):
        a = _unnormalise(aug[i]["pixel_values"], info)
        p = _unnormalise(plain[i]["pixel_values"], info)
        assert _matches_shifted(a, p, padding=4, flips=True)
        changed += not torch.allclose(a, p, atol=1e-5)
    assert changed >= 10
    again = load_image_dataset("cifar10", "train", data_dir=str(tmp_path), seed=2)
    assert torch.equal(again[4]["pixel_values"], load_image_dataset(
        "cifar10", "train", data_dir=str(tmp_path), seed=2)[4]["pixel_values"])


def test_cifar100_folder_and_tarball(tmp_path):
    rng = np.random.default_rng(2)
    folder = tmp_path / "cifar-100-python"
    info = DATASETS["cifar100"]
    content = {}
    for name, n in (("train", 6), ("test", 3)):
        content[name] = (_rows(rng, n), [int(v) for v in rng.integers(0, 100, size=n)])
        _write(str(folder / name), _py2_pickle({
            "filenames": [f"f{j}.png" for j in range(n)], "batch_label": name,
            "fine_labels": content[name][1], "coarse_labels": [0] * n,
            "data": content[name][0]}))
    fine = [f"fine{j}" for j in range(100)]
    _write(str(folder / "meta"), _py2_pickle({"fine_label_names": fine,
                                              "coarse_label_names": [f"c{j}" for j in range(20)]}))
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


# --------------------------------------------------------------------------------------
# ImageNet32


def _write_imagenet32(root, rng, npz=False):
    out = {}
    names = [f"train_data_batch_{k}" for k in range(1, 11)] + ["val_data"]
    for k, name in enumerate(names):
        n = 3 if name == "val_data" else 2
        rows = _rows(rng, n)
        labels = [1, 1000, 17][:n] if k in (0, 10) else [int(v) for v in rng.integers(1, 1001, n)]
        out[name] = (rows, labels)
        if npz:
            np.savez(os.path.join(root, name + ".npz"), data=rows, labels=np.array(labels))
        else:
            body = {"data": rows, "labels": labels}
            if name != "val_data":
                body["mean"] = rows.mean(axis=0)
            _write(os.path.join(root, name), _py2_pickle(body))
    return out


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


# --------------------------------------------------------------------------------------
# ImageNet (image folders)


def _solid(path, colour, size, fmt=None, mode="RGB"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.new(mode, size, colour).save(path, format=fmt)


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


def test_imagenet_eval_is_resize256_centercrop224(tmp_path):
    # 512 wide x 256 high, left half black, right half white: the shorter side is already
    # 256, so the resize keeps it; the centre 224 crop spans columns 144..367, so the
    # black/white boundary (column 256) lands at column 112 of the crop.
    root = tmp_path / "imnet"
    arr = np.zeros((256, 512, 3), np.uint8)
    arr[:, 256:] = 255
    os.makedirs(root / "train" / "a")
    os.makedirs(root / "val" / "a")
    Image.fromarray(arr).save(root / "val" / "a" / "x.png")
    Image.fromarray(arr).save(root / "train" / "a" / "x.png")
    val = load_image_dataset("imagenet", "val", data_dir=str(root))
    raw = _unnormalise(val[0]["pixel_values"], val.info)
    assert raw.shape == (3, 224, 224)
    assert raw[:, :, :110].max() < 0.01 and raw[:, :, 114:].min() > 0.99
    # the random-resized crop of the train split keeps the image's content range
    train = load_image_dataset("imagenet", "train", data_dir=str(root))
    r = _unnormalise(train[0]["pixel_values"], val.info)
    assert r.min() > -0.01 and r.max() < 1.01


# --------------------------------------------------------------------------------------
# Hub path (local parquet folder standing in for a Hub repository)


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


# --------------------------------------------------------------------------------------
# errors


def test_error_unknown_name_and_split():
    with pytest.raises(ValueError, match="imagenet32"):
        load_image_dataset("svhn", "train")
    with pytest.raises(ValueError, match="'train'.*'test'"):
        load_image_dataset("digits", "dev")
    with pytest.raises(ValueError, match="data_dir"):
        load_image_dataset("digits", "train", data_dir="/nonexistent")
    with pytest.raises(ValueError, match="not both"):
        load_image_dataset("cifar10", "train", data_dir="/x", hub_id="y")


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


def test_error_imagenet32_needs_data_dir_or_hub_id():
    with pytest.raises(ValueError, match="data_dir.*hub_id"):
        load_image_dataset("imagenet32", "train")


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
