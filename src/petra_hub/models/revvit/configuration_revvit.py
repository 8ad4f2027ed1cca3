"""Configuration of the reversible vision transformers (RevViT, Mangalam et al., CVPR 2022) trained with PETRA."""

from __future__ import annotations

from transformers import PretrainedConfig

from .loading_checks import (
    CheckedNumLabelsMixin,
    PROBLEM_TYPES,
    check_label_count,
    check_num_labels,
    is_integer,
    is_real,
    plain_count,
)

# Caps checked before anything is built from a configuration (a config.json can claim any size): the classes (as
# petra_hub.data.sources.MAX_CLASSES; this file imports nothing of petra_hub) and the blocks. The parameters the sizes
# make together are counted by the model (loading_checks.check_parameter_count).
MAX_BLOCKS = 10_000

# Widths and depths of the RevViT paper (ViT/DeiT sizes); patch 16 at 224x224.
PRESETS = {
    "revvit-tiny": {"hidden_size": 192, "num_hidden_layers": 12, "num_attention_heads": 3},
    "revvit-small": {"hidden_size": 384, "num_hidden_layers": 12, "num_attention_heads": 6},
    "revvit-base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12},
}

NOT_A_BACKBONE = "RevViTs are not transformers backbones: use output_hidden_states=True for the blocks' outputs"
NOT_A_RESNET = "a ResNet key: RevViTs are transformers (hidden_size, num_hidden_layers, patch_size set their shape)"
# Keys of transformers' ViTConfig and ResNetConfig that RevViTs do not implement: the values a RevViT behaves as
# (accepted, so that a key that states what the model does is honoured) and why any other is refused.
FOREIGN_KEYS = {
    "hidden_act": (("gelu",), "RevViT MLPs always use the exact GELU"),
    "attention_probs_dropout_prob": ((0.0,), "RevViT attention has no dropout (hidden_dropout_prob drops the "
                                             "outputs of attention and MLP)"),
    "qkv_bias": ((True,), "RevViT query, key and value projections always have a bias"),
    "encoder_stride": ((), "RevViTs have no masked-image-modeling decoder"),
    "pooler_output_size": ((None,), "a RevViT's pooler is a LayerNorm and the mean over tokens, with no dense layer"),
    "pooler_act": ((), "a RevViT's pooler is a LayerNorm and the mean over tokens, with no activation"),
    "embedding_size": ((), NOT_A_RESNET),
    "hidden_sizes": ((), NOT_A_RESNET),
    "depths": ((), NOT_A_RESNET),
    "layer_type": ((), NOT_A_RESNET),
    "downsample_in_first_stage": ((), NOT_A_RESNET),
    "downsample_in_bottleneck": ((), NOT_A_RESNET),
    "out_features": ((None,), NOT_A_BACKBONE),
    "out_indices": ((None,), NOT_A_BACKBONE),
}


def canonical_preset(name: str) -> str | None:
    """The `PRESETS` key `name` spells ("RevViT-S" is not guessed; "revvit_small", "REVVIT-SMALL" are)."""
    key = name.lower().replace("_", "-")
    return key if key in PRESETS else None


def check_sizes(num_hidden_layers, kwargs: dict) -> None:
    """Refuse, before anything is allocated from them, sizes beyond the caps: num_labels (or id2label) and the
    number of blocks."""
    check_label_count(kwargs, "RevViTConfig")
    layers = plain_count(num_hidden_layers)
    if layers is not None and layers > MAX_BLOCKS:
        raise ValueError(f"Invalid RevViTConfig: num_hidden_layers={layers:,} is more than the cap of {MAX_BLOCKS:,}")


