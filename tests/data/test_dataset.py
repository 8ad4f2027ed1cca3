"""The dataset objects and helpers: collation, the image processor, argument errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from petra_hub.data import DATASETS, collate_image_batch, image_processor_for, load_image_dataset, take


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


def test_error_unknown_name_and_split():
    with pytest.raises(ValueError, match="imagenet32"):
        load_image_dataset("svhn", "train")
    with pytest.raises(ValueError, match="'train'.*'test'"):
        load_image_dataset("digits", "dev")
    with pytest.raises(ValueError, match="data_dir"):
        load_image_dataset("digits", "train", data_dir="/nonexistent")
    with pytest.raises(ValueError, match="not both"):
        load_image_dataset("cifar10", "train", data_dir="/x", hub_id="y")


def test_error_imagenet32_needs_data_dir_or_hub_id():
    with pytest.raises(ValueError, match="data_dir.*hub_id"):
        load_image_dataset("imagenet32", "train")



def test_take_keeps_info_labels_and_epochs(digits_train):
    assert take(digits_train, None) is digits_train and take(digits_train, 10**6) is digits_train
    head = take(digits_train, 5)
    assert len(head) == 5 and head.info is digits_train.info
    assert head.labels.tolist() == digits_train.labels[:5].tolist()
    head.set_epoch(2)
    assert digits_train.epoch == 2
    assert head[-1]["labels"] == head[4]["labels"] == int(digits_train.labels[4])
    with pytest.raises(IndexError):
        head[5]
    with pytest.raises(ValueError, match=">= 1"):
        take(digits_train, 0)
    digits_train.set_epoch(0)


def test_collate_refuses_float_labels_instead_of_truncating():
    import pytest
    import torch

    from petra_hub.data import collate_image_batch

    item = {"pixel_values": torch.zeros(3, 4, 4)}
    with pytest.raises(ValueError, match="labels must be integers"):
        collate_image_batch([{**item, "labels": 2.7}, {**item, "labels": 1.0}])
    assert collate_image_batch([{**item, "labels": 2}])["labels"].tolist() == [2]
