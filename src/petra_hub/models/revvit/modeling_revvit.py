"""Two-stream reversible vision transformers (RevViT, Mangalam et al., CVPR 2022), as PETRA stages.

Stages: the patch embedding (stem, not reversible), one stage per block, and the head. A block maps (x1, x2) to

    y1 = x1 + F(x2),  F = attention(LayerNorm(.)),     y2 = x2 + G(y1),  G = MLP(LayerNorm(.)),

and is inverted as x2 = y2 - G(y1), x1 = y1 - F(x2). Its fused backward evaluates G and F once each under
autograd, in that order (the inverse's), so random sub-functions cannot rely on replaying the generator's stream in
the forward's order: a block that draws (dropout, stochastic depth in training) takes one seed from the global
generator, and F and G draw from private generators seeded from it. The engine replays the global generator for a
reconstruction, so the block draws the same seed and F and G the same masks, in any order.

This file may import only torch, transformers, its configuration file and loading_checks.py (the loading checks
shared by the families): they are copied next to checkpoints.
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

from .configuration_revvit import RevViTConfig
from .loading_checks import CheckedLoadingMixin, ImageClassifierMixin, check_parameter_count

Streams = tuple[torch.Tensor, torch.Tensor]


def seeded_dropout(x: torch.Tensor, p: float, generator: torch.Generator | None, per_sample: bool = False):
    """Dropout (or, `per_sample`, stochastic depth: a whole sample's value) with masks from `generator`."""
    if generator is None or p == 0.0:
        return x
    shape = (x.shape[0],) + (1,) * (x.dim() - 1) if per_sample else x.shape
    keep = torch.rand(shape, generator=generator, device=x.device, dtype=torch.float32) >= p
    return x * keep.to(x.dtype) / (1.0 - p)


class StemConvolution(nn.Conv2d):
    """A convolution of the convolutional stem (initialised as a ResNet's: `_init_weights`)."""


class ConvolutionalStem(nn.Sequential):
    """Xiao et al. (2021)'s stem: log2(patch_size) 3x3 convolutions of stride 2, each followed by BatchNorm and
    ReLU, their widths doubling up to hidden_size, then a 1x1 convolution to hidden_size. It turns an image into the
    same grid of tokens as the patchify convolution. Its convolutions start as a ResNet's do (He initialisation,
    fan-out, for ReLU), not at the transformer's small scale: under Adam a step moves every weight by about the same
    amount, so smaller weights change more, relative to their size, per step, and a delayed gradient is staler."""

    def __init__(self, config: RevViTConfig):
        steps = config.patch_size.bit_length() - 1
        widths = [config.num_channels] + [config.hidden_size >> (steps - 1 - i) for i in range(steps)]
        layers = []
        for width_in, width_out in zip(widths, widths[1:]):
            layers += [StemConvolution(width_in, width_out, 3, stride=2, padding=1, bias=False),
                       nn.BatchNorm2d(width_out), nn.ReLU()]
        super().__init__(*layers, StemConvolution(config.hidden_size, config.hidden_size, 1))


class RevViTEmbeddings(nn.Module):
    """Patches (a convolution with kernel = stride = patch size, or the convolutional stem) plus learned positions,
    as two equal streams."""

    reversible = False

    def __init__(self, config: RevViTConfig):
        super().__init__()
        if config.conv_stem:
            self.patches = ConvolutionalStem(config)
        else:
            self.patches = nn.Conv2d(config.num_channels, config.hidden_size, config.patch_size,
                                     stride=config.patch_size)
        self.position_embeddings = nn.Parameter(torch.zeros(1, config.num_patches, config.hidden_size))

    def forward(self, pixel_values: torch.Tensor) -> Streams:
        tokens = self.patches(pixel_values).flatten(2).transpose(1, 2) + self.position_embeddings
        return tokens, tokens.clone()  # two storages, as on a device that received them


class Attention(nn.Module):
    def __init__(self, config: RevViTConfig):
        super().__init__()
        self.heads = config.num_attention_heads
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.projection = nn.Linear(config.hidden_size, config.hidden_size)
        head_size = config.hidden_size // config.num_attention_heads
        if config.qk_norm:  # a LayerNorm per head on queries and keys bounds the attention logits
            self.query_norm = nn.LayerNorm(head_size, eps=config.layer_norm_eps)
            # no bias: a shift shared by every key moves all of a query's logits alike, which the softmax ignores
            self.key_norm = nn.LayerNorm(head_size, eps=config.layer_norm_eps, bias=False)
        else:
            self.query_norm = self.key_norm = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, width = x.shape
        qkv = self.qkv(self.norm(x)).view(batch, tokens, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        query, key, value = qkv.unbind(0)
        if self.query_norm is not None:
            query, key = self.query_norm(query), self.key_norm(key)
        attended = functional.scaled_dot_product_attention(query, key, value)
        return self.projection(attended.transpose(1, 2).reshape(batch, tokens, width))


class MLP(nn.Module):
    def __init__(self, config: RevViTConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(functional.gelu(self.fc1(self.norm(x))))


class ReversibleViTBlock(nn.Module):
    """y1 = x1 + F(x2), y2 = x2 + G(y1) with F = attention, G = MLP (see the module docstring for randomness).
    Under autocast F and G run in low precision and the couplings in the streams' own dtype."""

    reversible = True

    def __init__(self, config: RevViTConfig, drop_path: float):
        super().__init__()
        self.attention, self.mlp = Attention(config), MLP(config)
        self.dropout, self.drop_path = config.hidden_dropout_prob, drop_path
        if config.layer_scale_init_value is not None:  # LayerScale: per-channel gains of F and G
            self.attention_scale = nn.Parameter(torch.full((config.hidden_size,), config.layer_scale_init_value))
            self.mlp_scale = nn.Parameter(torch.full((config.hidden_size,), config.layer_scale_init_value))
        else:
            self.attention_scale = self.mlp_scale = None

    def _generators(self, device: torch.device) -> tuple[torch.Generator | None, torch.Generator | None]:
        if not self.training or (self.dropout == 0.0 and self.drop_path == 0.0):
            return None, None
        seed = int(torch.randint(0, 2**62, (1,)))  # one draw from the global generator, replayed by the engine
        return tuple(torch.Generator(device=device).manual_seed(seed + offset) for offset in (0, 1))

    def _branch(self, function: nn.Module, x: torch.Tensor, generator) -> torch.Tensor:
        value = function(x)
        scale = self.attention_scale if function is self.attention else self.mlp_scale
        if scale is not None:
            value = value * scale.to(value.dtype)
        value = seeded_dropout(value, self.dropout, generator)
        return seeded_dropout(value, self.drop_path, generator, per_sample=True).to(x.dtype)

    def forward(self, streams: Streams) -> Streams:
        x1, x2 = streams
        for_f, for_g = self._generators(x1.device)
        y1 = x1 + self._branch(self.attention, x2, for_f)
        return y1, x2 + self._branch(self.mlp, y1, for_g)

    def inverse(self, streams: Streams) -> Streams:
        y1, y2 = streams
        for_f, for_g = self._generators(y1.device)
        x2 = y2 - self._branch(self.mlp, y1, for_g)
        return y1 - self._branch(self.attention, x2, for_f), x2

    def reconstruct_and_backward(self, outputs: Streams, output_grads: Streams) -> tuple[Streams, Streams]:
        """Rebuild (x1, x2) and backpropagate (g1, g2), evaluating G then F once each under autograd; parameter
        gradients accumulate into `.grad`. Returns (inputs, input gradients), detached."""
        y1, y2 = outputs
        g1, g2 = output_grads
        for_f, for_g = self._generators(y1.device)
        y1 = y1.detach().requires_grad_(True)
        with torch.enable_grad():
            g_value = self._branch(self.mlp, y1, for_g)
        g_value.backward(g2)
        grad_y1 = g1 + y1.grad
        x2 = (y2 - g_value.detach()).requires_grad_(True)
        with torch.enable_grad():
            f_value = self._branch(self.attention, x2, for_f)
        f_value.backward(grad_y1)
        x1 = y1.detach() - f_value.detach()
        return (x1, x2.detach()), (grad_y1, g2 + x2.grad)


class RevViTPooler(nn.Module):
    """LayerNorm over the two streams side by side, then the mean over tokens."""

    def __init__(self, config: RevViTConfig):
        super().__init__()
        self.norm = nn.LayerNorm(2 * config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, streams: Streams) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self.norm(torch.cat(streams, dim=-1))
        return tokens, tokens.mean(dim=1)


class RevViTHead(nn.Module):
    """The last stage: pooler and classifier (not reversible)."""

    reversible = False

    def __init__(self, pooler: RevViTPooler, classifier: nn.Linear):
        super().__init__()
        self.pooler, self.classifier = pooler, classifier

    def forward(self, streams: Streams) -> torch.Tensor:
        return self.classifier(self.pooler(streams)[1])


def check_no_attentions(output_attentions) -> None:
    if output_attentions:
        raise ValueError(f"output_attentions={output_attentions!r} is not supported: RevViT attention runs torch's "
                         "scaled_dot_product_attention, which returns no attention weights; expected "
                         "output_attentions=False or None")


class RevViTPreTrainedModel(CheckedLoadingMixin, PreTrainedModel):
    """Attention always runs `torch.nn.functional.scaled_dot_product_attention`: `attn_implementation="sdpa"` (the
    default) is what the model does, and other implementations ("eager", flash, flex) are refused rather than
    ignored. SDPA returns no attention weights, so `output_attentions=True` (in the config or as an argument of
    `forward`) is refused too."""

    config_class = RevViTConfig
    config: RevViTConfig
    base_model_prefix = "revvit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    _supports_sdpa = True

    def get_correct_attn_implementation(self, requested_attention: str | None, is_init_check: bool = False) -> str:
        if requested_attention not in (None, "sdpa"):
            raise ValueError(f"attn_implementation={requested_attention!r} is not supported: RevViT attention always "
                             "runs torch's scaled_dot_product_attention; expected attn_implementation='sdpa' (the "
                             "default) or None")
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    def __init__(self, config: RevViTConfig, *inputs, **kwargs):
        # from_pretrained(..., drop_path_rate=...) sets keyword overrides on the config after it checked itself.
        config.validate_architecture()
        check_parameter_count(type(self), config)
        super().__init__(config, *inputs, **kwargs)

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, StemConvolution):
            init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, nn.BatchNorm2d)):
            init.ones_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, RevViTEmbeddings):
            init.trunc_normal_(module.position_embeddings, std=self.config.initializer_range)
        elif isinstance(module, ReversibleViTBlock) and module.attention_scale is not None:
            init.constant_(module.attention_scale, self.config.layer_scale_init_value)
            init.constant_(module.mlp_scale, self.config.layer_scale_init_value)


