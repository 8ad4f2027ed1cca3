"""Reversible vision transformers (RevViT). Importing this package registers the RevViT family (`family.py`):
the "revvit" model type with the Auto classes, its presets, recipe flags and model card."""

from .configuration_revvit import PRESETS, RevViTConfig
from .modeling_revvit import (
    ReversibleViTBlock,
    RevViTEmbeddings,
    RevViTForImageClassification,
    RevViTHead,
    RevViTModel,
    RevViTPreTrainedModel,
)
from .family import REVVIT  # registers the family (Auto classes included)

__all__ = [
    "REVVIT",
    "PRESETS",
    "ReversibleViTBlock",
    "RevViTConfig",
    "RevViTEmbeddings",
    "RevViTForImageClassification",
    "RevViTHead",
    "RevViTModel",
    "RevViTPreTrainedModel",
]

