"""A saved classifier's config.json maps "AutoModel" to its base model's class, so `AutoModel.from_pretrained(folder,
trust_remote_code=True)` loads the backbone without petra_hub. Before, auto_map held only AutoConfig and
AutoModelForImageClassification and AutoModel refused the folder ('Unrecognized configuration class')."""

from __future__ import annotations

import json

import pytest
import torch

from petra_hub import RevNetConfig, RevNetForImageClassification, RevViTConfig, RevViTForImageClassification
from petra_hub.testing.remote_code import run_without_petra_hub

BACKBONE_SCRIPT = """
    import torch
    from transformers import AutoModel

    folder, inputs, outputs = sys.argv[1:4]
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        torch.save(model(torch.load(inputs)).pooler_output, outputs)
    print("CLASS", type(model).__module__, type(model).__name__)
    print("PETRA_HUB_MODULES", sorted(name for name in sys.modules if name.split(".")[0] == "petra_hub"))
"""


def revnet():
    return RevNetForImageClassification(RevNetConfig(depths=[1, 1], hidden_sizes=[8, 16], embedding_size=8,
                                                     num_labels=3)), "revnet", "RevNetModel"


def revvit():
    return RevViTForImageClassification(RevViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                                     num_attention_heads=2, num_labels=3)), "revvit", "RevViTModel"


@pytest.mark.parametrize("build", [revnet, revvit])
def test_automodel_loads_the_backbone_of_a_saved_classifier_without_petra_hub(tmp_path, build):
    torch.manual_seed(0)
    model, family, base_name = build()
    model.eval().save_pretrained(tmp_path / "saved")
    auto_map = json.loads((tmp_path / "saved" / "config.json").read_text())["auto_map"]
    assert auto_map == {"AutoConfig": f"configuration_{family}.{type(model.config).__name__}",
                        "AutoModel": f"modeling_{family}.{base_name}",
                        "AutoModelForImageClassification": f"modeling_{family}.{type(model).__name__}"}
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    torch.save(images, tmp_path / "inputs.pt")
    result = run_without_petra_hub(BACKBONE_SCRIPT, [str(tmp_path / "saved"), str(tmp_path / "inputs.pt"),
                                                     str(tmp_path / "pooled.pt")], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.startswith(("CLASS", "PETRA")))
    module, name = lines["CLASS"].split()
    assert name == base_name and module.startswith("transformers_modules") and module.endswith(f"modeling_{family}")
    assert lines["PETRA_HUB_MODULES"] == "[]"
    with torch.no_grad():
        expected = model.base_model(images).pooler_output
    assert torch.equal(torch.load(tmp_path / "pooled.pt"), expected)  # the classifier's trained backbone weights
