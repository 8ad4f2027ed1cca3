"""The recipe's `datasets` path reads its labels before anything is built from them: a label column that would
make a huge classifier, or that holds an empty cell, is refused naming the column (and the row)."""

from __future__ import annotations

import os

import datasets
import numpy as np
import pytest
from PIL import Image

from petra_hub.recipe.data import DataArguments, load_data

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _saved(tmp_path, labels, feature=None) -> str:
    """A save_to_disk folder of len(labels) 4x4 images and a label column."""
    images = [Image.fromarray(np.full((4, 4, 3), 10 * i, np.uint8)) for i in range(len(labels))]
    features = datasets.Features(image=datasets.Image(), label=feature or datasets.Value("int64"))
    datasets.Dataset.from_dict({"image": images, "label": labels}, features=features).save_to_disk(str(tmp_path))
    return str(tmp_path)


def _load(folder: str):
    return load_data(DataArguments(dataset_name=folder, train_val_split=None), seed=0, splits={"train"})


def test_a_huge_class_index_is_refused_before_the_label_names_are_built(tmp_path):
    with pytest.raises(ValueError) as caught:
        _load(_saved(tmp_path, [0, 1, 0, 500_000]))
    message = str(caught.value)
    assert "label column 'label' holds the class index 500,000" in message
    assert "500,001 classes (one output of the model each) for 3 distinct labels" in message
    assert "at most 100,000 classes" in message


def test_a_stray_class_index_far_beyond_the_distinct_labels_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"class index 5,000: that makes 5,001 classes .* for 3 distinct labels"):
        _load(_saved(tmp_path, [0, 1, 0, 5_000]))


def test_plain_integer_labels_below_the_caps_keep_their_names(tmp_path):
    assert _load(_saved(tmp_path, [0, 3, 1, 3])).label_names == ["0", "1", "2", "3"]


def test_a_class_label_with_too_many_classes_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr("petra_hub.data.sources.MAX_CLASSES", 4)
    with pytest.raises(ValueError, match=r"label column 'label' \(a ClassLabel\): 5 classes, more than the 4 "):
        _load(_saved(tmp_path, [0, 1], datasets.ClassLabel(names=list("abcde"))))


def test_an_empty_label_cell_is_refused_naming_the_column_and_row(tmp_path):
    with pytest.raises(ValueError, match=r"label column 'label' has an empty cell at row 2 of split 'train'"):
        _load(_saved(tmp_path, [0, 1, None, 1]))
