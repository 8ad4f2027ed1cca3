"""A model loaded in another dtype (from_pretrained(..., dtype=torch.bfloat16)) takes float32 images, as ViTModel
does: the models cast pixel_values to their weights' dtype. Before, the stem's convolution raised (input and bias
dtypes differ)."""

from __future__ import annotations

import pytest
import torch

from petra_hub import RevNetConfig, RevNetForImageClassification, RevViTConfig, RevViTForImageClassification


def revnet():
    return RevNetForImageClassification(RevNetConfig(depths=[1, 1], hidden_sizes=[8, 16], embedding_size=8,
                                                     num_labels=3))


def revvit():
    return RevViTForImageClassification(RevViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                                     num_attention_heads=2, num_labels=3))


@pytest.mark.parametrize("build", [revnet, revvit])
@pytest.mark.parametrize("dtype, tolerance", [(torch.bfloat16, 0.1), (torch.float64, 1e-5)])
def test_float32_images_into_a_model_loaded_in_another_dtype(tmp_path, build, dtype, tolerance):
    torch.manual_seed(0)
    model = build().eval()
    model.save_pretrained(tmp_path)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = model(x).logits
        loaded = type(model).from_pretrained(tmp_path, dtype=dtype).eval()
        assert next(loaded.parameters()).dtype == dtype
        logits = loaded(x).logits  # float32 images
        assert logits.dtype == dtype
        assert torch.equal(logits, loaded(x.to(dtype)).logits)  # the same as images given in the model's dtype
    assert (logits.float() - reference).abs().max().item() < tolerance * reference.abs().max().item() + 1e-6
