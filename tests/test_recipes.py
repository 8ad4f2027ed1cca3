"""The recipe (`petra_hub.recipe`, run by `recipes/train_revnet.py` and `petra-train`) in one process: its
arguments, the paper's config files, the data sources it accepts, fine-tuning, resuming, and the files it writes."""

import json
import os
import re
import runpy
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from petra_hub.testing.data_files import tar_folder as _tar, write_cifar10 as _write_cifar10
from petra_hub.recipe import train as recipe

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(c for c in (ROOT / "recipes" / "configs").glob("*.yaml") if not c.stem.startswith("digits_"))
TINY = ["--hidden_sizes", "4,8,8,8", "--embedding_size", "4", "--disable_tqdm", "true", "--logging_steps", "1"]

PAPER = {  # (preset, mode, micro-batch, k, effective lr, weight decay, epochs, milestones)
    "cifar10_revnet18_petra": ("revnet18", "petra", 64, 2, 0.05, 5e-4, 300, [150, 225]),
    "cifar10_revnet18_backprop": ("revnet18", "backprop", 128, 1, 0.05, 5e-4, 300, [150, 225]),
    "imagenet32_revnet34_petra": ("revnet34", "petra", 64, 2, 0.05, 1e-4, 90, [30, 60, 80]),
    "imagenet32_revnet34_backprop": ("revnet34", "backprop", 128, 1, 0.05, 1e-4, 90, [30, 60, 80]),
    "imagenet_revnet50_petra": ("revnet50", "petra", 64, 4, 0.1, 1e-4, 90, [30, 60, 80]),
    "imagenet_revnet50_backprop": ("revnet50", "backprop", 128, 1, 0.05, 1e-4, 90, [30, 60, 80]),
}


