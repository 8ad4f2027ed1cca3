"""Keys of transformers' ResNetConfig and ViTConfig that a family does not implement are refused with the key and
the reason, unless their value states what the model does; derived properties cannot be set; RevViT takes ViT's
intermediate_size as the MLP width."""

from __future__ import annotations

import json

import pytest
import torch

from petra_hub import RevNetConfig, RevNetForImageClassification, RevViTConfig, RevViTForImageClassification

REVNET = dict(depths=[1, 1], hidden_sizes=[8, 16], embedding_size=8, num_labels=3)
REVVIT = dict(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_labels=3)


@pytest.mark.parametrize("key, value, reason", [
    ("hidden_act", "gelu", "RevNet blocks always use ReLU"),
    ("layer_norm_eps", 0.1, "RevNets have no layer norm"),
    ("drop_path_rate", 0.5, "RevNets have no stochastic depth"),
    ("hidden_dropout_prob", 0.5, "RevNets have no dropout"),
    ("attention_probs_dropout_prob", 0.5, "they have no attention"),
    ("qkv_bias", False, "they have no attention"),
    ("intermediate_size", 1000, "use hidden_sizes"),
    ("out_features", ["stage1"], "not transformers backbones"),
])
def test_revnet_refuses_keys_it_does_not_implement(key, value, reason):
    with pytest.raises(ValueError, match=rf"Invalid RevNetConfig: {key}={value!r} is not supported: .*{reason}"
                       .replace("[", r"\[").replace("]", r"\]")):
        RevNetConfig(**REVNET, **{key: value})


@pytest.mark.parametrize("key, value, reason", [
    ("hidden_act", "relu", "RevViT MLPs always use the exact GELU"),
    ("attention_probs_dropout_prob", 0.5, "RevViT attention has no dropout"),
    ("qkv_bias", False, "always have a bias"),
    ("pooler_act", "tanh", "no activation"),
    ("depths", [1, 1], "a ResNet key"),
])
def test_revvit_refuses_keys_it_does_not_implement(key, value, reason):
    with pytest.raises(ValueError, match=rf"Invalid RevViTConfig: {key}={value!r} is not supported: .*{reason}"
                       .replace("[", r"\[").replace("]", r"\]")):
        RevViTConfig(**REVVIT, **{key: value})


def test_keys_stating_what_the_model_does_are_accepted():
    RevNetConfig(**REVNET, hidden_act="relu", hidden_dropout_prob=0.0, drop_path_rate=0.0, out_features=None)
    RevViTConfig(**REVVIT, hidden_act="gelu", qkv_bias=True, attention_probs_dropout_prob=0.0)


def test_a_saved_config_with_a_foreign_key_is_refused_on_loading(tmp_path):
    RevNetForImageClassification(RevNetConfig(**REVNET)).save_pretrained(tmp_path)
    assert RevNetForImageClassification.from_pretrained(tmp_path).config.stem == "cifar"  # the clean file loads
    content = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**content, "hidden_act": "gelu"}))
    with pytest.raises(ValueError, match="hidden_act='gelu' is not supported"):
        RevNetForImageClassification.from_pretrained(tmp_path)


def test_intermediate_size_sets_the_mlp_width():
    config = RevViTConfig(**REVVIT, intermediate_size=24)
    assert (config.mlp_ratio, config.intermediate_size) == (1.5, 24)
    model = RevViTForImageClassification(config)
    assert model.revvit.encoder[0].mlp.fc1.out_features == 24
    assert RevViTConfig.from_dict(config.to_dict()).intermediate_size == 24
    with pytest.raises(ValueError, match=r"intermediate_size=24 disagrees with mlp_ratio=4.0 \(an MLP width of 64\)"):
        RevViTConfig(**REVVIT, intermediate_size=24, mlp_ratio=4.0)
    assert RevViTConfig(**REVVIT, intermediate_size=64, mlp_ratio=4.0).mlp_ratio == 4.0


def test_intermediate_size_override_of_from_pretrained(tmp_path):
    torch.manual_seed(0)
    RevViTForImageClassification(RevViTConfig(**REVVIT)).save_pretrained(tmp_path)
    model = RevViTForImageClassification.from_pretrained(tmp_path, intermediate_size=32, ignore_mismatched_sizes=True)
    assert model.revvit.encoder[0].mlp.fc1.out_features == 32


def test_derived_properties_cannot_be_set():
    with pytest.raises(ValueError, match=r"num_patches=7 cannot be set: it is \(image_size // patch_size\) \*\* 2"):
        RevViTConfig(**REVVIT, num_patches=7)
    with pytest.raises(ValueError, match=r"downsampling_factor=3 cannot be set: it follows from stem"):
        RevNetConfig(**REVNET, downsampling_factor=3)
