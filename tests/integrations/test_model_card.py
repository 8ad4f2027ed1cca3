"""Model cards: metadata, body, custom templates, and where their words come from."""

from __future__ import annotations

import pytest
from huggingface_hub import ModelCard

from petra_hub.data import dataset_spec
from petra_hub.engine.modes import Mode
from petra_hub.integrations.model_card import (
    NOT_RECORDED,
    TAGS,
    TrainingSummary,
    card_data_for,
    default_template_path,
    render_model_card,
    write_model_card,
)
from petra_hub.integrations.model_card_text import markdown_text
from petra_hub.models import RevNetConfig
from petra_hub.models.revnet import REVNET
from petra_hub.models.revvit import REVVIT

REPO_ID = "user/revnet-test"


def full_summary(**overrides) -> TrainingSummary:
    values = dict(
        model_name="revnet18-cifar10-petra",
        preset="revnet18",
        dataset="cifar10",
        dataset_id="uoft-cs/cifar10",
        mode="petra",
        num_stages=10,
        accumulation_steps=4,
        num_processes=10,
        epochs=200,
        micro_batch_size=64,
        learning_rate=0.1,
        hardware="8x H100 (NCCL)",
        eval_accuracy=0.9137,
        eval_loss=0.3012,
        num_parameters=12_211_048,
        extra={"stem": "cifar", "warm-up": None},
    )
    values.update(overrides)
    return TrainingSummary(**values)


def test_card_metadata_and_body_round_trip(tmp_path):
    summary = full_summary()
    path = write_model_card(tmp_path, summary, repo_id=REPO_ID)
    assert path == tmp_path / "README.md"
    card = ModelCard.load(path)
    data = card.data
    assert data.license == "apache-2.0"
    assert data.library_name == "transformers"
    assert data.pipeline_tag == "image-classification"
    assert data.tags == TAGS + list(REVNET.card_tags)
    assert data.datasets == ["uoft-cs/cifar10"]
    assert data.model_name == summary.model_name
    [result] = data.eval_results
    assert (result.task_type, result.metric_type) == ("image-classification", "accuracy")
    assert result.metric_value == pytest.approx(0.9137, abs=0)
    assert result.dataset_type == "uoft-cs/cifar10"
    assert card.data.to_dict()["model-index"][0]["name"] == summary.model_name

    body = card.text
    architecture = (
        "RevNet-18 (revnet18): basic blocks in layers of 2/2/2/2 (8 blocks), widths 64/128/256/512 per stream"
    )
    for needle in (architecture, "`petra`", "Pipeline stages (J) | 10", "Accumulation steps (k) | 4", "Processes | 10",
                   "RevNet-18", "revnet18", "91.37 %", "12,211,048", r"8x H100 \(NCCL\)", "| stem | cifar |",
                   f"| warm-up | {NOT_RECORDED} |", f'from_pretrained("{REPO_ID}")', "trust_remote_code=True",
                   'pipeline("image-classification"', "@inproceedings{rivaud2025petra",
                   "Parallel End-to-end Training with Reversible Architectures", "2406.02052"):
        assert needle in body, needle
    assert "None" not in card.content


def test_the_card_says_how_to_get_petra_hub_without_pypi():
    """petra_hub is not on PyPI: the card points at its source, never at `pip install petra_hub`; the
    trust_remote_code route needs no install."""
    body = render_model_card(full_summary()).text
    assert "pip install petra_hub" not in body and "pip install petra-hub" not in body
    assert "petra_hub is not published on PyPI" in body and "`pip install -e .`" in body
    assert "Without petra_hub (nothing to install beyond transformers and torch)" in body


def test_card_without_evaluation_has_no_model_index(tmp_path):
    summary = TrainingSummary(model_name="revnet-digits", preset=None, dataset="digits", mode="backprop")
    card = render_model_card(summary, config=RevNetConfig())
    assert "model-index" not in card.content
    assert "None" not in card.content
    assert NOT_RECORDED in card.text
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert loaded.data.eval_results is None
    assert loaded.data.datasets is None
    assert loaded.data.tags == TAGS + list(REVNET.card_tags)
    assert "`backprop`" in loaded.text and "Pipeline stages (J) | not recorded" in loaded.text