def digit_images(count: int, offset: int = 0):
    """`count` scikit-learn digits as 16x16 RGB PIL images, with their labels."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = digits.images[offset: offset + count] / 16.0 * 255.0
    pil = [Image.fromarray(image.astype(np.uint8), mode="L").resize((16, 16)).convert("RGB") for image in images]
    return pil, [int(label) for label in digits.target[offset: offset + count]]


NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def write_digits_dataset(folder: Path, train: int = 48, test: int = 24) -> Path:
    """A `datasets` image/label set (ClassLabel names) saved with `save_to_disk`: train and test splits."""
    import datasets

    def split(count, offset):
        images, labels = digit_images(count, offset)
        data = datasets.Dataset.from_dict({"image": images, "label": labels})
        return data.cast_column("image", datasets.Image()).cast_column("label", datasets.ClassLabel(names=NAMES))

    datasets.DatasetDict(train=split(train, 0), test=split(test, 1000)).save_to_disk(str(folder))
    return folder


def write_image_folders(root: Path, count: int, offset: int) -> Path:
    """An imagefolder tree: root/<label name>/<i>.png."""
    images, labels = digit_images(count, offset)
    for i, (image, label) in enumerate(zip(images, labels)):
        (root / NAMES[label]).mkdir(parents=True, exist_ok=True)
        image.save(root / NAMES[label] / f"{i}.png")
    return root


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def results(folder: Path, split: str) -> dict:
    return json.loads((folder / f"{split}_results.json").read_text())


# -- the paper's config files ------------------------------------------------------------------------------------------
def test_the_revvit_digits_recipe_trains_a_revvit_tiny_with_adamw(tmp_path):
    config = ROOT / "recipes" / "configs" / "digits_revvit_tiny.yaml"
    model_args, data_args, args = recipe.parse([str(config), "--petra_mode", "reversible_backprop"])
    assert (model_args.model, data_args.dataset, args.petra_mode) == ("revvit-tiny", "digits", "reversible_backprop")
    assert (args.optim, args.optim_args, args.learning_rate, args.weight_decay) == ("adamw_torch", None, 5e-4, 0.05)
    assert args.num_train_epochs == 30 and args.output_dir == "outputs/revvit-tiny-digits"
    assert model_args.layer_scale_init_value is None and args.petra_delay_lr_warmup == 0  # the paper's ViT-Ti


def test_the_revvit_petra_recipe_trains_4_regularised_stages_without_augmentation(tmp_path):
    config = ROOT / "recipes" / "configs" / "digits_revvit_tiny_petra.yaml"
    model_args, data_args, args = recipe.parse([str(config)])
    assert (model_args.model, data_args.dataset, args.petra_mode) == ("revvit-tiny", "digits", "petra")
    assert (args.optim, args.learning_rate, args.weight_decay) == ("adamw_torch", 5e-4, 0.05)
    assert (args.petra_num_stages, data_args.augment, args.num_train_epochs) == (4, False, 150)
    assert (args.label_smoothing_factor, model_args.drop_path_rate) == (0.1, 0.1)
    assert model_args.layer_scale_init_value is None and args.petra_delay_lr_warmup == 0  # as measured
    assert args.eval_strategy == "no" and args.do_eval  # one evaluation, at the end
    assert args.output_dir == "outputs/revvit-tiny-digits-petra"


def test_every_paper_recipe_is_there():
    assert sorted(c.stem for c in CONFIGS) == sorted(PAPER)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_recipe_holds_the_paper_hyper_parameters(config, tmp_path):
    model_args, data_args, args = recipe.parse([str(config), "--output_dir", str(tmp_path)])
    preset, mode, micro_batch, k, lr, weight_decay, epochs, milestones = PAPER[config.stem]
    assert (model_args.model, args.petra_mode, args.per_device_train_batch_size) == (preset, mode, micro_batch)
    assert args.gradient_accumulation_steps == k and args.petra_scale_lr
    assert args.learning_rate * micro_batch * k / 256 == pytest.approx(lr)
    assert (args.weight_decay, args.num_train_epochs, args.milestones()) == (weight_decay, epochs, milestones)
    assert args.warmup_steps * epochs == pytest.approx(5, abs=1e-3)  # 5 warm-up epochs
    assert (args.optim, args.optim_args) == ("sgd", "momentum=0.9,nesterov=True")
    assert model_args.hidden_sizes == "paper" and model_args.embedding_size == 0


def test_cifar10_recipe_runs_on_local_files(tmp_path):
    """The CIFAR-10 recipe as written, on a tiny archive in the original format, shortened to 2 steps."""
    _write_cifar10(tmp_path / "data", np.random.default_rng(0))
    _tar(tmp_path / "data", "cifar-10-batches-py", "cifar-10-python.tar.gz")
    config = ROOT / "recipes" / "configs" / "cifar10_revnet18_petra.yaml"
    trainer, metrics = recipe.run([
        str(config), "--data_dir", str(tmp_path / "data"), "--output_dir", str(tmp_path / "out"),
        "--max_steps", "2", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
        "--hidden_sizes", "4,8,8,8", "--embedding_size", "4", "--dataloader_num_workers", "0",
        "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true",
    ])
    assert trainer.state.global_step == 2 and len(trainer.stages) == 10
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert (tmp_path / "out" / "model.safetensors").exists()


# -- arguments ---------------------------------------------------------------------------------------------------------
def test_defaults_are_the_readme_main_job():
    model_args, data_args, args = recipe.parse([])
    assert (model_args.model, model_args.hidden_sizes, model_args.embedding_size) == ("revnet18", "16,32,64,128", 16)
    assert data_args.dataset == "digits" and args.output_dir == "outputs/revnet18-digits-petra"
    assert (args.num_train_epochs, args.learning_rate, args.optim, args.optim_args) == (
        12, 0.05, "sgd", "momentum=0.9,nesterov=True")
    assert (args.lr_scheduler_type, args.warmup_steps, args.eval_strategy, args.save_strategy) == (
        "cosine", 0.05, "epoch", "no")
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.weight_decay) == (32, 1, 5e-4)
    assert args.do_train and args.do_eval and not args.do_predict and not args.remove_unused_columns
    assert args.seed == 0 and args.petra_mode == "petra" and args.max_grad_norm == 0  # the paper clips nothing


def test_model_picks_the_family_and_shapes_it_to_the_data():
    model_args, _, args = recipe.parse(["--model", "RevViT_Tiny"])
    assert model_args.model == "revvit-tiny" and args.output_dir == "outputs/revvit-tiny-digits-petra"
    digits = type("Data", (), {"label_names": list("abc"), "image_size": 16})()
    default = recipe.build_model(model_args, digits)
    config = default.config
    assert (config.model_type, config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (
        "revvit", 192, 12, 3)  # the RevViT paper's ViT-Ti
    assert (config.image_size, config.patch_size, config.num_labels) == (16, 4, 3)  # small images: 4x4 patches
    photos = type("Data", (), {"label_names": list("ab"), "image_size": 224})()
    assert recipe.build_model(model_args, photos).config.patch_size == 16  # the paper's from 128 pixels
    model_args, *_ = recipe.parse(["--model", "revvit-small", "--patch_size", "8"])
    assert recipe.build_model(model_args, digits).config.patch_size == 8
    model_args, *_ = recipe.parse(["--model", "revvit-tiny", "--drop_path_rate", "0.1"])
    model = recipe.build_model(model_args, digits)
    assert model.config.drop_path_rate == 0.1 and config.drop_path_rate == 0.0  # the preset's default: none
    rates = [module.drop_path for module in model.modules() if hasattr(module, "drop_path")]
    assert len(rates) == 12 and rates[0] == 0.0 and rates[-1] == pytest.approx(0.1)  # one per block, linear
    assert config.qk_norm is False  # the preset's: none
    model_args, *_ = recipe.parse(["--model", "revvit-tiny", "--qk_norm", "true"])
    model = recipe.build_model(model_args, digits)
    assert model.config.qk_norm is True and len([m for m in model.modules() if hasattr(m, "query_norm")]) == 12
    # the family's recipe default: the convolutional stem (the preset, the paper's model, has the patchify one)
    assert config.conv_stem is True and isinstance(default.revvit.embeddings.patches, torch.nn.Sequential)
    unset, *_ = recipe.parse(["--model", "revvit-tiny", "--conv_stem", "null"])  # null: the preset's, patchify
    assert recipe.build_model(unset, digits).config.conv_stem is False
    model_args, *_ = recipe.parse(["--model", "revvit-tiny", "--conv_stem", "false"])
    model = recipe.build_model(model_args, digits)
    assert model.config.conv_stem is False and isinstance(model.revvit.embeddings.patches, torch.nn.Conv2d)


def test_flags_that_would_shape_no_model_are_refused():
    with pytest.raises(ValueError, match=r"--hidden_sizes shapes RevNet models, not --model revvit-tiny \(RevViT\), "
                                         r"whose own flags are --patch_size, --drop_path_rate"):
        recipe.parse(["--model", "revvit-tiny", "--hidden_sizes", "8,8,8,8"])
    with pytest.raises(ValueError, match=r"--patch_size shapes RevViT models, not --model revnet18 \(RevNet\)"):
        recipe.parse(["--patch_size", "4"])
    with pytest.raises(ValueError, match=r"--drop_path_rate shapes RevViT models, not --model revnet18 \(RevNet\)"):
        recipe.parse(["--drop_path_rate", "0.1"])
    with pytest.raises(ValueError, match=r"--qk_norm shapes RevViT models, not --model revnet18 \(RevNet\)"):
        recipe.parse(["--qk_norm", "true"])
    with pytest.raises(ValueError, match=r"--conv_stem shapes RevViT models, not --model revnet18 \(RevNet\)"):
        recipe.parse(["--conv_stem", "true"])
    with pytest.raises(ValueError, match="--stem shapes a new model, but --model_name_or_path 'some/folder' brings"):
        recipe.parse(["--model_name_or_path", "some/folder", "--stem", "cifar"])
    with pytest.raises(ValueError, match="--model shapes a new model"):
        recipe.parse(["--model_name_or_path", "some/folder", "--model", "revnet34"])
    with pytest.raises(ValueError, match="unknown model 'resnet50'; expected one of revnet18, .*, revvit-tiny"):
        recipe.parse(["--model", "resnet50"])


def test_help_shows_the_recipe_defaults(capsys):
    with pytest.raises(SystemExit) as exit_info:
        recipe.parse(["--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in [("num_train_epochs", "12.0"), ("learning_rate", "0.05"),
                          ("optim_args", "momentum=0.9,nesterov=True"),
                          ("output_dir", "outputs/revnet18-digits-petra"), ("lr_scheduler_type", "cosine"),
                          ("eval_strategy", "epoch"), ("warmup_steps", "0.05"), ("seed", "0"), ("dataset", "digits"),
                          ("hidden_sizes", "16,32,64,128"), ("do_train", "True"), ("image_column_name", "image")]:
        shown = text.split(f"--{flag} ", 1)[1].split("(default: ", 1)[1]  # the first default after the flag
        assert shown.startswith(default + ")"), (flag, shown[:80])
    assert "config.yaml" in text  # the usage line names the config file


def test_unknown_or_misspelled_keys_are_errors_naming_them(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("learning_rate: 0.1\nnum_train_epoch: 3\n")
    with pytest.raises(ValueError, match=r"num_train_epoch'.*did you mean 'num_train_epochs'"):
        recipe.parse([str(config)])
    (tmp_path / "run.json").write_text(json.dumps({"not_an_argument": 1}))
    with pytest.raises(ValueError, match="not_an_argument"):
        recipe.parse([str(tmp_path / "run.json")])
    with pytest.raises(SystemExit):
        recipe.parse(["--num_train_epoch", "3"])  # no abbreviations either
    assert "--num_train_epoch" in capsys.readouterr().err



@pytest.mark.parametrize("line, error", [
    ("max_train_samples: 10.5", "max_train_samples: 10.5 is not a whole number"),  # was: slice indices must be ints
    ("seed: 3.7", "seed: 3.7 is not a whole number"),
    ("per_device_train_batch_size: true", "per_device_train_batch_size: True is not a whole number"),
    ("learning_rate: [1, 2]", r"learning_rate: \[1, 2\] is not a single float"),  # was: accepted
    ("optim_args: {momentum: 0.9}", r"optim_args: \{'momentum': 0.9\} is not a single str"),  # was: AttributeError
])
def test_a_config_value_of_the_wrong_type_is_refused_naming_the_file_and_key(tmp_path, line, error):
    config = tmp_path / "run.yaml"
    config.write_text(line + "\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(config))}: {error}"):
        recipe.parse([str(config)])


def test_config_values_the_fields_take_are_read_as_their_types(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("max_train_samples: 10.0\nlearning_rate: 5e-4\nlr_scheduler_kwargs: {min_lr: 0.001}\n"
                      "report_to: [none]\ndo_train: true\nhidden_sizes: 8,8,16,16\n"
                      "optim_args: [momentum=0.8, nesterov=True]\n")
    model_args, data_args, args = recipe.parse([str(config)])
    assert args.optim_args == "momentum=0.8,nesterov=True"  # a list of a comma-separated flag's items, joined
    assert data_args.max_train_samples == 10 and type(data_args.max_train_samples) is int
    assert args.learning_rate == 5e-4 and args.lr_scheduler_kwargs == {"min_lr": 0.001} and args.do_train
    assert model_args.hidden_sizes == "8,8,16,16"

def test_a_value_can_be_unset_with_null(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("hidden_sizes: null\nembedding_size: null\noptim_args: null\nweight_decay: 1e-4\n")
    model_args, _, args = recipe.parse([str(config)])
    assert (model_args.hidden_sizes, model_args.embedding_size, args.optim_args) == (None, None, None)
    assert args.weight_decay == 1e-4  # YAML reads 1e-4 as a string; the recipe reads it as the field's type
    data = type("Data", (), {"label_names": list("abc"), "image_size": 16})()
    model = recipe.build_model(model_args, data)
    assert model.config.hidden_sizes == [64, 128, 256, 512] and model.config.num_labels == 3  # the preset's widths


@pytest.mark.parametrize("order", ["file_first", "flags_first"])
def test_flags_override_the_file_in_any_order(tmp_path, order):
    config = tmp_path / "run.yaml"
    config.write_text("num_train_epochs: 3\nlearning_rate: 0.2\nmodel: revnet34\n")
    flags = ["--num_train_epochs", "1", "--model", "revnet18"]
    argv = [str(config), *flags] if order == "file_first" else [*flags, str(config)]
    model_args, _, args = recipe.parse(argv)
    assert (args.num_train_epochs, args.learning_rate, model_args.model) == (1, 0.2, "revnet18")


def test_a_flag_value_ending_in_json_is_not_the_config_file(tmp_path):
    _, data_args, args = recipe.parse(["--dataset_name", "folder.json", "--output_dir", str(tmp_path / "a.yaml")])
    assert data_args.dataset_name == "folder.json" and args.output_dir.endswith("a.yaml")


def test_do_eval_false_also_turns_off_the_per_epoch_evaluation():
    _, _, args = recipe.parse(["--do_eval", "false"])
    assert not args.do_eval and args.eval_strategy == "no"


def test_resume_from_checkpoint_values(tmp_path):
    assert recipe.resolve_checkpoint(None, str(tmp_path)) is None  # the trainer's choice: a restarted job resumes
    for value in (False, "false", "no"):  # afresh, even in a restarted job
        assert recipe.resolve_checkpoint(value, str(tmp_path)) is False
    for value in (True, "true", "last", "LAST"):
        with pytest.raises(ValueError, match="no checkpoint-N folder"):
            recipe.resolve_checkpoint(value, str(tmp_path))
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-10").mkdir()
    for value in (True, "true", "last"):
        assert recipe.resolve_checkpoint(value, str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert recipe.resolve_checkpoint(str(tmp_path / "checkpoint-2"), "elsewhere") == str(tmp_path / "checkpoint-2")


# -- running -----------------------------------------------------------------------------------------------------------
def test_the_same_seed_builds_the_same_model_whatever_ran_before(tmp_path):
    argv = ["--output_dir", str(tmp_path), "--max_train_samples", "8", *TINY]
    first = recipe.prepare(argv).trainer.model.state_dict()
    torch.rand(100)  # the global RNG moved: set_seed runs right before the model is built
    second = recipe.prepare(argv).trainer.model.state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_train_eval_predict_write_the_metrics_files_and_resume_last(tmp_path):
    out = tmp_path / "out"
    argv = ["--output_dir", str(out), "--max_train_samples", "64", "--max_eval_samples", "32", "--max_steps", "4",
            "--per_device_train_batch_size", "8", "--save_strategy", "steps", "--save_steps", "2",
            "--eval_strategy", "no", "--do_predict", *TINY]
    with pytest.raises(ValueError, match="no checkpoint-N folder"):
        recipe.run([*argv, "--resume_from_checkpoint", "last"])
    trainer, metrics = recipe.run(argv)
    assert trainer.state.global_step == 4 and (out / "checkpoint-2").is_dir() and (out / "checkpoint-4").is_dir()
    assert results(out, "eval")["eval_accuracy"] == metrics["eval_accuracy"]
    assert results(out, "train")["train_loss"] > 0 and "predict_accuracy" in results(out, "predict")
    combined = results(out, "all")
    assert {"train_loss", "eval_accuracy", "predict_accuracy"} <= set(combined)
    assert len((out / "predict_results.txt").read_text().splitlines()) == 1 + 360  # header + the digits test split
    assert "32 of the 360 images of test" in (out / "README.md").read_text()  # not the whole split

    resumed, _ = recipe.run([*argv, "--max_steps", "6", "--resume_from_checkpoint", "last", "--do_predict", "false"])
    assert resumed.state.global_step == 6 and (out / "checkpoint-6").is_dir()
    steps = [entry["step"] for entry in resumed.state.log_history]
    assert min(steps) <= 4 < max(steps)  # the history of the first run, continued from checkpoint-4
    with pytest.raises(FileNotFoundError, match="is not a checkpoint folder"):
        recipe.prepare([*argv, "--resume_from_checkpoint", str(tmp_path / "missing")])


def test_a_datasets_image_label_set_from_a_local_folder(tmp_path, datasets_cache):
    folder = write_digits_dataset(tmp_path / "digits-hf")
    out = tmp_path / "out"
    trainer, metrics = recipe.run(["--dataset_name", str(folder), "--output_dir", str(out), "--num_train_epochs", "1",
                                   "--per_device_train_batch_size", "8", "--do_predict", *TINY])
    assert trainer.model.config.id2label == dict(enumerate(NAMES))
    assert trainer.state.global_step == 6 and 0.0 <= metrics["eval_accuracy"] <= 1.0  # 48 / 8 micro-batches
    assert len(trainer.eval_dataset) == 24 and results(out, "predict")["predict_accuracy"] == metrics["eval_accuracy"]
    saved = json.loads((out / "config.json").read_text())
    assert saved["id2label"]["3"] == "three"
    processor = json.loads((out / "preprocessor_config.json").read_text())
    assert processor["size"] == {"shortest_edge": 16} and processor["crop_size"] == {"height": 16, "width": 16}


def test_the_card_names_the_part_of_a_datasets_split_that_was_evaluated(tmp_path, datasets_cache):
    from petra_hub.recipe.data import DataArguments, load_data

    folder = str(write_digits_dataset(tmp_path / "digits-hf"))
    whole = load_data(DataArguments(dataset_name=folder), seed=0, splits={"eval"})
    cut = load_data(DataArguments(dataset_name=folder, max_eval_samples=10), seed=0, splits={"eval"})
    split = whole.card_arguments["eval_split"]
    assert len(whole.eval) == 24 and split in ("test", "validation")
    assert len(cut.eval) == 10 and cut.card_arguments["eval_split"] == f"10 of the 24 images of {split}"


def test_a_configuration_name_for_a_save_to_disk_folder_is_refused(tmp_path, datasets_cache):
    from petra_hub.recipe.data import DataArguments, load_data

    folder = str(write_digits_dataset(tmp_path / "digits-hf"))
    with pytest.raises(ValueError, match="--dataset_config_name 'foo' does not apply to .*a save_to_disk folder"):
        load_data(DataArguments(dataset_name=folder, dataset_config_name="foo"), seed=0, splits={"train"})


@pytest.mark.parametrize("labels", [[0.0, 1.9, 2.7, 0.5, 1.0, 2.0], [0, 1, -1, 2, 1, 0]])
def test_plain_labels_must_be_class_indices(tmp_path, datasets_cache, labels):
    """A plain (not ClassLabel) label column under another name than "label": floats were truncated (1.9 -> 1) and
    a negative label passed through, since the trainer's own check reads only "label" / "labels"."""
    import datasets

    from petra_hub.recipe.data import DataArguments, load_data

    images, _ = digit_images(6)
    data = datasets.Dataset.from_dict({"image": images, "fine_label": labels}).cast_column("image", datasets.Image())
    datasets.DatasetDict(train=data, test=data).save_to_disk(str(tmp_path / "set"))
    with pytest.raises(ValueError, match="label column 'fine_label' holds .*class labels must be integers from 0"):
        load_data(DataArguments(dataset_name=str(tmp_path / "set")), seed=0, splits={"train", "eval"})


