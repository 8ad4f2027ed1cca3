"""RevNets of the PETRA paper. Importing this package registers the RevNet family (`family.py`):
the "revnet" model type with the Auto classes, its presets, recipe flags and model card."""

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
from .family import REVNET  # registers the family (Auto classes included)

__all__ = [
    "REVNET",
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

