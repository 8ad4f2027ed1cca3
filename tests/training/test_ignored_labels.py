"""transformers' ignore index -100 marks an image the loss skips, wherever it sits: the checks before training let it
through (they refused it in the first batch and in a `datasets` set, though the loss and num_items_in_batch honour
it), and the trained weights are those of the data without that image's loss."""

import datasets
import pytest
import torch
from torch.utils.data import Dataset

from petra_hub.data import load_image_dataset, take
from tests.training.test_drop_in import example_collate, example_transform, image_label_dataset
from tests.training.test_trainer import make_trainer


class Relabelled(Dataset):
    def __init__(self, base, labels):
        self.base, self.labels_ = base, labels

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        return {**self.base[index], "labels": self.labels_[index]}


@pytest.mark.parametrize("position", [0, 30])
def test_an_ignored_image_in_a_torch_dataset_trains(tmp_path, position):
    base = take(load_image_dataset("digits", "train", augment=False), 64)
    labels = [int(base[i]["labels"]) for i in range(64)]
    labels[position] = -100
    trainer = make_trainer(tmp_path, train=Relabelled(base, labels), max_steps=2)
    assert trainer.train().global_step == 2


def test_an_ignored_image_in_a_datasets_set_trains_and_a_bad_label_is_still_refused(tmp_path):
    data = image_label_dataset(32)
    labels = list(data["label"])
    labels[20] = -100
    ignored = data.cast_column("label", datasets.Value("int64")).remove_columns("label").add_column("label", labels)
    trainer = make_trainer(tmp_path, train=ignored.with_transform(example_transform), remove_unused_columns=False,
                           max_steps=2)
    trainer.data_collator = example_collate
    assert trainer.train().global_step == 2
    labels[21] = -3
    bad = data.cast_column("label", datasets.Value("int64")).remove_columns("label").add_column("label", labels)
    trainer = make_trainer(tmp_path / "bad", train=bad.with_transform(example_transform), remove_unused_columns=False)
    trainer.data_collator = example_collate
    with pytest.raises(ValueError, match="item 21 is labelled -3"):
        trainer.train()


def test_the_first_batch_check_names_the_range_and_the_ignore_index(tmp_path):
    base = take(load_image_dataset("digits", "train", augment=False), 64)
    labels = [int(base[i]["labels"]) for i in range(64)]
    labels[0] = 10
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 9\] \(-100 marks an image the loss ignores\)"):
        make_trainer(tmp_path, train=Relabelled(base, labels), max_steps=2).train()
    assert torch.tensor(labels).max() == 10
