"""benchmarks/accuracy_digits.py builds the recipe's arguments for each model it compares."""

import argparse

import pytest

from petra_hub.recipe import train as recipe

from .conftest import load


def test_each_model_runs_under_its_own_recipe_settings():
    benchmark = load("accuracy_digits")
    revnet = benchmark.recipe_argv("petra", 2, 3, 12, "out")
    model_args, _, args = recipe.parse(revnet)
    assert (model_args.model, args.optim, args.gradient_accumulation_steps, args.seed) == ("revnet18", "sgd", 2, 3)
    assert args.petra_scale_lr and args.micro_batch_learning_rate() == 0.4 * 32 * 2 / 256  # the paper's scaling
    revvit = benchmark.recipe_argv("petra", 1, 0, 30, "out", model="revvit-tiny")
    model_args, _, args = recipe.parse(revvit)
    assert (model_args.model, args.optim, args.optim_args) == ("revvit-tiny", "adamw_torch", None)
    assert not args.petra_scale_lr and args.learning_rate == 5e-4 and args.num_train_epochs == 30
    assert benchmark.parse_args(["--model", "revvit-tiny"]).epochs == 30
    assert benchmark.parse_args([]).epochs == 12
    model_args, data_args, args = recipe.parse(benchmark.recipe_argv("backprop", 1, 0, 100, "out",
                                                                     model="revvit-tiny-petra"))
    assert model_args.model == "revvit-tiny" and args.petra_num_stages == 4 and not data_args.augment
    assert (args.petra_mode, args.num_train_epochs) == ("backprop", 100)
    assert benchmark.parse_args(["--model", "revvit-tiny-petra"]).epochs == 150  # the recipe file's


def test_a_configuration_without_a_remedy_is_the_papers_petra_whatever_the_recipe_turns_on():
    benchmark = load("accuracy_digits")
    plain = recipe.parse(benchmark.recipe_argv("petra", 1, 0, 12, "out"))[2]
    assert plain.petra_weight_prediction == 0 and recipe.parse([])[2].petra_weight_prediction == 0.5
    predicted = recipe.parse(benchmark.recipe_argv("petra", 1, 0, 12, "out", remedy="predict-half"))[2]
    assert predicted.petra_weight_prediction == 0.5


def test_remedies_combine_in_one_configuration_and_each_reaches_the_recipe():
    benchmark = load("accuracy_digits")
    assert benchmark.parse_config("petra-k2+delay-scaled+layerscale@bf16") == (
        "petra", 2, "bf16", "delay-scaled+layerscale")
    assert benchmark.config_name("petra-k1+none") == "petra-k1"
    for bad in ("petra-k1+predict+predict", "petra-k1+nonsense"):
        with pytest.raises(argparse.ArgumentTypeError, match="twice|unknown remedy"):
            benchmark.parse_config(bad)
    argv = benchmark.recipe_argv("petra", 1, 0, 10, "out", remedy="predict-half+delay-scaled+layerscale",
                                 model="revvit-tiny")
    model_args, _, args = recipe.parse(argv)
    assert (args.petra_weight_prediction, args.petra_delay_lr_warmup) == (0.5, float("inf"))
    assert model_args.layer_scale_init_value == 1e-4


def test_revnet34_is_the_recipe_widths_with_resnet34_depths_at_the_papers_learning_rate():
    benchmark = load("accuracy_digits")
    model_args, _, args = recipe.parse(benchmark.recipe_argv("petra", 1, 0, 12, "out", model="revnet34"))
    assert model_args.model == "revnet34" and model_args.hidden_sizes == "16,32,64,128"
    assert args.petra_scale_lr and args.micro_batch_learning_rate() == 0.4 * 32 / 256


@pytest.mark.benchmark_run
def test_runs_in_parallel_processes_give_the_accuracies_of_runs_in_this_one(tmp_path):
    benchmark = load("accuracy_digits")
    argv = ["--configs", "backprop", "petra-k1+predict-half", "--seeds", "0", "--epochs", "0.1", "--num-stages", "4"]
    alone = benchmark.main(argv + ["--out", str(tmp_path / "alone.json")])
    parallel = benchmark.main(argv + ["--jobs", "2", "--out", str(tmp_path / "parallel.json")])
    assert parallel["settings"]["jobs"] == 2
    assert [(r["mode"], r["remedy"], r["num_stages"], r["test_accuracy"], r["test_loss"]) for r in parallel["runs"]] \
        == [(r["mode"], r["remedy"], r["num_stages"], r["test_accuracy"], r["test_loss"]) for r in alone["runs"]]
