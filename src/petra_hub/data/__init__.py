"""Named image-classification data sets with the transforms of the PETRA paper.

``load_image_dataset(name, split)`` returns a map-style ``torch.utils.data.Dataset``
whose items are ``{"pixel_values": float32 [3, S, S] (normalised), "labels": int}``
(the Hugging Face ``Trainer`` convention).  Each data set also carries ``info`` (its
:class:`DatasetInfo`) and ``labels`` (an int64 tensor of all labels, read without
decoding any image).

Modules: :mod:`.registry` (one :class:`DatasetSpec` per data set: statistics, names, Hub
id and columns, reader, transforms), :mod:`.transforms` (train / test transforms and the
per-item seeded randomness), :mod:`.dataset` (the dataset class, ``take``, collation,
the matching ``transformers`` image processor) and :mod:`.sources` (one reader per file
format: scikit-learn digits, CIFAR / ImageNet32 pickles, image folders, the Hub).

Data sets: ``digits`` (embedded), ``cifar10``, ``cifar100``, ``imagenet32``,
``imagenet``; each read from ``data_dir`` in its original format, else from the Hub
(``DatasetSpec.hub_id`` by default, none for ``imagenet32``).
"""

from .dataset import collate_image_batch, image_processor_for, load_image_dataset, take
from .registry import DATASET_SPECS, DATASETS, DatasetInfo, DatasetSpec, dataset_info, dataset_spec

__all__ = [
    "DatasetInfo",
    "DatasetSpec",
    "DATASETS",
    "DATASET_SPECS",
    "dataset_info",
    "dataset_spec",
    "load_image_dataset",
    "collate_image_batch",
    "image_processor_for",
    "take",
]
