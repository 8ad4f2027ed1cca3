"""timm models from local files of the transformers base models (no classifier) and, with in_chans != 3, from
3-channel files: the weights load and the first convolution is adapted to the new channel count."""

from __future__ import annotations

import pytest
import timm
import torch

import petra_hub.integrations.timm  # noqa: F401  (registers the models)
from petra_hub import RevNetConfig, RevNetModel, RevViTConfig, RevViTModel

REVNET = dict(stem="cifar", hidden_sizes=[4, 8, 8, 8], embedding_size=4)
REVVIT = dict(image_size=16, patch_size=4, hidden_size=12, num_hidden_layers=2)
IMAGES = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))


def bare_file(family, folder):
    torch.manual_seed(0)
    if family == "revnet18":
        model = RevNetModel(RevNetConfig.from_preset("revnet18", **REVNET))
        arguments = REVNET
    else:
        model = RevViTModel(RevViTConfig.from_preset("revvit-tiny", **REVVIT))
        arguments = {**{k: v for k, v in REVVIT.items() if k != "image_size"}, "img_size": REVVIT["image_size"]}
    model.eval().save_pretrained(folder)
    return model, arguments, dict(file=str(folder / "model.safetensors"))


@pytest.mark.parametrize("family", ["revnet18", "revvit_tiny"])
def test_a_base_model_file_gives_a_model_without_head(family, tmp_path):
    base, arguments, overlay = bare_file(family, tmp_path)
    model = timm.create_model(family, pretrained=True, pretrained_cfg_overlay=overlay, **arguments).eval()
    assert model.num_classes == 0
    with torch.no_grad():
        assert torch.equal(model(IMAGES), base(IMAGES).pooler_output.flatten(1))


@pytest.mark.parametrize("family", ["revnet18", "revvit_tiny"])
@pytest.mark.parametrize("num_classes", [10, 1000])
def test_a_base_model_file_with_num_classes_gets_a_new_head(family, num_classes, tmp_path):
    base, arguments, overlay = bare_file(family, tmp_path)
    model = timm.create_model(family, pretrained=True, pretrained_cfg_overlay=overlay, num_classes=num_classes,
                              **arguments).eval()
    with torch.no_grad():
        assert model(IMAGES).shape == (2, num_classes)
        assert torch.equal(model.forward_head(model.forward_features(IMAGES), pre_logits=True),
                           base(IMAGES).pooler_output.flatten(1))


@pytest.mark.parametrize("family, stem", [("revnet18", "cifar"), ("revnet18", "imagenet"), ("revvit_tiny", None)])
def test_in_chans_1_from_a_3_channel_file_sums_the_first_convolution(family, stem, tmp_path):
    base, arguments, overlay = bare_file(family, tmp_path)
    if stem == "imagenet":
        torch.manual_seed(0)
        base = RevNetModel(RevNetConfig.from_preset("revnet18", **{**REVNET, "stem": "imagenet"})).eval()
        base.save_pretrained(tmp_path)
        arguments = {**REVNET, "stem": "imagenet"}
    model = timm.create_model(family, pretrained=True, pretrained_cfg_overlay=overlay, in_chans=1, **arguments)
    first = "embedder.layers.0" if family == "revnet18" else "embeddings.patches"
    weight = model.model.base_model.get_submodule(first).weight
    assert weight.shape[1] == 1
    assert torch.allclose(weight[:, 0], base.get_submodule(first).weight.sum(1))
    assert model.pretrained_cfg["input_size"][0] == 3  # the file's channels, from which timm adapted the conv
    assert model.config.num_channels == 1


@pytest.mark.parametrize("family", ["revnet18", "revvit_tiny"])
def test_weights_of_another_architecture_name_the_arguments_its_config_json_holds(family, tmp_path):
    """Loading a saved folder without its architecture arguments listed every tensor that did not fit (~100 lines);
    now one line naming the arguments of its config.json, and the call it gives loads the weights exactly."""
    model, _, overlay = bare_file(family, tmp_path)
    with pytest.raises(RuntimeError) as refused:
        timm.create_model(family, pretrained=True, num_classes=0, pretrained_cfg_overlay=overlay)
    message = str(refused.value)
    assert "size mismatch" not in message and message.count("\n") == 0
    assert f"are of another architecture than {family} with its preset" in message
    saved = message.split("pretrained_cfg_overlay=dict(file=...), ")[1][:-1]
    expected = REVNET if family == "revnet18" else REVVIT
    assert all(f"{name}={value!r}" in saved for name, value in expected.items()), saved
    arguments = eval(f"dict({saved})")  # the call the message gives
    loaded = timm.create_model(family, pretrained=True, num_classes=0, pretrained_cfg_overlay=overlay, **arguments)
    features = model(IMAGES).pooler_output
    assert torch.equal(loaded.eval()(IMAGES), features.flatten(1))
