"""A configuration (a config.json can claim any size) is refused, naming the key and the cap, before anything is
allocated from it: num_labels before PretrainedConfig builds id2label, layers and blocks by the configuration, and the
parameters the sizes make together by the model, which counts them on the meta device before building anything."""

import importlib
import json
import time

import pytest
import torch
from transformers import AutoConfig

import petra_hub  # noqa: F401 - registers the model types
from petra_hub.data.sources import MAX_CLASSES
from petra_hub.models import loading_checks
from petra_hub.models.revnet import RevNetConfig, RevNetForImageClassification, RevNetModel, configuration_revnet
from petra_hub.models.revvit import RevViTConfig, RevViTForImageClassification, RevViTModel


def _parameters(model_class, config) -> int:
    """The parameters of model_class(config), built on the meta device without the size check."""
    checks = importlib.import_module(model_class.__module__.rsplit(".", 1)[0] + ".loading_checks")  # the family's copy
    checks._counting.active = True
    try:
        with torch.device("meta"):
            model = model_class(config)
    finally:
        checks._counting.active = False
    return sum(p.numel() for p in model.parameters())


def test_the_label_caps_are_the_data_sets_class_cap():
    from petra_hub.models import loading_checks

    assert loading_checks.MAX_LABELS == MAX_CLASSES == 100_000  # one cap, which both families' configs import


@pytest.mark.parametrize("config_class", [RevNetConfig, RevViTConfig])
def test_num_labels_beyond_the_cap_is_refused_before_id2label_is_built(config_class):
    started = time.perf_counter()
    with pytest.raises(ValueError, match=rf"^Invalid {config_class.__name__}: num_labels makes 10,000,000 classes, "
                                         r"more than the cap of 100,000$"):
        config_class(num_labels=10_000_000)
    assert time.perf_counter() - started < 1.0  # building 10 million labels took 80 s
    with pytest.raises(ValueError, match=r"id2label makes 100,001 classes, more than the cap of 100,000"):
        config_class(id2label={i: str(i) for i in range(100_001)})
    assert config_class(num_labels=100_000).num_labels == 100_000


