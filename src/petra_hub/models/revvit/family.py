"""The RevViT family's registration: presets, recipe shaping, model-card words and timm entry points."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...integrations.model_card_text import markdown_text
from ..families import DataShape, ModelFamily, register_family
from .configuration_revvit import PRESETS, RevViTConfig, canonical_preset
from .modeling_revvit import RevViTForImageClassification, RevViTModel

# The recipe's training arguments for a RevViT where the user gives none: ViTs train with AdamW (the recipe's own
# defaults, momentum SGD at lr 0.05, are the RevNet paper's; a RevViT diverges with them within an epoch), with
# LayerScale, which lifted RevViT-Ti on digits under backprop as well as under PETRA, and with the convolutional
# stem, which took PETRA at one stage per block to within a point of backprop, above the patchify stem on every seed
# measured, and left backprop level (docs/delay-remedies.md).
RECIPE_DEFAULTS = {"optim": "adamw_torch", "optim_args": None, "learning_rate": 5e-4, "weight_decay": 0.05,
                   "num_train_epochs": 30.0, "layer_scale_init_value": 1e-4, "conv_stem": True}
# With delayed gradients, each stage's rate divided by its delay for the whole run, from a base four times
# backprop's: the best of the settings screened at one stage per block (docs/delay-remedies.md). Plain PETRA there
# ends in a NaN or at chance. Weight prediction, the recipe's default for RevNets, is off: it did not help a RevViT.
DELAYED_RECIPE_DEFAULTS = {"learning_rate": 2e-3, "petra_delay_lr_warmup": float("inf"),
                           "petra_weight_prediction": 0.0}
SHORT_NAMES = {"revvit-tiny": "RevViT-Ti", "revvit-small": "RevViT-S", "revvit-base": "RevViT-B"}
SMALL_IMAGES = 128  # below this side the recipe's default patch is 4 pixels, else the preset's
SMALL_PATCH = 4

CITATION = "\n".join([
    "@inproceedings{mangalam2022reversible,",
    '  title     = "Reversible Vision Transformers",',
    '  author    = "Mangalam, Karttikeya and Fan, Haoqi and Li, Yanghao and Wu, Chao-Yuan and Xiong, Bo and '
    'Feichtenhofer, Christoph and Malik, Jitendra",',
    '  booktitle = "Conference on Computer Vision and Pattern Recognition (CVPR)",',
    '  year      = "2022"',
    "}",
])


def shape_config(preset: str, flags: Mapping[str, Any], data: DataShape) -> RevViTConfig:
    """The recipe's RevViT: image_size is the data's; --patch_size (default: 4 pixels for small images, else the
    preset's), --drop_path_rate, --layer_scale_init_value, --qk_norm and --conv_stem (default: the preset's) shape
    it."""
    patch = flags["patch_size"] or (SMALL_PATCH if data.image_size < SMALL_IMAGES else RevViTConfig().patch_size)
    overrides = {name: flags[name] for name in ("drop_path_rate", "layer_scale_init_value", "qk_norm", "conv_stem")
                 if flags[name] is not None}
    return RevViTConfig.from_preset(preset, image_size=data.image_size, patch_size=patch,
                                    num_channels=data.num_channels, **overrides)


def architecture(config: RevViTConfig | None, preset: str | None) -> tuple[str, str]:
    key = canonical_preset(preset) if preset else None
    paper = PRESETS[key] if key else None
    source = config if config is not None else (RevViTConfig.from_preset(key) if key else None)
    if source is None:
        name = markdown_text(preset) if preset else "a custom RevViT"
        return name, "custom RevViT configuration (see `config.json`)"
    if paper is not None and all(getattr(source, name) == value for name, value in paper.items()):
        name = SHORT_NAMES[key]
    else:
        name = f"a custom RevViT (derived from {markdown_text(preset)})" if preset else "a custom RevViT"
    description = (
        f"{source.num_hidden_layers} reversible transformer blocks, width {source.hidden_size} per stream, "
        f"{source.num_attention_heads} attention heads, MLP {source.mlp_ratio:g}x, {source.patch_size}x"
        f"{source.patch_size} patches of {source.image_size}x{source.image_size} images ({source.num_patches} tokens)"
    )
    if source.layer_scale_init_value:
        description += f", LayerScale from {source.layer_scale_init_value:g}"
    if source.qk_norm:
        description += ", queries and keys normalised per head"
    if source.conv_stem:
        description += ", a convolutional stem"
    return name, (f"{name} ({key}): {description}" if name in SHORT_NAMES.values() else description)


REVVIT = register_family(ModelFamily(
    title="RevViT",
    config_class=RevViTConfig,
    base_model_class=RevViTModel,
    classifier_class=RevViTForImageClassification,
    description="a reversible vision transformer (RevViT, Mangalam et al., CVPR 2022)",
    presets=PRESETS,
    canonical_preset=canonical_preset,
    shape_config=shape_config,
    recipe_flags=("patch_size", "drop_path_rate", "layer_scale_init_value", "qk_norm", "conv_stem"),
    recipe_defaults=RECIPE_DEFAULTS,
    delayed_recipe_defaults=DELAYED_RECIPE_DEFAULTS,
    architecture=architecture,
    stored_stages=lambda config: "The patch embedding and the head",
    package="petra_hub",
    card_tags=("revvit", "vision-transformer"),
    card_template="revvit.md",
    citation=CITATION,
    timm_module="petra_hub.integrations.timm",
    timm_models=("revvit_tiny", "revvit_small", "revvit_base"),
))