def test_a_summary_refuses_every_accuracy_given_as_a_percentage():
    for overrides in ({"eval_accuracy": 97.5}, {"eval_metrics": {"eval_top_5_accuracy": 99.0}},
                      {"results": [{"epoch": 1, "step": 4, "eval_accuracy": 97.5}]}):
        with pytest.raises(ValueError, match=r"fraction in \[0, 1\]|fractions in \[0, 1\]"):
            full_summary(**overrides).validate()
    with pytest.raises(ValueError, match=r"eval_metrics\['accuracy'\] = 97.5: a card reports accuracies as "
                                         r"fractions in \[0, 1\] \(give 0.975, not 97.5\)"):
        render_model_card(full_summary(eval_accuracy=None, eval_metrics={"accuracy": 97.5}))
    full_summary(eval_metrics={"f1": 91.0, "top_5_accuracy": 0.99}).validate()  # only accuracies are fractions


def test_the_evaluated_split_is_named_as_it_is_or_not_at_all():
    """A split name, what the evaluated data is where it is no split, or nothing: never a made-up "evaluation"."""
    for split, label, published in (("test", "test split", "test"), ("validation[:10%]", r"validation\[:10%\] split",
                                                                     "validation[:10%]"),
                                    ("held-out 15% of train", "held-out 15% of train", "held-out 15% of train"),
                                    (None, "evaluation set", None)):
        card = render_model_card(full_summary(eval_split=split))
        assert f"| Accuracy ({label}) | 91.37 % |" in card.text, split
        assert card.data.eval_results[0].dataset_split == published
        assert "evaluation split" not in card.text and "split: evaluation" not in card.content


def test_card_rejects_inconsistent_summaries():
    with pytest.raises(ValueError, match="fraction"):
        render_model_card(full_summary(eval_accuracy=91.4))
    with pytest.raises(ValueError, match="PETRA mode"):
        render_model_card(full_summary(mode="pipedream"))
    with pytest.raises(ValueError, match="accumulation_steps"):
        render_model_card(full_summary(accumulation_steps=0))


def test_card_from_a_custom_template(tmp_path):
    template = tmp_path / "short.md"
    template.write_text("---\n{{ card_data }}\n---\n\n# {{ model_name }}: {{ mode }}, J={{ num_stages }}\n")
    card = render_model_card(full_summary(num_stages=None), template_path=template)
    assert card.text.strip() == f"# revnet18-cifar10-petra: petra, J={NOT_RECORDED}"
    assert card.data.license == "apache-2.0"


@pytest.mark.parametrize("mode", Mode.names())
def test_mode_words_come_from_the_engine(mode):
    text = render_model_card(full_summary(mode=mode)).text
    assert f"in mode `{mode}`: {Mode.parse(mode).description}" in text


@pytest.mark.parametrize("name", ["digits", "cifar10", "cifar100", "imagenet32", "imagenet"])
def test_dataset_words_come_from_the_data_package(name):
    spec = dataset_spec(name)
    summary = full_summary(dataset=name, dataset_id=spec.hub_id)
    text = render_model_card(summary).text
    assert f"Trained on {spec.description} in mode" in text
    label = f"{spec.description} (`{spec.hub_id}`)" if spec.hub_id else spec.description
    assert f"| Data set | {label} |" in text
    assert f"{spec.info.num_channels}x{spec.info.image_size}x{spec.info.image_size} images" in text
    [result] = card_data_for(summary).eval_results
    assert result.dataset_name == spec.title


def test_unknown_dataset_is_named_as_given():
    summary = full_summary(dataset="my-photos", dataset_id=None)
    card = render_model_card(summary)
    assert "Trained on my-photos in mode" in card.text
    assert "RGB images (see `preprocessor_config.json`)" in card.text
    assert card.data.eval_results[0].dataset_name == "my-photos"


def test_preset_spellings_name_the_same_architecture():
    expected = render_model_card(full_summary(preset="revnet50")).text
    for spelling in ("RevNet-50", "revnet_50", "REVNET50"):
        assert render_model_card(full_summary(preset=spelling)).text == expected
    assert "RevNet-50 (revnet50): bottleneck blocks in layers of 3/4/6/3" in expected
    custom = render_model_card(full_summary(preset="revnet18"), config=RevNetConfig(depths=[1, 1, 1, 1])).text
    assert "a custom RevNet (derived from revnet18)" in custom
    with pytest.raises(ValueError, match="unknown model 'my-net'"):  # a card never guesses the family
        render_model_card(full_summary(preset="my-net"))
    with pytest.raises(ValueError, match="pass config="):
        render_model_card(full_summary(preset=None))


