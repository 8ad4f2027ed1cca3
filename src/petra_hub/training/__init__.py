"""Training with PETRA through transformers' Trainer API."""

from .trainer import EpochSampler, PetraTrainer, PetraTrainingArguments

__all__ = ["EpochSampler", "PetraTrainer", "PetraTrainingArguments"]
