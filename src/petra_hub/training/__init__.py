"""Training with PETRA through transformers' Trainer API."""

from .arguments import PetraTrainingArguments
from .fidelity import GradientFidelityCallback
from .preemption import PREEMPTED_EXIT_STATUS, Preempted
from .sampler import EpochSampler
from .trainer import PetraTrainer

__all__ = ["EpochSampler", "GradientFidelityCallback", "PREEMPTED_EXIT_STATUS", "PetraTrainer",
           "PetraTrainingArguments", "Preempted"]
