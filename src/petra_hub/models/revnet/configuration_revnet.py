"""Configuration of the reversible ResNets (RevNets) used by PETRA."""

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

BLOCK_TYPES = ("basic", "bottleneck")
STEMS = ("cifar", "imagenet")
DOWNSAMPLINGS = ("buffered", "invertible")
# Caps checked before anything is built from a configuration (a config.json can claim any size): the classes (as
# petra_hub.data.sources.MAX_CLASSES; this file imports nothing of petra_hub), the layers and the blocks of all
# layers. The parameters the sizes make together are counted by the model (loading_checks.check_parameter_count).
MAX_LAYERS = 64
MAX_BLOCKS = 10_000

# The paper's models: ResNet depths, and per-stream widths equal to the ResNet widths.
PRESETS = {
    "revnet18": {"block_type": "basic", "depths": [2, 2, 2, 2], "hidden_sizes": [64, 128, 256, 512]},
    "revnet34": {"block_type": "basic", "depths": [3, 4, 6, 3], "hidden_sizes": [64, 128, 256, 512]},
    "revnet50": {"block_type": "bottleneck", "depths": [3, 4, 6, 3], "hidden_sizes": [256, 512, 1024, 2048]},
    "revnet101": {"block_type": "bottleneck", "depths": [3, 4, 23, 3], "hidden_sizes": [256, 512, 1024, 2048]},
}

NO_ATTENTION = "RevNets are convolutional: they have no attention"
NOT_A_BACKBONE = "RevNets are not transformers backbones: use output_hidden_states=True for the stages' outputs"
# Keys of transformers' ResNetConfig and ViTConfig that RevNets do not implement: the values a RevNet behaves as
# (accepted, so that a key that states what the model does is honoured) and why any other is refused.
FOREIGN_KEYS = {
    "hidden_act": (("relu",), "RevNet blocks always use ReLU"),
    "layer_type": ((), "use block_type ('basic' or 'bottleneck')"),
    "downsample_in_first_stage": ((), "use layer_strides (the stride of each layer's first block)"),
    "downsample_in_bottleneck": ((), "a bottleneck block strides in its 3x3 convolution"),
    "out_features": ((None,), NOT_A_BACKBONE),
    "out_indices": ((None,), NOT_A_BACKBONE),
    "hidden_size": ((), "use hidden_sizes (the width of each stream, per layer)"),
    "intermediate_size": ((), "use hidden_sizes (the width of each stream, per layer)"),
    "num_hidden_layers": ((), "use depths (the number of blocks of each layer)"),
    "num_attention_heads": ((), NO_ATTENTION),
    "attention_probs_dropout_prob": ((0.0,), NO_ATTENTION),
    "qkv_bias": ((), NO_ATTENTION),
    "hidden_dropout_prob": ((0.0,), "RevNets have no dropout"),
    "drop_path_rate": ((0.0,), "RevNets have no stochastic depth"),
    "layer_norm_eps": ((), "RevNets have no layer norm (batch_norm_eps sets the batch norms' epsilon)"),
    "image_size": ((), "RevNets take images of any size the stem and strides can reduce"),
    "patch_size": ((), "RevNets have no patch embedding (stem sets the first layers)"),
    "encoder_stride": ((), "RevNets have no masked-image-modeling decoder"),
    "pooler_output_size": ((None,), "a RevNet's pooler is a global average of the streams"),
    "pooler_act": ((), "a RevNet's pooler is a global average of the streams"),
}


def canonical_preset(name: str) -> str | None:
    """The `PRESETS` key that `name` spells ("RevNet-18", "revnet_18", "REVNET18" -> "revnet18"), else None."""
    key = name.lower().replace("-", "").replace("_", "")
    return key if key in PRESETS else None


def _counts(values) -> list[int] | None:
    if not isinstance(values, (list, tuple)) or len(values) > MAX_LAYERS:
        return None
    counts = [plain_count(value) for value in values]
    return None if None in counts else [max(count, 0) for count in counts]


def _as_list(values):
    """A list of per-layer values from a list or tuple; anything else is kept for validate_architecture to name."""
    return list(values) if isinstance(values, (list, tuple)) else values


