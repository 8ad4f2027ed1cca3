"""Train and test transforms of the PETRA paper, with per-item seeded randomness.

A transform is called as ``transform(img, size, rng)``: ``img`` is a [C, H, W] tensor
(uint8, or float in [0, 1]), ``size`` the side length the model sees
(``DatasetInfo.image_size``) and ``rng`` a ``random.Random`` for the augmenting ones
(None for the deterministic ones).  The result is ``size`` x ``size``, same dtype and
range; normalisation comes after (see :mod:`petra_hub.data.dataset`), so zero padding is
black.  Each data set names its two transforms in :mod:`petra_hub.data.registry`:

``PadCrop(padding, flip)``   random ``size`` x ``size`` crop of the image zero-padded by
                             ``padding``, then a horizontal flip with p=0.5 if ``flip``
                             (digits: padding 2, no flip; CIFAR / ImageNet32: 4, flip).
``ResizeIfNeeded()``         none for images already ``size`` x ``size`` (the small sets'
                             test transform).
``RandomResizedCropFlip()``  random-resized crop (scale 0.08..1, log-uniform aspect
                             3/4..4/3) and flip (ImageNet train).
``ResizeCenterCrop(resize)`` shorter side to ``resize``, centre crop (ImageNet test:
                             256, then 224).

Randomness: augmentation never touches the global RNG.  Item ``i`` is augmented with a
``random.Random`` seeded from ``item_seed(seed, epoch, i, n_i)``, where ``epoch`` is the
value of the last ``set_epoch(epoch)`` call (0 initially; the Trainer calls it each
epoch) and ``n_i`` counts the reads of item ``i`` by this dataset object since then.  So
datasets built with the same seed give identical tensors for the same reads in any order,
in any process (every rank, every resumed run).  Only ``rng.random()`` is drawn: its
stream is guaranteed stable across Python versions.  The pixel operations themselves are
``torchvision.transforms.v2.functional``'s.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Protocol

import torch

__all__ = [
    "Transform",
    "PadCrop",
    "ResizeIfNeeded",
    "RandomResizedCropFlip",
    "ResizeCenterCrop",
    "item_seed",
]


class Transform(Protocol):
    def __call__(self, img: torch.Tensor, size: int, rng: random.Random | None) -> torch.Tensor: ...


def item_seed(seed: int, epoch: int, index: int, draw: int) -> int:
    """Injective packing of the four counters into one non-negative integer."""
    key = seed % (1 << 64)
    key = (key << 32) | (epoch % (1 << 32))
    key = (key << 32) | (draw % (1 << 32))
    return (key << 40) | (index % (1 << 40))


def _tf():
    """``torchvision.transforms.v2.functional``, imported on first use (it takes a second)."""
    from torchvision.transforms.v2 import functional

    return functional


def _randbelow(rng: random.Random, n: int) -> int:
    return min(int(rng.random() * n), n - 1)


def _maybe_flip(img: torch.Tensor, rng: random.Random) -> torch.Tensor:
    return _tf().horizontal_flip(img) if rng.random() < 0.5 else img


def _fit(img: torch.Tensor, size: int) -> torch.Tensor:
    if img.shape[-2:] != (size, size):
        img = _tf().resize(img, [size, size], antialias=True)
    return img


@dataclass(frozen=True)
class ResizeIfNeeded:
    """Bilinear (antialiased) resize to ``size`` x ``size``, for images of another size only."""

    def __call__(self, img: torch.Tensor, size: int, rng: random.Random | None) -> torch.Tensor:
        return _fit(img, size)


@dataclass(frozen=True)
class PadCrop:
    """Random ``size`` x ``size`` crop of the image zero-padded by ``padding`` (+ optional flip)."""

    padding: int
    flip: bool

    def __call__(self, img: torch.Tensor, size: int, rng: random.Random | None) -> torch.Tensor:
        img = _fit(img, size)
        p = self.padding
        top = _randbelow(rng, img.shape[-2] + 2 * p - size + 1)  # drawn first, then left
        left = _randbelow(rng, img.shape[-1] + 2 * p - size + 1)
        tf = _tf()
        img = tf.crop(tf.pad(img, [p], fill=0), top, left, size, size)
        return _maybe_flip(img, rng) if self.flip else img


@dataclass(frozen=True)
class RandomResizedCropFlip:
    """Random-resized crop (area fraction ``scale``, log-uniform aspect ``ratio``) + flip."""

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def box(self, h: int, w: int, rng: random.Random) -> tuple[int, int, int, int]:
        """(top, left, height, width): ten tries at a random box, else a central one."""
        log_lo, log_hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            area = h * w * (self.scale[0] + (self.scale[1] - self.scale[0]) * rng.random())
            aspect = math.exp(log_lo + (log_hi - log_lo) * rng.random())
            cw = int(round(math.sqrt(area * aspect)))
            ch = int(round(math.sqrt(area / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                return _randbelow(rng, h - ch + 1), _randbelow(rng, w - cw + 1), ch, cw
        # fallback: the largest central box whose aspect lies in the allowed range
        aspect = w / h
        if aspect < self.ratio[0]:
            cw, ch = w, min(h, int(round(w / self.ratio[0])))
        elif aspect > self.ratio[1]:
            ch, cw = h, min(w, int(round(h * self.ratio[1])))
        else:
            cw, ch = w, h
        return (h - ch) // 2, (w - cw) // 2, ch, cw

    def __call__(self, img: torch.Tensor, size: int, rng: random.Random | None) -> torch.Tensor:
        top, left, ch, cw = self.box(img.shape[-2], img.shape[-1], rng)
        img = _tf().resized_crop(img, top, left, ch, cw, [size, size], antialias=True)
        return _maybe_flip(img, rng)


@dataclass(frozen=True)
class ResizeCenterCrop:
    """Shorter side to ``resize``, then a centred ``size`` x ``size`` crop."""

    resize: int

    def __call__(self, img: torch.Tensor, size: int, rng: random.Random | None) -> torch.Tensor:
        tf = _tf()
        return tf.center_crop(tf.resize(img, [self.resize], antialias=True), [size, size])
