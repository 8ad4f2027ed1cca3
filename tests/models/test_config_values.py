"""Numeric configuration keys are checked when the configuration is made (and when from_pretrained overrides them),
naming the key, the value as given and what was expected: before, a negative epsilon or momentum, a negative
initializer_range, float sizes and an unknown problem_type were taken, and failed later (NaN logits, a crash at
build or at the loss) or silently changed what the model does."""

from __future__ import annotations

import pytest
import torch

from petra_hub import RevNetConfig, RevNetForImageClassification, RevViTConfig, RevViTForImageClassification

REVNET = dict(depths=[1, 1], hidden_sizes=[8, 16], embedding_size=8, layer_strides=[1, 2])
REVVIT = dict(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
PROBLEM_TYPES = r"\(None, 'regression', 'single_label_classification', 'multi_label_classification'\)"


@pytest.mark.parametrize("key, value, message", [
    ("batch_norm_eps", -1.0, "batch_norm_eps must be a positive number, got -1.0"),
    ("batch_norm_eps", 0.0, "batch_norm_eps must be a positive number, got 0.0"),
    ("batch_norm_momentum", -0.5, r"batch_norm_momentum must lie in \[0, 1\] \(or be None: a cumulative average\), "
                                  "got -0.5"),
    ("batch_norm_momentum", 2.0, r"batch_norm_momentum must lie in \[0, 1\] .*got 2.0"),
    ("initializer_range", -0.1, r"initializer_range must be a number >= 0 \(a standard deviation\), got -0.1"),
    ("embedding_size", 8.0, "embedding_size must be a positive integer, got 8.0"),
    ("num_channels", 3.0, "num_channels must be a positive integer, got 3.0"),
    ("problem_type", "foo", rf"problem_type must be one of {PROBLEM_TYPES}, got 'foo'"),
    ("num_labels", -3, r"num_labels must be a positive integer \(the number of classes\), got -3"),
    ("num_labels", 0, r"num_labels must be a positive integer \(the number of classes\), got 0"),
    ("num_labels", True, r"num_labels must be a positive integer \(the number of classes\), got True"),
    ("num_labels", 3.0, r"num_labels must be a positive integer \(the number of classes\), got 3.0"),
])
def test_revnet_numeric_keys_are_checked_at_construction(key, value, message):
    with pytest.raises(ValueError, match=rf"^Invalid RevNetConfig: {message}$"):
        RevNetConfig(**{**REVNET, key: value})


@pytest.mark.parametrize("key, value, message", [
    ("layer_norm_eps", -1.0, "layer_norm_eps must be a positive number, got -1.0"),
    ("layer_norm_eps", 0.0, "layer_norm_eps must be a positive number, got 0.0"),
    ("initializer_range", -1.0, r"initializer_range must be a number >= 0 \(a standard deviation\), got -1.0"),
    ("num_channels", 3.0, "num_channels must be a positive integer, got 3.0"),
    ("mlp_ratio", 0.01, r"mlp_ratio \* hidden_size \(the MLP width\) must be >= 1, got mlp_ratio 0.01 \* hidden_size "
                        "16 = 0.16"),
    ("mlp_ratio", float("inf"), "mlp_ratio must be a positive finite number, got inf"),
    ("mlp_ratio", "4", "mlp_ratio must be a positive finite number, got '4'"),
    ("hidden_dropout_prob", "0.1", r"hidden_dropout_prob must lie in \[0, 1\), got '0.1'"),
    ("problem_type", "foo", rf"problem_type must be one of {PROBLEM_TYPES}, got 'foo'"),
    ("num_labels", -3, r"num_labels must be a positive integer \(the number of classes\), got -3"),
])
def test_revvit_numeric_keys_are_checked_at_construction(key, value, message):
    with pytest.raises(ValueError, match=rf"^Invalid RevViTConfig: {message}$"):
        RevViTConfig(**{**REVVIT, key: value})


def test_boundary_values_are_accepted_and_honoured():
    torch.manual_seed(0)
    model = RevNetForImageClassification(RevNetConfig(**REVNET, batch_norm_momentum=None, initializer_range=0.0))
    norm = model.revnet.embedder.layers[1]
    assert norm.momentum is None and torch.count_nonzero(model.classifier.weight) == 0
    batches = [torch.randn(4, 3, 8, 8, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]
    model.train()
    for batch in batches:
        model(batch)
    # momentum None: a cumulative average of the batches' means (the stem's output is that of its conv)
    means = [model.revnet.embedder.layers[0](batch).mean(dim=(0, 2, 3)) for batch in batches]
    assert torch.allclose(norm.running_mean, (means[0] + means[1]) / 2, atol=1e-6)
    assert RevNetConfig(**REVNET, batch_norm_momentum=1.0).batch_norm_momentum == 1.0
    assert RevNetConfig(**REVNET, batch_norm_momentum=0).batch_norm_momentum == 0


def test_a_tiny_layer_norm_eps_still_gives_finite_logits():
    """layer_norm_eps=-1 gave all-NaN logits (LayerNorm's sqrt of a negative variance); a small positive one is
    valid and finite."""
    torch.manual_seed(0)
    model = RevViTForImageClassification(RevViTConfig(**REVVIT, layer_norm_eps=1e-12)).eval()
    assert torch.isfinite(model(torch.randn(2, 3, 16, 16)).logits).all()


def test_from_pretrained_overrides_report_the_value_given(tmp_path):
    """PretrainedConfig stores id2label (range(-3) is empty): the check reads num_labels as given, not its length."""
    RevNetForImageClassification(RevNetConfig(**REVNET, num_labels=3)).save_pretrained(tmp_path / "revnet")
    with pytest.raises(ValueError, match=r"num_labels must be a positive integer \(the number of classes\), got -3"):
        RevNetForImageClassification.from_pretrained(tmp_path / "revnet", num_labels=-3, ignore_mismatched_sizes=True)
    with pytest.raises(ValueError, match=r"^Invalid RevNetConfig: batch_norm_eps must be a positive number, got -1"):
        RevNetForImageClassification.from_pretrained(tmp_path / "revnet", batch_norm_eps=-1)
    config = RevNetConfig(**REVNET)
    with pytest.raises(ValueError, match=r"got -3$"):
        config.num_labels = -3
    assert config.num_labels == 2 and len(config.id2label) == 2  # unchanged by the refused value
    model = RevNetForImageClassification.from_pretrained(tmp_path / "revnet", num_labels=5,
                                                         ignore_mismatched_sizes=True)
    assert model.classifier.out_features == 5 and model.config.id2label[4] == "LABEL_4"