def test_the_collator_refuses_float_labels():
    from petra_hub.recipe.data import ImageClassificationCollator

    examples = [{"pixel_values": torch.zeros(3, 2, 2), "label": value} for value in (1.9, 0.0)]
    with pytest.raises(ValueError, match="never truncated"):
        ImageClassificationCollator("label")(examples)


@pytest.mark.parametrize("argv, named", [
    (["--data_dir", "/nowhere"], "--data_dir and --hub_id do not apply"),
    (["--image_size", "64"], "--image_size applies to a `datasets` set"),
    (["--label_column_name", "fine"], "--label_column_name applies"),
    (["--train_val_split", "0.5"], "--train_val_split applies"),
    (["--dataset_config_name", "plain"], "--dataset_config_name applies"),
    (["--dataset", "cifar10", "--dataset_name", "uoft-cs/cifar100"], "name different sets"),
    (["--dataset", "cifar10", "--train_dir", "images"], "--dataset cifar10 names a built-in set"),
])
def test_flags_a_builtin_set_would_ignore_are_refused(argv, named):
    with pytest.raises(ValueError, match=named):
        recipe.parse(argv)
    assert recipe.parse(["--image_size", "16"])[1].image_size == 16  # digits' own size: nothing ignored


def test_augment_false_trains_on_the_images_as_evaluation_sees_them(tmp_path, datasets_cache):
    import datasets

    from petra_hub.recipe.data import DataArguments, load_data

    def train_images(args, epoch):
        train = load_data(args, seed=3, splits={"train"}).train
        if hasattr(train, "set_epoch"):
            train.set_epoch(epoch)
        return torch.stack([train[index]["pixel_values"] for index in range(8)])

    builtin = DataArguments(dataset="digits")
    assert not torch.equal(train_images(builtin, 0), train_images(builtin, 1))  # shifted differently every epoch
    plain = DataArguments(dataset="digits", augment=False)
    test = load_data(plain, seed=3, splits={"test"}).test
    assert torch.equal(train_images(plain, 0), train_images(plain, 1))
    assert test[0]["pixel_values"].shape == train_images(plain, 0)[0].shape

    images, labels = digit_images(16)
    datasets.Dataset.from_dict({"image": images, "label": labels}).cast_column(
        "label", datasets.ClassLabel(names=NAMES)).save_to_disk(str(tmp_path / "set"))
    for augment in (True, False):
        args = DataArguments(dataset_name=str(tmp_path / "set"), train_val_split=0.25, image_size=12, augment=augment)
        draws = [train_images(args, 0) for _ in range(2)]  # random crops and flips draw anew on every read
        assert torch.equal(*draws) == (not augment)


