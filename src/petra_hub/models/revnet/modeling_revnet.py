"""Two-stream reversible ResNets (RevNets) as in PETRA (Rivaud et al., ICLR 2025).

The network is a list of *stages*: the stem, one stage per block, and the head. A reversible stage maps
(x1, x2) to (x2 + F(x1), x1) and can therefore rebuild its input from its output; a pipeline that trains it
needs no activation buffer. `RevNetForImageClassification.get_stages()` hands these stages to a training engine.

This file may import only torch, transformers, its configuration file and loading_checks.py (the loading checks
shared by the families): they are copied next to saved checkpoints so that `trust_remote_code=True` users can load
them without petra_hub.
"""

from __future__ import annotations

import torch
import torch.nn.functional as functional
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndNoAttention,
    ImageClassifierOutputWithNoAttention,
)

from .configuration_revnet import RevNetConfig
from .loading_checks import CheckedLoadingMixin, ImageClassifierMixin, check_parameter_count

Streams = tuple[torch.Tensor, torch.Tensor]


def conv_bn_relu(in_width: int, out_width: int, kernel: int, stride: int, config: RevNetConfig) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_width, out_width, kernel, stride=stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(out_width, eps=config.batch_norm_eps, momentum=config.batch_norm_momentum),
        nn.ReLU(),
    )


def projection(in_width: int, out_width: int, stride: int, config: RevNetConfig) -> nn.Sequential:
    """The 1x1 strided convolution + BN that changes the shape of a stream."""
    return nn.Sequential(
        nn.Conv2d(in_width, out_width, 1, stride=stride, bias=False),
        nn.BatchNorm2d(out_width, eps=config.batch_norm_eps, momentum=config.batch_norm_momentum),
    )


def residual_function(
    block_type: str, in_width: int, hidden: int, out_width: int, stride: int, config: RevNetConfig
) -> nn.Sequential:
    """F of a block: basic = 3x3-BN-ReLU-3x3-BN-ReLU; bottleneck = 1x1-BN-ReLU-3x3-BN-ReLU-1x1-BN-ReLU."""
    if block_type == "basic":
        return nn.Sequential(
            conv_bn_relu(in_width, hidden, 3, stride, config),
            conv_bn_relu(hidden, out_width, 3, 1, config),
        )
    if block_type == "bottleneck":
        return nn.Sequential(
            conv_bn_relu(in_width, hidden, 1, 1, config),
            conv_bn_relu(hidden, hidden, 3, stride, config),
            conv_bn_relu(hidden, out_width, 1, 1, config),
        )
    raise ValueError(f"Invalid RevNetConfig: block_type must be 'basic' or 'bottleneck', got {block_type!r}")


