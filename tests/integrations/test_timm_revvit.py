"""The RevViTs as timm models."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import timm
import torch
from safetensors.torch import save_file

import petra_hub.integrations.timm as timm_models
from petra_hub import RevViTConfig, RevViTForImageClassification
from petra_hub.data import dataset_spec
from petra_hub.integrations import timm_revvit
from petra_hub.integrations.timm_revvit import TimmRevViT
from petra_hub.models.revvit.configuration_revvit import PRESETS
from petra_hub.testing.models import small_revvit

NAMES = ("revvit_tiny", "revvit_small", "revvit_base")
SMALL = dict(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16)


def test_importing_the_timm_module_registers_the_revvits_once():
    code = """
        import warnings
        import timm
        assert not timm.list_models("revvit*")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import petra_hub.integrations.timm_revvit as revvit_module  # alone first, then with the RevNets
            import petra_hub.integrations.timm as timm_models
        assert not [w for w in caught if "Overwriting" in str(w.message)]
        from petra_hub.integrations.timm import REVVIT_MODEL_NAMES, TimmRevViT, revvit_small
        assert REVVIT_MODEL_NAMES == ("revvit_tiny", "revvit_small", "revvit_base")
        assert sorted(timm.list_models("revvit*")) == sorted(REVVIT_MODEL_NAMES)
        assert timm_models.MODEL_NAMES == ("revnet18", "revnet34", "revnet50", "revnet101")
        assert sorted(timm.list_models("rev*")) == sorted(timm_models.MODEL_NAMES + REVVIT_MODEL_NAMES)
        for name in REVVIT_MODEL_NAMES:
            assert timm.models.model_entrypoint(name) is getattr(timm_models, name) is getattr(revvit_module, name)
        assert TimmRevViT is revvit_module.TimmRevViT and revvit_small is revvit_module.revvit_small
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_list_models_lists_the_three():
    assert timm_models.REVVIT_MODEL_NAMES == NAMES
    assert sorted(timm.list_models("revvit*")) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_presets_have_the_paper_widths_and_the_transformers_parameters(name):
    with torch.device("meta"):  # sizes only: no allocation, no initialisation cost
        model = timm.create_model(name, pretrained=False)
        reference = RevViTForImageClassification(RevViTConfig.from_preset(name, num_labels=1000))
    assert isinstance(model, TimmRevViT) and isinstance(model.model, RevViTForImageClassification)
    config, preset = model.model.config, PRESETS[name.replace("_", "-")]
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (
        preset["hidden_size"], preset["num_hidden_layers"], preset["num_attention_heads"])
    assert (config.image_size, config.patch_size, config.num_labels) == (224, 16, 1000)
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in reference.parameters())
    assert model.num_classes == 1000 and model.num_features == 2 * config.hidden_size


def test_pretrained_cfg_describes_imagenet_inputs_and_the_wrapped_model():
    cfg = timm.models.get_pretrained_cfg("revvit_small")
    imagenet = dataset_spec("imagenet").info
    assert (cfg.num_classes, cfg.input_size, cfg.crop_pct, cfg.url) == (1000, (3, 224, 224), 0.875, "")
    assert (cfg.mean, cfg.std, cfg.fixed_input_size) == (imagenet.mean, imagenet.std, True)
    assert "Mangalam" in cfg.description and "CVPR 2022" in cfg.description
    model = timm.create_model("revvit_small", num_classes=10, **SMALL)
    assert model.pretrained_cfg["input_size"] == (3, 16, 16)  # follows image_size
    assert isinstance(model.get_submodule(model.pretrained_cfg["first_conv"]), torch.nn.Conv2d)
    assert model.get_submodule(model.pretrained_cfg["classifier"]) is model.get_classifier() is model.model.classifier
    direct = TimmRevViT(preset="revvit-base", num_classes=3, **SMALL)
    assert direct.default_cfg is direct.pretrained_cfg  # built without create_model: the preset's default cfg
    assert direct.pretrained_cfg == timm_revvit.default_cfgs["revvit_base"].default.to_dict()


@pytest.mark.parametrize("name", NAMES)
def test_create_model_matches_the_wrapped_transformers_model(name):
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, **SMALL).eval()
    x = images()
    logits = model(x)
    assert logits.shape == (2, 10)
    assert torch.equal(logits, model.model(x).logits)
    features = model.forward_features(x)
    assert features.shape == (2, 16, model.num_features) and model.num_features == 32  # 16 tokens, two streams
    assert torch.equal(model.forward_head(features), logits)
    pooled = model.forward_head(features, pre_logits=True)
    assert pooled.shape == (2, model.num_features)
    assert torch.equal(pooled, model.model.revvit(x).pooler_output)
    stages = model.get_stages()
    assert len(stages) == 1 + 2 + 1
    value = x
    for stage in stages:
        value = stage(value)
    assert torch.allclose(value, logits, rtol=0, atol=0)


def test_reset_classifier_and_no_head():
    model = timm.create_model("revvit_tiny", num_classes=10, **SMALL).eval()
    x = images()
    model.reset_classifier(5)
    assert model(x).shape == (2, 5) and model.model(x).logits.shape == (2, 5)
    assert model.num_classes == model.model.config.num_labels == 5
    model.reset_classifier(0)
    assert isinstance(model.get_classifier(), torch.nn.Identity)
    assert model(x).shape == (2, model.num_features)
    headless = timm.create_model("revvit_tiny", num_classes=0, **SMALL).eval()
    assert isinstance(headless.get_classifier(), torch.nn.Identity) and headless.num_classes == 0
    assert headless(x).shape == (2, headless.num_features)
    with pytest.raises(ValueError, match="global_pool"):
        model.reset_classifier(3, global_pool="token")