def test_a_datasets_set_without_a_validation_split_is_split_with_the_seed(tmp_path, datasets_cache):
    import datasets

    from petra_hub.recipe.data import DataArguments, load_data

    images, labels = digit_images(40)
    datasets.Dataset.from_dict({"img": images, "fine_label": labels}).cast_column(
        "fine_label", datasets.ClassLabel(names=NAMES)).save_to_disk(str(tmp_path / "one"))
    args = DataArguments(dataset_name=str(tmp_path / "one"), train_val_split=0.25, image_size=12)
    first, second = (load_data(args, seed=3, splits={"train", "eval"}) for _ in range(2))
    assert (len(first.train), len(first.eval)) == (30, 10)  # columns found by their usual names
    assert first.eval[:]["fine_label"] == second.eval[:]["fine_label"]
    batch = first.collator([first.train[0], first.train[1]])
    assert batch["pixel_values"].shape == (2, 3, 12, 12) and batch["labels"].dtype == torch.int64
    with pytest.raises(ValueError, match="--label_column_name 'digit' is not a column"):
        load_data(DataArguments(dataset_name=str(tmp_path / "one"), label_column_name="digit"), seed=0,
                  splits={"train"})


def test_train_dir_and_validation_dir_image_folders(tmp_path, datasets_cache):
    train = write_image_folders(tmp_path / "train", 40, 0)
    validation = write_image_folders(tmp_path / "val", 20, 1000)
    out = tmp_path / "out"
    trainer, metrics = recipe.run(["--train_dir", str(train), "--validation_dir", str(validation),
                                   "--output_dir", str(out), "--max_steps", "2", "--eval_strategy", "no", *TINY])
    assert sorted(trainer.model.config.id2label.values()) == sorted(NAMES)
    assert trainer.state.global_step == 2 and len(trainer.eval_dataset) == 20
    assert results(out, "eval")["eval_accuracy"] == metrics["eval_accuracy"]