def test_a_saved_config_json_with_huge_num_labels_is_refused_by_autoconfig(tmp_path):
    saved = RevNetConfig().to_dict()
    del saved["id2label"], saved["label2id"]
    saved["num_labels"] = 10_000_000
    (tmp_path / "config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="num_labels makes 10,000,000 classes, more than the cap of 100,000"):
        AutoConfig.from_pretrained(tmp_path)


def test_revnet_widths_depths_and_layers_beyond_the_caps():
    with pytest.raises(ValueError, match=r"depths \[100000000, 2\] make 100,000,002 blocks, more than the cap of "
                                         r"10,000$"):
        RevNetConfig(depths=[100_000_000, 2], hidden_sizes=[8, 8])
    with pytest.raises(ValueError, match=r"depths has 65 entries \(one per layer\), more than the cap of 64 layers"):
        RevNetConfig(depths=[1] * 65, hidden_sizes=[8] * 65)
    wide = RevNetConfig(hidden_sizes=[100_000] * 4)  # the model, not the configuration, counts parameters
    count = _parameters(RevNetForImageClassification, wide)
    for model_class in (RevNetForImageClassification, RevNetModel):
        with pytest.raises(ValueError, match=r"hidden_sizes \[100000, 100000, 100000, 100000\], embedding_size 64, "
                                             r"num_channels 3 \(buffered downsampling\) and 2 labels make "
                                             r"1,380,\d{3},\d{3},\d{3} parameters, more than the cap of "
                                             r"2,000,000,000$"):
            model_class(wide)
    with pytest.raises(ValueError, match=f"make {count:,} parameters"):  # the model's own count
        RevNetForImageClassification(wide)
    with pytest.raises(ValueError, match=r"make [\d,]+ parameters, more than the cap"):  # streams 4x wider
        RevNetForImageClassification(RevNetConfig(embedding_size=8192, downsampling="invertible",
                                                  hidden_sizes=[512] * 4))  # per stride-2 layer


def test_revvit_sizes_beyond_the_caps():
    with pytest.raises(ValueError, match=r"^Invalid RevViTConfig: num_hidden_layers=10,001 is more than the cap of "
                                         r"10,000$"):
        RevViTConfig(num_hidden_layers=10_001)
    with pytest.raises(ValueError, match=r"image_size 65536, patch_size 1, .* make [\d,]+ parameters, more "
                                         r"than the cap of 2,000,000,000$"):
        RevViTForImageClassification(RevViTConfig(image_size=65_536, patch_size=1))  # 4 billion positions per width
    with pytest.raises(ValueError, match=r"an MLP width of 38400000 .* parameters, more than the cap"):
        RevViTModel(RevViTConfig(mlp_ratio=100_000.0))


def test_the_cap_counts_no_model_that_fits_it():
    for preset in configuration_revnet.PRESETS:
        config = RevNetConfig.from_preset(preset, num_labels=1000, stem="imagenet")
        assert RevNetForImageClassification(config).num_parameters() == _parameters(RevNetForImageClassification,
                                                                                     config)
    largest = RevViTConfig.from_preset("revvit-base", num_labels=1000)
    assert _parameters(RevViTForImageClassification, largest) < loading_checks.MAX_PARAMETERS


def test_bad_types_are_still_validate_architectures_to_name():
    with pytest.raises(ValueError, match="depths must be positive"):
        RevNetConfig(depths=[2, "x", 2, 2])
    with pytest.raises(ValueError, match="hidden_size must be a positive integer, got 'big'"):
        RevViTConfig(hidden_size="big")


# Sizes given as bools or floats: `isinstance(True, int)` holds and `2.0 in (1, 2)` too; validate_architecture refuses
# them (with num_hidden_layers=True, the sizes below would make 12,000,791,000,002 parameters).
HUGE_REVNET = {"hidden_sizes": [8, 1_000_000], "embedding_size": 8}


@pytest.mark.parametrize("key, value, message", [
    ("depths", [1, True], r"depths must be positive integers, got \[1, True\]"),
    ("layer_strides", [1, 2.0], r"layer_strides must be 1 or 2 \(integers\), got \[1, 2.0\]"),
    ("layer_strides", [1, True], r"layer_strides must be 1 or 2 \(integers\), got \[1, True\]"),
    ("embedding_size", 8.0, r"embedding_size must be a positive integer, got 8.0"),
    ("num_channels", True, r"num_channels must be a positive integer, got True"),
])
def test_revnet_sizes_as_bools_or_floats_are_refused(key, value, message):
    arguments = {"depths": [1, 1], "layer_strides": [1, 2], **HUGE_REVNET, key: value}
    with pytest.raises(ValueError, match=r"^Invalid RevNetConfig: " + message + "$"):
        RevNetConfig.from_dict({"model_type": "revnet", **arguments})
    with pytest.raises(ValueError, match=message):
        RevNetConfig(**arguments)


@pytest.mark.parametrize("key, value, message", [
    ("num_hidden_layers", True, "num_hidden_layers must be a positive integer, got True"),
    ("num_channels", True, "num_channels must be a positive integer, got True"),
    ("image_size", 16.0, "image_size must be a positive integer, got 16.0"),
])
def test_revvit_sizes_as_bools_or_floats_are_refused(key, value, message):
    arguments = {"image_size": 16, "patch_size": 16, "hidden_size": 1_000_000, "num_attention_heads": 1,
                 "num_hidden_layers": 1, key: value}  # with num_hidden_layers=True: 12,000,791,000,002 parameters
    with pytest.raises(ValueError, match=r"^Invalid RevViTConfig: " + message + "$"):
        RevViTConfig.from_dict({"model_type": "revvit", **arguments})


@pytest.mark.parametrize("ratio, width", [(1.5e9, "1500000000"), (2e9, "2000000000"), (1e12, "1000000000000")])
def test_revvit_mlp_ratio_has_no_way_around_the_cap(ratio, width):
    config = RevViTConfig.from_dict({"model_type": "revvit", "image_size": 16, "patch_size": 16, "hidden_size": 1,
                                     "num_hidden_layers": 1, "num_attention_heads": 1, "mlp_ratio": ratio})
    count = _parameters(RevViTForImageClassification, config)
    with pytest.raises(ValueError, match=rf"an MLP width of {width} and 2 labels make {count:,} "
                                         r"parameters, more than the cap of 2,000,000,000$"):
        RevViTForImageClassification(config)
    config = RevViTConfig(image_size=16, patch_size=16, hidden_size=1, num_hidden_layers=1, num_attention_heads=1,
                          mlp_ratio=1000.0)
    assert RevViTForImageClassification(config).num_parameters() < 10_000  # a large ratio within the cap is taken


def test_the_model_counts_the_sizes_set_after_the_configuration_checked_itself():
    """Values set after __init__ (from_pretrained's overrides) are checked by the model before it builds anything."""
    config = RevNetConfig(depths=[1, 1], hidden_sizes=[8, 16], embedding_size=8)
    config.hidden_sizes = [8, 1_000_000]
    with pytest.raises(ValueError, match=r"hidden_sizes \[8, 1000000\], .* make 9,000,0[\d,]+ parameters, more "
                                         r"than the cap of 2,000,000,000$"):
        RevNetForImageClassification(config)
    vit = RevViTConfig(image_size=16, patch_size=16, hidden_size=1, num_hidden_layers=1, num_attention_heads=1)
    vit.mlp_ratio = 2e9
    with pytest.raises(ValueError, match=r"an MLP width of 2000000000 .* more than the cap of 2,000,000,000$"):
        RevViTForImageClassification(vit)


def _edited_folder(tmp_path, model, changes: dict, keep: str):
    """A saved model whose config.json claims `changes`, with only the weights starting with `keep` in its file (as
    a crafted upload would: the loader allocates what the file lacks)."""
    from safetensors.torch import load_file, save_file

    model.save_pretrained(tmp_path)
    content = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**content, **changes}))
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if k.startswith(keep)}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    return tmp_path


