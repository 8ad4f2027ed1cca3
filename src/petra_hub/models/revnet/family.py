"""The RevNet family's registration: presets, recipe shaping, model-card words and timm entry points."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...integrations.model_card_text import markdown_text
from ..families import DataShape, ModelFamily, register_family
from .configuration_revnet import PRESETS, RevNetConfig, canonical_preset
from .modeling_revnet import RevNetForImageClassification, RevNetModel

SMALL_IMAGES = 128  # below this side the recipe uses the cifar stem (no stride, no pooling)


def shape_config(preset: str, flags: Mapping[str, Any], data: DataShape) -> RevNetConfig:
    """The recipe's RevNet: the stem suits the image size unless --stem says otherwise; --hidden_sizes ('paper' or
    None: the preset's) and --embedding_size (0 or None: the preset's) set the widths."""
    overrides = {"downsampling": flags["downsampling"], "num_channels": data.num_channels,
                 "stem": flags["stem"] or ("cifar" if data.image_size < SMALL_IMAGES else "imagenet")}
    if flags["hidden_sizes"] and flags["hidden_sizes"] != "paper":
        overrides["hidden_sizes"] = [int(width) for width in str(flags["hidden_sizes"]).split(",")]
    if flags["embedding_size"]:
        overrides["embedding_size"] = flags["embedding_size"]
    return RevNetConfig.from_preset(preset, **overrides)


def architecture(config: RevNetConfig | None, preset: str | None) -> tuple[str, str]:
    key = canonical_preset(preset) if preset else None
    paper = PRESETS[key] if key else None
    if config is not None:
        layout = {"block_type": config.block_type, "depths": list(config.depths),
                  "hidden_sizes": list(config.hidden_sizes)}
    elif paper is not None:
        layout = paper
    else:
        name = markdown_text(preset) if preset else "a custom RevNet"
        return name, "custom RevNet configuration (see `config.json`)"
    # The paper's RevNets downsample with buffered (non-reversible) blocks; invertible ones are other networks.
    buffered = config is None or config.downsampling == "buffered"
    if paper is not None and buffered and all(layout[name] == paper[name] for name in paper):
        name = f"RevNet-{key.removeprefix('revnet')}"
    else:
        name = f"a custom RevNet (derived from {markdown_text(preset)})" if preset else "a custom RevNet"
    widths = layout["hidden_sizes"] if buffered else config.stream_widths()
    description = (
        f"{layout['block_type']} blocks in layers of {'/'.join(str(d) for d in layout['depths'])} "
        f"({sum(layout['depths'])} blocks), widths {'/'.join(str(w) for w in widths)} per stream"
    )
    if not buffered:
        inner = [w if layout["block_type"] == "basic" else w // 4 for w in layout["hidden_sizes"]]
        description += f" (residual functions {'/'.join(str(w) for w in inner)} wide)"
    if config is not None:
        description += f", {config.stem} stem, {config.downsampling} downsampling"
    return name, (f"{name} ({key}): {description}" if name.startswith("RevNet-") else description)


def stored_stages(config: RevNetConfig | None) -> str:
    if config is not None and config.downsampling == "invertible":
        return "The stem and the head (the invertible downsampling blocks are reversible)"
    return "The stem, the downsampling blocks and the head"


REVNET = register_family(ModelFamily(
    title="RevNet",
    config_class=RevNetConfig,
    base_model_class=RevNetModel,
    classifier_class=RevNetForImageClassification,
    description="a two-stream reversible ResNet (RevNet)",
    presets=PRESETS,
    canonical_preset=canonical_preset,
    shape_config=shape_config,
    recipe_flags=("stem", "downsampling", "hidden_sizes", "embedding_size"),
    architecture=architecture,
    stored_stages=stored_stages,
    package="petra_hub",
    card_tags=("revnet",),
    card_template="revnet.md",
    timm_module="petra_hub.integrations.timm",
    timm_models=("revnet18", "revnet34", "revnet50", "revnet101"),
))
