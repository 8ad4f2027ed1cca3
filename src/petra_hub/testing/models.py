"""Small RevNets and inputs shared by the tests and the benchmarks (float64 by default: exact comparisons)."""

from __future__ import annotations

import torch

from ..models.revnet import RevNetConfig, RevNetForImageClassification
from ..models.revvit import RevViTConfig, RevViTForImageClassification

SMALL_WIDTHS = {"basic": [4, 8, 8, 8], "bottleneck": [8, 8, 16, 16]}


def small_config(preset: str = "revnet18", **overrides) -> RevNetConfig:
    block_type = RevNetConfig.from_preset(preset).block_type
    arguments = {"hidden_sizes": SMALL_WIDTHS[block_type], "embedding_size": 4, "num_labels": 10, **overrides}
    return RevNetConfig.from_preset(preset, **arguments)


def input_size(config: RevNetConfig) -> int:
    return max(8, config.downsampling_factor)


def small_model(preset: str = "revnet18", dtype=torch.float64, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    model = RevNetForImageClassification(small_config(preset, **overrides)).to(dtype)
    return model


def random_images(config: RevNetConfig, batch: int = 4, dtype=torch.float64, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    size = input_size(config)
    return torch.randn(batch, config.num_channels, size, size, generator=generator, dtype=dtype)


# Stage layouts of the paper's table (S stem, R reversible, D non-reversible downsampling, H head).
PAPER_LAYOUTS = {
    "revnet18": "SRRDRDRDRH",
    "revnet34": "SRRRDRRRDRRRRRDRRH",
    "revnet50": "SDRRDRRRDRRRRRDRRH",
    "revnet101": "SDRRD" + "R" * 3 + "D" + "R" * 22 + "DRRH",
}


# Widths of the benchmarks (benchmarks/common.py), float32 CPU runs. A RevNet's four layers use stream widths
# [w, 2w, 4w, 8w] and a stem of width w per stream; w = RECIPE_WIDTH is the small RevNet18 that
# recipes/train_revnet.py trains by default (hidden sizes 16,32,64,128, embedding 16).
RECIPE_WIDTH = 16
QUICK_WIDTH = 4  # benchmarks/throughput.py --quick
# benchmarks/memory.py --fast: tiny widths that keep every preset's depth and block type, stem width FAST_EMBEDDING.
FAST_WIDTHS = {"basic": [8, 16, 16, 16], "bottleneck": [16, 16, 32, 32]}
FAST_EMBEDDING = 8


def doubling_widths(width: int) -> list[int]:
    """Stream widths of the four layers, [w, 2w, 4w, 8w]."""
    return [width, 2 * width, 4 * width, 8 * width]


# RevViT test widths: every preset's depth and head count, tokens 4 wide per head, 16x16 images in 4x4 patches.
def small_revvit_config(preset: str = "revvit-tiny", **overrides) -> RevViTConfig:
    heads = RevViTConfig.from_preset(preset).num_attention_heads
    arguments = {"hidden_size": 4 * heads, "image_size": 16, "patch_size": 4, "num_labels": 10, **overrides}
    return RevViTConfig.from_preset(preset, **arguments)


def small_revvit(preset: str = "revvit-tiny", dtype=torch.float64, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return RevViTForImageClassification(small_revvit_config(preset, **overrides)).to(dtype)
