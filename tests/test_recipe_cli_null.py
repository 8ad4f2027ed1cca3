"""`null` on the recipe's command line unsets a value, as in its config file (--help offers it for --hidden_sizes
and --embedding_size), and --hidden_sizes is checked with an error naming the flag."""

from types import SimpleNamespace

import pytest

from petra_hub.recipe.train import _new_config
from petra_hub.recipe.arguments import parse

PAPER_CIFAR10 = "recipes/configs/cifar10_revnet18_petra.yaml"


@pytest.mark.parametrize("argv", [["--hidden_sizes", "null", "--embedding_size", "null"],
                                  ["--hidden_sizes=None", "--embedding-size=None"]])
def test_null_flags_give_the_presets_widths(argv):
    model_args, _, _ = parse(argv)
    assert model_args.hidden_sizes is None and model_args.embedding_size is None
    config = _new_config(model_args, SimpleNamespace(image_size=32))
    assert (config.hidden_sizes, config.embedding_size) == ([64, 128, 256, 512], 64)  # revnet18's, not 16,...,128


def test_a_paper_recipe_switches_to_the_hub_from_the_command_line():
    _, data_args, args = parse([PAPER_CIFAR10, "--data_dir", "null", "--hub_id", "uoft-cs/cifar10"])
    assert (data_args.data_dir, data_args.hub_id, args.output_dir) == (None, "uoft-cs/cifar10",
                                                                       "outputs/revnet18-cifar10-petra")
    _, data_args, _ = parse([PAPER_CIFAR10, "--hub_id", "uoft-cs/cifar10"])
    assert data_args.data_dir == "data/cifar10"  # without the null the file's stays (refused with hub_id on loading)


def test_null_for_a_flag_that_cannot_be_none_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"^--model null: this flag cannot be unset \(it has no null value\)"):
        parse(["--model", "null"])


def test_words_that_are_not_null_stay_values():
    _, _, args = parse(["--report_to", "none", "--run_name", "nullity"])
    assert (args.report_to, args.run_name) == ([], "nullity")


@pytest.mark.parametrize("value", ["16,x", "0,32", "16;32", "null,16"])
def test_bad_hidden_sizes_name_the_flag(value):
    with pytest.raises(ValueError, match=rf"^--hidden_sizes '{value}': expected comma-separated positive integers, "
                                         r"one width per layer \(e.g. 16,32,64,128\), 'paper' or null"):
        parse(["--hidden_sizes", value])


def test_hidden_sizes_spaces_and_yaml_lists(tmp_path):
    assert parse(["--hidden_sizes", " 8, 16 ,32,64"])[0].hidden_sizes == "8,16,32,64"
    (tmp_path / "run.yaml").write_text("hidden_sizes: [8, 16, 32, 64]\n")
    model_args, _, _ = parse([str(tmp_path / "run.yaml")])
    assert _new_config(model_args, SimpleNamespace(image_size=32)).hidden_sizes == [8, 16, 32, 64]
