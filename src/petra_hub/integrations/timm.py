"""The paper's RevNets as timm models: ``timm.create_model("revnet18", num_classes=10, stem="cifar")``.

Importing this module registers the entry points ``revnet18``, ``revnet34``, ``revnet50`` and ``revnet101`` with timm
(``import petra_hub.integrations.timm``); nothing else in petra_hub imports timm.

The timm model (:class:`TimmRevNet`) wraps a :class:`~petra_hub.RevNetForImageClassification`, kept as its ``model``
attribute (state-dict keys ``model.revnet.embedder...``, ``model.classifier...``): it takes images and returns logits,
and follows timm's conventions (``num_classes``, ``in_chans``, ``forward_features``, ``forward_head``,
``reset_classifier``, ``pretrained_cfg``). Other keyword arguments of ``create_model`` (``stem`` (default
"imagenet"), ``downsampling``, ``hidden_sizes``, ``depths``, ``embedding_size``, ...) go to
:meth:`RevNetConfig.from_preset`.

No weights are published: ``pretrained=True`` needs ``pretrained_cfg_overlay=dict(file="path/model.safetensors")``,
a file written by ``RevNetForImageClassification.save_pretrained`` (or ``RevNetModel.save_pretrained``) or a timm
state dict of the same architecture (give the same ``stem``, widths, ... as the saved model).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import torch
import torch.nn.functional as functional
from safetensors import safe_open
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model, resolve_pretrained_cfg
from torch import nn

from ..data import dataset_spec
from ..models.revnet.configuration_revnet import RevNetConfig
from ..models.revnet.modeling_revnet import RevNetForImageClassification

__all__ = ["MODEL_NAMES", "TimmRevNet", "default_cfgs", "revnet18", "revnet34", "revnet50", "revnet101"]

MODEL_NAMES = ("revnet18", "revnet34", "revnet50", "revnet101")

_IMAGENET = dataset_spec("imagenet").info


def _pretrained_cfg(name: str) -> dict[str, Any]:
    return {
        "url": "",
        "num_classes": _IMAGENET.num_labels,
        "input_size": (_IMAGENET.num_channels, _IMAGENET.image_size, _IMAGENET.image_size),
        "pool_size": (7, 7),  # 224 / 32 with the imagenet stem
        "crop_pct": 0.875,
        "interpolation": "bilinear",
        "mean": _IMAGENET.mean,
        "std": _IMAGENET.std,
        "first_conv": "model.revnet.embedder.layers.0",
        "classifier": "model.classifier",
        "license": "apache-2.0",
        "paper_ids": "arXiv:2406.02052",
        "paper_name": "PETRA: Parallel End-to-end Training with Reversible Architectures",
        "description": f"{name} reversible ResNet of the PETRA paper, no weights",
    }


# What timm's register_model reads from this module.
default_cfgs = generate_default_cfgs({name: _pretrained_cfg(name) for name in MODEL_NAMES})

# Arguments of RevNetConfig that the timm arguments replace.
_RENAMED = {"num_labels": "num_classes", "num_channels": "in_chans", "block_type": "the preset name"}
_CONFIG_ARGUMENTS = frozenset(inspect.signature(RevNetConfig.__init__).parameters) - {"self", "kwargs", *_RENAMED}


class TimmRevNet(nn.Module):
    """A RevNet classifier with timm's interface; `self.model` is the transformers model it wraps."""

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
        for name in config_kwargs:
            if name in _RENAMED:
                raise TypeError(f"{type(self).__name__}: pass {_RENAMED[name]} instead of {name!r}")
            if name not in _CONFIG_ARGUMENTS:
                raise TypeError(
                    f"{type(self).__name__} got an unexpected keyword argument {name!r}; RevNet arguments are "
                    f"num_classes, in_chans, drop_rate, global_pool and {', '.join(sorted(_CONFIG_ARGUMENTS))}"
                )
        _check_global_pool(global_pool)
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        config = RevNetConfig.from_preset(
            preset, stem=stem, num_channels=in_chans, num_labels=max(num_classes, 1), **config_kwargs
        )
        self.model = RevNetForImageClassification(config)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = float(drop_rate)
        self.global_pool = "avg"
        self.num_features = self.head_hidden_size = self.model.revnet.num_features
        if num_classes == 0:
            self.model.classifier = nn.Identity()
        # create_model (build_model_with_cfg) replaces these with the resolved cfg.
        self.pretrained_cfg = self.default_cfg = default_cfgs[config.preset].default.to_dict()

    @property
    def config(self) -> RevNetConfig:
        return self.model.config

    def get_stages(self) -> list[nn.Module]:
        """The PETRA stages of the wrapped model (stem, one per block, head)."""
        return self.model.get_stages()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Unpooled features [batch, num_features, height, width]: the two streams after the last block."""
        return self.model.revnet(x, return_dict=True).last_hidden_state

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.model.revnet.pooler.pool(x).flatten(1)
        if self.drop_rate > 0.0:
            x = functional.dropout(x, p=self.drop_rate, training=self.training)
        return x if pre_logits else self.model.classifier(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.model.classifier

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new, freshly initialised linear head with `num_classes` outputs (0: no head, features out)."""
        if global_pool is not None:
            _check_global_pool(global_pool)
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        reference = next(self.model.revnet.parameters())
        if num_classes > 0:
            head = nn.Linear(self.num_features, num_classes, device=reference.device, dtype=reference.dtype)
            with torch.no_grad():
                nn.init.normal_(head.weight, mean=0.0, std=self.model.config.initializer_range)
                nn.init.zeros_(head.bias)
            self.model.config.num_labels = num_classes
            self.model.num_labels = num_classes
        else:
            head = nn.Identity()
        self.model.classifier = head
        self.num_classes = num_classes

    def group_matcher(self, coarse: bool = False) -> dict[str, str]:
        """Parameter groups for timm's layer-wise learning-rate decay: the stem, then one group per block."""
        return {"stem": r"^model\.revnet\.embedder", "blocks": r"^model\.revnet\.encoder\.(\d+)"}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if enable:
            raise NotImplementedError(
                "gradient checkpointing is not implemented for RevNets (reversible blocks can rebuild their inputs "
                "instead: see petra_hub's reversible_backprop and petra modes)"
            )