def test_architecture_arguments_and_typos():
    model = timm.create_model("revvit_tiny", num_classes=7, in_chans=1, drop_path_rate=0.1, mlp_ratio=2.0,
                              layer_norm_eps=1e-5, hidden_dropout_prob=0.05, **SMALL)
    config = model.model.config
    assert (config.num_labels, config.num_channels, config.drop_path_rate, config.mlp_ratio) == (7, 1, 0.1, 2.0)
    assert (config.layer_norm_eps, config.hidden_dropout_prob) == (1e-5, 0.05)
    assert model.model.revvit.encoder[-1].drop_path == pytest.approx(0.1)  # stochastic depth, rising to the rate
    assert model.pretrained_cfg["input_size"] == (1, 16, 16)
    with pytest.raises(TypeError, match="hiden_size"):
        timm.create_model("revvit_tiny", hiden_size=16)
    with pytest.raises(TypeError, match="num_classes"):
        timm.create_model("revvit_tiny", num_labels=10)
    with pytest.raises(ValueError, match="global_pool"):
        timm.create_model("revvit_tiny", global_pool="token", **SMALL)
    with pytest.raises(NotImplementedError, match="features_only"):
        timm.create_model("revvit_tiny", features_only=True, **SMALL)
    with pytest.raises(NotImplementedError, match="gradient checkpointing"):
        model.set_grad_checkpointing()
    model.set_grad_checkpointing(False)


def test_img_size_is_image_size():
    small = {key: value for key, value in SMALL.items() if key != "image_size"}
    for img_size in (32, (32, 32)):
        model = timm.create_model("revvit_tiny", img_size=img_size, **small)
        assert model.model.config.image_size == 32 and model.pretrained_cfg["input_size"] == (3, 32, 32)
    assert timm.create_model("revvit_tiny", img_size=16, **SMALL).model.config.image_size == 16
    with pytest.raises(ValueError, match="disagree"):
        timm.create_model("revvit_tiny", img_size=32, **SMALL)
    with pytest.raises(ValueError, match="square"):
        timm.create_model("revvit_tiny", img_size=(32, 16), **small)


def test_parameter_groups_for_layer_decay():
    model = timm.create_model("revvit_tiny", num_classes=10, **SMALL)
    names = dict(model.named_parameters())
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert len(groups) == 1 + 2 + 1  # stem, one per block, the rest (final norm and head)
    assert set(groups[0]) == {name for name in names if name.startswith("model.revvit.embeddings.")}
    assert "model.revvit.embeddings.position_embeddings" in groups[0]
    assert all(name.startswith("model.revvit.encoder.1.") for name in groups[2])
    assert model.no_weight_decay() <= set(names)


def test_pretrained_without_weights_fails_clearly():
    with pytest.raises(RuntimeError, match="no pretrained weights are published"):
        timm.create_model("revvit_small", pretrained=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        timm.create_model("revvit_small", pretrained=True, pretrained_cfg_overlay=dict(file="/no/model.safetensors"))


@pytest.mark.parametrize("name", NAMES)
def test_pretrained_from_a_transformers_checkpoint(tmp_path, name):
    reference = small_revvit(name, dtype=torch.float32, **SMALL).eval()
    reference.save_pretrained(tmp_path)
    file = str(tmp_path / "model.safetensors")
    x = images()

    model = timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=file), **SMALL).eval()
    assert model.num_classes == 10  # read from the file
    assert torch.equal(model(x), reference(x).logits)

    # a different head: the backbone is loaded, the classifier is new
    model = timm.create_model(name, pretrained=True, num_classes=3, pretrained_cfg_overlay=dict(file=file),
                              **SMALL).eval()
    assert model(x).shape == (2, 3)
    assert torch.equal(model.forward_features(x), reference.revvit(x).last_hidden_state)


@pytest.mark.parametrize("layout", ["timm", "bare RevViTModel"])
def test_pretrained_from_other_checkpoints(tmp_path, layout):
    torch.manual_seed(1)
    reference = timm.create_model("revvit_small", num_classes=10, **SMALL).eval()
    if layout == "timm":
        state_dict = {key: value.contiguous() for key, value in reference.state_dict().items()}
        save_file(state_dict, tmp_path / "w.safetensors")
    else:
        reference.model.revvit.save_pretrained(tmp_path)
    [file] = tmp_path.glob("*.safetensors")
    model = timm.create_model("revvit_small", pretrained=True, num_classes=10,
                              pretrained_cfg_overlay=dict(file=str(file)), **SMALL).eval()
    x = images()
    assert torch.equal(model.forward_features(x), reference.forward_features(x))
    if layout == "timm":
        assert torch.equal(model(x), reference(x))


def test_pretrained_with_the_convolutional_stem_takes_its_input_channels_from_the_file(tmp_path):
    """A one-channel model with the convolutional stem: timm reads the channels from the stem's first convolution,
    as from the patchify one, and the loaded model equals the saved one."""
    reference = small_revvit("revvit_tiny", dtype=torch.float32, num_channels=1, conv_stem=True, **SMALL).eval()
    reference.save_pretrained(tmp_path)
    model = timm.create_model("revvit_tiny", pretrained=True, conv_stem=True,
                              pretrained_cfg_overlay=dict(file=str(tmp_path / "model.safetensors")), **SMALL).eval()
    assert model.pretrained_cfg["input_size"][0] == 1
    x = torch.randn(2, 1, 16, 16)
    assert torch.equal(model(x), reference(x).logits)
