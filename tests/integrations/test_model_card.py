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
    assert data.tags == TAGS
    assert data.datasets == ["uoft-cs/cifar10"]
    assert data.model_name == summary.model_name
    [result] = data.eval_results
    assert (result.task_type, result.metric_type) == ("image-classification", "accuracy")
    assert result.metric_value == pytest.approx(0.9137, abs=0)
    assert result.dataset_type == "uoft-cs/cifar10"
    assert card.data.to_dict()["model-index"][0]["name"] == summary.model_name

    body = card.text
    architecture = "RevNet-18 (revnet18): basic blocks in layers of 2/2/2/2 (8 blocks), widths 64/128/256/512 per stream"
    for needle in (architecture, "`petra`", "Pipeline stages (J) | 10", "Accumulation steps (k) | 4", "Processes | 10",
                   "RevNet-18", "revnet18", "91.37 %", "12,211,048", "8x H100 (NCCL)", "| stem | cifar |",
                   f"| warm-up | {NOT_RECORDED} |", f'from_pretrained("{REPO_ID}")', "trust_remote_code=True",
                   'pipeline("image-classification"', "pip install petra_hub", "@inproceedings{rivaud2025petra",
                   "Parallel End-to-end Training with Reversible Architectures", "2406.02052"):
        assert needle in body, needle
    assert "None" not in card.content


def test_card_without_evaluation_has_no_model_index(tmp_path):
    summary = TrainingSummary(model_name="revnet-digits", preset=None, dataset="digits", mode="backprop")
    card = render_model_card(summary)
    assert "model-index" not in card.content
    assert "None" not in card.content
    assert NOT_RECORDED in card.text
    card.save(tmp_path / "README.md")
    loaded = ModelCard.load(tmp_path / "README.md")
    assert loaded.data.eval_results is None
    assert loaded.data.datasets is None
    assert loaded.data.tags == TAGS
    assert "`backprop`" in loaded.text and "Pipeline stages (J) | not recorded" in loaded.text


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
    custom = render_model_card(full_summary(preset="my-net")).text
    assert "custom RevNet configuration (see `config.json`)" in custom


def test_default_template_is_the_packaged_card():
    path = default_template_path()
    assert path.name == "revnet.md" and path.is_file()
    text = path.read_text()
    assert "import petra_hub  #" not in text  # registration happens on importing the model classes
    assert "from petra_hub import RevNetForImageClassification" in text
