"""Fixtures shared by the data tests (digits is embedded: no files needed)."""

from __future__ import annotations

import numpy as np
import pytest

from petra_hub.data import load_image_dataset


@pytest.fixture(scope="module")
def digits_train():
    return load_image_dataset("digits", "train")


@pytest.fixture(scope="module")
def digits_test():
    return load_image_dataset("digits", "test")


@pytest.fixture(scope="module")
def sk_digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    tr, te = train_test_split(np.arange(len(d.target)), test_size=0.2, random_state=0,
                              stratify=d.target)
    return d, tr, te

