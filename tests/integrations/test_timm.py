"""The RevNets as timm models."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import timm
import torch
from safetensors.torch import save_file

import petra_hub.integrations.timm as timm_models
from petra_hub import RevNetConfig, RevNetForImageClassification
from petra_hub.data import dataset_spec
from petra_hub.testing.models import small_model

TINY = dict(stem="cifar", hidden_sizes=[4, 8, 8, 8], embedding_size=4)


def run_python(code: str) -> None:
    """Run `code` in a fresh interpreter (so that nothing this test process imported counts)."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


# What a fresh interpreter imports. Starting one takes seconds, so both checks share one, in this order: the first
# leaves timm unloaded (it checks that), so the second still finds no model registered with timm and imports timm and
# the module that registers the models itself.
FRESH_CHECKS = {
    "the rest of petra_hub does not import timm": """
        import sys
        import petra_hub.engine
        assert "timm" not in sys.modules
        import petra_hub.integrations.hub, petra_hub.integrations.model_card
        assert "timm" not in sys.modules
    """,
    "importing the module registers the models": """
        import warnings
        import timm
        assert not timm.list_models("revnet*")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import petra_hub.integrations.timm as timm_models
        assert not [w for w in caught if "Overwriting" in str(w.message)]  # timm's word for a name registered twice
        assert sorted(timm.list_models("revnet*")) == sorted(timm_models.MODEL_NAMES)
        assert timm_models.MODEL_NAMES == ("revnet18", "revnet34", "revnet50", "revnet101")
        for name in timm_models.MODEL_NAMES:
            assert timm.models.is_model(name)
            assert timm.models.model_entrypoint(name) is getattr(timm_models, name)
    """,
}

# Runs the checks (JSON, argv[1]) in order, each in a namespace of its own, and prints a line [check, traceback or
# None] after each; after a check fails it stops, as the next ones would not find the interpreter they expect.
CHECK_RUNNER = """
import json, linecache, sys, textwrap, traceback

for check, source in json.loads(sys.argv[1]).items():
    source, filename = textwrap.dedent(source), f"<{check}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    try:
        exec(compile(source, filename, "exec"), {"__name__": "__main__"})
    except BaseException:
        print("OUTCOME", json.dumps([check, traceback.format_exc()]), flush=True)
        break
    print("OUTCOME", json.dumps([check, None]), flush=True)
"""


@pytest.fixture(scope="module")
def fresh_checks():
    """{check: traceback, or None when it passed} for the FRESH_CHECKS run in one fresh interpreter; a check that did
    not run there (an earlier one failed) is missing. If the interpreter itself failed, the check it was running
    fails with its stderr (every check, when it failed after the last one)."""
    result = subprocess.run([sys.executable, "-c", CHECK_RUNNER, json.dumps(FRESH_CHECKS)], capture_output=True,
                            text=True, timeout=300)
    outcomes = dict(json.loads(line.removeprefix("OUTCOME ")) for line in result.stdout.splitlines()
                    if line.startswith("OUTCOME "))
    if result.returncode != 0:
        failure = f"the interpreter exited with {result.returncode}:\n{result.stderr[-3000:]}"
        unreported = [check for check in FRESH_CHECKS if check not in outcomes]
        for check in unreported[:1] or [check for check, error in outcomes.items() if error is None]:
            outcomes[check] = failure
    return outcomes


def assert_passes_in_a_fresh_interpreter(check: str, fresh_checks) -> None:
    """The check passed in the shared interpreter; one that did not run there (an earlier check failed) runs alone."""
    if check in fresh_checks:
        assert fresh_checks[check] is None, fresh_checks[check]
    else:
        run_python(FRESH_CHECKS[check])


def test_importing_the_module_registers_the_models(fresh_checks):
    assert_passes_in_a_fresh_interpreter("importing the module registers the models", fresh_checks)


def test_the_rest_of_petra_hub_does_not_import_timm(fresh_checks):
    assert_passes_in_a_fresh_interpreter("the rest of petra_hub does not import timm", fresh_checks)


def test_models_are_listed_with_their_pretrained_cfg():
    assert set(timm.list_models("revnet*")) == set(timm_models.MODEL_NAMES)
    cfg = timm.models.get_pretrained_cfg("revnet50")
    assert (cfg.num_classes, cfg.input_size, cfg.classifier) == (1000, (3, 224, 224), "model.classifier")
    imagenet = dataset_spec("imagenet").info
    assert (cfg.mean, cfg.std) == (imagenet.mean, imagenet.std)
    model = timm_models.TimmRevNet(preset="RevNet-50", num_classes=3, hidden_sizes=[8, 8, 16, 16], embedding_size=8)
    assert model.default_cfg is model.pretrained_cfg  # built without create_model: the preset's default cfg
    assert model.pretrained_cfg == timm_models.default_cfgs["revnet50"].default.to_dict()
    assert model.pretrained_cfg["first_conv"] == "model.revnet.embedder.layers.0"


