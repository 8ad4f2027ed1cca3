"""The reversible vision transformers as timm models: ``timm.create_model("revvit_small", num_classes=10)``.

``import petra_hub.integrations.timm`` (or this module) registers ``revvit_tiny``, ``revvit_small`` and
``revvit_base`` with timm: RevViT (Mangalam et al., "Reversible Vision Transformers", CVPR 2022) at the widths of
the presets ``revvit-tiny``, ``revvit-small``, ``revvit-base`` (patch 16, 12 blocks; hidden size 192 / 384 / 768).

The timm model (:class:`TimmRevViT`) wraps a :class:`~petra_hub.RevViTForImageClassification` as its ``model``
attribute (state-dict keys ``model.revvit.embeddings...``, ``model.revvit.encoder.<i>...``,
``model.revvit.pooler...``, ``model.classifier...``). As timm's ViTs, ``forward_features`` returns the normalised
tokens [batch, num_patches, num_features] (the two streams side by side after the final LayerNorm, so
``num_features`` = 2 x hidden size; there is no class token) and ``forward_head`` takes their mean (as the
transformers model does, hence ``global_pool="avg"`` only), applies ``drop_rate`` dropout and the classifier.

Arguments: timm's ``num_classes``, ``in_chans``, ``drop_rate``, ``global_pool`` and ``drop_path_rate`` (stochastic
depth, which RevViTConfig names the same: rising linearly over the blocks up to it); timm's ``img_size`` (an int or
a square ``(size, size)``) is accepted as a synonym of ``image_size``, and giving both with different values is a
ValueError. The other keyword arguments (``image_size``, ``patch_size``, ``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``mlp_ratio``, ``hidden_dropout_prob``, ``layer_norm_eps``, ``initializer_range``) go to
:meth:`RevViTConfig.from_preset`; any other is a TypeError naming it.

pretrained cfg: 3x224x224 ImageNet inputs, ImageNet mean and std, ``crop_pct`` 0.875 (petra_hub's ImageNet test
transform: resize 256, centre crop 224; timm's DeiT cfgs use 0.9), bilinear, ``fixed_input_size`` (the position
embeddings are learned per patch); ``input_size`` follows ``image_size`` and ``in_chans`` (with ``pretrained=True``,
its channels are the file's, from which timm adapts the patch embedding to ``in_chans``). No weights are published:
``pretrained=True`` needs ``pretrained_cfg_overlay=dict(file="path/model.safetensors")``, a file written by
``RevViTForImageClassification.save_pretrained`` (or ``RevViTModel.save_pretrained``) or a timm state dict, with the
architecture arguments of the saved model; ``num_classes`` is read from the file unless given (a ``RevViTModel``
file has no classifier: 0, a model without head; with ``num_classes`` given, the head is new).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from timm.models import generate_default_cfgs, register_model
from torch import nn

from ..models.revvit.configuration_revvit import RevViTConfig
from ..models.revvit.modeling_revvit import RevViTForImageClassification
from .timm_common import TIMM_ARGUMENTS, TimmWrapper, build, convert_keys, imagenet_cfg

__all__ = ["REVVIT_MODEL_NAMES", "TimmRevViT", "default_cfgs", "revvit_tiny", "revvit_small", "revvit_base"]

REVVIT_MODEL_NAMES = ("revvit_tiny", "revvit_small", "revvit_base")


def _pretrained_cfg(name: str) -> dict[str, Any]:
    return imagenet_cfg(
        fixed_input_size=True,
        first_conv="model.revvit.embeddings.patches",
        paper_ids="arXiv:2302.04869",
        paper_name="Reversible Vision Transformers (Mangalam et al., CVPR 2022)",
        description=f"{name} reversible vision transformer (RevViT, Mangalam et al., CVPR 2022), no weights",
    )


# What timm's register_model reads from this module.
default_cfgs = generate_default_cfgs({name: _pretrained_cfg(name) for name in REVVIT_MODEL_NAMES})


def _image_size(img_size: int | tuple[int, int] | None, image_size: int | None) -> int | None:
    """The side of the square input images, from timm's `img_size` (int or (size, size)) and RevViT's `image_size`."""
    if isinstance(img_size, (tuple, list)):
        if len(img_size) != 2 or img_size[0] != img_size[1]:
            raise ValueError(f"RevViTs take square images: img_size must be an int or (size, size), got {img_size!r}")
        img_size = img_size[0]
    if img_size is not None and image_size is not None and img_size != image_size:
        raise ValueError(f"img_size={img_size} and image_size={image_size} disagree (they name the same size: "
                         "give one, or both equal)")
    return image_size if image_size is not None else img_size


class TimmRevViT(TimmWrapper):
    """A RevViT classifier with timm's interface; `self.model` is the transformers model it wraps."""

    family = "RevViT"
    stem = "embeddings"
    # Arguments of RevViTConfig that the timm arguments replace, and those taken.
    renamed = {"num_labels": "num_classes", "num_channels": "in_chans"}
    config_arguments = (frozenset(inspect.signature(RevViTConfig.__init__).parameters)
                        - {"self", "kwargs", "preset", *renamed})
    timm_arguments = (*TIMM_ARGUMENTS, "img_size")

    def __init__(
        self,
        preset: str = "revvit-small",
        num_classes: int = 1000,
        in_chans: int = 3,
        drop_rate: float = 0.0,
        global_pool: str = "avg",
        img_size: int | tuple[int, int] | None = None,
        **config_kwargs: Any,
    ):
        super().__init__()
        self._check_arguments(config_kwargs, num_classes, global_pool)
        size = _image_size(img_size, config_kwargs.pop("image_size", None))
        if size is not None:
            config_kwargs["image_size"] = size
        config = RevViTConfig.from_preset(preset, num_channels=in_chans, num_labels=max(num_classes, 1),
                                          **config_kwargs)
        model = RevViTForImageClassification(config)
        cfg = default_cfgs[config.preset.replace("-", "_")].default.to_dict()
        self._wrap(model, num_classes, in_chans, drop_rate, cfg)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Normalised tokens [batch, num_patches, num_features]: the two streams side by side after the last block
        and the final LayerNorm."""
        return self.model.revvit(x, return_dict=True).last_hidden_state

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self._classify(x.mean(dim=1), pre_logits)

    def no_weight_decay(self) -> set[str]:
        """Parameters timm's optimizer factory keeps out of weight decay (besides biases and norms): the learned
        position embeddings, as for timm's ViTs."""
        return {"model.revvit.embeddings.position_embeddings"}


