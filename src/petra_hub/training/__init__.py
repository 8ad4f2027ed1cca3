"""Training with PETRA through transformers' Trainer API."""

from .arguments import PetraTrainingArguments
from .sampler import EpochSampler
from .trainer import PetraTrainer

__all__ = ["EpochSampler", "PetraTrainer", "PetraTrainingArguments"]
