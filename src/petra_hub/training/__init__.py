"""Training with PETRA through transformers' Trainer API."""

from .arguments import PetraTrainingArguments
from .fidelity import GradientFidelityCallback
from .sampler import EpochSampler
from .trainer import PetraTrainer

__all__ = ["EpochSampler", "GradientFidelityCallback", "PetraTrainer", "PetraTrainingArguments"]
