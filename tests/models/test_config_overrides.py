"""A configuration reaches the model checked however it was made: keyword overrides of `from_pretrained` (which
transformers sets after the configuration's own `__init__`) fail as the same arguments to the configuration do."""

from __future__ import annotations

import pytest
import torch

from petra_hub import RevNetConfig, RevNetForImageClassification, RevViTConfig, RevViTForImageClassification


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("saved")
    torch.manual_seed(0)
    RevNetForImageClassification(RevNetConfig(depths=[1, 1], hidden_sizes=[8, 16], embedding_size=8,
                                              num_labels=3)).save_pretrained(folder / "revnet")
    RevViTForImageClassification(RevViTConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=2,
                                              num_attention_heads=2, num_labels=3)).save_pretrained(folder / "revvit")
    return folder


@pytest.mark.parametrize("override, message", [
    ({"stem": "bogus"}, "stem must be one of ('cifar', 'imagenet'), got 'bogus'"),
    ({"downsampling": "bogus"}, "downsampling must be one of ('buffered', 'invertible'), got 'bogus'"),
    ({"block_type": "bogus"}, "block_type must be one of ('basic', 'bottleneck'), got 'bogus'"),
])
def test_revnet_from_pretrained_overrides_are_checked(saved, override, message):
    with pytest.raises(ValueError, match=r"Invalid RevNetConfig: " + message.replace("(", r"\(").replace(")", r"\)")):
        RevNetForImageClassification.from_pretrained(saved / "revnet", **override)


@pytest.mark.parametrize("override, message", [
    ({"hidden_dropout_prob": 1.0}, "hidden_dropout_prob must lie in [0, 1), got 1.0"),
    ({"hidden_dropout_prob": -0.5}, "hidden_dropout_prob must lie in [0, 1), got -0.5"),
    ({"drop_path_rate": 1.0}, "drop_path_rate must lie in [0, 1), got 1.0"),
])
def test_revvit_from_pretrained_overrides_are_checked(saved, override, message):
    with pytest.raises(ValueError, match=r"Invalid RevViTConfig: " + message.replace("[", r"\[").replace(")", r"\)")):
        RevViTForImageClassification.from_pretrained(saved / "revvit", **override)


def test_a_config_changed_after_construction_is_checked_by_the_model():
    config = RevNetConfig(depths=[1], hidden_sizes=[8], embedding_size=8)
    config.stem = "bogus"  # before the fix, the `else` branch built the cifar stem
    with pytest.raises(ValueError, match="stem must be one of"):
        RevNetForImageClassification(config)


def test_valid_overrides_still_apply(saved):
    model = RevViTForImageClassification.from_pretrained(saved / "revvit", drop_path_rate=0.5)
    assert model.config.drop_path_rate == 0.5
    assert model.revvit.encoder[-1].drop_path == 0.5
    model = RevNetForImageClassification.from_pretrained(saved / "revnet", batch_norm_eps=1e-3)
    assert model.revnet.embedder.layers[1].eps == 1e-3