def _check_global_pool(global_pool: str) -> None:
    if global_pool != "avg":
        raise ValueError(f"RevNets only support global_pool='avg', got {global_pool!r}")


# --------------------------------------------------------------------------------------------------------------
# loading weights

_LEGACY_PREFIX = "revnet.revnet."  # timm RevNets of petra_hub 0.1.0 kept the transformers model as `revnet`


def _to_timm_keys(state_dict: dict[str, torch.Tensor], model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Accept the keys of a timm RevNet, a transformers RevNetForImageClassification or a bare RevNetModel."""
    if any(key.startswith("model.") for key in state_dict):  # timm RevNet
        return state_dict
    if any(key.startswith(_LEGACY_PREFIX) for key in state_dict):  # timm RevNet saved before the rename
        return {f"model.{key.removeprefix('revnet.')}": value for key, value in state_dict.items()}
    if any(key.startswith(("revnet.", "classifier.")) for key in state_dict):  # RevNetForImageClassification
        return {f"model.{key}": value for key, value in state_dict.items()}
    return {f"model.revnet.{key}": value for key, value in state_dict.items()}  # RevNetModel


def _classifier_width(path: str) -> int | None:
    """Output width of the classifier stored in a safetensors file (read from its header), if any."""
    if not str(path).endswith(".safetensors"):
        return None
    with safe_open(path, framework="pt") as handle:
        keys = set(handle.keys())
        for key in ("model.classifier.weight", "revnet.classifier.weight", "classifier.weight"):
            if key in keys:
                return int(handle.get_slice(key).get_shape()[0])
    return None


def _prepare_pretrained(variant: str, pretrained_cfg, overlay: dict | None) -> dict | None:
    """Fail clearly when there is nothing to load; return the overlay, completed with the file's head width."""
    resolved = resolve_pretrained_cfg(variant, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=overlay)
    if not (resolved.file or resolved.url or resolved.hf_hub_id or resolved.state_dict):
        raise RuntimeError(
            f"no pretrained weights are published for {variant!r}. Use pretrained=False, or point at a local file: "
            f"timm.create_model({variant!r}, pretrained=True, pretrained_cfg_overlay=dict(file='.../model.safetensors'"
            "), ...) with the architecture arguments (stem, hidden_sizes, ...) of the saved model"
        )
    if resolved.file:
        if not os.path.isfile(resolved.file):
            raise FileNotFoundError(f"pretrained weights file {resolved.file!r} does not exist")
        if overlay is not None and "num_classes" not in overlay:
            width = _classifier_width(resolved.file)
            if width is not None:
                overlay = {**overlay, "num_classes": width}
    return overlay


def _create_revnet(variant: str, pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    if kwargs.pop("features_only", False):
        raise NotImplementedError(f"{variant} does not support features_only; use forward_features instead")
    overlay = kwargs.pop("pretrained_cfg_overlay", None)
    if pretrained:
        overlay = _prepare_pretrained(variant, kwargs.get("pretrained_cfg"), overlay)
    if kwargs.get("stem", "imagenet") == "cifar":
        # The cifar stem (no stride, no pooling) is meant for small images: describe 32x32 inputs unless told so.
        architecture = {name: value for name, value in kwargs.items() if name in _CONFIG_ARGUMENTS}
        factor = RevNetConfig.from_preset(variant, **architecture).downsampling_factor
        small = {"input_size": (kwargs.get("in_chans", 3), 32, 32), "crop_pct": 1.0,
                 "pool_size": (max(1, 32 // factor),) * 2}
        overlay = {**small, **(overlay or {})}
    return build_model_with_cfg(
        TimmRevNet,
        variant,
        pretrained,
        pretrained_cfg_overlay=overlay,
        pretrained_filter_fn=_to_timm_keys,
        preset=variant,
        **kwargs,
    )


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
