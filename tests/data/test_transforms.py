"""Train / test transforms: the paper's augmentations, per-item seeded randomness."""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from PIL import Image

from petra_hub.data import DATASET_SPECS, DATASETS, load_image_dataset
from petra_hub.data.transforms import item_seed
from petra_hub.testing.data_files import write_cifar10 as _write_cifar10
from tests.data.helpers import _matches_shifted, _unnormalise


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



def test_each_transform_gives_the_model_size_and_keeps_dtype():
    for name, spec in DATASET_SPECS.items():
        s = spec.info.image_size
        for h, w in ((s, s), (s + 3, s - 5), (5, 300)):
            for img in (torch.randint(0, 256, (3, h, w), dtype=torch.uint8), torch.rand(3, h, w)):
                for augment in (False, True):
                    out = spec.transform(augment)(img, s, random.Random(item_seed(0, 0, 1, 0)))
                    assert out.shape == (3, s, s) and out.dtype == img.dtype, (name, h, w, augment)
                    if not augment and (h, w) == (s, s) and name != "imagenet":
                        assert torch.equal(out, img)  # the small sets' test transform is the identity


def test_item_seed_is_injective_on_small_counters():
    keys = {item_seed(s, e, i, d) for s in range(3) for e in range(3) for i in range(5) for d in range(3)}
    assert len(keys) == 3 * 3 * 5 * 3 and min(keys) >= 0
    assert item_seed(-1, 0, 0, 0) != item_seed(0, 0, 0, 0)
