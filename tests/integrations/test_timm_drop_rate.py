"""timm's drop_rate reaches the PETRA stages: the stages of a timm model compose to its forward in training mode
(same random numbers), and a Pipeline over them trains as autograd on the forward does."""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as functional

import petra_hub.integrations.timm  # noqa: F401  (registers the models)
from petra_hub.engine import Pipeline

REVNET = dict(stem="cifar", hidden_sizes=[8, 8, 8, 8], embedding_size=8, depths=[1, 1, 1, 1])
REVVIT = dict(img_size=16, patch_size=4, hidden_size=12, num_hidden_layers=2)
IMAGES = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
LABELS = torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])


def build(name, drop_rate):
    torch.manual_seed(0)
    return timm.create_model(name, num_classes=4, drop_rate=drop_rate, **(REVNET if name == "revnet18" else REVVIT))


@pytest.mark.parametrize("name", ["revnet18", "revvit_tiny"])
@pytest.mark.parametrize("training", [True, False])
def test_stages_compose_to_forward_with_dropout(name, training):
    model = build(name, 0.9).train(training)
    torch.manual_seed(1)
    expected = model(IMAGES)
    torch.manual_seed(1)
    value = IMAGES
    for stage in model.get_stages():
        value = stage(value)
    assert torch.equal(value, expected)
    if training:  # the dropout acted: without it the logits differ
        model.drop_rate = 0.0
        torch.manual_seed(1)
        assert (model(IMAGES) - expected).abs().max() > 1e-3


def test_pipeline_training_honours_drop_rate():
    def weights_after_a_step(drop_rate, pipelined):
        model = build("revnet18", drop_rate).train()
        if pipelined:
            pipeline = Pipeline(model.get_stages(), loss_fn=functional.cross_entropy, mode="backprop",
                                optimizer_factory=lambda index, stage: torch.optim.SGD(stage.parameters(), lr=0.1))
            torch.manual_seed(1)
            pipeline.step(IMAGES, LABELS)
            pipeline.drain()
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            torch.manual_seed(1)
            functional.cross_entropy(model(IMAGES), LABELS).backward()
            optimizer.step()
        return torch.cat([parameter.detach().flatten() for parameter in model.parameters()])

    pipelined, plain = weights_after_a_step(0.9, True), weights_after_a_step(0.9, False)
    assert (pipelined - plain).abs().max() < 1e-5
    assert (pipelined - weights_after_a_step(0.0, True)).abs().max() > 1e-2  # drop_rate changed the step
