"""RevMLP, a reversible multilayer perceptron, as a petra_hub model family defined outside petra_hub.

Importing this package registers the family: transformers' Auto classes load saved RevMLPs, `PetraTrainer.save_model`
writes their model card, and the recipe trains `--model revmlp-small` (see `examples/revmlp_recipe.py`)."""

from petra_hub import DataShape, ModelFamily, register_family

from .configuration_revmlp import RevMLPConfig
from .modeling_revmlp import RevMLPBlock, RevMLPForImageClassification, RevMLPModel

__all__ = ["REVMLP", "RevMLPBlock", "RevMLPConfig", "RevMLPForImageClassification", "RevMLPModel"]

PRESETS = {
    "revmlp-small": {"hidden_size": 64, "num_blocks": 4},
    "revmlp-deep": {"hidden_size": 64, "num_blocks": 12},
}


def shape_config(preset: str, flags: dict, data: DataShape) -> RevMLPConfig:
    """The recipe's RevMLP takes the data's image size and channels (no recipe flag shapes it further)."""
    return RevMLPConfig(**PRESETS[preset], image_size=data.image_size, num_channels=data.num_channels, preset=preset)


REVMLP = register_family(ModelFamily(
    title="RevMLP",
    config_class=RevMLPConfig,
    base_model_class=RevMLPModel,
    classifier_class=RevMLPForImageClassification,
    description=("a reversible multilayer perceptron (RevMLP): an embedding splits the flattened image into two "
                 "streams, and each block maps them to (x2 + MLP(x1), x1)"),
    presets=PRESETS,
    shape_config=shape_config,
    architecture=lambda config, preset: (
        "RevMLP", f"{config.num_blocks} reversible blocks of width {config.hidden_size} per stream"
        if config is not None else f"RevMLP ({preset})"),
    stored_stages=lambda config: "The embedding and the head",
    package="revmlp",
    card_tags=("revmlp",),
))
