"""The RevNets as timm models (skipped where timm cannot be imported)."""

from __future__ import annotations

import importlib.util
import sys
import warnings

import pytest
import torch

import petra_hub.integrations.timm as timm_models
from petra_hub import RevNetConfig, RevNetForImageClassification
from petra_hub.testing.models import small_model

TINY = dict(stem="cifar", hidden_sizes=[4, 8, 8, 8], embedding_size=4)


@pytest.fixture(scope="module")
def timm():
    module = pytest.importorskip("timm")
    timm_models.register_timm_models()
    return module


def test_module_imports_without_timm(monkeypatch):
    """A fresh copy of the module, with timm unimportable: it imports, and registering says what is missing."""
    monkeypatch.setitem(sys.modules, "timm", None)
    monkeypatch.setitem(sys.modules, "timm.models", None)
    spec = importlib.util.spec_from_file_location("petra_hub._timm_models_probe", timm_models.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert not module.timm_available()
    with pytest.raises(ImportError, match="pip install timm"):
        module.register_timm_models()
    assert module.TimmRevNet(num_classes=3, **TINY).eval()(torch.randn(1, 3, 8, 8)).shape == (1, 3)


def test_models_are_listed_and_registration_is_idempotent(timm):
    assert set(timm.list_models("revnet*")) == set(timm_models.MODEL_NAMES)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # timm warns when a name is registered twice
        assert timm_models.register_timm_models() == []
        assert timm_models.register_timm_models() == []
    assert set(timm.list_models("revnet*")) == set(timm_models.MODEL_NAMES)
    cfg = timm.models.get_pretrained_cfg("revnet50")
    assert (cfg.num_classes, cfg.input_size, cfg.classifier) == (1000, (3, 224, 224), "revnet.classifier")


def test_a_foreign_model_of_the_same_name_is_left_alone(timm, monkeypatch):
    def revnet18(pretrained=False, **kwargs):  # pragma: no cover - never called
        raise AssertionError

    real = timm.models.model_entrypoint
    monkeypatch.setattr(timm.models, "model_entrypoint", lambda name: revnet18 if name == "revnet18" else real(name))
    with pytest.warns(UserWarning, match="already has a model named 'revnet18'"):
        assert timm_models.register_timm_models() == []


def test_create_model_matches_the_wrapped_transformers_model(timm):
    torch.manual_seed(0)
    model = timm.create_model("revnet18", num_classes=10, **TINY).eval()
    assert isinstance(model, timm_models.TimmRevNet)
    assert isinstance(model.revnet, RevNetForImageClassification)
    assert (model.num_classes, model.in_chans, model.revnet.config.stem) == (10, 3, "cifar")
    assert model.pretrained_cfg["input_size"] == (3, 32, 32) and model.default_cfg is model.pretrained_cfg
    images = torch.randn(2, 3, 16, 16)
    logits = model(images)
    assert logits.shape == (2, 10)
    assert torch.equal(logits, model.revnet(images).logits)
    features = model.forward_features(images)
    assert features.shape == (2, model.num_features, 2, 2)
    assert model.forward_head(features, pre_logits=True).shape == (2, model.num_features)
    assert model.get_classifier() is model.revnet.classifier
    stages = model.get_stages()
    assert len(stages) == 10
    streams = stages[0](images)
    for stage in stages[1:]:
        streams = stage(streams)
    assert torch.allclose(streams, logits)


def test_reset_classifier_changes_the_output_width(timm):
    model = timm.create_model("revnet18", num_classes=10, **TINY).eval()
    images = torch.randn(2, 3, 16, 16)
    model.reset_classifier(5)
    assert model(images).shape == (2, 5)
    assert model.revnet(images).logits.shape == (2, 5)
    assert model.num_classes == model.revnet.config.num_labels == 5
    model.reset_classifier(0)
    assert model(images).shape == (2, model.num_features)


def test_full_imagenet_revnet18_has_the_parameters_of_the_transformers_model(timm):
    with torch.device("meta"):  # sizes only: no allocation, no initialisation cost
        timm_model = timm.create_model("revnet18")
        reference = RevNetForImageClassification(RevNetConfig.from_preset("revnet18", stem="imagenet",
                                                                          num_labels=1000))
    count = sum(p.numel() for p in timm_model.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) == 12_211_048
    assert timm_model.num_classes == 1000 and timm_model.revnet.config.stem == "imagenet"


def test_config_arguments_and_typos(timm):
    with torch.device("meta"):
        model = timm.create_model("revnet50", num_classes=7, in_chans=1, downsampling="invertible",
                                  hidden_sizes=[8, 8, 16, 16], embedding_size=8)
    config = model.revnet.config
    assert (config.num_labels, config.num_channels, config.downsampling) == (7, 1, "invertible")
    with pytest.raises(TypeError, match="hiden_sizes"):
        timm.create_model("revnet18", hiden_sizes=[4, 8, 8, 8])
    with pytest.raises(TypeError, match="num_classes"):
        timm.create_model("revnet18", num_labels=10)


def test_pretrained_without_weights_fails_clearly(timm):
    with pytest.raises(RuntimeError, match="no pretrained weights are published"):
        timm.create_model("revnet18", pretrained=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        timm.create_model("revnet18", pretrained=True, pretrained_cfg_overlay=dict(file="/no/such/model.safetensors"))


def test_pretrained_from_a_transformers_checkpoint(timm, tmp_path):
    reference = small_model(dtype=torch.float32, **TINY).eval()
    reference.save_pretrained(tmp_path)
    file = str(tmp_path / "model.safetensors")
    images = torch.randn(2, 3, 16, 16)

    model = timm.create_model("revnet18", pretrained=True, pretrained_cfg_overlay=dict(file=file), **TINY).eval()
    assert model.num_classes == 10  # read from the file
    assert torch.equal(model(images), reference(images).logits)

    # a different head: the backbone is loaded, the classifier is new
    model = timm.create_model("revnet18", pretrained=True, num_classes=3, pretrained_cfg_overlay=dict(file=file),
                              **TINY).eval()
    assert model(images).shape == (2, 3)
    assert torch.equal(model.forward_features(images), reference.revnet(images).last_hidden_state)
