"""The RevNet models as Hugging Face models: sizes, stage layouts, saving and loading, remote code, pipeline,
input checking, losses and hidden states."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as functional
import transformers
from PIL import Image
from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

from petra_hub import RevNetConfig, RevNetForImageClassification, RevNetModel
from petra_hub.models.revnet import RevNetHead, RevNetStem
from petra_hub.testing.models import PAPER_LAYOUTS, random_images, small_config, small_model
from tests.models import remote_checks

PRESETS = ["revnet18", "revnet34", "revnet50", "revnet101"]
# Table of the paper (ImageNet, 1000 classes), in millions of parameters.
PAPER_PARAMETERS = {"revnet18": 12.2, "revnet34": 22.3, "revnet50": 30.4, "revnet101": 49.4}
PAPER_STAGES = {"revnet18": 10, "revnet34": 18, "revnet50": 18, "revnet101": 35}
DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def build_on_meta(config: RevNetConfig) -> RevNetForImageClassification:
    """Build a model without allocating (or initialising) its weights."""
    with torch.device("meta"):
        model = RevNetForImageClassification(config)
    assert next(model.parameters()).device.type == "meta"
    return model


def layout(model: RevNetForImageClassification) -> str:
    """S stem, R reversible, D non-reversible block, H head."""
    letters = []
    for stage in model.get_stages():
        if isinstance(stage, RevNetStem):
            letters.append("S")
        elif isinstance(stage, RevNetHead):
            letters.append("H")
        else:
            letters.append("R" if stage.reversible else "D")
    return "".join(letters)


def trained_statistics(model: RevNetForImageClassification, images: torch.Tensor) -> None:
    """Move the batch-norm running statistics away from their initial values, then switch to eval mode."""
    model.train()
    with torch.no_grad():
        for step in range(3):
            model(images + step)
    model.eval()


def realigned(model: torch.nn.Module) -> torch.nn.Module:
    """Copy every parameter and buffer into a fresh (allocator-aligned) tensor.

    Weights loaded from a memory-mapped safetensors file can sit at addresses that are only 8-byte aligned; the
    CPU convolution kernels then take another vectorised path and round differently (last bit), although the
    weights are bit-identical. Fresh copies make the comparison of logits bit-exact again.
    """
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.data = tensor.data.clone()
    return model


def buffers_of(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(model.named_buffers())


# 1. Sizes -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
def test_imagenet_parameter_counts_match_the_paper(preset):
    model = build_on_meta(RevNetConfig.from_preset(preset, stem="imagenet", num_labels=1000))
    count = sum(parameter.numel() for parameter in model.parameters()) / 1e6
    assert count == pytest.approx(PAPER_PARAMETERS[preset], rel=0.01), f"{preset}: {count:.3f}M parameters"
    # The classifier reads both streams of the last layer.
    assert model.classifier.in_features == 2 * model.config.hidden_sizes[-1]
    assert model.classifier.out_features == 1000


def test_meta_construction_counts_the_same_as_a_real_one():
    config = RevNetConfig.from_preset("revnet18", stem="imagenet", num_labels=1000)
    real = RevNetForImageClassification(config)
    meta = build_on_meta(config)
    assert [(name, p.shape) for name, p in real.named_parameters()] == [
        (name, p.shape) for name, p in meta.named_parameters()
    ]
    assert sum(p.numel() for p in real.parameters()) == 12_211_048


# 2. Stage layouts ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
def test_stage_layouts_match_the_paper(preset):
    model = build_on_meta(RevNetConfig.from_preset(preset, stem="imagenet", num_labels=1000))
    assert layout(model) == PAPER_LAYOUTS[preset]
    assert len(model.get_stages()) == PAPER_STAGES[preset]
    # The head shares its modules with the model: the stages hold exactly the model's parameters.
    stage_parameters = {id(p) for stage in model.get_stages() for p in stage.parameters()}
    assert stage_parameters == {id(p) for p in model.parameters()}


@pytest.mark.parametrize("preset", PRESETS)
def test_invertible_downsampling_makes_every_block_reversible(preset):
    model = build_on_meta(
        RevNetConfig.from_preset(preset, stem="imagenet", num_labels=1000, downsampling="invertible")
    )
    assert layout(model) == "S" + "R" * (PAPER_STAGES[preset] - 2) + "H"


# 3. save_pretrained / from_pretrained ----------------------------------------------------------------------------


def save_trained_model(folder):
    """A small float64 model with trained running statistics saved to `folder`; the model, an input and its logits."""
    model = small_model("revnet18")
    images = random_images(model.config)
    trained_statistics(model, images)
    assert int(model.revnet.embedder.layers[1].num_batches_tracked) == 3
    model.save_pretrained(folder)
    with torch.no_grad():
        logits = model(images).logits
    return model, images, logits


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A small float64 model with trained running statistics, saved to a folder, and an input."""
    folder = tmp_path_factory.mktemp("revnet18")
    model, images, logits = save_trained_model(folder)
    return folder, model, images, logits