class RevViTModel(RevViTPreTrainedModel):
    """Patch embedding and reversible blocks; returns the normalised tokens (streams side by side) and their mean."""

    def __init__(self, config: RevViTConfig):
        super().__init__(config)
        self.embeddings = RevViTEmbeddings(config)
        depth = config.num_hidden_layers
        rates = [config.drop_path_rate * i / max(1, depth - 1) for i in range(depth)]
        self.encoder = nn.ModuleList(ReversibleViTBlock(config, rate) for rate in rates)
        self.pooler = RevViTPooler(config)
        self.num_features = 2 * config.hidden_size
        self.post_init()

    def get_stages(self) -> list[nn.Module]:
        """The patch embedding and one stage per block (no head)."""
        return [self.embeddings, *self.encoder]

    def check_pixel_values(self, pixel_values: torch.Tensor) -> None:
        """Raise a ValueError unless `pixel_values` is a float [batch, channels, image_size, image_size]."""
        config = self.config
        expected = f"[batch, {config.num_channels}, {config.image_size}, {config.image_size}]"
        if not isinstance(pixel_values, torch.Tensor) or pixel_values.dim() != 4:
            shape = tuple(pixel_values.shape) if isinstance(pixel_values, torch.Tensor) else type(pixel_values)
            raise ValueError(f"pixel_values must be a 4-D tensor {expected}, got {shape}")
        if not pixel_values.is_floating_point():
            raise ValueError(f"pixel_values must be a floating-point tensor, got {pixel_values.dtype}")
        if pixel_values.shape[1] != config.num_channels:
            raise ValueError(f"pixel_values has {pixel_values.shape[1]} channels but the model expects "
                             f"config.num_channels={config.num_channels} ({expected})")
        if tuple(pixel_values.shape[2:]) != (config.image_size, config.image_size):
            raise ValueError(f"pixel_values of spatial size {tuple(pixel_values.shape[2:])}: this RevViT was built "
                             f"for {config.image_size}x{config.image_size} images in patches of {config.patch_size} "
                             f"(its position embeddings are learned per patch) {expected}")

    def forward(self, pixel_values: torch.Tensor, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs) -> BaseModelOutputWithPoolingAndNoAttention | tuple:
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        check_no_attentions(kwargs.get("output_attentions"))
        self.check_pixel_values(pixel_values)
        # Images in the weights' dtype (as ViTModel does): float32 pixels into a bfloat16 or float64 model.
        pixel_values = pixel_values.to(self.embeddings.position_embeddings.dtype)
        streams = self.embeddings(pixel_values)
        hidden_states = [torch.cat(streams, dim=-1)] if output_hidden_states else None
        for block in self.encoder:
            streams = block(streams)
            if output_hidden_states:
                hidden_states.append(torch.cat(streams, dim=-1))
        last_hidden_state, pooled = self.pooler(streams)
        hidden_states = tuple(hidden_states) if output_hidden_states else None
        if not return_dict:
            return (last_hidden_state, pooled) + ((hidden_states,) if output_hidden_states else ())
        return BaseModelOutputWithPoolingAndNoAttention(
            last_hidden_state=last_hidden_state, pooler_output=pooled, hidden_states=hidden_states)


class RevViTForImageClassification(ImageClassifierMixin, RevViTPreTrainedModel):
    base_model_class = RevViTModel

    def get_stages(self) -> list[nn.Module]:
        """Patch embedding, one stage per block, head. Running them in order equals `forward`."""
        return [*self.revvit.get_stages(), RevViTHead(self.revvit.pooler, self.classifier)]

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                **kwargs) -> ImageClassifierOutputWithNoAttention | tuple:
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        check_no_attentions(kwargs.get("output_attentions"))
        outputs = self.revvit(pixel_values, output_hidden_states=output_hidden_states, return_dict=True)
        logits = self.classifier(outputs.pooler_output)
        loss = self.compute_loss(logits, labels) if labels is not None else None
        if not return_dict:
            output = (logits,) + ((outputs.hidden_states,) if outputs.hidden_states is not None else ())
            return ((loss,) + output) if loss is not None else output
        return ImageClassifierOutputWithNoAttention(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
