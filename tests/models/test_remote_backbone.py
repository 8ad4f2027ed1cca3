"""A saved classifier's config.json maps "AutoModel" to its base model's class, so `AutoModel.from_pretrained(folder,
trust_remote_code=True)` loads the backbone without petra_hub. Before, auto_map held only AutoConfig and
AutoModelForImageClassification and AutoModel refused the folder ('Unrecognized configuration class')."""

from __future__ import annotations

import json

import pytest
import torch

from petra_hub import RevNetConfig, RevNetForImageClassification, RevViTConfig, RevViTForImageClassification
from tests.models import remote_checks


def revnet():
    return RevNetForImageClassification(RevNetConfig(depths=[1, 1], hidden_sizes=[8, 16], embedding_size=8,
                                                     num_labels=3)), "revnet", "RevNetModel"


def revvit():
    return RevViTForImageClassification(RevViTConfig(image_size=16, patch_size=8, hidden_size=16, num_hidden_layers=2,
                                                     num_attention_heads=2, num_labels=3)), "revvit", "RevViTModel"


def backbone_folder(build):
    """What the interpreter without petra_hub loads (tests/models/remote_checks.py) for one family: a saved classifier,
    with images and the pooled output of its backbone."""

    def prepare(folder):
        torch.manual_seed(0)
        model, family, base_name = build()
        model.eval().save_pretrained(folder)
        images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            expected = model.base_model(images).pooler_output
        return remote_checks.RemoteLoad("AutoModel", inputs=images, output="pooler_output",
                                        expected=(model, family, base_name, expected))

    return prepare


remote_checks.register("backbone_revnet", backbone_folder(revnet))
remote_checks.register("backbone_revvit", backbone_folder(revvit))


@pytest.mark.parametrize("build", [revnet, revvit])
def test_automodel_loads_the_backbone_of_a_saved_classifier_without_petra_hub(tmp_path_factory, build):
    outcome = remote_checks.outcome(f"backbone_{build.__name__}", tmp_path_factory)
    model, family, base_name, expected = outcome.expected
    auto_map = json.loads((outcome.folder / "config.json").read_text())["auto_map"]
    assert auto_map == {"AutoConfig": f"configuration_{family}.{type(model.config).__name__}",
                        "AutoModel": f"modeling_{family}.{base_name}",
                        "AutoModelForImageClassification": f"modeling_{family}.{type(model).__name__}"}
    assert outcome.error is None, outcome.error
    assert outcome.petra_hub_importable is False
    module, name = outcome.model_module, outcome.model_class
    assert name == base_name and module.startswith("transformers_modules") and module.endswith(f"modeling_{family}")
    assert outcome.petra_hub_modules == []
    assert torch.equal(outcome.output, expected)  # the classifier's trained backbone weights
