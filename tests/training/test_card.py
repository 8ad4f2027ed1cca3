"""The model card a PetraTrainer writes: any data set, the run's hyper-parameters and results, a how-to that runs,
and `create_model_card`'s arguments."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard

from petra_hub import RevNetForImageClassification
from petra_hub.data import collate_image_batch, image_processor_for, load_image_dataset, take
from petra_hub.integrations.model_card import render_model_card
from petra_hub.integrations.model_card_text import FRAMEWORKS, markdown_text
from petra_hub.testing.models import small_config
from petra_hub.training import PetraTrainer, PetraTrainingArguments
from petra_hub.training.card import results_from_log_history, summarize_trainer
from petra_hub.training.card_data import CUSTOM_DATASET, describe_data
from tests.training.test_trainer import make_trainer

datasets = pytest.importorskip("datasets")

PART = "first 40 of the 360 images of test"  # what make_trainer evaluates: take(test, 40)


def metrics_with_f1(prediction):
    predicted = np.argmax(prediction.predictions, -1)
    labels = prediction.label_ids
    return {"accuracy": float((predicted == labels).mean()), "f1_macro": 0.125, "top_2_accuracy": 0.5}


def python_blocks(card_text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", card_text, re.S)


def load_card(folder) -> ModelCard:
    return ModelCard.load(os.path.join(folder, "README.md"))


# ---------------------------------------------------------------------------------------------------------------
# a digits run: hyper-parameters, results, a how-to that runs


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    """8 steps over 2 epochs of 4 steps, evaluated every epoch and once more after training, then saved."""
    root = tmp_path_factory.mktemp("digits-run")
    trainer = make_trainer(root / "out", max_steps=8, eval_strategy="epoch", logging_steps=2, warmup_steps=2,
                           weight_decay=5e-4, lr_scheduler_type="cosine", seed=3, label_smoothing_factor=0.1,
                           max_grad_norm=2.0)
    trainer.compute_metrics = metrics_with_f1
    config = trainer.model.config
    config.id2label = {i: str(i) for i in range(10)}
    config.label2id = {str(i): i for i in range(10)}
    trainer.train()
    trainer.evaluate()
    folder = root / "revnet-digits"
    trainer.save_model(str(folder))
    return trainer, folder


def test_digits_card_states_the_run(digits_run):
    trainer, folder = digits_run
    card = load_card(folder)
    text = card.text
    rows = {
        "Mode": "`petra`",
        "Pipeline stages (J)": "10",
        "Accumulation steps (k)": "2",
        "Processes": "1",
        "Epochs": "2",
        "Global steps (optimizer updates per stage)": "8",
        "Micro-batch size": "8",
        "Learning rate": "0.05",
        "Optimizer": "`sgd`: `SGD(momentum=0.9, nesterov=True)`",
        "LR schedule": "linear warm-up, then cosine",
        "Warm-up steps": "2",
        "Weight decay (not on biases and norms)": "0.0005",
        "Max gradient norm (each stage clips its own; 0: no clipping)": "2",
        "Label smoothing": "0.1",
        "Seed": "3",
        "Data set": "scikit-learn digits (8x8 grey-scale digits upscaled to 16x16, 10 classes)",
    }
    for name, value in rows.items():
        assert f"| {name} | {value} |" in text, name
    # input convention from the registry, class names from the model's config
    assert ("3x16x16 images (any image resized to 16x16), rescaled to [0, 1] and normalised with mean (0.3054, "
            "0.3054, 0.3054)") in text
    assert "white digits on a black background" in text and "upscaled to 16x16" in text
    assert "| Classes | 10: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 |" in text
    # the stem, 3 downsampling blocks and the head of RevNet-18 store their inputs
    assert "(5 of this run's 10 pipeline stages) are not reversible" in text
    assert "1.4-3.1 points below backprop" in text
    assert "were not reproduced here" not in text  # digits is the set petra_hub measured
    for name in FRAMEWORKS:
        assert re.search(rf"^\| {re.escape(markdown_text(name))} \| \d+\.\d+", text, re.M), name  # petra\_hub
    assert "None" not in card.content


def test_digits_card_results_and_every_metric(digits_run):
    trainer, folder = digits_run
    card = load_card(folder)
    text = card.text
    assert "| Epoch | Step | Training loss | Eval loss | Eval accuracy | Eval f1 macro | Eval top 2 accuracy |" in text
    table = text.split("### Training results")[1].split("## Evaluation")[0]
    rows = [line for line in table.splitlines() if re.match(r"\| \d", line)]
    # one row per epoch: the evaluation after training re-evaluates step 8 and replaces that row
    assert [row.split(" | ")[:2] for row in rows] == [["| 1", "4"], ["| 2", "8"]]
    final = trainer._last_eval_metrics
    last_loss = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry][-1]
    accuracy = f"{100 * final['eval_accuracy']:.2f} %"
    assert rows[1] == f"| 2 | 8 | {last_loss:.4f} | {final['eval_loss']:.4f} | {accuracy} | 0.125 | 50.00 % |"
    assert f"| Accuracy ({PART}) | {100 * final['eval_accuracy']:.2f} % |" in text  # take(test, 40) evaluated
    assert f"| F1 macro ({PART}) | 0.125 |" in text
    assert f"| Top 2 accuracy ({PART}) | 50.00 % |" in text
    assert "runtime" not in text.lower() and "per second" not in text.lower()
    results = {result.metric_type: result.metric_value for result in card.data.eval_results}
    assert results == {"accuracy": final["eval_accuracy"], "f1_macro": 0.125, "top_2_accuracy": 0.5}
    assert card.data.eval_results[0].metric_type == "accuracy"
    assert card.data.eval_results[0].dataset_type == "digits"  # no Hub id for digits: the name


RUN_BLOCKS = textwrap.dedent(
    """
    import re, sys

    text = open(sys.argv[1], encoding="utf-8").read()
    for number, block in enumerate(re.findall(r"```python\\n(.*?)```", text, re.S)):
        print(f"--- block {number}", flush=True)
        exec(compile(block, f"<card block {number}>", "exec"), {"__name__": "__main__"})
    """
)


def test_digits_card_how_to_runs(digits_run, tmp_path):
    """Every Python block of the card runs on its own (no undefined names) and classifies a real digits image
    with the saved folder: the card's repository id is the local folder, as it is for a run without a Hub id."""
    trainer, folder = digits_run
    text = (folder / "README.md").read_text()
    blocks = python_blocks(text)
    assert len(blocks) == 2
    assert all("load_digits()" in block and f'"{folder}"' in block for block in blocks)
    assert "trust_remote_code=True" in blocks[1]
    script = tmp_path / "run_blocks.py"
    script.write_text(RUN_BLOCKS)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), OMP_NUM_THREADS="1",
               TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run([sys.executable, str(script), str(folder / "README.md")], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    predictions = re.findall(r"^predicted label: (\S+)$", result.stdout, re.M)
    truths = re.findall(r"^true label: (\S+)$", result.stdout, re.M)
    assert len(predictions) == 2 and predictions[0] == predictions[1], result.stdout
    assert predictions[0] in [str(d) for d in range(10)]
    assert truths == ["8", "8"]  # the last image of load_digits()


def metrics_with_size(prediction):
    """Accuracy, and the number of examples evaluated: it tells which set a number comes from."""
    predicted = np.argmax(prediction.predictions, -1)
    return {"accuracy": float((predicted == prediction.label_ids).mean()), "examples": len(prediction.label_ids)}


def test_a_dict_of_eval_sets_reports_its_first_set_everywhere(tmp_path):
    """eval_dataset={"test": 40 items, "train": 64 items}: model-index, the Evaluation table and the training results
    all report the first set, `test` (the last one evaluated, `train`, used to win), and a note names the other."""
    train = take(load_image_dataset("digits", "train"), 64)
    test = take(load_image_dataset("digits", "test"), 40)
    trainer = make_trainer(tmp_path, train=train, max_steps=4, eval_strategy="steps", eval_steps=2)
    trainer.eval_dataset = {"test": test, "train": train}
    trainer.compute_metrics = metrics_with_size
    trainer.train()
    final = trainer.evaluate()
    trainer.evaluate("train")  # another set evaluated last: the card still reports `test`
    trainer.save_model(str(tmp_path / "saved"))
    card = load_card(tmp_path / "saved")
    text = card.text
    published = {result.metric_type: result for result in card.data.eval_results}
    assert published["examples"].metric_value == 40
    assert published["accuracy"].metric_value == final["eval_test_accuracy"]
    assert {result.dataset_split for result in card.data.eval_results} == {PART}
    assert f"| Accuracy ({PART}) | {100 * final['eval_test_accuracy']:.2f} % |" in text
    assert f"| Loss ({PART}) | {final['eval_test_loss']:.4f} |" in text and f"| Examples ({PART}) | 40 |" in text
    assert "| Epoch | Step | Training loss | Eval loss | Eval accuracy | Eval examples |" in text
    table = text.split("### Training results")[1].split("## Evaluation")[0]
    rows = [line for line in table.splitlines() if re.match(r"\| \d", line)]
    assert [row.split(" | ")[1] for row in rows] == ["2", "4"] and all(row.endswith(" | 40 |") for row in rows)
    assert "this card reports the first, `test`. The metrics of `train`" in text


def test_learning_rate_zero_still_gets_a_card(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, learning_rate=0.0)
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    assert "| Learning rate | 0 |" in load_card(tmp_path / "saved").text


def test_the_card_names_the_delay_remedies(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2, petra_weight_prediction=0.5, petra_delay_lr_warmup=0.25)
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    text = load_card(tmp_path / "saved").text
    # the rows' names are escaped as any text of the summary's extra rows
    assert r"Weight prediction \(petra\_weight\_prediction\)" in text and "0.5 x each stage's delay" in text
    assert r"Delay-aware warm-up \(petra\_delay\_lr\_warmup\) | 0.25 |" in text


def percent_metrics(prediction):
    predicted = np.argmax(prediction.predictions, -1)
    return {"accuracy": 97.5, "top_2_accuracy": 0.5, "f1": float((predicted == prediction.label_ids).mean())}


def test_an_accuracy_given_as_a_percentage_is_refused_everywhere_in_the_card(tmp_path):
    """compute_metrics returning 97.5 for an accuracy: the card publishes it neither in model-index nor in its tables
    (it does not guess the convention), says so under the Evaluation table and warns; the model is still saved."""
    trainer = make_trainer(tmp_path, max_steps=4, eval_strategy="steps", eval_steps=2)
    trainer.compute_metrics = percent_metrics
    trainer.train()
    trainer.evaluate()
    with pytest.warns(UserWarning, match=r"`accuracy` = 97.5: a card reports accuracies as fractions in \[0, 1\] "
                                         r"\(give 0.975, not 97.5\)"):
        trainer.save_model(str(tmp_path / "saved"))
    card = load_card(tmp_path / "saved")
    published = {result.metric_type: result.metric_value for result in card.data.eval_results}
    assert "accuracy" not in published and published["top_2_accuracy"] == 0.5
    assert "97.5" not in card.content.split("## Evaluation")[0]  # neither model-index nor the results table
    assert f"| Accuracy ({PART}) | not recorded |" in card.text
    assert "- compute_metrics returned `accuracy` = 97.5: a card reports accuracies as fractions in [0, 1] (give " \
           "0.975, not 97.5); this card leaves it out." in card.text
    assert "| Epoch | Step | Training loss | Eval loss | Eval top 2 accuracy | Eval f1 |" in card.text
    assert (tmp_path / "saved" / "model.safetensors").is_file()


# ---------------------------------------------------------------------------------------------------------------
# `datasets` data sets


def tensor_items(count: int, seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "pixel_values": torch.randn(count, 3, 16, 16, generator=generator).tolist(),
        "labels": torch.randint(0, 3, (count,), generator=generator).tolist(),
    }


def hf_trainer(tmp_path, train, evaluation, processor=None, **overrides) -> PetraTrainer:
    torch.manual_seed(0)
    config = small_config("revnet18", stem="cifar", num_labels=3)
    settings = dict(output_dir=str(tmp_path), per_device_train_batch_size=4, per_device_eval_batch_size=8,
                    gradient_accumulation_steps=1, learning_rate=0.01, max_steps=2, max_grad_norm=0.0,
                    logging_steps=1, eval_strategy="no", save_strategy="no", report_to=[], disable_tqdm=True)
    settings.update(overrides)
    return PetraTrainer(model=RevNetForImageClassification(config), args=PetraTrainingArguments(**settings),
                        train_dataset=train, eval_dataset=evaluation, data_collator=collate_image_batch,
                        processing_class=processor, compute_metrics=metrics_with_f1)


def class_label_sets(**splits) -> tuple:
    """(train, test): `datasets` sets of random 3x16x16 pixel values with ClassLabel labels cat, dog, owl."""
    features = datasets.Features({
        "pixel_values": datasets.Array3D((3, 16, 16), "float32"),
        "labels": datasets.ClassLabel(names=["cat", "dog", "owl"]),
    })
    train = datasets.Dataset.from_dict(tensor_items(16), features=features, split=splits.get("train"))
    test = datasets.Dataset.from_dict(tensor_items(8, seed=1), features=features, split=splits.get("test"))
    return train.with_format("torch"), test.with_format("torch")


def rendered_card(trainer, **card_kwargs) -> str:
    """The card text `trainer` would write, without writing it."""
    summary = summarize_trainer(trainer, trainer.args.output_dir, **card_kwargs)
    return render_model_card(summary, config=trainer.model.config).text


@pytest.mark.parametrize("shorter_side, expected", [
    (None, "3x16x16 images (any image resized to 16x16), rescaled to [0, 1] and normalised with mean (0.3054, "
           "0.3054, 0.3054) and std (0.319, 0.319, 0.319)"),
    (20, "3x16x16 images (an image's shorter side resized to 20, then its centred 16x16 cropped), rescaled to [0, 1] "
         "and normalised with mean (0.3054, 0.3054, 0.3054) and std (0.319, 0.319, 0.319)"),
])
def test_the_input_line_follows_the_image_processor(tmp_path, shorter_side, expected):
    """Both processor kinds petra_hub saves: ViTImageProcessor (size height = width = S) and BitImageProcessor
    (size shortest_edge S, crop_size C x C: every recipe `datasets` set and ImageNet)."""
    processor = image_processor_for(load_image_dataset("digits", "test").info, shorter_side)
    text = rendered_card(hf_trainer(tmp_path, *class_label_sets(), processor))
    assert f"| Input | {expected} |" in text
    processor.crop_size = {"height": 16, "width": 12}  # not a square: the card does not guess
    if shorter_side is not None:
        assert "| Input | RGB images (see `preprocessor_config.json`) |" in rendered_card(
            hf_trainer(tmp_path, *class_label_sets(), processor))


def test_a_datasets_dataset_gets_a_card(tmp_path):
    train, test = class_label_sets()
    processor = image_processor_for(load_image_dataset("digits", "test").info)
    trainer = hf_trainer(tmp_path, train, test, processor)
    trainer.train()
    trainer.evaluate()
    trainer.save_model()
    card = load_card(tmp_path)
    text = card.text
    assert f"Trained on {CUSTOM_DATASET} in mode `petra`" in text
    assert "| Classes | 3: cat, dog, owl |" in text  # the data's names: the config only has LABEL_i
    assert "3x16x16 images (any image resized to 16x16), rescaled to [0, 1] and normalised with mean (0.3054" in text
    assert "white digits" not in text
    assert 'Image.open("path/to/image.png")  # placeholder' in text and "is a placeholder" in text
    assert "were not reproduced here beyond this model's own evaluation above" in text
    assert "| Accuracy (evaluation set) |" in text and "evaluation split" not in text  # no split name to give
    assert card.data.eval_results[0].dataset_type == CUSTOM_DATASET
    assert card.data.eval_results[0].dataset_split is None and "split:" not in card.content.split("---")[1]
    assert card.data.datasets is None
    assert f'from_pretrained("{tmp_path}")' in text  # no Hub id: the local folder


@pytest.mark.parametrize("splits, expected_split", [(("train", "test"), "test"),
                                                    (("train",), "held-out 15% of train")])
def test_the_recipe_names_its_datasets_set_and_the_evaluated_part(tmp_path, monkeypatch, splits, expected_split):
    """`--dataset_name <folder>`: the card names the set as the recipe does (the folder) and the evaluated part
    as what it is: the test split, or, for a train-only set, the seeded hold-out (its rows keep split "train")."""
    from tests.test_recipes import TINY, write_digits_dataset

    from petra_hub.recipe import train as recipe

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    folder = write_digits_dataset(tmp_path / "my-digits")
    if splits == ("train",):  # the same images, train only
        train_only = datasets.DatasetDict(train=datasets.load_from_disk(str(folder))["train"])
        folder = tmp_path / "my-digits-train"
        train_only.save_to_disk(str(folder))
    prepared = recipe.prepare(["--dataset_name", str(folder), "--output_dir", str(tmp_path / "out"), *TINY])
    trainer = prepared.trainer
    final = trainer.evaluate()
    trainer.save_model()
    card = load_card(tmp_path / "out")
    [accuracy] = [result for result in card.data.eval_results if result.metric_type == "accuracy"]
    assert (accuracy.dataset_name, accuracy.dataset_type) == (folder.name, folder.name)
    assert accuracy.dataset_split == expected_split and accuracy.metric_value == final["eval_accuracy"]
    label = f"{expected_split} split" if expected_split == "test" else expected_split
    assert f"| Accuracy ({label}) | {100 * final['eval_accuracy']:.2f} % |" in card.text
    assert f"Trained on {folder.name} in mode" in card.text
    assert CUSTOM_DATASET not in card.text and "(train split)" not in card.text
    assert trainer.model_card_kwargs == {"dataset": folder.name, "eval_split": expected_split}  # the hand-over
    # create_model_card's own arguments come first
    trainer.create_model_card(dataset="Digits (a copy)", eval_split="validation")
    assert "| Accuracy (validation split) |" in load_card(tmp_path / "out").text


def test_an_image_folder_with_a_transform_gets_a_card(tmp_path):
    from PIL import Image

    for split in ("train", "test"):
        for name in ("rose", "tulip"):
            os.makedirs(tmp_path / "flowers" / split / name)
            for index in range(4):
                pixels = np.random.default_rng(index).integers(0, 255, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / "flowers" / split / name / f"{index}.png")
    loaded = datasets.load_dataset("imagefolder", data_dir=str(tmp_path / "flowers"), cache_dir=str(tmp_path / "c"))
    processor = image_processor_for(load_image_dataset("digits", "test").info)

    def transform(batch):
        pixels = processor(images=[image.convert("RGB") for image in batch["image"]], return_tensors="pt")
        return {"pixel_values": list(pixels["pixel_values"]), "labels": batch["label"]}

    trainer = hf_trainer(tmp_path / "out", loaded["train"].with_transform(transform),
                         loaded["test"].with_transform(transform), processor, remove_unused_columns=False)
    trainer.train()
    trainer.evaluate()
    trainer.create_model_card()
    text = load_card(tmp_path / "out").text
    assert f"Trained on {CUSTOM_DATASET} in mode" in text  # "imagefolder" is a file format, not a name
    assert r"| Classes | 3: LABEL\_0, LABEL\_1, LABEL\_2 (transformers' placeholder names" in text  # 2 names, 3 labels
    assert "Accuracy (test split)" in text
    assert 'Image.open("path/to/image.png")' in text


def arrow_dataset(folder, info: "datasets.DatasetInfo", count: int = 4) -> "datasets.Dataset":
    """A data set read from an Arrow file at `folder`, as `load_dataset` leaves them in its cache."""
    from PIL import Image

    features = datasets.Features({"img": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    images = [Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)) for _ in range(count)]
    source = datasets.Dataset.from_dict({"img": images, "label": [0, 1] * (count // 2)}, features=features)
    os.makedirs(folder, exist_ok=True)
    source.save_to_disk(str(folder / "saved"))
    arrow = next((folder / "saved").glob("*.arrow"))
    return datasets.Dataset.from_file(str(arrow), info=info, split="validation")


def test_a_hub_dataset_is_named_by_its_repository(tmp_path):
    info = datasets.DatasetInfo(dataset_name="beans", builder_name="parquet", config_name="default")
    hub = arrow_dataset(tmp_path / "cache" / "AI-Lab-Makerere___beans" / "default" / "0.0.0" / "abc", info)
    facts = describe_data(hub, hub)
    assert (facts.name, facts.dataset_id, facts.config) == ("beans", "AI-Lab-Makerere/beans", None)
    assert (facts.image_column, facts.label_column, facts.label_names) == ("img", "label", ["a", "b"])
    assert facts.eval_split == facts.example_split == "validation"
    local = arrow_dataset(tmp_path / "elsewhere", datasets.DatasetInfo(dataset_name="imagefolder",
                                                                       builder_name="imagefolder"))
    assert describe_data(local, None).name == CUSTOM_DATASET
    assert describe_data(local, None).dataset_id is None


def test_a_known_set_from_the_hub_gets_the_registry_id(tmp_path):
    info = datasets.DatasetInfo(dataset_name="cifar10", builder_name="parquet", config_name="plain_text")
    streamed = datasets.Dataset.from_dict({"x": [1, 2]}, info=info)  # no cache file: known by its name
    facts = describe_data(streamed, None)
    assert (facts.name, facts.dataset_id, facts.config) == ("cifar10", "uoft-cs/cifar10", "plain_text")
    petra = take(load_image_dataset("digits", "train"), 8)
    facts = describe_data(petra, take(load_image_dataset("digits", "test"), 8))
    assert (facts.name, facts.dataset_id, facts.from_registry, facts.eval_split) == (
        "digits", None, True, "first 8 of the 360 images of test")


def test_save_model_names_placeholder_labels_as_save_for_hub_does(tmp_path):
    """The README's Trainer quick start (a config with transformers' LABEL_i, a petra_hub data set): the saved
    config.json, hence a pipeline, names the classes; a `datasets` set gives its ClassLabel names. The Trainer and
    save_for_hub share one function."""
    import json

    from PIL import Image
    from transformers import pipeline

    from petra_hub.integrations import hub
    from petra_hub.training import card

    assert card.name_generic_labels is hub.name_generic_labels
    trainer = make_trainer(tmp_path, max_steps=2)
    assert trainer.model.config.id2label[1] == "LABEL_1"
    trainer.train()
    trainer.save_model(str(tmp_path / "saved"))
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["id2label"] == {str(i): str(i) for i in range(10)} and saved["label2id"]["7"] == 7
    classifier = pipeline("image-classification", model=str(tmp_path / "saved"), device="cpu")
    assert classifier(Image.new("RGB", (16, 16)), top_k=1)[0]["label"] in [str(i) for i in range(10)]
    assert "| Classes | 10: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9 |" in load_card(tmp_path / "saved").text

    train, test = class_label_sets()
    trainer = hf_trainer(tmp_path / "hf", train, test, image_processor_for(load_image_dataset("digits", "test").info))
    trainer.save_model()
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert saved["id2label"] == {"0": "cat", "1": "dog", "2": "owl"}
    named = {0: "zero", 1: "one", 2: "two"}  # names of the model's own are kept
    trainer.model.config.id2label, trainer.model.config.label2id = named, {v: k for k, v in named.items()}
    trainer.save_model()
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["id2label"]["1"] == "one"


# ---------------------------------------------------------------------------------------------------------------
# Trainer.create_model_card's arguments, one by one


@pytest.fixture(scope="module")
def card_trainer(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("card-args"), max_steps=2)
    trainer.train()
    trainer.evaluate()
    return trainer


def card_with(trainer, **kwargs) -> ModelCard:
    trainer.create_model_card(**kwargs)
    return load_card(trainer.args.output_dir)


CHANGES = {
    "language": ("en", lambda card: card.data.language == "en"),
    "license": ("mit", lambda card: card.data.license == "mit"),
    "tags": (["my-tag"], lambda card: card.data.tags[-1] == "my-tag" and "petra" in card.data.tags),
    "model_name": ("my-revnet", lambda card: card.text.startswith("\n# my-revnet")
                   and card.data.model_name == "my-revnet"),
    "finetuned_from": ("org/base-revnet", lambda card: card.data.base_model == "org/base-revnet"
                       and "fine-tuned from [org/base-revnet](https://huggingface.co/org/base-revnet)" in card.text),
    "tasks": ("image-feature-extraction", lambda card: card.data.pipeline_tag == "image-feature-extraction"
              and card.data.eval_results[0].task_type == "image-feature-extraction"),
    "dataset_tags": (["org/digits", "org/more"], lambda card: card.data.datasets == ["org/digits", "org/more"]
                     and card.data.eval_results[0].dataset_type == "org/digits"),
    "dataset": ("My digits", lambda card: card.data.eval_results[0].dataset_name == "My digits"
                and "Trained on My digits in mode" in card.text),
    "dataset_args": ("small", lambda card: card.data.eval_results[0].dataset_config == "small"
                     and "config `small`" in card.text),
}


@pytest.mark.parametrize("argument", sorted(CHANGES))
def test_each_create_model_card_argument_changes_the_card(card_trainer, argument):
    plain = card_with(card_trainer)
    value, check = CHANGES[argument]
    assert not check(plain), argument
    changed = card_with(card_trainer, **{argument: value})
    assert check(changed), argument
    assert changed.content != plain.content


def test_create_model_card_refuses_unknown_arguments(card_trainer):
    with pytest.raises(TypeError, match="unexpected model card arguments"):
        card_trainer.create_model_card(licence="mit")


# ---------------------------------------------------------------------------------------------------------------
# the results table


def test_results_from_log_history():
    history = [
        {"loss": 2.0, "learning_rate": 0.1, "epoch": 0.5, "step": 2},
        {"loss": 1.5, "learning_rate": 0.1, "epoch": 1.0, "step": 4},
        {"eval_loss": 1.4, "eval_accuracy": 0.5, "eval_runtime": 0.1, "eval_samples_per_second": 9.0, "epoch": 1.0,
         "step": 4},
        {"loss": 1.0, "epoch": 2.0, "step": 8},
        {"eval_loss": 1.1, "eval_accuracy": 0.6, "epoch": 2.0, "step": 8},
        {"train_loss": 1.4, "train_runtime": 1.0, "epoch": 2.0, "step": 8},
        {"eval_loss": 1.0, "eval_accuracy": 0.7, "epoch": 2.0, "step": 8},  # evaluate() again after training
    ]
    assert results_from_log_history(history) == [
        {"epoch": 1.0, "step": 4, "training_loss": 1.5, "eval_loss": 1.4, "eval_accuracy": 0.5},
        {"epoch": 2.0, "step": 8, "training_loss": 1.0, "eval_loss": 1.0, "eval_accuracy": 0.7},
    ]
    no_evaluation = [entry for entry in history if not any(key.startswith("eval_") for key in entry)]
    assert results_from_log_history(no_evaluation) == [
        {"epoch": 1.0, "step": 4, "training_loss": 1.5},
        {"epoch": 2.0, "step": 8, "training_loss": 1.0},
    ]
    assert results_from_log_history([]) == []


def test_summary_of_an_untrained_trainer(tmp_path):
    trainer = make_trainer(tmp_path)
    summary = summarize_trainer(trainer, str(tmp_path))
    assert summary.global_steps == 0 and summary.epochs is None and summary.results == []
    assert summary.eval_accuracy is None and summary.warmup_steps is None
