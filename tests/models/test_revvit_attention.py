"""RevViT attention is torch's scaled_dot_product_attention: attn_implementation="sdpa" is accepted (it was refused,
the class did not declare `_supports_sdpa`), and what the model does not do is refused instead of ignored: "eager"
(accepted before, and SDPA ran anyway) and output_attentions=True (no attention weights came back)."""

from __future__ import annotations

import math

import pytest
import torch

from petra_hub import RevViTConfig, RevViTForImageClassification

REVVIT = dict(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_labels=3)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("revvit")
    torch.manual_seed(0)
    model = RevViTForImageClassification(RevViTConfig(**REVVIT)).eval()
    model.save_pretrained(folder)
    return folder, model


def test_sdpa_is_accepted_and_is_the_default(saved):
    folder, model = saved
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    for requested in ("sdpa", None):
        loaded = RevViTForImageClassification.from_pretrained(folder, attn_implementation=requested).eval()
        assert loaded.config._attn_implementation == "sdpa"
        with torch.no_grad():
            assert torch.equal(loaded(x).logits, model(x).logits)


@pytest.mark.parametrize("implementation", ["eager", "flex_attention"])
def test_other_attention_implementations_are_refused(saved, implementation):
    with pytest.raises(ValueError, match=rf"^attn_implementation='{implementation}' is not supported: RevViT "
                                         r"attention always runs torch's scaled_dot_product_attention; expected "
                                         r"attn_implementation='sdpa' \(the default\) or None$"):
        RevViTForImageClassification.from_pretrained(saved[0], attn_implementation=implementation)


def test_output_attentions_is_refused(saved):
    folder, model = saved
    x = torch.randn(2, 3, 16, 16)
    for call in (lambda: model(x, output_attentions=True), lambda: model.revvit(x, output_attentions=True)):
        with pytest.raises(ValueError, match=r"^output_attentions=True is not supported: .* returns no attention "
                                             r"weights; expected output_attentions=False or None$"):
            call()
    assert model(x, output_attentions=False).logits.shape == (2, 3)
    message = r"^Invalid RevViTConfig: output_attentions=True is not supported: .* \(expected False\)$"
    with pytest.raises(ValueError, match=message):
        RevViTConfig(**REVVIT, output_attentions=True)
    with pytest.raises(ValueError, match=message):
        RevViTForImageClassification.from_pretrained(folder, output_attentions=True)


def test_the_attention_is_softmax_attention():
    """What "sdpa" names: softmax(q k^T / sqrt(d)) v per head, to float64 rounding."""
    torch.manual_seed(0)
    model = RevViTForImageClassification(RevViTConfig(**REVVIT)).double()
    attention = model.revvit.encoder[0].attention
    x = torch.randn(2, 4, 16, dtype=torch.float64)
    q, k, v = attention.qkv(attention.norm(x)).view(2, 4, 3, 2, 8).permute(2, 0, 3, 1, 4)
    weights = (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(dim=-1)
    expected = attention.projection((weights @ v).transpose(1, 2).reshape(2, 4, 16))
    assert (attention(x) - expected).abs().max().item() < 1e-12
