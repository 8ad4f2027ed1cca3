"""A second run into the same output_dir trains into it again, as transformers 5's Trainer does: by default the
earlier run's outputs are replaced (overwrite_output_dir=True); overwrite_output_dir=False refuses the folder."""

import pytest

from petra_hub.training import PetraTrainingArguments
from petra_hub.recipe.arguments import RecipeTrainingArguments, build_parser, parse
from tests.training.test_trainer import make_trainer


def test_a_second_run_into_the_same_output_dir_replaces_the_first(tmp_path, caplog):
    make_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=2).train()
    (tmp_path / "my_notes.txt").write_text("mine")
    with caplog.at_level("WARNING", logger="petra_hub.training.guards"):
        trainer = make_trainer(tmp_path, max_steps=2)  # no overwrite_output_dir given
        trainer.train()
    assert trainer.state.global_step == 2
    assert not (tmp_path / "checkpoint-2").exists()  # the earlier run's checkpoint went with it
    assert (tmp_path / "my_notes.txt").read_text() == "mine"  # other files stay
    assert [m for m in caplog.messages if "removed the earlier run's files" in m and "checkpoint-2" in m]


def test_false_still_refuses_another_runs_folder(tmp_path):
    make_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=2).train()
    with pytest.raises(FileExistsError, match="already holds another run"):
        make_trainer(tmp_path, max_steps=2, overwrite_output_dir=False).train()
    assert (tmp_path / "checkpoint-2").is_dir()


def test_the_default_is_true_in_the_arguments_and_the_recipe(tmp_path):
    assert PetraTrainingArguments(output_dir=str(tmp_path), report_to=[]).overwrite_output_dir is True
    assert parse(["--output_dir", str(tmp_path)])[2].overwrite_output_dir is True
    assert parse(["--output_dir", str(tmp_path), "--overwrite_output_dir", "false"])[2].overwrite_output_dir is False
    for arguments in (PetraTrainingArguments, RecipeTrainingArguments):
        text = arguments.__dataclass_fields__["overwrite_output_dir"].metadata["help"]
        assert "replaces the earlier run's" in text and "False refuses" in text, arguments
    shown = " ".join(build_parser().format_help().split())
    assert "refused otherwise" not in shown