def test_create_model_matches_the_wrapped_transformers_model():
    torch.manual_seed(0)
    model = timm.create_model("revnet18", num_classes=10, **TINY).eval()
    assert isinstance(model, timm_models.TimmRevNet)
    assert isinstance(model.model, RevNetForImageClassification)
    assert (model.num_classes, model.in_chans, model.model.config.stem) == (10, 3, "cifar")
    assert model.pretrained_cfg["input_size"] == (3, 32, 32) and model.default_cfg is model.pretrained_cfg
    images = torch.randn(2, 3, 16, 16)
    logits = model(images)
    assert logits.shape == (2, 10)
    assert torch.equal(logits, model.model(images).logits)
    features = model.forward_features(images)
    assert features.shape == (2, model.num_features, 2, 2)
    assert model.forward_head(features, pre_logits=True).shape == (2, model.num_features)
    assert model.get_classifier() is model.model.classifier
    stages = model.get_stages()
    assert len(stages) == 10
    streams = stages[0](images)
    for stage in stages[1:]:
        streams = stage(streams)
    assert torch.allclose(streams, logits)


def test_reset_classifier_changes_the_output_width():
    model = timm.create_model("revnet18", num_classes=10, **TINY).eval()
    images = torch.randn(2, 3, 16, 16)
    model.reset_classifier(5)
    assert model(images).shape == (2, 5)
    assert model.model(images).logits.shape == (2, 5)
    assert model.num_classes == model.model.config.num_labels == 5
    model.reset_classifier(0)
    assert model(images).shape == (2, model.num_features)


def test_full_imagenet_revnet18_has_the_parameters_of_the_transformers_model():
    with torch.device("meta"):  # sizes only: no allocation, no initialisation cost
        timm_model = timm.create_model("revnet18")
        reference = RevNetForImageClassification(RevNetConfig.from_preset("revnet18", stem="imagenet",
                                                                          num_labels=1000))
    count = sum(p.numel() for p in timm_model.parameters())
    assert count == sum(p.numel() for p in reference.parameters()) == 12_211_048
    assert timm_model.num_classes == 1000 and timm_model.model.config.stem == "imagenet"


def test_config_arguments_and_typos():
    with torch.device("meta"):
        model = timm.create_model("revnet50", num_classes=7, in_chans=1, downsampling="invertible",
                                  hidden_sizes=[8, 8, 16, 16], embedding_size=8)
    config = model.model.config
    assert (config.num_labels, config.num_channels, config.downsampling) == (7, 1, "invertible")
    with pytest.raises(TypeError, match="hiden_sizes"):
        timm.create_model("revnet18", hiden_sizes=[4, 8, 8, 8])
    with pytest.raises(TypeError, match="num_classes"):
        timm.create_model("revnet18", num_labels=10)


def test_pretrained_without_weights_fails_clearly():
    with pytest.raises(RuntimeError, match="no pretrained weights are published"):
        timm.create_model("revnet18", pretrained=True)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        timm.create_model("revnet18", pretrained=True, pretrained_cfg_overlay=dict(file="/no/such/model.safetensors"))


def test_pretrained_from_a_transformers_checkpoint(tmp_path):
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


def test_state_dict_keys_name_the_wrapped_model_once():
    model = timm.create_model("revnet18", num_classes=10, **TINY)
    keys = list(model.state_dict())
    assert keys[0].startswith("model.revnet.embedder.") and "model.classifier.weight" in keys
    assert not any(key.startswith("revnet.") for key in keys)
    assert all(key.startswith(("model.revnet.", "model.classifier.")) for key in keys)
    cfg = model.pretrained_cfg
    assert isinstance(model.get_submodule(cfg["first_conv"]), torch.nn.Conv2d)
    assert model.get_submodule(cfg["classifier"]) is model.get_classifier()
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert len(groups) == 1 + len(model.model.revnet.encoder) + 1  # stem, one per block, the rest (the head)
    assert set(groups[0]) == {name for name in dict(model.named_parameters()) if ".embedder." in name}


def test_key_converter_accepts_every_layout():
    reference = small_model(dtype=torch.float32, **TINY)
    timm_keys = {f"model.{key}": value for key, value in reference.state_dict().items()}
    layouts = {
        "timm": timm_keys,
        "transformers": reference.state_dict(),
        "bare RevNetModel": reference.revnet.state_dict(),
    }
    for layout, state_dict in layouts.items():
        converted = timm_models._to_timm_keys(state_dict)
        expected = {key: value for key, value in timm_keys.items() if not key.startswith("model.classifier.")
                    or layout != "bare RevNetModel"}
        assert converted.keys() == expected.keys(), layout


@pytest.mark.parametrize("layout", ["timm", "bare RevNetModel"])
def test_pretrained_from_other_checkpoints(tmp_path, layout):
    torch.manual_seed(1)
    reference = timm.create_model("revnet18", num_classes=10, **TINY).eval()
    if layout == "timm":
        save_file(
            {key: value.contiguous() for key, value in reference.state_dict().items()}, tmp_path / "w.safetensors"
        )
    else:
        reference.model.revnet.save_pretrained(tmp_path)
    [file] = tmp_path.glob("*.safetensors")
    model = timm.create_model("revnet18", pretrained=True, num_classes=10, pretrained_cfg_overlay=dict(file=str(file)),
                              **TINY).eval()
    images = torch.randn(2, 3, 16, 16)
    assert torch.equal(model.forward_features(images), reference.forward_features(images))
    if layout == "timm":
        assert torch.equal(model(images), reference(images))


def test_cifar_stem_describes_small_inputs():
    with torch.device("meta"):
        model = timm.create_model("revnet18", in_chans=1, layer_strides=[1, 1, 2, 2], **TINY)
    assert model.pretrained_cfg["input_size"] == (1, 32, 32)
    assert model.pretrained_cfg["pool_size"] == (8, 8)
    assert model.pretrained_cfg["crop_pct"] == 1.0