def test_save_pretrained_writes_safetensors_and_config(saved):
    folder, model, _, _ = saved
    names = set(os.listdir(folder))
    assert {"config.json", "model.safetensors"} <= names
    assert not any(name.endswith(".bin") for name in names)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "revnet"
    assert config["architectures"] == ["RevNetForImageClassification"]
    assert config["depths"] == [2, 2, 2, 2] and config["hidden_sizes"] == [4, 8, 8, 8]
    # Every parameter and every buffer (running statistics included) is in the file.
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", framework="pt") as handle:
        assert set(handle.keys()) == set(model.state_dict())


def test_from_pretrained_gives_identical_weights_statistics_and_logits(saved):
    folder, model, images, logits = saved
    loaded = RevNetForImageClassification.from_pretrained(folder)
    assert not loaded.training
    assert loaded.dtype == torch.float64
    expected, actual = model.state_dict(), loaded.state_dict()
    assert set(actual) == set(expected)
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name
    for name, buffer in buffers_of(model).items():
        assert torch.equal(buffers_of(loaded)[name], buffer), name
    assert int(loaded.revnet.embedder.layers[1].num_batches_tracked) == 3
    with torch.no_grad():
        # Bit-identical weights; only the memory alignment of the loaded tensors can move the last bit.
        assert torch.allclose(loaded(images).logits, logits, rtol=0, atol=1e-13)
        assert torch.equal(realigned(loaded)(images).logits, logits)


def test_auto_classes_load_the_saved_folder(saved):
    folder, model, images, logits = saved
    config = AutoConfig.from_pretrained(folder)
    assert type(config) is RevNetConfig
    fields = ("block_type", "depths", "hidden_sizes", "embedding_size", "stem", "downsampling", "layer_strides")
    assert {f: getattr(config, f) for f in fields} == {f: getattr(model.config, f) for f in fields}
    assert config.num_labels == 10 and config.id2label == model.config.id2label
    classifier = AutoModelForImageClassification.from_pretrained(folder)
    assert type(classifier) is RevNetForImageClassification
    with torch.no_grad():
        assert torch.equal(realigned(classifier)(images).logits, logits)
    backbone = AutoModel.from_pretrained(folder)
    assert type(backbone) is RevNetModel
    with torch.no_grad():
        pooled = realigned(backbone)(images).pooler_output.flatten(1)
        assert torch.equal(pooled, model.revnet(images).pooler_output.flatten(1))
        # The backbone and the classifier's linear layer give back the classifier's logits.
        assert torch.allclose(model.classifier(pooled), logits, rtol=0, atol=1e-13)


# 4. trust_remote_code without petra_hub ---------------------------------------------------------------------------


def remote_folder(folder):
    """What the interpreter without petra_hub loads (tests/models/remote_checks.py): the model of `saved`, built and
    saved the same way, with its input and its logits."""
    _, images, logits = save_trained_model(folder)
    return remote_checks.RemoteLoad("AutoModelForImageClassification", inputs=images, expected=logits)


remote_checks.register("revnet_classifier", remote_folder)