def test_model_name_or_path_fine_tunes_a_saved_revnet(tmp_path, datasets_cache):
    from transformers import ResNetConfig

    from petra_hub import RevNetConfig, RevNetForImageClassification
    from petra_hub.data import image_processor_for, load_image_dataset

    saved = tmp_path / "saved"
    config = RevNetConfig.from_preset("revnet18", stem="cifar", num_labels=10, hidden_sizes=[4, 8, 8, 8],
                                      embedding_size=4)
    model = RevNetForImageClassification(config)
    model.save_pretrained(saved)
    image_processor_for(load_image_dataset("digits", "test").info).save_pretrained(saved)

    common = ["--model_name_or_path", str(saved), "--max_eval_samples", "64", "--disable_tqdm", "true"]
    trainer, metrics = recipe.run([*common, "--output_dir", str(tmp_path / "eval"), "--do_train", "false"])
    for key, value in model.state_dict().items():  # evaluated the saved weights, trained nothing, saved nothing
        torch.testing.assert_close(trainer.model.state_dict()[key], value, rtol=0, atol=0)
    assert not (tmp_path / "eval" / "train_results.json").exists() and "eval_accuracy" in metrics

    tuned, _ = recipe.run([*common, "--output_dir", str(tmp_path / "tuned"), "--max_steps", "2",
                           "--max_train_samples", "32", "--eval_strategy", "no"])
    assert tuned.state.global_step == 2 and tuned.model.config.hidden_sizes == [4, 8, 8, 8]
    assert RevNetForImageClassification.from_pretrained(tmp_path / "tuned").config.embedding_size == 4

    five = write_image_folders(tmp_path / "five", 5, 0)  # digits 0-4: 5 labels
    with pytest.raises(ValueError, match="pass --ignore_mismatched_sizes"):
        recipe.prepare(["--model_name_or_path", str(saved), "--train_dir", str(five), "--output_dir", str(tmp_path)])
    new_head = recipe.prepare(["--model_name_or_path", str(saved), "--train_dir", str(five), "--output_dir",
                               str(tmp_path), "--ignore_mismatched_sizes", "--train_val_split", "0.4"])
    assert new_head.trainer.model.config.num_labels == 5 and new_head.data.image_size == 16  # the processor's size
    ResNetConfig().save_pretrained(tmp_path / "resnet")
    with pytest.raises(ValueError, match="holds a 'resnet' model"):
        recipe.prepare(["--model_name_or_path", str(tmp_path / "resnet")])


