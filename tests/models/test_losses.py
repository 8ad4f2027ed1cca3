"""The classifiers' losses follow transformers' (ForImageClassification): the label range is checked for
single-label classification only, and -100 marks an image the cross-entropy ignores."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as functional

from petra_hub import RevNetConfig, RevNetForImageClassification, RevViTConfig, RevViTForImageClassification


def revnet(**config):
    torch.manual_seed(0)
    return RevNetForImageClassification(RevNetConfig(depths=[1], hidden_sizes=[8], embedding_size=8, **config))


def revvit(**config):
    torch.manual_seed(0)
    return RevViTForImageClassification(RevViTConfig(image_size=16, patch_size=4, hidden_size=16,
                                                     num_hidden_layers=1, num_attention_heads=2, **config))


IMAGES = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
MODELS = [revnet, revvit]


@pytest.mark.parametrize("build", MODELS)
def test_minus_100_is_ignored_by_the_cross_entropy(build):
    model = build(num_labels=3).eval()
    labels = torch.tensor([0, -100, 1, 2])
    output = model(IMAGES, labels=labels)
    kept = torch.tensor([0, 2, 3])
    expected = functional.cross_entropy(output.logits[kept], labels[kept])
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert output.loss.item() != pytest.approx(functional.cross_entropy(output.logits, labels.clamp(min=0)).item())


@pytest.mark.parametrize("build", MODELS)
def test_regression_takes_integer_targets_beyond_num_labels(build):
    model = build(num_labels=3, problem_type="regression").eval()
    targets = torch.tensor([[5, 0, 7], [1, 2, 3], [0, 0, 9], [4, 4, 4]])
    output = model(IMAGES, labels=targets)
    expected = functional.mse_loss(output.logits, targets.float())
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert output.loss.item() > 10.0  # targets up to 9 against logits near 0


@pytest.mark.parametrize("build", MODELS)
@pytest.mark.parametrize("labels, low, high", [([0, -100, 3, 1], 0, 3), ([0, -100, -5, 1], -5, 1)])
def test_out_of_range_labels_still_fail_beside_ignored_ones(build, labels, low, high):
    model = build(num_labels=3).eval()
    message = rf"labels must lie in \[0, 2\] \(config.num_labels=3\), got values in \[{low}, {high}\] \(-100 marks"
    with pytest.raises(ValueError, match=message):
        model(IMAGES, labels=torch.tensor(labels))


@pytest.mark.parametrize("build", MODELS)
def test_explicit_single_label_problem_type_is_checked(build):
    model = build(num_labels=3, problem_type="single_label_classification").eval()
    with pytest.raises(ValueError, match=r"got values in \[0, 7\]"):
        model(IMAGES, labels=torch.tensor([0, 7, 1, 2]))


@pytest.mark.parametrize("build", MODELS)
@pytest.mark.parametrize("problem_type, dtype", [  # without problem_type, int64 and int32 mean single-label
    (None, torch.int32), *[("single_label_classification", d) for d in (torch.int32, torch.int16, torch.uint8)]])
def test_integer_labels_of_any_width_give_the_cross_entropy(build, problem_type, dtype):
    """int32 labels passed the label checks (and transformers' inference of single-label classification) but the
    cross-entropy raised 'expected target dtype to be Long or Byte, but got Int'; compute_loss casts class indices to
    int64."""
    model = build(num_labels=3, problem_type=problem_type).eval()
    labels = torch.tensor([0, 2, 1, 2])
    output = model(IMAGES, labels=labels.to(dtype))
    expected = functional.cross_entropy(output.logits, labels)
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert output.loss.item() > 0.5 and model.config.problem_type == "single_label_classification"
    with pytest.raises(ValueError, match=r"got values in \[0, 3\]"):
        model(IMAGES, labels=torch.tensor([0, 3, 1, 2], dtype=dtype))


@pytest.mark.parametrize("build", MODELS)
def test_integer_multi_label_targets_give_the_binary_cross_entropy(build):
    """int32 multi-label targets raised in the BCE (result type Float can't be cast to Int): they are cast to float."""
    model = build(num_labels=3, problem_type="multi_label_classification").eval()
    targets = torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]], dtype=torch.int32)
    output = model(IMAGES, labels=targets)
    expected = functional.binary_cross_entropy_with_logits(output.logits, targets.float())
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-6)
