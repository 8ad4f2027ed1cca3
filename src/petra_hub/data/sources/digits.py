"""scikit-learn's 8x8 digits, embedded (works offline).

A fixed stratified split (``train_test_split(test_size=0.2, random_state=0)``: 1,437 /
360 images), values scaled to [0, 1], bilinear upscale to the spec's image size (16x16),
grey repeated to RGB.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from ..registry import DatasetSpec
    from . import Loaded


@lru_cache(maxsize=1)
def digits_arrays(size: int, test_size: float, random_state: int
                  ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
    """All images ([N, 3, size, size] float in [0, 1]), labels, train and test indices."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    labels = torch.as_tensor(bunch.target, dtype=torch.int64)
    x = torch.as_tensor(bunch.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    x = torch.nn.functional.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    x = x.expand(-1, 3, -1, -1).contiguous()
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=test_size, random_state=random_state, stratify=bunch.target
    )
    return x, labels, np.asarray(train_idx), np.asarray(test_idx)


@dataclass(frozen=True)
class SklearnDigits:
    """Reader of the embedded digits: ``test_size`` and ``random_state`` fix the split."""

    test_size: float = 0.2
    random_state: int = 0
    embedded = "scikit-learn"
    layout = "nothing: the data is embedded"

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None, keep_images: bool = True) -> Loaded:
        images, labels, train_idx, test_idx = digits_arrays(
            spec.info.image_size, self.test_size, self.random_state)
        idx = torch.as_tensor(train_idx if split == "train" else test_idx)
        images, labels = images[idx], labels[idx]
        return images.__getitem__, labels, spec.info
