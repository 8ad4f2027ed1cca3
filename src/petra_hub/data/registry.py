"""The named data sets: one :class:`DatasetSpec` each, the single home of every fact about it.

Adding a data set means adding one entry to ``DATASET_SPECS`` (plus a reader module in
:mod:`petra_hub.data.sources` if its file format is new).  ``DATASETS`` (name ->
:class:`DatasetInfo`) is derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .sources import LocalReader
from .sources.digits import SklearnDigits
from .sources.folders import ImageFolders
from .sources.pickles import CifarBatches, ImagenetBatches
from .transforms import PadCrop, RandomResizedCropFlip, ResizeCenterCrop, ResizeIfNeeded, Transform

__all__ = ["DatasetInfo", "DatasetSpec", "DATASET_SPECS", "DATASETS", "dataset_info", "dataset_spec"]


@dataclass(frozen=True)
class DatasetInfo:
    """Static description of a named data set (what the model sees)."""

    name: str
    num_labels: int
    image_size: int  # side length the model sees (train and test)
    num_channels: int  # 3 for all
    mean: tuple[float, ...]  # per-channel normalisation
    std: tuple[float, ...]
    label_names: tuple[str, ...]


@dataclass(frozen=True)
class DatasetSpec:
    """Everything the package knows about one named data set."""

    info: DatasetInfo
    title: str  # short human name, e.g. "CIFAR-10"
    description: str  # one-line label for model cards
    reader: LocalReader  # reads ``data_dir`` (or the embedded data); see petra_hub.data.sources
    train_transform: Transform  # for augment=True
    test_transform: Transform  # for augment=False
    hub_id: str | None = None  # default Hub data set when neither data_dir nor hub_id is given
    hub_image_columns: tuple[str, ...] = ("image", "img")  # tried in order
    hub_label_columns: tuple[str, ...] = ("label", "labels")
    hub_test_splits: tuple[str, ...] = ("test", "validation", "val")  # Hub split names of "test"

    @property
    def name(self) -> str:
        return self.info.name

    def transform(self, augment: bool) -> Transform:
        return self.train_transform if augment else self.test_transform

    @property
    def eval_shorter_side(self) -> int | None:
        """The side evaluation resizes the shorter side of an image to before a centred crop (ImageNet: 256, then
        224 x 224), or None where it resizes to the model's size directly."""
        return getattr(self.test_transform, "resize", None)

    def hub_splits(self, split: str) -> tuple[str, ...]:
        """The Hub split names tried, in order, for split "train" or "test"."""
        return ("train",) if split == "train" else self.hub_test_splits


_CIFAR10_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)
_CIFAR100_NAMES = tuple(
    """apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
    butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch
    crab crocodile cup dinosaur dolphin elephant flatfish forest fox girl hamster house kangaroo
    keyboard lamp lawn_mower leopard lion lizard lobster man maple_tree motorcycle mountain mouse
    mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree plain plate poppy
    porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper
    snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television
    tiger tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm""".split()
)


def _generic_names(n: int) -> tuple[str, ...]:
    return tuple(f"class_{i}" for i in range(n))


DATASET_SPECS: dict[str, DatasetSpec] = {
    "digits": DatasetSpec(
        # mean/std: train split, 16x16 upscaled images in [0, 1] (population std);
        # tests check them against the data to 1e-3.
        DatasetInfo("digits", 10, 16, 3, (0.3054,) * 3, (0.3190,) * 3,
                    tuple(str(d) for d in range(10))),
        title="scikit-learn digits",
        description="scikit-learn digits (8x8 grey-scale digits upscaled to 16x16, 10 classes)",
        reader=SklearnDigits(test_size=0.2, random_state=0),
        train_transform=PadCrop(padding=2, flip=False),  # digits are not flip-invariant
        test_transform=ResizeIfNeeded(),
    ),
    "cifar10": DatasetSpec(
        DatasetInfo("cifar10", 10, 32, 3, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616),
                    _CIFAR10_NAMES),
        title="CIFAR-10",
        description="CIFAR-10",
        reader=CifarBatches(
            folder="cifar-10-batches-py", tarball="cifar-10-python.tar.gz",
            train_files=tuple(f"data_batch_{i}" for i in range(1, 6)), test_files=("test_batch",),
            meta_file="batches.meta", label_key="labels", names_key="label_names",
            max_rows=10_000),  # every batch holds 10,000 images
        train_transform=PadCrop(padding=4, flip=True),
        test_transform=ResizeIfNeeded(),
        hub_id="uoft-cs/cifar10",
        hub_image_columns=("img", "image"),
    ),
    "cifar100": DatasetSpec(
        DatasetInfo("cifar100", 100, 32, 3, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762),
                    _CIFAR100_NAMES),
        title="CIFAR-100",
        description="CIFAR-100",
        reader=CifarBatches(
            folder="cifar-100-python", tarball="cifar-100-python.tar.gz",
            train_files=("train",), test_files=("test",),
            meta_file="meta", label_key="fine_labels", names_key="fine_label_names",
            max_rows=50_000),  # train: 50,000 images, test: 10,000
        train_transform=PadCrop(padding=4, flip=True),
        test_transform=ResizeIfNeeded(),
        hub_id="uoft-cs/cifar100",
        hub_image_columns=("img", "image"),
        hub_label_columns=("fine_label", "label", "labels"),
    ),
    "imagenet32": DatasetSpec(
        DatasetInfo("imagenet32", 1000, 32, 3, (0.4811, 0.4575, 0.4078), (0.2605, 0.2533, 0.2683),
                    _generic_names(1000)),
        title="ImageNet 32x32",
        description="ImageNet 32x32 (downsampled ImageNet-1k)",
        reader=ImagenetBatches(
            train_files=tuple(f"train_data_batch_{i}" for i in range(1, 11)),
            test_files=("val_data",),
            layout="a folder with train_data_batch_1..10 and val_data",
            label_key="labels", first_label=1,
            max_rows=130_000),  # train batches ~128,100 images each, val_data 50,000
        train_transform=PadCrop(padding=4, flip=True),
        test_transform=ResizeIfNeeded(),
        hub_id=None,  # no default: give data_dir or hub_id
    ),
    "imagenet": DatasetSpec(
        DatasetInfo("imagenet", 1000, 224, 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225),
                    _generic_names(1000)),
        title="ImageNet-1k",
        description="ImageNet-1k",
        reader=ImageFolders(eval_folders=("val", "validation", "test")),
        train_transform=RandomResizedCropFlip(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)),
        test_transform=ResizeCenterCrop(resize=256),  # then the centre 224 x 224
        hub_id="ILSVRC/imagenet-1k",
        hub_test_splits=("validation", "val", "test"),  # ILSVRC's "test" split has no labels
    ),
}

DATASETS: dict[str, DatasetInfo] = {name: spec.info for name, spec in DATASET_SPECS.items()}


def dataset_spec(name: str) -> DatasetSpec:
    """The :class:`DatasetSpec` of a named data set (ValueError for an unknown name)."""
    try:
        return DATASET_SPECS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown data set {name!r}; known names: {', '.join(sorted(DATASET_SPECS))}"
        ) from None


def dataset_info(name: str) -> DatasetInfo:
    """The :class:`DatasetInfo` of a named data set (ValueError for an unknown name)."""
    return dataset_spec(name).info
