"""The order in which every rank of a pipeline reads the training data."""

from __future__ import annotations

import torch
from torch.utils.data import Sampler


class EpochSampler(Sampler[int]):
    """The same order on every rank of a pipeline: a permutation seeded by (seed, epoch), optionally starting
    mid-epoch. With several pipeline replicas, replica d reads every D-th index of it (equal shares)."""

    def __init__(self, size: int, seed: int, shuffle: bool = True, replica: int = 0, replicas: int = 1):
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.replica, self.replicas = replica, replicas
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(
                self.size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            )
        else:
            order = torch.arange(self.size)
        share = order[self.replica :: self.replicas][: self.size // self.replicas]
        return iter(share[self.start :].tolist())

    def __len__(self) -> int:
        return self.size // self.replicas - self.start