class RevViTConfig(CheckedNumLabelsMixin, PretrainedConfig):
    r"""Configuration of a two-stream reversible vision transformer.

    Args:
        image_size: height and width of the input images.
        patch_size: side of the square patches (the patch embedding is a convolution with this kernel and stride).
        num_channels: channels of the input images.
        hidden_size: width of each of the two residual streams (the token width).
        num_hidden_layers: number of reversible blocks.
        num_attention_heads: heads of each block's self-attention (must divide `hidden_size`).
        mlp_ratio: width of each block's MLP, as a multiple of `hidden_size` (default 4). `intermediate_size`
            (ViTConfig's name for that width) may be given instead: it sets `mlp_ratio = intermediate_size /
            hidden_size`.
        hidden_dropout_prob: dropout on the outputs of attention and MLP.
        drop_path_rate: stochastic depth: the largest probability of dropping a block's sub-function per sample,
            rising linearly with depth from 0.
        layer_scale_init_value: LayerScale (Touvron et al., CaiT, 2021): each block's attention and MLP outputs are
            multiplied per channel by a learned gain starting at this value (small, e.g. 1e-4: each block starts near
            the identity, and an update moves the stages after it less, which is what makes a delayed gradient
            stale); None: no gain (the RevViT paper's blocks).
        qk_norm: a LayerNorm over each attention head's queries and keys before their dot products (Dehghani et
            al., ViT-22B, 2023; Wortsman et al., 2023): bounds the attention logits; False: none (the RevViT paper's
            blocks).
        conv_stem: a convolutional stem in place of the patchify convolution (Xiao et al., "Early convolutions help
            transformers see better", 2021): log2(patch_size) 3x3 convolutions of stride 2 with BatchNorm and ReLU,
            then a 1x1 convolution, giving the same tokens; needs a power-of-two patch_size and a hidden_size
            divisible by half of it. False: the patchify convolution (the RevViT paper's).
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
        mlp_ratio: float | None = None,
        hidden_dropout_prob: float = 0.0,
        drop_path_rate: float = 0.0,
        layer_scale_init_value: float | None = None,
        qk_norm: bool = False,
        conv_stem: bool = False,
        layer_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        preset: str | None = None,
        **kwargs,
    ):
        check_sizes(num_hidden_layers, kwargs)  # before PretrainedConfig builds id2label from num_labels
        self.image_size = image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.mlp_ratio = 4.0 if mlp_ratio is None else mlp_ratio
        self.hidden_dropout_prob = hidden_dropout_prob
        self.drop_path_rate = drop_path_rate
        self.layer_scale_init_value = layer_scale_init_value
        self.qk_norm = qk_norm
        self.conv_stem = conv_stem
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.preset = preset
        intermediate_size = kwargs.pop("intermediate_size", None)  # ViTConfig's name for the MLP width
        super().__init__(**kwargs)
        if intermediate_size is not None:
            if mlp_ratio is not None and intermediate_size != self.intermediate_size:
                raise ValueError(f"Invalid RevViTConfig: intermediate_size={intermediate_size} disagrees with "
                                 f"mlp_ratio={mlp_ratio} (an MLP width of {self.intermediate_size}): give one of them")
            self.intermediate_size = intermediate_size
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

    @num_patches.setter
    def num_patches(self, value) -> None:
        raise ValueError(f"Invalid RevViTConfig: num_patches={value!r} cannot be set: it is (image_size // "
                         "patch_size) ** 2")

    @property
    def intermediate_size(self) -> int:
        """The MLP width, hidden_size * mlp_ratio; setting it sets mlp_ratio (ViTConfig names the width so)."""
        return int(self.hidden_size * self.mlp_ratio)

    @intermediate_size.setter
    def intermediate_size(self, value) -> None:
        if not (is_integer(value) and value >= 1 and is_integer(self.hidden_size) and self.hidden_size >= 1):
            raise ValueError(f"Invalid RevViTConfig: intermediate_size must be a positive integer (with a positive "
                             f"integer hidden_size), got {value!r} (hidden_size {self.hidden_size!r})")
        ratio = value / self.hidden_size
        if int(self.hidden_size * ratio) != value:
            raise ValueError(f"Invalid RevViTConfig: intermediate_size={value} is not hidden_size * mlp_ratio for "
                             f"any float mlp_ratio (hidden_size {self.hidden_size}): set mlp_ratio")
        self.mlp_ratio = ratio

    def describe_sizes(self) -> str:
        """The sizes that set the number of parameters, for the model's size check."""
        return (f"image_size {self.image_size}, patch_size {self.patch_size}, num_channels {self.num_channels}, "
                f"hidden_size {self.hidden_size}, num_hidden_layers {self.num_hidden_layers}, an MLP width of "
                f"{self.intermediate_size} and {self.num_labels:,} labels")

    def validate_architecture(self) -> None:
        """Raise a ValueError naming the first inconsistent field."""

        def check(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(f"Invalid RevViTConfig: {message}")

        for name in ("image_size", "patch_size", "num_channels", "hidden_size", "num_hidden_layers",
                     "num_attention_heads"):
            value = getattr(self, name)
            check(is_integer(value) and value >= 1, f"{name} must be a positive integer, got {value!r}")
        check(self.num_hidden_layers <= MAX_BLOCKS,
              f"num_hidden_layers={self.num_hidden_layers:,} is more than the cap of {MAX_BLOCKS:,}")
        check(self.image_size % self.patch_size == 0,
              f"image_size {self.image_size} must be a multiple of patch_size {self.patch_size}")
        check(self.hidden_size % self.num_attention_heads == 0,
              f"hidden_size {self.hidden_size} must be divisible by num_attention_heads {self.num_attention_heads}")
        check(is_real(self.mlp_ratio) and self.mlp_ratio > 0,
              f"mlp_ratio must be a positive finite number, got {self.mlp_ratio!r}")
        check(self.intermediate_size >= 1,
              f"mlp_ratio * hidden_size (the MLP width) must be >= 1, got mlp_ratio {self.mlp_ratio} * hidden_size "
              f"{self.hidden_size} = {self.mlp_ratio * self.hidden_size:g}")
        check(self.layer_scale_init_value is None or (is_real(self.layer_scale_init_value)
                                                       and self.layer_scale_init_value > 0),
              f"layer_scale_init_value must be a positive number or None (no LayerScale), got "
              f"{self.layer_scale_init_value!r}")
        check(isinstance(self.qk_norm, bool), f"qk_norm must be True or False, got {self.qk_norm!r}")
        check(isinstance(self.conv_stem, bool), f"conv_stem must be True or False, got {self.conv_stem!r}")
        if self.conv_stem:
            halving = self.patch_size // 2
            check(self.patch_size >= 2 and self.patch_size & (self.patch_size - 1) == 0,
                  f"conv_stem=True needs a patch_size that is a power of two (each of its convolutions halves the "
                  f"image), got patch_size {self.patch_size}")
            check(self.hidden_size % halving == 0,
                  f"conv_stem=True needs hidden_size divisible by patch_size // 2 = {halving} (the stem's widths "
                  f"double up to hidden_size), got hidden_size {self.hidden_size}")
        for name in ("hidden_dropout_prob", "drop_path_rate"):
            value = getattr(self, name)
            check(is_real(value) and 0.0 <= value < 1.0, f"{name} must lie in [0, 1), got {value!r}")
        check(is_real(self.layer_norm_eps) and self.layer_norm_eps > 0,
              f"layer_norm_eps must be a positive number, got {self.layer_norm_eps!r}")
        check(is_real(self.initializer_range) and self.initializer_range >= 0,
              f"initializer_range must be a number >= 0 (a standard deviation), got {self.initializer_range!r}")
        check_num_labels(self.num_labels, "RevViTConfig")
        check(not self.output_attentions,
              f"output_attentions={self.output_attentions!r} is not supported: RevViT attention runs torch's "
              "scaled_dot_product_attention, which returns no attention weights (expected False)")
        check(self.problem_type in PROBLEM_TYPES,
              f"problem_type must be one of {PROBLEM_TYPES}, got {self.problem_type!r}")
        for key, (accepted, why) in FOREIGN_KEYS.items():
            if key in vars(self):
                check(vars(self)[key] in accepted, f"{key}={vars(self)[key]!r} is not supported: {why}")