def test_recipes_script_is_a_thin_wrapper():
    text = (ROOT / "recipes" / "train_revnet.py").read_text()
    assert "from petra_hub.recipe import main" in text and len(text.splitlines()) < 20
    script = runpy.run_path(str(ROOT / "recipes" / "train_revnet.py"))  # as benchmarks/accuracy_digits.py loads it
    assert script["run"] is recipe.run and script["parse"] is recipe.parse


def test_console_script_petra_train(tmp_path):
    command = shutil.which("petra-train")
    if command is None:
        pytest.skip("petra-train is not on PATH (pip install -e . installs it)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([command, "--help"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: petra-train") and "outputs/revnet18-digits-petra" in result.stdout


@pytest.mark.parametrize("mode, changes", [("backprop", False), ("petra", True)])
def test_evaluating_each_epoch_changes_petra_training_only(tmp_path, mode, changes):
    """The Trainer drains the pipeline before evaluating (docs/training-arguments.md, eval_strategy): backprop's
    weights do not depend on how often it evaluates, PETRA's do (the micro-batches in flight finish first)."""
    weights = []
    for strategy in ("no", "epoch"):
        trainer, _ = recipe.run(["--output_dir", str(tmp_path / strategy), "--max_train_samples", "64",
                                 "--max_eval_samples", "16", "--num_train_epochs", "2", "--eval_strategy", strategy,
                                 "--save_strategy", "no", "--petra_mode", mode, *TINY])
        weights.append({name: value.clone() for name, value in trainer.model.state_dict().items()})
    differ = [name for name in weights[0] if not torch.equal(weights[0][name], weights[1][name])]
    assert bool(differ) == changes, differ