def test_trust_remote_code_loads_without_petra_hub(tmp_path_factory):
    outcome = remote_checks.outcome("revnet_classifier", tmp_path_factory)
    folder, logits = outcome.folder, outcome.expected
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"] == {
        "AutoConfig": "configuration_revnet.RevNetConfig",
        "AutoModel": "modeling_revnet.RevNetModel",
        "AutoModelForImageClassification": "modeling_revnet.RevNetForImageClassification",
    }
    assert (folder / "modeling_revnet.py").is_file() and (folder / "configuration_revnet.py").is_file()
    # The copied modeling code imports only torch, transformers and its configuration file.
    source = (folder / "modeling_revnet.py").read_text()
    assert "petra_hub" not in source.replace('"""', "").split("from __future__")[1]

    assert outcome.error is None, outcome.error
    assert outcome.petra_hub_importable is False
    module, name, config_module = outcome.model_module, outcome.model_class, outcome.config_module
    assert name == "RevNetForImageClassification"
    assert not module.startswith("petra_hub") and module.startswith("transformers_modules")
    assert module.endswith("modeling_revnet") and config_module.endswith("configuration_revnet")
    assert outcome.petra_hub_modules == []
    remote_logits = outcome.output
    assert remote_logits.dtype == torch.float64 and remote_logits.shape == logits.shape
    assert torch.allclose(remote_logits, logits, rtol=0, atol=1e-12)


# 5. pipeline ------------------------------------------------------------------------------------------------------


def test_image_classification_pipeline(tmp_path):
    config = small_config(
        "revnet18", id2label=dict(enumerate(DIGITS)), label2id={label: i for i, label in enumerate(DIGITS)}
    )
    torch.manual_seed(0)
    model = RevNetForImageClassification(config).eval()
    # Give the classifier weights large enough for the scores to differ clearly.
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 1.0)
        model.classifier.bias.normal_(0.0, 1.0)
    processor = transformers.ViTImageProcessor(
        do_resize=True, size={"height": 16, "width": 16}, image_mean=[0.5] * 3, image_std=[0.25] * 3
    )
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    assert (tmp_path / "preprocessor_config.json").is_file()

    classifier = transformers.pipeline("image-classification", model=str(tmp_path))
    assert type(classifier.model) is RevNetForImageClassification
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8), mode="RGB")
    predictions = classifier(image, top_k=4)

    pixel_values = processor(image, return_tensors="pt")["pixel_values"]
    assert pixel_values.shape == (1, 3, 16, 16)
    # The pipeline's own processor (loaded from the folder) prepares the same input.
    piped = classifier.image_processor(image, return_tensors="pt")["pixel_values"]
    assert torch.allclose(pixel_values, piped, atol=1e-5)
    with torch.no_grad():
        probabilities = model(pixel_values).logits.softmax(-1)[0]
    assert float(probabilities.max() - probabilities.min()) > 0.05
    expected = probabilities.sort(descending=True)

    assert len(predictions) == 4
    assert [p["label"] for p in predictions] == [DIGITS[int(i)] for i in expected.indices[:4]]
    assert all(p["label"] in DIGITS for p in predictions)
    scores = torch.tensor([p["score"] for p in predictions], dtype=torch.float32)
    assert torch.allclose(scores, expected.values[:4], atol=1e-5)
    assert scores.tolist() == sorted(scores.tolist(), reverse=True)
    assert predictions[0]["label"] == DIGITS[int(probabilities.argmax())]
    # All ten scores sum to one.
    everything = classifier(image, top_k=10)
    assert sorted(p["label"] for p in everything) == sorted(DIGITS)
    assert sum(p["score"] for p in everything) == pytest.approx(1.0, abs=1e-5)


# 6. Bad inputs and configurations ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    model = small_model("revnet18").eval()
    return model, random_images(model.config)


def test_pixel_values_must_be_4d(tiny):
    model, images = tiny
    with pytest.raises(ValueError, match=r"4-D tensor \[batch, 3, height, width\], got \(3, 8, 8\)"):
        model(images[0])


def test_pixel_values_need_the_configured_channels(tiny):
    model, images = tiny
    with pytest.raises(ValueError, match=r"has 1 channels but the model expects config.num_channels=3"):
        model(images[:, :1])


def test_pixel_values_must_be_floating_point(tiny):
    model, images = tiny
    with pytest.raises(ValueError, match=r"floating-point tensor, got torch.int64"):
        model((images * 10).long())
    with pytest.raises(ValueError, match=r"floating-point tensor, got torch.uint8"):
        model(torch.zeros(2, 3, 8, 8, dtype=torch.uint8))


