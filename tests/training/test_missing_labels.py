"""An item without a label (None: an empty cell of a `datasets` label column, a None in a plain data set's list of
labels) is refused before training as what it is, by its index and column; before, the column read as a float
tensor (None becomes NaN) and the check complained of "floating-point labels ... multi-label" targets."""

from __future__ import annotations

import re
from types import SimpleNamespace

import datasets
import numpy as np
import pytest
from PIL import Image
from torch.utils.data import Dataset

from petra_hub.training.batches import check_all_labels
from petra_hub.recipe.data import ImageClassificationCollator
from tests.training.test_drop_in import example_collate, example_transform, image_label_dataset
from tests.training.test_trainer import make_trainer

NEEDS_A_CLASS = "every training item needs a class index"


def images(count: int) -> list:
    return [Image.fromarray(np.full((4, 4, 3), 10 * i, np.uint8)) for i in range(count)]


def no_label(of: str, item: int, needed: str = NEEDS_A_CLASS) -> str:
    return rf"^{re.escape(of)} has no label for item {item} \(None\): {needed}$"


def test_a_none_in_a_datasets_label_column_is_named_not_called_a_float_label():
    table = datasets.Dataset.from_dict({"image": images(4), "label": [0, None, 1, 1]})
    with pytest.raises(ValueError, match=no_label("train_dataset (column 'label')", 1)):
        check_all_labels(table, 2)
    try:
        check_all_labels(table, 2)
    except ValueError as error:
        assert "floating-point" not in str(error) and "multi-label" not in str(error)


def test_the_item_is_counted_in_the_set_the_trainer_reads():
    table = datasets.Dataset.from_dict({"image": images(5), "label": [0, 1, 1, 0, None]})
    with pytest.raises(ValueError, match=no_label("train_dataset (column 'label')", 1)):
        check_all_labels(table.select([2, 4, 0]), 2)  # item 4 of the table is item 1 of the selection
    assert check_all_labels(table.select([0, 1, 2, 3]), 2).tolist() == [0, 1, 1, 0]  # the gap left out: read


def test_a_set_built_from_a_list_a_class_label_column_and_the_collators_column():
    listed = datasets.Dataset.from_list([{"image": image, "labels": label}
                                         for image, label in zip(images(3), [2, 0, None])])
    with pytest.raises(ValueError, match=no_label("train_dataset (column 'labels')", 2)):
        check_all_labels(listed, 3)
    features = datasets.Features(image=datasets.Image(), fine_label=datasets.ClassLabel(names=["a", "b"]))
    fine = datasets.Dataset.from_dict({"image": images(3), "fine_label": [None, 0, 1]}, features=features)
    with pytest.raises(ValueError, match=no_label("eval_dataset (column 'fine_label')", 0)):
        check_all_labels(fine, 2, "eval_dataset", collator=ImageClassificationCollator("fine_label"))


def test_a_plain_list_backed_set_and_regression_targets():
    with pytest.raises(ValueError, match=no_label("train_dataset", 1)):
        check_all_labels(SimpleNamespace(labels=[0, None, 1]), 2)
    with pytest.raises(ValueError, match=no_label("train_dataset", 0, r"every training item needs a label \(its "
                                                                       r"targets\)")):
        check_all_labels(SimpleNamespace(labels=(None, 0.5)), 1)
    assert check_all_labels(SimpleNamespace(labels=[0, 1, 1]), 2) is None  # read when training, as before


class Listed(Dataset):
    """A plain torch data set over a list of items and a list of labels."""

    def __init__(self, base, labels):
        self.base, self.labels = base, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {**self.base[index], "labels": self.labels[index]}


@pytest.mark.parametrize("position", [1, 20])
def test_the_trainer_refuses_an_unlabelled_item_before_any_step(tmp_path, position):
    """Item 1 is in the first batch (its collator fails on the None), item 20 only in the column read before
    training: both are named, and no step runs."""
    data = image_label_dataset(32)
    labels = list(data["label"])
    labels[position] = None
    gappy = data.cast_column("label", datasets.Value("int64")).remove_columns("label").add_column("label", labels)
    trainer = make_trainer(tmp_path, train=gappy.with_transform(example_transform), remove_unused_columns=False,
                           max_steps=2)
    trainer.data_collator = example_collate
    with pytest.raises(ValueError, match=no_label("train_dataset (column 'label')", position)):
        trainer.train()
    assert trainer.state.global_step == 0


def test_the_trainer_refuses_a_none_in_a_plain_sets_list_of_labels(tmp_path):
    data = image_label_dataset(32).with_transform(example_transform)
    base = [{"pixel_values": item["pixel_values"]} for item in data]
    labels = list(image_label_dataset(32)["label"])
    labels[9] = None
    trainer = make_trainer(tmp_path, train=Listed(base, labels), max_steps=2)
    with pytest.raises(ValueError, match=no_label("train_dataset", 9)):
        trainer.train()