def test_each_family_has_a_packaged_template_extending_the_shared_card():
    shared = default_template_path().parent / "card.md"
    assert "import petra_hub  #" not in shared.read_text()  # registration happens on importing the model classes
    for model_type in ("revnet", "revvit"):
        path = default_template_path(model_type)
        assert path.name == f"{model_type}.md" and path.parent == shared.parent
        assert path.read_text().startswith('{% extends "card.md" %}')
    with pytest.raises(ValueError, match="no model family of model_type 'bert'"):
        default_template_path("bert")


def test_a_revvit_card_names_its_family_everywhere(tmp_path):
    from petra_hub import RevViTConfig

    config = RevViTConfig.from_preset("revvit-small", num_labels=10)
    summary = full_summary(model_name="revvit-small-cifar10-petra", preset="revvit-small", num_stages=14,
                           buffered_stages=2, num_parameters=None)
    text = render_model_card(summary, config=config, repo_id=REPO_ID).text
    assert "built on **RevViT-S**, a reversible vision" in text
    assert ("| Architecture | RevViT-S (revvit-small): 12 reversible transformer blocks, width 384 per stream, 6 "
            "attention heads, MLP 4x, 16x16 patches of 224x224 images (196 tokens) |") in text
    assert "from petra_hub import RevViTForImageClassification" in text and "RevNet" not in text
    assert 'RevViTForImageClassification.from_pretrained("user/revnet-test")' in text
    assert "The patch embedding and the head (2 of this run's 14 pipeline stages) are not reversible" in text
    assert "title     = \"Reversible Vision Transformers\"" in text and "rivaud2025petra" in text
    assert card_data_for(summary, config).tags == TAGS + list(REVVIT.card_tags)
    # without a configuration the preset names the family; a wider model is a custom one
    from_preset = render_model_card(summary).text
    assert "from petra_hub import RevViTForImageClassification" in from_preset
    assert ("| Architecture | RevViT-S (revvit-small): 12 reversible transformer blocks, width 384 per stream, 6 "
            "attention heads, MLP 4x, 16x16 patches of 224x224 images (196 tokens) |") in from_preset
    wide = render_model_card(summary, config=RevViTConfig.from_preset("revvit-small", hidden_size=480)).text
    assert "built on **a custom RevViT (derived from revvit-small)**" in wide


# ---------------------------------------------------------------------------------------------------------------
# what a published card needs: every metric, the run's settings and results, a how-to per data set


def test_a_revvit_card_with_grouped_stages_agrees_with_itself():
    """recipes/configs/digits_revvit_tiny_petra.yaml groups a RevViT-Ti into petra_num_stages=4: the card's J is 4
    everywhere (no "J = depth + 2"), and the mode's words fit any reversible network (no RevNet stem)."""
    from petra_hub import RevViTConfig

    config = RevViTConfig.from_preset("revvit-tiny", image_size=16, patch_size=4, num_labels=10)
    summary = full_summary(model_name="revvit-tiny-digits-petra", preset="revvit-tiny", dataset="digits",
                           dataset_id=None, num_stages=4, buffered_stages=2, num_parameters=None)
    text = render_model_card(summary, config=config).text
    assert "| Pipeline stages (J) | 4 |" in text
    assert "depth + 2" not in text and "(4 in this run:" in text
    assert "the stem" not in text and "shape-changing" not in text
    assert "the stages that are not reversible keep their inputs" in Mode.PETRA.description
    assert "The patch embedding and the head (2 of this run's 4 pipeline stages) are not reversible" in text