def test_pixel_values_too_small_for_the_imagenet_stem():
    model = small_model("revnet18", stem="imagenet").eval()
    assert model.config.downsampling_factor == 32
    with pytest.raises(ValueError, match=r"8x8 .*'imagenet' stem.* at least 32"):
        model(torch.randn(1, 3, 8, 8, dtype=torch.float64))
    assert model(torch.randn(1, 3, 32, 32, dtype=torch.float64)).logits.shape == (1, 10)
    # Not a multiple is fine for buffered downsampling: the strided convolutions round up.
    assert model(torch.randn(1, 3, 40, 40, dtype=torch.float64)).logits.shape == (1, 10)


def test_pixel_values_must_divide_for_invertible_downsampling():
    model = small_model("revnet18", downsampling="invertible").eval()
    assert model.config.downsampling_factor == 8
    with pytest.raises(ValueError, match=r"12x12 .*'invertible' downsampling: height and width must be multiples of 8"):
        model(torch.randn(1, 3, 12, 12, dtype=torch.float64))
    assert model(torch.randn(1, 3, 16, 16, dtype=torch.float64)).logits.shape == (1, 10)


@pytest.mark.parametrize("bad_label", [10, -1])
def test_labels_out_of_range(tiny, bad_label):
    model, images = tiny
    labels = torch.tensor([0, 1, bad_label, 3])
    low, high = min(0, bad_label), max(3, bad_label)
    message = rf"labels must lie in \[0, 9\] \(config.num_labels=10\), got values in \[{low}, {high}\]"
    with pytest.raises(ValueError, match=message):
        model(images, labels=labels)


def test_labels_must_match_the_batch(tiny):
    model, images = tiny
    with pytest.raises(ValueError, match=r"labels has 3 entries for a batch of 4 images"):
        model(images, labels=torch.tensor([0, 1, 2]))


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"Unknown RevNet preset 'revnet20'; expected one of \['revnet101'"):
        RevNetConfig.from_preset("revnet20")
    # Spelling variants of a known name are accepted.
    assert RevNetConfig.from_preset("RevNet-50").block_type == "bottleneck"


@pytest.mark.parametrize(
    "arguments,message",
    [
        (
            {"depths": [2, 2, 2], "hidden_sizes": [64, 128, 256, 512]},
            r"depths \(3\), hidden_sizes \(4\) .* one entry per layer",
        ),
        ({"block_type": "wide"}, r"block_type must be one of \('basic', 'bottleneck'\), got 'wide'"),
        ({"stem": "mnist"}, r"stem must be one of \('cifar', 'imagenet'\), got 'mnist'"),
        ({"downsampling": "pooling"}, r"downsampling must be one of \('buffered', 'invertible'\), got 'pooling'"),
        (
            {"block_type": "bottleneck", "hidden_sizes": [64, 128, 256, 510]},
            r"bottleneck blocks need hidden_sizes divisible by 4, got \[64, 128, 256, 510\]",
        ),
        ({"depths": [2, 0, 2, 2]}, r"depths must be positive integers, got \[2, 0, 2, 2\]"),
        ({"num_labels": 0}, r"num_labels must be a positive integer \(the number of classes\), got 0"),
        ({"layer_strides": [1, 3, 2, 2]}, r"layer_strides must be 1 or 2"),
    ],
)
def test_inconsistent_configs_are_rejected(arguments, message):
    with pytest.raises(ValueError, match=r"Invalid RevNetConfig: " + message):
        RevNetConfig(**arguments)


# 7. Losses --------------------------------------------------------------------------------------------------------


def test_single_label_loss_is_cross_entropy(tiny):
    model, images = tiny
    labels = torch.tensor([3, 0, 9, 3])
    output = model(images, labels=labels)
    assert output.loss.shape == ()
    assert torch.allclose(output.loss, functional.cross_entropy(output.logits, labels), rtol=0, atol=1e-12)
    assert model.config.problem_type == "single_label_classification"


def test_multi_label_loss_is_bce_with_logits():
    model = small_model("revnet18", problem_type="multi_label_classification").eval()
    images = random_images(model.config)
    labels = (torch.rand(4, 10, generator=torch.Generator().manual_seed(0)) > 0.5).double()
    output = model(images, labels=labels)
    expected = functional.binary_cross_entropy_with_logits(output.logits, labels)
    assert torch.allclose(output.loss, expected, rtol=0, atol=1e-12)
    assert not torch.allclose(output.loss, functional.cross_entropy(output.logits, labels.argmax(-1)), atol=1e-3)


