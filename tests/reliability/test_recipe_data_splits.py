"""The recipe's `datasets` path refuses a split with no rows naming the source and the split (datasets itself
raises a bare IndexError for a saved split with no rows)."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

from petra_hub.recipe.data import DataArguments, load_data

FEATURES = datasets.Features(image=datasets.Image(), label=datasets.ClassLabel(names=["a", "b"]))


def _table(rows: int) -> datasets.Dataset:
    images = [Image.fromarray(np.zeros((4, 4, 3), np.uint8))] * rows
    return datasets.Dataset.from_dict({"image": images, "label": [i % 2 for i in range(rows)]}, features=FEATURES)


def test_a_saved_empty_train_split_is_named(tmp_path):
    datasets.DatasetDict(train=_table(0), validation=_table(2)).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=rf"^{tmp_path}: split 'train' has no items$"):
        load_data(DataArguments(dataset_name=str(tmp_path)), seed=0, splits={"train", "eval"})


def test_an_empty_train_split_in_memory_is_named(tmp_path, monkeypatch):
    data = datasets.DatasetDict(train=_table(0).flatten_indices(), validation=_table(2))
    monkeypatch.setattr("petra_hub.recipe.data._open", lambda args: data)
    with pytest.raises(ValueError, match=r"^somewhere: split 'train' has no items$"):
        load_data(DataArguments(dataset_name="somewhere"), seed=0, splits={"train", "eval"})


def test_an_empty_evaluation_split_is_named(tmp_path, monkeypatch):
    data = datasets.DatasetDict(train=_table(2), validation=_table(2).select([]))
    monkeypatch.setattr("petra_hub.recipe.data._open", lambda args: data)
    with pytest.raises(ValueError, match=r"^somewhere: split 'validation' \(for eval\) has no items$"):
        load_data(DataArguments(dataset_name="somewhere"), seed=0, splits={"train", "eval"})
