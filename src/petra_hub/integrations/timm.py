"""The paper's RevNets as timm models: ``timm.create_model("revnet18", num_classes=10, stem="cifar")``.

Importing this module registers the entry points ``revnet18``, ``revnet34``, ``revnet50`` and ``revnet101`` with timm
(``import petra_hub.integrations.timm``), and with them the RevViTs ``revvit_tiny``, ``revvit_small`` and
``revvit_base`` (:mod:`petra_hub.integrations.timm_revvit`; :class:`TimmRevViT` and the entry points are re-exported
here). Nothing else in petra_hub imports timm. `MODEL_NAMES` lists the RevNets, `REVVIT_MODEL_NAMES` the RevViTs;
`default_cfgs` here holds the RevNets' pretrained cfgs (the RevViTs' are in their module).

The timm model (:class:`TimmRevNet`) wraps a :class:`~petra_hub.RevNetForImageClassification`, kept as its ``model``
attribute (state-dict keys ``model.revnet.embedder...``, ``model.classifier...``): it takes images and returns logits,
and follows timm's conventions (``num_classes``, ``in_chans``, ``forward_features``, ``forward_head``,
``reset_classifier``, ``pretrained_cfg``). Other keyword arguments of ``create_model`` (``stem`` (default
"imagenet"), ``downsampling``, ``hidden_sizes``, ``depths``, ``embedding_size``, ...) go to
:meth:`RevNetConfig.from_preset`. What the families share (the wrapper, the ImageNet cfg, loading local weights) is
in :mod:`petra_hub.integrations.timm_common`.

No weights are published: ``pretrained=True`` needs ``pretrained_cfg_overlay=dict(file="path/model.safetensors")``,
a file written by ``RevNetForImageClassification.save_pretrained`` (or ``RevNetModel.save_pretrained``) or a timm
state dict of the same architecture (give the same ``stem``, widths, ... as the saved model). ``num_classes`` is read
from the file unless given: a ``RevNetModel`` file has no classifier and gives a model without head (``num_classes``
0, features out); with ``num_classes`` given, the head is new and freshly initialised.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ..models.revnet.configuration_revnet import RevNetConfig
from ..models.revnet.modeling_revnet import RevNetForImageClassification
from .timm_common import TimmWrapper, build, convert_keys, imagenet_cfg
from .timm_revvit import REVVIT_MODEL_NAMES, TimmRevViT, revvit_base, revvit_small, revvit_tiny

__all__ = [
    "MODEL_NAMES", "REVVIT_MODEL_NAMES", "TimmRevNet", "TimmRevViT", "default_cfgs",
    "revnet18", "revnet34", "revnet50", "revnet101", "revvit_tiny", "revvit_small", "revvit_base",
]

MODEL_NAMES = ("revnet18", "revnet34", "revnet50", "revnet101")


def _pretrained_cfg(name: str) -> dict[str, Any]:
    return imagenet_cfg(
        pool_size=(7, 7),  # 224 / 32 with the imagenet stem
        first_conv="model.revnet.embedder.layers.0",
        paper_ids="arXiv:2406.02052",
        paper_name="PETRA: Parallel End-to-end Training with Reversible Architectures",
        description=f"{name} reversible ResNet of the PETRA paper, no weights",
    )


# What timm's register_model reads from this module (the RevNets'; the RevViTs' are in timm_revvit).
default_cfgs = generate_default_cfgs({name: _pretrained_cfg(name) for name in MODEL_NAMES})


class TimmRevNet(TimmWrapper):
    """A RevNet classifier with timm's interface; `self.model` is the transformers model it wraps."""

    family = "RevNet"
    stem = "embedder"
    # Arguments of RevNetConfig that the timm arguments replace, and those taken.
    renamed = {"num_labels": "num_classes", "num_channels": "in_chans", "block_type": "the preset name"}
    config_arguments = (frozenset(inspect.signature(RevNetConfig.__init__).parameters)
                        - {"self", "kwargs", "preset", *renamed})  # the model name is the preset

    def __init__(
        self,
        preset: str = "revnet18",
        num_classes: int = 1000,
        in_chans: int = 3,
        stem: str = "imagenet",
        drop_rate: float = 0.0,
        global_pool: str = "avg",
        **config_kwargs: Any,
    ):
        super().__init__()
        self._check_arguments(config_kwargs, num_classes, global_pool)
        config = RevNetConfig.from_preset(
            preset, stem=stem, num_channels=in_chans, num_labels=max(num_classes, 1), **config_kwargs
        )
        model = RevNetForImageClassification(config)
        self._wrap(model, num_classes, in_chans, drop_rate, default_cfgs[config.preset].default.to_dict())

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Unpooled features [batch, num_features, height, width]: the two streams after the last block."""
        return self.model.revnet(x, return_dict=True).last_hidden_state

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self._classify(self.model.revnet.pooler.pool(x).flatten(1), pre_logits)


def _to_timm_keys(state_dict: dict[str, torch.Tensor], model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Accept the keys of a timm RevNet, a transformers RevNetForImageClassification or a bare RevNetModel."""
    return convert_keys(state_dict, "revnet")


def _create_revnet(variant: str, pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    cfg_defaults = None
    if kwargs.get("stem", "imagenet") == "cifar":
        # The cifar stem (no stride, no pooling) is meant for small images: describe 32x32 inputs unless told so.
        architecture = {name: value for name, value in kwargs.items() if name in TimmRevNet.config_arguments}
        factor = RevNetConfig.from_preset(variant, **architecture).downsampling_factor
        cfg_defaults = {"input_size": (kwargs.get("in_chans", 3), 32, 32), "crop_pct": 1.0,
                        "pool_size": (max(1, 32 // factor),) * 2}
    return build(TimmRevNet, variant, pretrained, kwargs, architecture="stem, hidden_sizes, ...",
                 filter_fn=_to_timm_keys, cfg_defaults=cfg_defaults)


# --------------------------------------------------------------------------------------------------------------
# entry points


@register_model
def revnet18(pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    """RevNet-18 of the PETRA paper (basic blocks, 2/2/2/2, widths 64-512 per stream; 12.2 M parameters)."""
    return _create_revnet("revnet18", pretrained, **kwargs)


@register_model
def revnet34(pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    """RevNet-34 of the PETRA paper (basic blocks, 3/4/6/3, widths 64-512 per stream)."""
    return _create_revnet("revnet34", pretrained, **kwargs)


@register_model
def revnet50(pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    """RevNet-50 of the PETRA paper (bottleneck blocks, 3/4/6/3, widths 256-2048 per stream)."""
    return _create_revnet("revnet50", pretrained, **kwargs)


@register_model
def revnet101(pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    """RevNet-101 of the PETRA paper (bottleneck blocks, 3/4/23/3, widths 256-2048 per stream)."""
    return _create_revnet("revnet101", pretrained, **kwargs)
