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
