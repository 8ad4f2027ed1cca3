"""The trainer checks every label before the first step in the column the recipe's collator reads, whatever its
name (fine_label, --label_column_name), not only a column named label / labels."""

from __future__ import annotations

import datasets
import numpy as np
import pytest
from PIL import Image

from petra_hub.training.batches import check_all_labels
from petra_hub.recipe.data import DataArguments, ImageClassificationCollator, load_data


def _fine_labels(tmp_path, column: str) -> str:
    """16 4x4 images, labels 0/1 in a ClassLabel column `column`, with -1 ("no label") at row 13."""
    labels = [i % 2 for i in range(16)]
    labels[13] = -1
    images = [Image.fromarray(np.full((4, 4, 3), i, np.uint8)) for i in range(16)]
    features = datasets.Features(image=datasets.Image(), **{column: datasets.ClassLabel(names=["a", "b"])})
    datasets.Dataset.from_dict({"image": images, column: labels}, features=features).save_to_disk(str(tmp_path))
    return str(tmp_path)


@pytest.mark.parametrize("column,argument", [("fine_label", None), ("target", "target")])
def test_the_recipe_label_column_is_checked_before_training(tmp_path, column, argument):
    arguments = {"label_column_name": argument} if argument else {}
    data = load_data(DataArguments(dataset_name=_fine_labels(tmp_path, column), train_val_split=None, **arguments),
                     seed=0, splits={"train"})
    assert data.collator.label_column == column
    with pytest.raises(ValueError, match=rf"^train_dataset \(column '{column}'\) has labels outside \[0, 1\] "
                                         r"\(the model's num_labels=2\): item 13 is labelled -1$"):
        check_all_labels(data.train, len(data.label_names))


def test_the_collator_names_the_label_column_of_any_transform(tmp_path):
    table = datasets.load_from_disk(_fine_labels(tmp_path, "fine_label")).with_transform(lambda batch: batch)
    check_all_labels(table, 2)  # neither the transform nor a collator says which column: nothing to read
    with pytest.raises(ValueError, match=r"\(column 'fine_label'\) .* item 13 is labelled -1$"):
        check_all_labels(table, 2, collator=ImageClassificationCollator("fine_label"))
