from .revnet import RevNetConfig, RevNetForImageClassification, RevNetModel, RevNetPreTrainedModel

__all__ = ["RevNetConfig", "RevNetForImageClassification", "RevNetModel", "RevNetPreTrainedModel"]
