"""The paper's RevNets as timm models: ``timm.create_model("revnet18", num_classes=10, stem="cifar")``.

Importing this module registers the entry points ``revnet18``, ``revnet34``, ``revnet50`` and ``revnet101`` with timm
when timm can be imported (it needs torchvision); without timm the module still imports and
:func:`register_timm_models` raises an ImportError. Registration is idempotent.

The timm model (:class:`TimmRevNet`) wraps a :class:`~petra_hub.RevNetForImageClassification`, kept as its ``revnet``
attribute: it takes images and returns logits, and follows timm's conventions (``num_classes``, ``in_chans``,
``forward_features``, ``forward_head``, ``reset_classifier``, ``pretrained_cfg``). Other keyword arguments of
``create_model`` (``stem`` (default "imagenet"), ``downsampling``, ``hidden_sizes``, ``depths``, ``embedding_size``,
...) go to :meth:`RevNetConfig.from_preset`.

No weights are published: ``pretrained=True`` needs ``pretrained_cfg_overlay=dict(file="path/model.safetensors")``,
a file written by ``RevNetForImageClassification.save_pretrained`` or a timm state dict of the same architecture
(give the same ``stem``, widths, ... as the saved model).
"""

from __future__ import annotations

import inspect
import math
import os
import warnings
from typing import Any

import torch
import torch.nn.functional as functional
from torch import nn

from ..models.revnet.configuration_revnet import PRESETS, RevNetConfig
from ..models.revnet.modeling_revnet import RevNetForImageClassification

__all__ = ["MODEL_NAMES", "TimmRevNet", "register_timm_models", "timm_available"]

MODEL_NAMES = ("revnet18", "revnet34", "revnet50", "revnet101")

_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)
_PAPER = "PETRA: Parallel End-to-end Training with Reversible Architectures"


def _pretrained_cfg(**overrides: Any) -> dict[str, Any]:
    cfg = {
        "url": "",
        "num_classes": 1000,
        "input_size": (3, 224, 224),
        "pool_size": (7, 7),
        "crop_pct": 0.875,
        "interpolation": "bilinear",
        "mean": _IMAGENET_MEAN,
        "std": _IMAGENET_STD,
        "first_conv": "revnet.revnet.embedder.layers.0",
        "classifier": "revnet.classifier",
        "license": "apache-2.0",
        "paper_ids": "arXiv:2406.02052",
        "paper_name": _PAPER,
    }
    cfg.update(overrides)
    return cfg


# The plain cfg dicts (no timm needed); `default_cfgs` is what timm's register_model reads from this module.
_PRETRAINED_CFGS = {name: _pretrained_cfg(description=f"{name} reversible ResNet of the PETRA paper, no weights")
                    for name in MODEL_NAMES}
default_cfgs: dict | None = None

# Arguments of RevNetConfig that the timm arguments replace.
_RENAMED = {"num_labels": "num_classes", "num_channels": "in_chans", "block_type": "the preset name"}
_CONFIG_ARGUMENTS = frozenset(inspect.signature(RevNetConfig.__init__).parameters) - {"self", "kwargs", *_RENAMED}


class TimmRevNet(nn.Module):
    """A RevNet classifier with timm's interface; `self.revnet` is the transformers model it wraps."""

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
        self.revnet = RevNetForImageClassification(config)
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = float(drop_rate)
        self.global_pool = "avg"
        self.num_features = self.head_hidden_size = self.revnet.revnet.num_features
        if num_classes == 0:
            self.revnet.classifier = nn.Identity()
        # create_model (build_model_with_cfg) replaces these with the resolved cfg.
        self.pretrained_cfg = self.default_cfg = dict(_PRETRAINED_CFGS.get(preset, _pretrained_cfg()))

    @property
    def config(self) -> RevNetConfig:
        return self.revnet.config

    def get_stages(self) -> list[nn.Module]:
        """The PETRA stages of the wrapped model (stem, one per block, head)."""
        return self.revnet.get_stages()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Unpooled features [batch, num_features, height, width]: the two streams after the last block."""
        return self.revnet.revnet(x, return_dict=True).last_hidden_state

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.revnet.revnet.pooler.pool(x).flatten(1)
        if self.drop_rate > 0.0:
            x = functional.dropout(x, p=self.drop_rate, training=self.training)
        return x if pre_logits else self.revnet.classifier(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.revnet.classifier

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new, freshly initialised linear head with `num_classes` outputs (0: no head, features out)."""
        if global_pool is not None:
            _check_global_pool(global_pool)
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        reference = next(self.revnet.revnet.parameters())
        if num_classes > 0:
            head = nn.Linear(self.num_features, num_classes, device=reference.device, dtype=reference.dtype)
            with torch.no_grad():
                nn.init.normal_(head.weight, mean=0.0, std=self.revnet.config.initializer_range)
                nn.init.zeros_(head.bias)
            self.revnet.config.num_labels = num_classes
            self.revnet.num_labels = num_classes
        else:
            head = nn.Identity()
        self.revnet.classifier = head
        self.num_classes = num_classes

    def group_matcher(self, coarse: bool = False) -> dict[str, str]:
        """Parameter groups for timm's layer-wise learning-rate decay: the stem, then one group per block."""
        return {"stem": r"^revnet\.revnet\.embedder", "blocks": r"^revnet\.revnet\.encoder\.(\d+)"}

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


