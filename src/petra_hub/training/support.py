"""Which `TrainingArguments` fields PetraTrainer honours, refuses, or has no use for (placeholder: being written)."""

from __future__ import annotations


def check_supported(args) -> None:
    """Raise a ValueError naming the first refused field set to a value other than its default."""
