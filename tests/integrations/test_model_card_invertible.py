"""Cards of RevNets with invertible downsampling tell the truth: real stream widths, no paper name, and only the
stem and the head keep their inputs; buffered RevNets keep the paper's wording."""

from __future__ import annotations

import pytest
import torch

from petra_hub import RevNetConfig, RevNetForImageClassification
from petra_hub.integrations.model_card import TrainingSummary, render_model_card


def card(config):
    return str(render_model_card(TrainingSummary(model_name="x", preset="revnet18", dataset="cifar10"), config=config))


@pytest.mark.parametrize("preset", ["revnet18", "revnet50"])
def test_stream_widths_are_the_models(preset):
    config = RevNetConfig.from_preset(preset, hidden_sizes=[8, 8, 16, 16], embedding_size=4, downsampling="invertible")
    model = RevNetForImageClassification(config).eval()
    with torch.no_grad():
        states = model(torch.randn(1, 3, 16, 16), output_hidden_states=True).hidden_states
    ends = [sum(config.depths[:i + 1]) for i in range(len(config.depths))]
    assert [states[end].shape[1] // 2 for end in ends] == config.stream_widths() == [4, 16, 64, 256]
    assert RevNetConfig.from_preset(preset).stream_widths() == RevNetConfig.from_preset(preset).hidden_sizes


def test_invertible_card():
    text = card(RevNetConfig.from_preset("revnet18", stem="cifar", downsampling="invertible", num_labels=10))
    assert "**a custom RevNet (derived from revnet18)**" in text and "RevNet-18" not in text
    assert ("widths 64/256/1024/4096 per stream (residual functions 64/128/256/512 wide), cifar stem, invertible "
            "downsampling") in text
    assert "the blocks that change the stream shape are reversible too" in text
    assert "only the stem and the head keep their\ninputs" in text
    assert "the blocks that change the stream shape and the head keep their inputs" not in text


def test_buffered_card_keeps_the_paper_name_and_wording():
    text = card(RevNetConfig.from_preset("revnet18", stem="cifar", num_labels=10))
    assert "**RevNet-18**" in text
    assert "widths 64/128/256/512 per stream, cifar stem, buffered downsampling" in text
    assert "only the stem, the blocks that change the stream shape and the head keep their inputs" in text