def _to_timm_keys(state_dict: dict[str, torch.Tensor], model: nn.Module | None = None) -> dict[str, torch.Tensor]:
    """Accept the keys of a timm RevViT, a transformers RevViTForImageClassification or a bare RevViTModel."""
    return convert_keys(state_dict, "revvit")


def _create_revvit(variant: str, pretrained: bool = False, **kwargs: Any) -> TimmRevViT:
    size = _image_size(kwargs.pop("img_size", None), kwargs.get("image_size"))
    if size is not None:
        kwargs["image_size"] = size
    else:
        size = RevViTConfig.from_preset(variant).image_size
    # The input size this instance takes (timm passes it back to TimmRevViT as img_size: fixed_input_size).
    cfg_defaults = {"input_size": (kwargs.get("in_chans", 3), size, size)}
    return build(TimmRevViT, variant, pretrained, kwargs, architecture="image_size, patch_size, hidden_size, ...",
                 filter_fn=_to_timm_keys, cfg_defaults=cfg_defaults)


# --------------------------------------------------------------------------------------------------------------
# entry points


@register_model
def revvit_tiny(pretrained: bool = False, **kwargs: Any) -> TimmRevViT:
    """RevViT-Ti (hidden size 192 per stream, 12 blocks, 3 heads, patch 16)."""
    return _create_revvit("revvit_tiny", pretrained, **kwargs)


@register_model
def revvit_small(pretrained: bool = False, **kwargs: Any) -> TimmRevViT:
    """RevViT-S (hidden size 384 per stream, 12 blocks, 6 heads, patch 16)."""
    return _create_revvit("revvit_small", pretrained, **kwargs)


@register_model
def revvit_base(pretrained: bool = False, **kwargs: Any) -> TimmRevViT:
    """RevViT-B (hidden size 768 per stream, 12 blocks, 12 heads, patch 16)."""
    return _create_revvit("revvit_base", pretrained, **kwargs)