def test_max_samples_draw_from_every_class_of_a_folder_sorted_by_class(tmp_path):
    """--max_*_samples kept the first items: on a folder of class folders, all of class 0 (the model never saw the
    other classes, and the evaluation measured one class)."""
    from petra_hub.testing.data_files import solid_image
    from petra_hub.recipe.data import DataArguments, load_data

    for split in ("train", "val"):
        for name in ("ant", "bee", "cat"):
            for i in range(4):
                solid_image(str(tmp_path / split / name / f"{i}.png"), (10 * i, 20, 30), (8, 8))
    args = DataArguments(dataset="imagenet", data_dir=str(tmp_path), max_train_samples=4, max_eval_samples=3)
    data = load_data(args, seed=0, splits={"train", "eval"})
    assert len(data.train) == 4 and len(data.eval) == 3
    assert len(set(data.train.labels.tolist())) > 1 and len(set(data.eval.labels.tolist())) > 1
    assert [data.train[i]["labels"] for i in range(4)] == data.train.labels.tolist()
    again = load_data(args, seed=0, splits={"train"})
    assert data.train.indices == again.train.indices != load_data(args, seed=1, splits={"train"}).train.indices
    assert data.card_arguments["eval_split"] == "3 of the 12 images of test"


@pytest.mark.parametrize("flag, value", [("max_train_samples", 0), ("max_eval_samples", -3),
                                         ("max_predict_samples", 2.5), ("image_size", -8), ("image_size", 0)])
def test_sample_counts_and_image_size_must_be_positive_whole_numbers(flag, value):
    from petra_hub.recipe.data import DataArguments

    with pytest.raises(ValueError, match=rf"--{flag} must be a positive whole number .*got {value}"):
        DataArguments(dataset_name="x", **{flag: value})


@pytest.mark.parametrize("argv, remedy", [
    (["--dataset", "cifar10"], "or pass data_dir (the recipe's --data_dir): cifar-10-batches-py/"),
    (["--dataset_name", "someone/images"], "or give --dataset_name a local save_to_disk folder"),
])
def test_a_hub_set_missing_from_the_offline_cache_says_why_and_what_to_do(argv, remedy, datasets_cache):
    """datasets' own error said only "Couldn't reach 'uoft-cs/cifar10' on the Hub (OfflineModeIsEnabled)"."""
    from petra_hub.recipe.data import DataArguments, load_data

    args = DataArguments(**{flag.removeprefix("--"): value for flag, value in zip(argv[::2], argv[1::2])})
    expected = r"cannot load the data set '.*': it is not in the datasets cache, and offline mode is on .*run once "
    with pytest.raises(FileNotFoundError, match=expected + rf"with network access .*{re.escape(remedy)}"):
        load_data(args, seed=0, splits={"train"})


def test_a_missing_local_hub_id_is_named():
    from petra_hub.data import load_image_dataset

    with pytest.raises(FileNotFoundError, match=r"'./nope' is a local path, but there is no such file or folder"):
        load_image_dataset("cifar10", "train", hub_id="./nope")


def test_a_pretrained_processor_that_crops_is_followed_in_evaluation(tmp_path, datasets_cache):
    """A processor of ImageNet's kind (shorter side 24, then the centre 16) trained and evaluated at 24 x 24, while
    the saved processor, used at inference, crops 16: evaluation did not prepare images as inference does."""
    from transformers import BitImageProcessor, ViTImageProcessor

    from petra_hub.recipe.data import DataArguments, load_data

    folder = str(write_digits_dataset(tmp_path / "digits-hf"))
    cropping = BitImageProcessor(size={"shortest_edge": 24}, crop_size={"height": 16, "width": 16},
                                 do_center_crop=True)
    data = load_data(DataArguments(dataset_name=folder), seed=0, splits={"train", "eval"}, processor=cropping)
    assert data.image_size == 16 and data.eval[0]["pixel_values"].shape == (3, 16, 16)
    assert data.train[0]["pixel_values"].shape == (3, 16, 16)
    steps = data.eval.format["format_kwargs"]["transform"].transform.transforms
    assert steps[0].size == [24] and steps[1].size == (16, 16)  # the shorter side to 24, then the centre 16
    squashing = ViTImageProcessor(size={"height": 20, "width": 20})  # ViT's: resized to 20 x 20, no crop
    vit = load_data(DataArguments(dataset_name=folder), seed=0, splits={"eval"}, processor=squashing)
    assert vit.image_size == 20 and vit.eval[0]["pixel_values"].shape == (3, 20, 20)


