"""Configuration of the reversible vision transformers (RevViT, Mangalam et al., CVPR 2022) trained with PETRA."""

from __future__ import annotations

from transformers import PretrainedConfig

# Widths and depths of the RevViT paper (ViT/DeiT sizes); patch 16 at 224x224.
PRESETS = {
    "revvit-tiny": {"hidden_size": 192, "num_hidden_layers": 12, "num_attention_heads": 3},
    "revvit-small": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6},
    "revvit-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12},
}


def canonical_preset(name: str) -> str | None:
    """The `PRESETS` key `name` spells ("RevViT-S" is not guessed; "revvit_small", "REVVIT-SMALL" are)."""
    key = name.lower().replace("_", "-")
    return key if key in PRESETS else None


class RevViTConfig(PretrainedConfig):
    r"""Configuration of a two-stream reversible vision transformer.

    Args:
        image_size: height and width of the input images.
        patch_size: side of the square patches (the patch embedding is a convolution with this kernel and stride).
        num_channels: channels of the input images.
        hidden_size: width of each of the two residual streams (the token width).
        num_hidden_layers: number of reversible blocks.
        num_attention_heads: heads of each block's self-attention (must divide `hidden_size`).
        mlp_ratio: width of each block's MLP, as a multiple of `hidden_size`.
        hidden_dropout_prob: dropout on the outputs of attention and MLP.
        drop_path_rate: stochastic depth: the largest probability of dropping a block's sub-function per sample,
            rising linearly with depth from 0.
        layer_norm_eps: epsilon of the layer norms.
        preset: the paper model this configuration started from (set by `from_preset`).
    """

    model_type = "revvit"

    def __init__(
        self,
        image_size: int = 224,
        patch_size: int = 16,
        num_channels: int = 3,
        hidden_size: int = 384,
        num_hidden_layers: int = 12,
        num_attention_heads: int = 6,
        mlp_ratio: float = 4.0,
        hidden_dropout_prob: float = 0.0,
        drop_path_rate: float = 0.0,
        layer_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        preset: str | None = None,
        **kwargs,
    ):
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.mlp_ratio = mlp_ratio
        self.hidden_dropout_prob = hidden_dropout_prob
        self.drop_path_rate = drop_path_rate
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.preset = preset
        super().__init__(**kwargs)
        self.validate_architecture()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "RevViTConfig":
        key = canonical_preset(name)
        if key is None:
            raise ValueError(f"Unknown RevViT preset {name!r}; expected one of {sorted(PRESETS)}.")
        return cls(**{**PRESETS[key], "preset": key, **overrides})

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def intermediate_size(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    def validate_architecture(self) -> None:
        """Raise a ValueError naming the first inconsistent field."""

        def check(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(f"Invalid RevViTConfig: {message}")

        for name in ("image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers",
                     "num_attention_heads"):
            value = getattr(self, name)
            check(isinstance(value, int) and value >= 1, f"{name} must be a positive integer, got {value!r}")
        check(self.image_size % self.patch_size == 0,
              f"image_size {self.image_size} must be a multiple of patch_size {self.patch_size}")
        check(self.hidden_size % self.num_attention_heads == 0,
              f"hidden_size {self.hidden_size} must be divisible by num_attention_heads {self.num_attention_heads}")
        check(self.mlp_ratio > 0 and self.intermediate_size >= 1, f"mlp_ratio must be positive, got {self.mlp_ratio}")
        for name in ("hidden_dropout_prob", "drop_path_rate"):
            value = getattr(self, name)
            check(0.0 <= value < 1.0, f"{name} must lie in [0, 1), got {value}")
        check(self.num_labels >= 1, f"num_labels must be positive, got {self.num_labels}")
