"""RevMLP: an embedding, `num_blocks` reversible coupling blocks and a classifier, each one PETRA pipeline stage.

A block maps its streams (x1, x2) to (x2 + F(x1), x1) with F a two-layer MLP, so `inverse` rebuilds its input from its
output, and `reconstruct_and_backward` does so while backpropagating, evaluating F once: the three methods PETRA asks
of a reversible stage (`reversible = True`). The embedding and the head are ordinary stages (PETRA keeps their
inputs). This file imports only torch, transformers and its configuration."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput

from .configuration_revmlp import RevMLPConfig

Streams = tuple[torch.Tensor, torch.Tensor]


class RevMLPEmbedding(nn.Module):
    """Flattened pixels -> two streams of hidden_size features."""

    def __init__(self, config: RevMLPConfig):
        super().__init__()
        inputs = config.num_channels * config.image_size * config.image_size
        self.project = nn.Linear(inputs, 2 * config.hidden_size)

    def forward(self, pixel_values: torch.Tensor) -> Streams:
        x1, x2 = self.project(pixel_values.flatten(1)).chunk(2, dim=-1)
        return x1.contiguous(), x2.contiguous()


class RevMLPBlock(nn.Module):
    """(x1, x2) -> (x2 + F(x1), x1), F = Linear, GELU, Linear."""

    reversible = True

    def __init__(self, config: RevMLPConfig):
        super().__init__()
        width = config.hidden_size
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, config.expansion * width), nn.GELU(),
                                 nn.Linear(config.expansion * width, width))

    def forward(self, streams: Streams) -> Streams:
        x1, x2 = streams
        return x2 + self.mlp(x1).to(x2.dtype), x1

    def inverse(self, streams: Streams) -> Streams:
        y1, y2 = streams
        return y2, y1 - self.mlp(y2).to(y1.dtype)

    def reconstruct_and_backward(self, outputs: Streams, output_grads: Streams) -> tuple[Streams, Streams]:
        """The input rebuilt from `outputs`, and the input's gradients; F's parameter gradients accumulate."""
        (y1, y2), (g1, g2) = outputs, output_grads
        x1 = y2.detach().requires_grad_(True)
        with torch.enable_grad():
            f = self.mlp(x1).to(y1.dtype)
        f.backward(g1)
        return (x1.detach(), y1.detach() - f.detach()), (g2 + x1.grad, g1)


class RevMLPHead(nn.Module):
    """The streams' sum -> logits."""

    def __init__(self, config: RevMLPConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, streams: Streams) -> torch.Tensor:
        return self.classifier(self.norm(streams[0] + streams[1]))


class RevMLPPreTrainedModel(PreTrainedModel):
    config_class = RevMLPConfig
    base_model_prefix = "revmlp"
    main_input_name = "pixel_values"


class RevMLPModel(RevMLPPreTrainedModel):
    """The embedding and the blocks; `pooler_output` is the streams' sum."""

    def __init__(self, config: RevMLPConfig):
        super().__init__(config)
        self.embedding = RevMLPEmbedding(config)
        self.blocks = nn.ModuleList(RevMLPBlock(config) for _ in range(config.num_blocks))
        self.post_init()

    def get_stages(self) -> list[nn.Module]:
        return [self.embedding, *self.blocks]

    def forward(self, pixel_values: torch.Tensor, **kwargs) -> BaseModelOutputWithPooling:
        streams = self.embedding(pixel_values)
        for block in self.blocks:
            streams = block(streams)
        hidden = torch.cat(streams, dim=-1)
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=streams[0] + streams[1])


class RevMLPForImageClassification(RevMLPPreTrainedModel):
    def __init__(self, config: RevMLPConfig):
        super().__init__(config)
        self.revmlp = RevMLPModel(config)
        self.head = RevMLPHead(config)
        self.post_init()

    def get_stages(self) -> list[nn.Module]:
        """Embedding, one stage per block, head: running them in order is `forward`."""
        return [*self.revmlp.get_stages(), self.head]

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor | None = None, **kwargs):
        logits = pixel_values
        for stage in self.get_stages():
            logits = stage(logits)
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return ImageClassifierOutput(loss=loss, logits=logits)