def test_learning_rate_zero_is_a_valid_summary():
    assert "| Learning rate | 0 |" in render_model_card(full_summary(learning_rate=0)).text
    assert "| Learning rate | 0 |" in render_model_card(full_summary(learning_rate=0.0)).text
    with pytest.raises(ValueError, match="learning_rate"):
        render_model_card(full_summary(learning_rate=-0.1))
    with pytest.raises(ValueError, match="epochs must be positive"):
        render_model_card(full_summary(epochs=0))
    with pytest.raises(ValueError, match="label_smoothing"):
        render_model_card(full_summary(label_smoothing=1.5))
    with pytest.raises(ValueError, match="global_steps"):
        render_model_card(full_summary(global_steps=-1))


def test_every_metric_is_reported_and_indexed():
    summary = full_summary(eval_metrics={"eval_f1": 0.8812, "top_5_accuracy": 0.99, "eval_runtime": 3.2,
                                         "eval_samples_per_second": 100.0})
    card = render_model_card(summary)
    for row in ("| Accuracy (test split) | 91.37 % |", "| Loss (test split) | 0.3012 |", "| F1 (test split) | 0.8812 |",
                "| Top 5 accuracy (test split) | 99.00 % |"):
        assert row in card.text, row
    assert "runtime" not in card.text.lower() and "per_second" not in card.content
    assert [(r.metric_type, r.metric_value) for r in card.data.eval_results] == [
        ("accuracy", 0.9137), ("f1", 0.8812), ("top_5_accuracy", 0.99)]
    assert card.data.metrics == ["accuracy", "f1", "top_5_accuracy"]
    only_loss = render_model_card(full_summary(eval_accuracy=None))
    assert only_loss.data.eval_results is None and "| Loss (test split) | 0.3012 |" in only_loss.text


def test_hyper_parameters_results_and_versions():
    summary = full_summary(
        optimizer="`sgd`: SGD(momentum=0.9, nesterov=True)", lr_schedule="linear warm-up, then cosine",
        warmup_steps=50, weight_decay=5e-4, max_grad_norm=0.0, label_smoothing=0.1, seed=7, global_steps=1000,
        buffered_stages=5, framework_versions={"petra_hub": "9.9", "torch": "1.0"},
        results=[{"epoch": 1.0, "step": 500, "training_loss": None, "eval_loss": 1.25, "eval_accuracy": 0.5},
                 {"epoch": 2.0, "step": 1000, "training_loss": 0.75, "eval_loss": 0.5, "eval_accuracy": 0.875}],
    )
    text = render_model_card(summary).text
    for row in ("| Optimizer | `sgd`: SGD(momentum=0.9, nesterov=True) |",
                "| LR schedule | linear warm-up, then cosine |",
                "| Warm-up steps | 50 |", "| Weight decay (not on biases and norms) | 0.0005 |", "| Seed | 7 |",
                "| Max gradient norm (each stage clips its own; 0: no clipping) | 0 |", "| Label smoothing | 0.1 |",
                "| Global steps (optimizer updates per stage) | 1000 |",
                "| Epoch | Step | Training loss | Eval loss | Eval accuracy |",
                "| 1 | 500 | - | 1.2500 | 50.00 % |", "| 2 | 1000 | 0.7500 | 0.5000 | 87.50 % |",
                r"| petra\_hub | 9.9 |", "| torch | 1.0 |", "(5 of this run's 10 pipeline stages)"):
        assert row in text, row
    assert "No evaluation or training loss was logged" in render_model_card(full_summary()).text
    installed = render_model_card(full_summary()).text.split("## Framework versions")[1]
    for name in ("petra_hub", "torch", "transformers", "datasets", "accelerate", "huggingface_hub"):
        assert f"| {markdown_text(name)} | " in installed, name  # "petra\_hub": escaped as any user text


def test_create_model_card_fields_reach_the_metadata():
    summary = full_summary(language="en", license="mit", tags=["my-tag", "petra"], base_model="org/base",
                           tasks=["image-feature-extraction"], dataset_tags=["org/more"], dataset_title="My CIFAR",
                           dataset_config="plain_text")
    card = render_model_card(summary)
    data = card.data
    assert (data.language, data.license, data.base_model, data.pipeline_tag) == (
        "en", "mit", "org/base", "image-feature-extraction")
    assert data.tags == TAGS + list(REVNET.card_tags) + ["my-tag"]
    assert data.datasets == ["uoft-cs/cifar10", "org/more"]
    [result, *_] = data.eval_results
    assert (result.task_type, result.dataset_name, result.dataset_type, result.dataset_config) == (
        "image-feature-extraction", "My CIFAR", "uoft-cs/cifar10", "plain_text")
    assert "fine-tuned from [org/base](https://huggingface.co/org/base)" in card.text
    assert "| Data set | My CIFAR (`uoft-cs/cifar10`, `org/more`, config `plain_text`) |" in card.text
    assert 'load_dataset("uoft-cs/cifar10", "plain_text", split="test")' in card.text


