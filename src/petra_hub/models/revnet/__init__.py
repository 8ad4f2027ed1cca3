"""RevNets of the PETRA paper. Importing this package registers the "revnet" model type with the Auto classes."""

from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from .configuration_revnet import PRESETS, RevNetConfig
from .modeling_revnet import (
    DownsampleBlock,
    ReversibleBlock,
    RevNetForImageClassification,
    RevNetHead,
    RevNetModel,
    RevNetPreTrainedModel,
    RevNetStem,
)

__all__ = [
    "PRESETS",
    "DownsampleBlock",
    "ReversibleBlock",
    "RevNetConfig",
    "RevNetForImageClassification",
    "RevNetHead",
    "RevNetModel",
    "RevNetPreTrainedModel",
    "RevNetStem",
]


def _register_auto_classes() -> None:
    AutoConfig.register(RevNetConfig.model_type, RevNetConfig, exist_ok=True)
    AutoModel.register(RevNetConfig, RevNetModel, exist_ok=True)
    AutoModelForImageClassification.register(RevNetConfig, RevNetForImageClassification, exist_ok=True)
    # Saved folders carry `auto_map` and this code, for `trust_remote_code=True` users without petra_hub.
    RevNetConfig.register_for_auto_class()
    RevNetModel.register_for_auto_class("AutoModel")
    RevNetForImageClassification.register_for_auto_class("AutoModelForImageClassification")


_register_auto_classes()