def test_split_folders_are_named_after_the_folder_above_them_and_a_missing_model_folder_is_named(tmp_path):
    """--train_dir data/flowers/train named the data set "train" (card, outputs/revnet18-train-petra)."""
    from petra_hub.recipe.data import DataArguments

    assert DataArguments(train_dir="data/flowers/train/").set_name == "flowers"
    assert DataArguments(dataset_name="uoft-cs/cifar10").set_name == "cifar10"
    assert DataArguments(dataset_name="./my_images").set_name == "my_images" and DataArguments().set_name == "digits"
    _, _, args = recipe.parse(["--train_dir", "data/flowers/train"])
    assert args.output_dir == "outputs/revnet18-flowers-petra"
    with pytest.raises(FileNotFoundError, match=r"--model_name_or_path '\./no/such/model' is a local path, but there "
                                                r"is no such folder"):
        recipe.prepare(["--model_name_or_path", "./no/such/model", "--output_dir", str(tmp_path)])


def test_image_size_with_a_pretrained_processor_saves_a_processor_of_that_size(tmp_path, datasets_cache):
    """--image_size 12 with a processor of ImageNet's kind trained at 12 but re-saved the processor that resizes to
    24 and crops 16."""
    from transformers import BitImageProcessor, ViTImageProcessor

    from petra_hub.recipe.data import DataArguments, load_data

    folder = str(write_digits_dataset(tmp_path / "digits-hf"))
    cropping = BitImageProcessor(size={"shortest_edge": 24}, crop_size={"height": 16, "width": 16},
                                 do_center_crop=True)
    data = load_data(DataArguments(dataset_name=folder, image_size=12), seed=0, splits={"eval"}, processor=cropping)
    assert data.image_size == 12 and data.eval[0]["pixel_values"].shape == (3, 12, 12)
    assert data.processor.size == {"shortest_edge": 12} and data.processor.crop_size == {"height": 12, "width": 12}
    assert cropping.size == {"shortest_edge": 24}  # the caller's processor is left as it was
    image = digit_images(1)[0][0]  # what inference gets: the saved processor prepares it at the trained size
    assert data.processor(image, return_tensors="pt")["pixel_values"].shape == (1, 3, 12, 12)
    squashing = ViTImageProcessor(size={"height": 20, "width": 20})
    vit = load_data(DataArguments(dataset_name=folder, image_size=12), seed=0, splits={"eval"}, processor=squashing)
    assert vit.processor.size == {"height": 12, "width": 12} and vit.eval[0]["pixel_values"].shape == (3, 12, 12)


def test_a_new_model_trains_with_its_familys_recipe_defaults_where_no_flag_is_given():
    """The recipe's own defaults (momentum SGD at lr 0.05) are the RevNet paper's; a RevViT diverged with them at
    step 43 on 2 processes. It trains with its family's (AdamW) unless flags or a file say otherwise (trained with
    them: tests/test_recipe_multiprocess.py)."""
    from petra_hub.models.revvit.family import DELAYED_RECIPE_DEFAULTS, RECIPE_DEFAULTS

    model_args, _, args = recipe.parse(["--model", "revvit-tiny", "--petra_mode", "backprop"])
    assert (args.optim, args.optim_args, args.learning_rate, args.weight_decay, args.num_train_epochs,
            model_args.layer_scale_init_value, model_args.conv_stem) == (
        "adamw_torch", None, 5e-4, 0.05, 30.0, 1e-4, True) == tuple(RECIPE_DEFAULTS.values())
    assert args.petra_delay_lr_warmup == 0 and args.petra_weight_prediction == 0.5  # the recipe's own
    for mode in ("petra", "delayed"):  # delayed gradients: the family's delay remedies too
        model_args, _, args = recipe.parse(["--model", "revvit-tiny", "--petra_mode", mode])
        assert (args.learning_rate, args.petra_delay_lr_warmup, args.petra_weight_prediction) == (
            2e-3, float("inf"), 0.0) == tuple(DELAYED_RECIPE_DEFAULTS.values())
        assert (args.optim, model_args.layer_scale_init_value, model_args.conv_stem) == ("adamw_torch", 1e-4, True)
    assert recipe.parse(["--model", "revvit-tiny"])[2].learning_rate == 2e-3  # the recipe's mode is petra
    model_args, _, args = recipe.parse(["--model", "revvit-tiny", "--learning_rate", "1e-3", "--optim", "sgd",
                                        "--layer_scale_init_value", "null"])
    assert (args.optim, args.learning_rate, args.weight_decay) == ("sgd", 1e-3, 0.05)  # flags win, one by one
    assert model_args.layer_scale_init_value is None and args.petra_delay_lr_warmup == float("inf")
    assert recipe.parse([])[2].optim == "sgd" and recipe.parse([])[2].learning_rate == 0.05  # RevNet: the recipe's
    assert recipe.parse([])[2].petra_delay_lr_warmup == 0