@pytest.mark.parametrize("changes, message", [
    ({"depths": [1, True], "hidden_sizes": [8, 1_000_000]}, r"depths must be positive integers, got \[1, True\]"),
    ({"layer_strides": [1, 2.0], "hidden_sizes": [8, 1_000_000]},
     r"layer_strides must be 1 or 2 \(integers\), got \[1, 2.0\]"),
])
def test_from_pretrained_refuses_a_revnet_config_json_before_allocating(tmp_path, changes, message):
    from transformers import AutoModelForImageClassification

    model = RevNetForImageClassification(RevNetConfig(depths=[1, 1], hidden_sizes=[8, 16], embedding_size=8))
    folder = _edited_folder(tmp_path, model, changes, keep="revnet.embedder")
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"^Invalid RevNetConfig: " + message):
        AutoModelForImageClassification.from_pretrained(folder)
    assert time.perf_counter() - started < 2.0


@pytest.mark.parametrize("changes, message", [
    ({"mlp_ratio": 1e12}, r"image_size 16, .* an MLP width of 1000000000000 and 2 labels make [\d,]+ parameters"),
    ({"hidden_size": 1_000_000, "num_hidden_layers": True}, "num_hidden_layers must be a positive integer, got True"),
])
def test_from_pretrained_refuses_a_revvit_config_json_before_allocating(tmp_path, changes, message):
    from transformers import AutoModelForImageClassification

    model = RevViTForImageClassification(RevViTConfig(image_size=16, patch_size=16, hidden_size=1,
                                                      num_hidden_layers=1, num_attention_heads=1))
    folder = _edited_folder(tmp_path, model, changes, keep="revvit.embeddings")
    started = time.perf_counter()
    with pytest.raises(ValueError, match=r"^Invalid RevViTConfig: " + message):
        AutoModelForImageClassification.from_pretrained(folder)
    assert time.perf_counter() - started < 2.0