def test_regression_loss_is_mse():
    model = small_model("revnet18", num_labels=1).eval()
    images = random_images(model.config)
    targets = torch.linspace(-1, 1, 4, dtype=torch.float64)
    output = model(images, labels=targets)
    assert output.logits.shape == (4, 1)
    assert torch.allclose(output.loss, functional.mse_loss(output.logits.squeeze(-1), targets), rtol=0, atol=1e-12)


def test_return_dict_false_gives_a_tuple(tiny):
    model, images = tiny
    labels = torch.tensor([1, 2, 3, 4])
    reference = model(images, labels=labels)
    output = model(images, labels=labels, return_dict=False)
    assert isinstance(output, tuple) and len(output) == 2
    loss, logits = output
    assert torch.equal(loss, reference.loss) and torch.equal(logits, reference.logits)
    without_labels = model(images, return_dict=False)
    assert isinstance(without_labels, tuple) and len(without_labels) == 1
    assert torch.equal(without_labels[0], reference.logits)


def test_loss_reaches_every_parameter(tiny):
    model, images = tiny
    model.zero_grad()
    model(images, labels=torch.tensor([1, 2, 3, 4])).loss.backward()
    missing = [name for name, p in model.named_parameters() if p.grad is None]
    assert missing == []
    model.zero_grad()


def test_forward_uses_no_deprecated_config_attribute(tiny, monkeypatch):
    model, images = tiny

    def deprecated(self):
        raise AssertionError("config.use_return_dict is deprecated in transformers 5: read config.return_dict")

    monkeypatch.setattr(RevNetConfig, "use_return_dict", property(deprecated), raising=False)
    assert model(images).logits.shape == (4, 10)
    assert model.revnet(images).pooler_output.shape == (4, 16, 1, 1)


# 8. Hidden states -------------------------------------------------------------------------------------------------


def expected_stream_widths(config: RevNetConfig) -> list[int]:
    """Width of each stream after the stem and after every block."""
    width, widths = config.embedding_size, [config.embedding_size]
    for depth, layer_width, stride in zip(config.depths, config.hidden_sizes, config.layer_strides):
        for index in range(depth):
            if index == 0 and (stride != 1 or width != layer_width):
                if config.downsampling == "buffered":
                    width = layer_width
                elif stride == 2:
                    width *= 4
            widths.append(width)
    return widths


@pytest.mark.parametrize(
    "preset,downsampling",
    [("revnet18", "buffered"), ("revnet50", "buffered"), ("revnet34", "invertible"), ("revnet50", "invertible")],
)
def test_hidden_states_one_per_stage_with_both_streams(preset, downsampling):
    model = small_model(preset, downsampling=downsampling).eval()
    images = random_images(model.config, batch=2)
    output = model(images, output_hidden_states=True)
    stages = len(model.get_stages())
    assert stages == PAPER_STAGES[preset]
    hidden_states = output.hidden_states
    assert len(hidden_states) == stages - 1
    widths = expected_stream_widths(model.config)
    assert [h.shape[1] for h in hidden_states] == [2 * w for w in widths]
    if downsampling == "buffered":
        assert widths[1:] == [w for w, d in zip(model.config.hidden_sizes, model.config.depths) for _ in range(d)]
    # Spatial sizes: 8 after the cifar stem, halved by every stride-2 layer.
    size = images.shape[-1]
    sizes = [size]
    for depth, stride in zip(model.config.depths, model.config.layer_strides):
        size //= stride
        sizes += [size] * depth
    assert [tuple(h.shape[2:]) for h in hidden_states] == [(s, s) for s in sizes]
    # The last hidden state is the backbone's output, and the classifier reads its spatial mean.
    backbone = model.revnet(images, output_hidden_states=True)
    assert torch.equal(backbone.last_hidden_state, hidden_states[-1])
    assert torch.allclose(model.classifier(hidden_states[-1].mean((2, 3))), output.logits, rtol=0, atol=1e-12)
    # Hidden states equal the outputs of the stages run in order (streams concatenated).
    x = images
    for stage, hidden in zip(model.get_stages()[:-1], hidden_states):
        x = stage(x)
        assert torch.equal(torch.cat(x, dim=1), hidden)
    # Off by default; the tuple form appends them after the logits.
    assert model(images).hidden_states is None
    as_tuple = model(images, output_hidden_states=True, return_dict=False)
    assert len(as_tuple) == 2 and len(as_tuple[1]) == stages - 1
