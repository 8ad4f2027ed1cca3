"""Checks shared by the data tests: (un)normalising, expected pixels, shifted crops."""

from __future__ import annotations

import numpy as np
import torch

from petra_hub.data import DatasetInfo


def _unnormalise(pv: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    mean = torch.tensor(info.mean).view(-1, 1, 1)
    std = torch.tensor(info.std).view(-1, 1, 1)
    return pv * std + mean


def _normalise(x: torch.Tensor, info: DatasetInfo) -> torch.Tensor:
    return (x - torch.tensor(info.mean).view(-1, 1, 1)) / torch.tensor(info.std).view(-1, 1, 1)


def _expected_from_row(row: np.ndarray) -> torch.Tensor:
    """[3, 32, 32] in [0, 1] from a channel-major 3072 row, by the explicit index formula."""
    c, r, col = np.indices((3, 32, 32))
    return torch.from_numpy(row[c * 1024 + r * 32 + col].astype(np.float32) / 255.0)


def _matches_shifted(aug: torch.Tensor, orig: torch.Tensor, padding: int, flips: bool) -> bool:
    """True if ``aug`` is a ``padding``-zero-padded crop (optionally flipped) of ``orig``."""
    c, h, w = orig.shape
    padded = torch.zeros(c, h + 2 * padding, w + 2 * padding)
    padded[:, padding : padding + h, padding : padding + w] = orig
    for dy in range(2 * padding + 1):
        for dx in range(2 * padding + 1):
            crop = padded[:, dy : dy + h, dx : dx + w]
            for cand in ([crop, crop.flip(-1)] if flips else [crop]):
                if torch.allclose(aug, cand, atol=1e-5):
                    return True
    return False