class RevNetStem(nn.Module):
    """Stage 0: images to two streams. Not reversible; the engine keeps (or re-reads) its input."""

    reversible = False

    def __init__(self, config: RevNetConfig):
        super().__init__()
        width = 2 * config.embedding_size
        if config.stem == "imagenet":
            self.layers = nn.Sequential(
                nn.Conv2d(config.num_channels, width, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(width, eps=config.batch_norm_eps, momentum=config.batch_norm_momentum),
                nn.ReLU(),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
        elif config.stem == "cifar":
            self.layers = conv_bn_relu(config.num_channels, width, 3, 1, config)
        else:
            raise ValueError(f"Invalid RevNetConfig: stem must be 'cifar' or 'imagenet', got {config.stem!r}")

    def forward(self, pixel_values: torch.Tensor) -> Streams:
        first, second = self.layers(pixel_values).chunk(2, dim=1)
        # Own storage per stream (at batch 1 the chunks are contiguous views of one buffer): a stage that keeps
        # one stream must not keep the other alive.
        return first.clone(memory_format=torch.contiguous_format), second.clone(memory_format=torch.contiguous_format)


class ReversibleBlock(nn.Module):
    """y1 = x2 + F(x1), y2 = x1; with `squeeze`, both streams are pixel-unshuffled (2x2 -> 4x channels) first.

    `width` is the stream width the coupling works at (after squeezing). Under autocast F runs in low precision
    and the coupling in the streams' own dtype, so the streams keep the dtype they arrive in.
    """

    reversible = True

    def __init__(self, config: RevNetConfig, width: int, hidden: int, squeeze: bool = False):
        super().__init__()
        self.squeeze = squeeze
        self.residual = residual_function(config.block_type, width, hidden, width, 1, config)

    def forward(self, streams: Streams) -> Streams:
        x1, x2 = streams
        if self.squeeze:
            x1, x2 = functional.pixel_unshuffle(x1, 2), functional.pixel_unshuffle(x2, 2)
        return x2 + self.residual(x1).to(x2.dtype), x1

    def inverse(self, streams: Streams) -> Streams:
        y1, y2 = streams
        x1, x2 = y2, y1 - self.residual(y2).to(y1.dtype)
        if self.squeeze:
            x1, x2 = functional.pixel_shuffle(x1, 2), functional.pixel_shuffle(x2, 2)
        return x1, x2

    def reconstruct_and_backward(self, outputs: Streams, output_grads: Streams) -> tuple[Streams, Streams]:
        """Rebuild the input from the output and backpropagate `output_grads` through the block.

        F is evaluated once, under autograd: its value gives the input (x2 = y1 - F(y2)) and its graph gives the
        gradients. Parameter gradients are accumulated into `.grad`; returns (inputs, input_grads), detached.
        """
        y1, y2 = outputs
        g1, g2 = output_grads
        x1 = y2.detach().requires_grad_(True)
        with torch.enable_grad():
            f = self.residual(x1).to(y1.dtype)
        f.backward(g1)
        x2 = y1.detach() - f.detach()
        grad_x1, grad_x2 = g2 + x1.grad, g1
        x1 = x1.detach()
        if self.squeeze:
            x1, x2 = functional.pixel_shuffle(x1, 2), functional.pixel_shuffle(x2, 2)
            # pixel_unshuffle is a permutation: its adjoint is its inverse.
            grad_x1, grad_x2 = functional.pixel_shuffle(grad_x1, 2), functional.pixel_shuffle(grad_x2, 2)
        return (x1, x2), (grad_x1, grad_x2)


class DownsampleBlock(nn.Module):
    """The paper's non-reversible block for the first block of a layer that changes the stream shape.

    bottleneck: y1 = F_s(x1) + P(x2), y2 = P'(x1) (P, P' strided 1x1 conv + BN), as in the paper's RevNet50.
    basic: y1 = G(h) + P(x2), y2 = h, where h = conv3x3_s-BN-ReLU(x1) and G the second half of F: the released
    RevNet18/34 emit F's hidden state as the second stream (by in-place aliasing); we do the same explicitly,
    which keeps the parameter counts the paper reports.
    """

    reversible = False

    def __init__(self, config: RevNetConfig, in_width: int, out_width: int, stride: int):
        super().__init__()
        self.block_type = config.block_type
        self.shortcut = projection(in_width, out_width, stride, config)
        if config.block_type == "basic":
            self.first = conv_bn_relu(in_width, out_width, 3, stride, config)
            self.second = conv_bn_relu(out_width, out_width, 3, 1, config)
        else:
            self.residual = residual_function("bottleneck", in_width, out_width // 4, out_width, stride, config)
            self.second_shortcut = projection(in_width, out_width, stride, config)

    def forward(self, streams: Streams) -> Streams:
        x1, x2 = streams
        if self.block_type == "basic":
            hidden = self.first(x1)
            return self.second(hidden) + self.shortcut(x2), hidden
        return self.residual(x1) + self.shortcut(x2), self.second_shortcut(x1)


class RevNetPooler(nn.Module):
    """Concatenate the streams and average over space."""

    def __init__(self):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, streams: Streams) -> tuple[torch.Tensor, torch.Tensor]:
        merged = torch.cat(streams, dim=1)
        return merged, self.pool(merged)


class RevNetHead(nn.Module):
    """Last stage: concat + global average pool + linear, sharing its modules with the model."""

    reversible = False

    def __init__(self, pooler: RevNetPooler, classifier: nn.Linear):
        super().__init__()
        self.pooler = pooler
        self.classifier = classifier

    def forward(self, streams: Streams) -> torch.Tensor:
        return self.classifier(self.pooler(streams)[1].flatten(1))


def build_blocks(config: RevNetConfig) -> tuple[list[nn.Module], int]:
    """The blocks between stem and head, and the width of each stream after the last one."""
    blocks: list[nn.Module] = []
    width = config.embedding_size
    for depth, layer_width, stride in zip(config.depths, config.hidden_sizes, config.layer_strides):
        hidden = layer_width if config.block_type == "basic" else layer_width // 4
        for index in range(depth):
            transition = index == 0 and (stride != 1 or width != layer_width)
            if not transition:
                blocks.append(ReversibleBlock(config, width, hidden))
            elif config.downsampling == "buffered":
                blocks.append(DownsampleBlock(config, width, layer_width, stride))
                width = layer_width
            elif config.downsampling != "invertible":
                raise ValueError(f"Invalid RevNetConfig: downsampling must be 'buffered' or 'invertible', "
                                 f"got {config.downsampling!r}")
            elif stride == 2:
                width *= 4
                blocks.append(ReversibleBlock(config, width, hidden, squeeze=True))
            else:  # a channel change without a stride has no invertible counterpart: keep the width
                blocks.append(ReversibleBlock(config, width, hidden))
    return blocks, width


class RevNetPreTrainedModel(CheckedLoadingMixin, PreTrainedModel):
    config_class = RevNetConfig
    config: RevNetConfig
    base_model_prefix = "revnet"
    main_input_name = "pixel_values"
    input_modalities = ("image",)

    def __init__(self, config: RevNetConfig, *inputs, **kwargs):
        # from_pretrained(..., stem=...) sets keyword overrides on the config after the config checked itself.
        config.validate_architecture()
        check_parameter_count(type(self), config)
        super().__init__(config, *inputs, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, nn.Conv2d):
            init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.BatchNorm2d):
            init.ones_(module.weight)
            init.zeros_(module.bias)
            init.zeros_(module.running_mean)
            init.ones_(module.running_var)
            init.zeros_(module.num_batches_tracked)


class RevNetModel(RevNetPreTrainedModel):
    """Stem and reversible blocks; returns the concatenated streams and their spatial average."""

    def __init__(self, config: RevNetConfig):
        super().__init__(config)
        self.embedder = RevNetStem(config)
        blocks, width = build_blocks(config)
        self.encoder = nn.ModuleList(blocks)
        self.pooler = RevNetPooler()
        self.num_features = 2 * width
        self.post_init()

    def get_stages(self) -> list[nn.Module]:
        """The stem and one stage per block (no head)."""
        return [self.embedder, *self.encoder]

    def check_pixel_values(self, pixel_values: torch.Tensor) -> None:
        """Raise a ValueError unless `pixel_values` is a float [batch, channels, height, width] the stem can take."""
        config = self.config
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 4:
            shape = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else type(pixel_values)
            raise ValueError(
                f"pixel_values must be a 4-D tensor [batch, {config.num_channels}, height, width], got {shape}"
            )
        if not pixel_values.is_floating_point():
            raise ValueError(f"pixel_values must be a floating-point tensor, got {pixel_values.dtype}")
        if pixel_values.shape[1] != config.num_channels:
            raise ValueError(
                f"pixel_values has {pixel_values.shape[1]} channels but the model expects "
                f"config.num_channels={config.num_channels} (shape [batch, channels, height, width])"
            )
        factor = config.downsampling_factor
        height, width = pixel_values.shape[2:]
        exact = config.downsampling == "invertible"
        if min(height, width) < factor or (exact and (height % factor or width % factor)):
            need = "multiples of" if exact else "at least"
            raise ValueError(
                f"pixel_values of spatial size {height}x{width} cannot pass the {config.stem!r} stem and "
                f"{config.downsampling!r} downsampling: height and width must be {need} {factor}"
            )

    def forward(
        self,
        pixel_values: torch.Tensor,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPoolingAndNoAttention | tuple:
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        self.check_pixel_values(pixel_values)
        # Images in the weights' dtype (as ViTModel does): float32 pixels into a bfloat16 or float64 model.
        pixel_values = pixel_values.to(self.embedder.layers[0].weight.dtype)
        streams = self.embedder(pixel_values)
        hidden_states = [torch.cat(streams, dim=1)] if output_hidden_states else None
        for block in self.encoder:
            streams = block(streams)
            if output_hidden_states:
                hidden_states.append(torch.cat(streams, dim=1))
        last_hidden_state, pooled = self.pooler(streams)
        hidden_states = tuple(hidden_states) if output_hidden_states else None
        if not return_dict:
            return (last_hidden_state, pooled) + ((hidden_states,) if output_hidden_states else ())
        return BaseModelOutputWithPoolingAndNoAttention(
            last_hidden_state=last_hidden_state, pooler_output=pooled, hidden_states=hidden_states
        )


class RevNetForImageClassification(ImageClassifierMixin, RevNetPreTrainedModel):
    base_model_class = RevNetModel

    def get_stages(self) -> list[nn.Module]:
        """The paper's partition: stem, one stage per block, head. Running them in order equals `forward`."""
        return [*self.revnet.get_stages(), RevNetHead(self.revnet.pooler, self.classifier)]

    def forward(
        self,
        pixel_values: torch.Tensor,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> ImageClassifierOutputWithNoAttention | tuple:
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.revnet(pixel_values, output_hidden_states=output_hidden_states, return_dict=True)
        logits = self.classifier(outputs.pooler_output.flatten(1))
        loss = self.compute_loss(logits, labels) if labels is not None else None
        if not return_dict:
            output = (logits,) + ((outputs.hidden_states,) if outputs.hidden_states is not None else ())
            return ((loss,) + output) if loss is not None else output
        return ImageClassifierOutputWithNoAttention(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
