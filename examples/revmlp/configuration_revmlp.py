"""Configuration of RevMLP, a reversible multilayer perceptron: the example of a model family defined outside
petra_hub. This file imports only transformers, so that a saved folder loads with `trust_remote_code=True` alone."""

from transformers import PretrainedConfig


class RevMLPConfig(PretrainedConfig):
    """image_size x image_size images of num_channels channels are flattened and embedded into two streams of
    hidden_size features; num_blocks reversible blocks follow, then a linear classifier on the streams' sum."""

    model_type = "revmlp"

    def __init__(self, image_size: int = 8, num_channels: int = 3, hidden_size: int = 64, num_blocks: int = 4,
                 expansion: int = 2, **kwargs):
        for name, value in (("image_size", image_size), ("num_channels", num_channels),
                            ("hidden_size", hidden_size), ("num_blocks", num_blocks), ("expansion", expansion)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 1 << 16:
                raise ValueError(f"RevMLPConfig.{name} must be an integer in [1, 65536], got {value!r}")
        self.image_size = image_size
        self.num_channels = num_channels
        self.hidden_size = hidden_size
        self.num_blocks = num_blocks
        self.expansion = expansion
        super().__init__(**kwargs)