def how_to(card) -> str:
    return card.text.split("## How to use")[1].split("## Limitations")[0]


def test_how_to_per_data_set():
    digits = how_to(render_model_card(full_summary(dataset="digits", dataset_id=None)))
    assert "load_digits()" in digits and "Image.fromarray" in digits and "path/to/image" not in digits
    cifar100 = how_to(render_model_card(full_summary(dataset="cifar100", dataset_id="uoft-cs/cifar100")))
    assert 'load_dataset("uoft-cs/cifar100", split="test")[0]' in cifar100
    assert 'image = example["img"]' in cifar100 and 'example["fine_label"]' in cifar100
    imagenet = how_to(render_model_card(full_summary(dataset="imagenet", dataset_id="ILSVRC/imagenet-1k")))
    assert 'load_dataset("ILSVRC/imagenet-1k", split="validation")' in imagenet  # its "test" split has no labels
    hub = how_to(render_model_card(full_summary(dataset="beans", dataset_id="org/beans", image_column="image",
                                                label_column="labels", example_split="validation")))
    assert 'load_dataset("org/beans", split="validation")[0]' in hub and 'example["labels"]' in hub
    for summary in (full_summary(dataset="imagenet32", dataset_id=None), full_summary(dataset="my-photos",
                                                                                      dataset_id=None)):
        text = how_to(render_model_card(summary))
        assert 'Image.open("path/to/image.png")  # placeholder' in text and "is a placeholder" in text
    for text in (digits, cifar100, imagenet, hub):
        assert text.count("image = ") == 2  # each block defines the image it classifies
        assert 'print("predicted label:"' in text


def test_input_convention_and_limitations():
    digits = render_model_card(full_summary(dataset="digits", dataset_id=None)).text
    assert "white digits on a black background" in digits and "upscaled to 16x16" in digits
    assert "1.4-3.1 points below backprop" in digits and "not reproduced here" not in digits
    cifar = render_model_card(full_summary()).text
    assert "white digits" not in cifar
    assert "results on\n  CIFAR-10 were not reproduced here beyond this model's own evaluation above" in cifar
    unevaluated = render_model_card(full_summary(eval_accuracy=None, eval_loss=None)).text
    assert "this card records no evaluation: this model's accuracy is unknown" in unevaluated
    assert "The stem, the downsampling blocks and the head are not reversible and store" in cifar
    backprop = render_model_card(full_summary(mode="backprop")).text
    assert "synchronous (no delayed gradients)" in backprop and "keeps the autograd graph" in backprop
    assert "1.4-3.1 points" not in backprop
    custom = render_model_card(full_summary(dataset="my-photos", dataset_id=None, image_size=24,
                                            image_mean=(0.5, 0.5, 0.5), image_std=(0.25, 0.25, 0.25))).text
    assert "3x24x24 images, rescaled to [0, 1] and normalised with mean (0.5, 0.5, 0.5) and std (0.25" in custom
    # a petra_hub set: its image processor's convention (data.image_processor_for), resize or resize and crop
    imagenet = render_model_card(full_summary(dataset="imagenet", dataset_id=None)).text
    assert ("| Input | 3x224x224 images (an image's shorter side resized to 256, then its centred 224x224 cropped), "
            "rescaled to [0, 1] and normalised with mean (0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225) |"
            ) in imagenet
    assert "| Input | 3x32x32 images (any image resized to 32x32), rescaled" in cifar
    cropped = render_model_card(full_summary(dataset="my-photos", dataset_id=None, image_size=24, image_resize=32,
                                             image_center_crop=True, image_mean=(0.5,) * 3, image_std=(0.25,) * 3))
    assert "3x24x24 images (an image's shorter side resized to 32, then its centred 24x24 cropped)" in cropped.text