def check_sizes(depths, hidden_sizes, layer_strides, kwargs: dict) -> None:
    """Refuse, before anything is allocated from them, sizes beyond the caps: num_labels (or id2label), the number
    of layers and of blocks."""
    check_label_count(kwargs, "RevNetConfig")
    for key, values in (("depths", depths), ("hidden_sizes", hidden_sizes), ("layer_strides", layer_strides)):
        if isinstance(values, (list, tuple)) and len(values) > MAX_LAYERS:
            raise ValueError(f"Invalid RevNetConfig: {key} has {len(values):,} entries (one per layer), more than the "
                             f"cap of {MAX_LAYERS} layers")
    depths = _counts([2, 2, 2, 2] if depths is None else depths)
    if depths is not None and sum(depths) > MAX_BLOCKS:
        raise ValueError(f"Invalid RevNetConfig: depths {depths} make {sum(depths):,} blocks, more than the cap of "
                         f"{MAX_BLOCKS:,}")


class RevNetConfig(CheckedNumLabelsMixin, PretrainedConfig):
    r"""Configuration of a two-stream reversible ResNet.

    Args:
        block_type: `"basic"` (two 3x3 convolutions) or `"bottleneck"` (1x1, 3x3, 1x1 with a 4x narrower middle).
        depths: number of blocks in each layer.
        hidden_sizes: width of *each of the two streams* in each layer (the ResNet width).
        embedding_size: width of each stream leaving the stem.
        stem: `"cifar"` (conv3x3 stride 1, no pooling) or `"imagenet"` (conv7x7 stride 2 and a 3x3 max-pool).
        num_channels: channels of the input images.
        downsampling: `"buffered"` (the paper: the first block of a layer that changes shape is not reversible and
            its stage keeps its input) or `"invertible"` (pixel-unshuffle then a reversible coupling, so every block
            is reversible; each stride-2 transition multiplies the stream width by 4, as in i-RevNet).
        layer_strides: stride of the first block of each layer; defaults to 1 for the first layer and 2 after.
        preset: the paper model this configuration started from (set by `from_preset`), for model cards.
    """

    model_type = "revnet"

    def __init__(
        self,
        block_type: str = "basic",
        depths: list[int] | None = None,
        hidden_sizes: list[int] | None = None,
        embedding_size: int = 64,
        stem: str = "cifar",
        num_channels: int = 3,
        downsampling: str = "buffered",
        layer_strides: list[int] | None = None,
        preset: str | None = None,
        batch_norm_eps: float = 1e-5,
        batch_norm_momentum: float = 0.1,
        initializer_range: float = 0.01,
        **kwargs,
    ):
        check_sizes(depths, hidden_sizes, layer_strides, kwargs)  # before PretrainedConfig builds id2label
        self.block_type = block_type
        self.depths = _as_list([2, 2, 2, 2] if depths is None else depths)
        self.hidden_sizes = _as_list([64, 128, 256, 512] if hidden_sizes is None else hidden_sizes)
        self.embedding_size = embedding_size
        self.stem = stem
        self.num_channels = num_channels
        self.downsampling = downsampling
        if layer_strides is None:
            layer_strides = [1] + [2] * (len(self.depths) - 1 if isinstance(self.depths, list) else 0)
        self.layer_strides = _as_list(layer_strides)
        self.preset = preset
        self.batch_norm_eps = batch_norm_eps
        self.batch_norm_momentum = batch_norm_momentum
        self.initializer_range = initializer_range
        super().__init__(**kwargs)
        self.validate_architecture()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "RevNetConfig":
        """Build the configuration of a named paper model, e.g.
        `from_preset("revnet18", stem="cifar", num_labels=10)`."""
        key = canonical_preset(name)
        if key is None:
            raise ValueError(f"Unknown RevNet preset {name!r}; expected one of {sorted(PRESETS)}.")
        arguments = {**PRESETS[key], "preset": key, **overrides}
        return cls(**arguments)

    def validate_architecture(self) -> None:
        """Raise a ValueError naming the first inconsistent field."""

        def check(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(f"Invalid RevNetConfig: {message}")

        check(self.block_type in BLOCK_TYPES, f"block_type must be one of {BLOCK_TYPES}, got {self.block_type!r}")
        check(self.stem in STEMS, f"stem must be one of {STEMS}, got {self.stem!r}")
        check(
            self.downsampling in DOWNSAMPLINGS,
            f"downsampling must be one of {DOWNSAMPLINGS}, got {self.downsampling!r}",
        )
        for key in ("depths", "hidden_sizes", "layer_strides"):
            values = getattr(self, key)
            check(isinstance(values, list) and 1 <= len(values) <= MAX_LAYERS,
                  f"{key} must be a list of 1 to {MAX_LAYERS} integers (one per layer), got {values!r}")
        check(
            len(self.hidden_sizes) == len(self.depths) == len(self.layer_strides),
            f"depths ({len(self.depths)}), hidden_sizes ({len(self.hidden_sizes)}) and layer_strides "
            f"({len(self.layer_strides)}) must have one entry per layer",
        )
        check(all(is_integer(d) and d >= 1 for d in self.depths),
              f"depths must be positive integers, got {self.depths}")
        check(sum(self.depths) <= MAX_BLOCKS,
              f"depths {self.depths} make {sum(self.depths):,} blocks, more than the cap of {MAX_BLOCKS:,}")
        check(
            all(is_integer(w) and w >= 1 for w in self.hidden_sizes),
            f"hidden_sizes must be positive integers, got {self.hidden_sizes}",
        )
        check(all(is_integer(s) and s in (1, 2) for s in self.layer_strides),
              f"layer_strides must be 1 or 2 (integers), got {self.layer_strides}")
        if self.block_type == "bottleneck":
            check(
                all(w % 4 == 0 for w in self.hidden_sizes),
                f"bottleneck blocks need hidden_sizes divisible by 4, got {self.hidden_sizes}",
            )
        check(is_integer(self.embedding_size) and self.embedding_size >= 1,
              f"embedding_size must be a positive integer, got {self.embedding_size!r}")
        check(is_integer(self.num_channels) and self.num_channels >= 1,
              f"num_channels must be a positive integer, got {self.num_channels!r}")
        check_num_labels(self.num_labels, "RevNetConfig")
        check(self.problem_type in PROBLEM_TYPES, f"problem_type must be one of {PROBLEM_TYPES}, got "
                                                  f"{self.problem_type!r}")
        check(is_real(self.batch_norm_eps) and self.batch_norm_eps > 0,
              f"batch_norm_eps must be a positive number, got {self.batch_norm_eps!r}")
        check(self.batch_norm_momentum is None or (is_real(self.batch_norm_momentum)
                                                   and 0 <= self.batch_norm_momentum <= 1),
              f"batch_norm_momentum must lie in [0, 1] (or be None: a cumulative average), got "
              f"{self.batch_norm_momentum!r}")
        check(is_real(self.initializer_range) and self.initializer_range >= 0,
              f"initializer_range must be a number >= 0 (a standard deviation), got {self.initializer_range!r}")
        for key, (accepted, why) in FOREIGN_KEYS.items():
            if key in vars(self):
                check(vars(self)[key] in accepted, f"{key}={vars(self)[key]!r} is not supported: {why}")

    def describe_sizes(self) -> str:
        """The sizes that set the number of parameters, for the model's size check."""
        return (f"depths {self.depths}, hidden_sizes {self.hidden_sizes}, embedding_size {self.embedding_size}, "
                f"num_channels {self.num_channels} ({self.downsampling} downsampling) and {self.num_labels:,} labels")

    def stream_widths(self) -> list[int]:
        """The width of each stream after each layer: hidden_sizes with buffered downsampling; with invertible
        downsampling each stride-2 layer multiplies the width by 4 (pixel-unshuffle) and hidden_sizes only set the
        blocks' inner widths."""
        if self.downsampling == "buffered":
            return list(self.hidden_sizes)
        widths, width = [], self.embedding_size
        for stride in self.layer_strides:
            width *= stride * stride
            widths.append(width)
        return widths

    @property
    def downsampling_factor(self) -> int:
        """How much the spatial size shrinks from the input to the last layer."""
        factor = 4 if self.stem == "imagenet" else 1
        for stride in self.layer_strides:
            factor *= stride
        return factor

    @downsampling_factor.setter
    def downsampling_factor(self, value) -> None:
        raise ValueError(f"Invalid RevNetConfig: downsampling_factor={value!r} cannot be set: it follows from stem "
                         "(4 for 'imagenet') and layer_strides")