def _to_timm_keys(state_dict: dict[str, torch.Tensor], model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Accept the keys of a timm RevNet, a transformers RevNetForImageClassification or a bare RevNetModel."""
    if any(key.startswith("revnet.revnet.") for key in state_dict):
        return state_dict
    if any(key.startswith(("revnet.", "classifier.")) for key in state_dict):
        return {f"revnet.{key}": value for key, value in state_dict.items()}
    return {f"revnet.revnet.{key}": value for key, value in state_dict.items()}


def _classifier_width(path: str) -> int | None:
    """Output width of the classifier stored in a safetensors file (read from its header), if any."""
    if not str(path).endswith(".safetensors"):
        return None
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        for key in ("revnet.classifier.weight", "classifier.weight"):
            if key in handle.keys():
                return int(handle.get_slice(key).get_shape()[0])
    return None


def _prepare_pretrained(variant: str, pretrained_cfg, overlay: dict | None) -> dict | None:
    """Fail clearly when there is nothing to load; return the overlay, completed with the file's head width."""
    from timm.models import resolve_pretrained_cfg

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
    from timm.models import build_model_with_cfg

    if kwargs.pop("features_only", False):
        raise NotImplementedError(f"{variant} does not support features_only; use forward_features instead")
    overlay = kwargs.pop("pretrained_cfg_overlay", None)
    if pretrained:
        overlay = _prepare_pretrained(variant, kwargs.get("pretrained_cfg"), overlay)
    if kwargs.get("stem", "imagenet") == "cifar":
        # The cifar stem (no stride, no pooling) is meant for small images: describe 32x32 inputs unless told so.
        depths = kwargs.get("depths") or PRESETS[variant]["depths"]
        factor = math.prod(kwargs.get("layer_strides") or [1] + [2] * (len(depths) - 1))
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
# entry points (registered with timm by register_timm_models)


def revnet18(pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    """RevNet-18 of the PETRA paper (basic blocks, 2/2/2/2, widths 64-512 per stream; 12.2 M parameters)."""
    return _create_revnet("revnet18", pretrained, **kwargs)


def revnet34(pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    """RevNet-34 of the PETRA paper (basic blocks, 3/4/6/3, widths 64-512 per stream)."""
    return _create_revnet("revnet34", pretrained, **kwargs)


def revnet50(pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    """RevNet-50 of the PETRA paper (bottleneck blocks, 3/4/6/3, widths 256-2048 per stream)."""
    return _create_revnet("revnet50", pretrained, **kwargs)


def revnet101(pretrained: bool = False, **kwargs: Any) -> TimmRevNet:
    """RevNet-101 of the PETRA paper (bottleneck blocks, 3/4/23/3, widths 256-2048 per stream)."""
    return _create_revnet("revnet101", pretrained, **kwargs)


_ENTRY_POINTS = {"revnet18": revnet18, "revnet34": revnet34, "revnet50": revnet50, "revnet101": revnet101}
assert set(_ENTRY_POINTS) == set(MODEL_NAMES) <= set(PRESETS)


def _import_timm():
    try:
        import timm
        import timm.models
    except Exception as error:  # ImportError, or e.g. a RuntimeError from a torchvision that does not fit torch
        raise ImportError(
            "petra_hub's timm models need timm (and torchvision): pip install timm. "
            f"Importing timm failed with {type(error).__name__}: {error}"
        ) from error
    return timm


def timm_available() -> bool:
    try:
        _import_timm()
    except ImportError:
        return False
    return True


def register_timm_models() -> list[str]:
    """Register the RevNet entry points with timm; returns the names this call registered (empty if done already).

    A name that some other module registered first is left alone, with a warning.
    """
    global default_cfgs
    timm = _import_timm()
    registry = timm.models
    if default_cfgs is None:
        default_cfgs = registry.generate_default_cfgs(_PRETRAINED_CFGS)
    registered = []
    for name, function in _ENTRY_POINTS.items():
        if registry.is_model(name):
            owner = getattr(registry.model_entrypoint(name), "__module__", None)
            if owner != __name__:
                warnings.warn(
                    f"timm already has a model named {name!r} (from {owner}); petra_hub's {name} is not registered",
                    stacklevel=2,
                )
            continue
        registry.register_model(function)
        registered.append(name)
    return registered


if timm_available():
    register_timm_models()
