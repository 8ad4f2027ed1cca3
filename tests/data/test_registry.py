"""The registry of named data sets: DatasetInfo / DatasetSpec of each name."""

from __future__ import annotations

import pytest

from petra_hub.data import DATASET_SPECS, DATASETS, DatasetSpec, dataset_info, dataset_spec


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



def test_every_spec_is_complete():
    assert list(DATASET_SPECS) == list(DATASETS)
    for name, spec in DATASET_SPECS.items():
        assert isinstance(spec, DatasetSpec) and dataset_spec(name) is spec
        assert spec.name == spec.info.name == name and spec.info is DATASETS[name]
        assert spec.title.strip() and spec.description.strip() and "\n" not in spec.description
        assert spec.description.split(" (")[0] == spec.title  # model cards: name, then details
        assert callable(spec.reader) and spec.reader.layout.strip()
        assert spec.reader.embedded is None or isinstance(spec.reader.embedded, str)
        assert callable(spec.train_transform) and callable(spec.test_transform)
        assert spec.transform(True) is spec.train_transform
        assert spec.transform(False) is spec.test_transform
        assert spec.hub_image_columns and spec.hub_label_columns
        assert spec.hub_splits("train") == ("train",) and spec.hub_splits("test")
    titles = {name: spec.title for name, spec in DATASET_SPECS.items()}
    assert titles == {"digits": "scikit-learn digits", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
                      "imagenet32": "ImageNet 32x32", "imagenet": "ImageNet-1k"}
    assert dataset_spec("imagenet32").description == "ImageNet 32x32 (downsampled ImageNet-1k)"
    with pytest.raises(ValueError, match="cifar10.*digits|digits.*cifar10"):
        dataset_spec("mnist")


def test_default_hub_ids_and_splits():
    assert {name: dataset_spec(name).hub_id for name in DATASETS} == {
        "digits": None, "cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100",
        "imagenet32": None, "imagenet": "ILSVRC/imagenet-1k"}
    assert dataset_spec("imagenet").hub_splits("test")[0] == "validation"  # ILSVRC's test has no labels
    assert dataset_spec("cifar10").hub_splits("test")[0] == "test"
    assert dataset_spec("cifar100").hub_label_columns[0] == "fine_label"
