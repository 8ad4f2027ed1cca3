"""petra_hub: PETRA (parallel end-to-end training of reversible architectures) across processes and devices."""

from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from .models.revnet import RevNetConfig, RevNetForImageClassification, RevNetModel, RevNetPreTrainedModel

__version__ = "0.1.0"


def _register_auto_classes() -> None:
    AutoConfig.register(RevNetConfig.model_type, RevNetConfig, exist_ok=True)
    AutoModel.register(RevNetConfig, RevNetModel, exist_ok=True)
    AutoModelForImageClassification.register(RevNetConfig, RevNetForImageClassification, exist_ok=True)
    # Saved folders carry `auto_map` and this code, for `trust_remote_code=True` users without petra_hub.
    RevNetConfig.register_for_auto_class()
    RevNetModel.register_for_auto_class("AutoModel")
    RevNetForImageClassification.register_for_auto_class("AutoModelForImageClassification")


_register_auto_classes()

from . import timm_models  # noqa: E402,F401  registers revnet18..revnet101 with timm when timm imports

__all__ = ["RevNetConfig", "RevNetForImageClassification", "RevNetModel", "RevNetPreTrainedModel", "__version__"]
