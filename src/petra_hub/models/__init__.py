from .revnet import RevNetConfig, RevNetForImageClassification, RevNetModel, RevNetPreTrainedModel
from .revvit import RevViTConfig, RevViTForImageClassification, RevViTModel, RevViTPreTrainedModel

__all__ = [
    "RevNetConfig",
    "RevNetForImageClassification",
    "RevNetModel",
    "RevNetPreTrainedModel",
    "RevViTConfig",
    "RevViTForImageClassification",
    "RevViTModel",
    "RevViTPreTrainedModel",
]
