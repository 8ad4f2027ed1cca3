"""Reversible vision transformers (RevViT). Importing this package registers the "revvit" model type with the Auto
classes."""

from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from .configuration_revvit import PRESETS, RevViTConfig
from .modeling_revvit import (
    ReversibleViTBlock,
    RevViTEmbeddings,
    RevViTForImageClassification,
    RevViTHead,
    RevViTModel,
    RevViTPreTrainedModel,
)

__all__ = [
    "PRESETS",
    "ReversibleViTBlock",
    "RevViTConfig",
    "RevViTEmbeddings",
    "RevViTForImageClassification",
    "RevViTHead",
    "RevViTModel",
    "RevViTPreTrainedModel",
]


def _register_auto_classes() -> None:
    AutoConfig.register(RevViTConfig.model_type, RevViTConfig, exist_ok=True)
    AutoModel.register(RevViTConfig, RevViTModel, exist_ok=True)
    AutoModelForImageClassification.register(RevViTConfig, RevViTForImageClassification, exist_ok=True)
    RevViTConfig.register_for_auto_class()
    RevViTModel.register_for_auto_class("AutoModel")
    RevViTForImageClassification.register_for_auto_class("AutoModelForImageClassification")


_register_auto_classes()
