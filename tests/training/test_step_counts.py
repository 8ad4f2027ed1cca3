"""A run of no steps is refused when the arguments are built: num_train_epochs must be positive when epochs decide
the length of the run (max_steps -1), and max_steps is -1 or a positive number of global steps. Before, a run of
-1 or 0 epochs (or max_steps 0) trained nothing, evaluated and saved the untrained model, then failed in the card."""

import os
import subprocess
import sys

import pytest

from petra_hub.training import PetraTrainingArguments
from petra_hub.recipe import train as recipe


def arguments(tmp_path, **settings):
    return PetraTrainingArguments(output_dir=str(tmp_path), report_to=[], **settings)


@pytest.mark.parametrize("epochs", [-1, 0, 0.0, -0.5])
def test_epochs_that_give_no_steps_are_refused(tmp_path, epochs):
    with pytest.raises(ValueError, match=r"^num_train_epochs=.*: expected a positive number of epochs"):
        arguments(tmp_path, num_train_epochs=epochs)


@pytest.mark.parametrize("steps", [0, -2, -100])
def test_max_steps_is_minus_one_or_positive(tmp_path, steps):
    with pytest.raises(ValueError, match=rf"^max_steps={steps}: expected -1 .* or a positive number of global steps"):
        arguments(tmp_path, max_steps=steps)


def test_runs_of_at_least_one_step_are_accepted(tmp_path):
    assert arguments(tmp_path, num_train_epochs=0.25).max_steps == -1
    assert arguments(tmp_path, num_train_epochs=0, max_steps=3).max_steps == 3  # max_steps decides: epochs unused
    assert arguments(tmp_path, num_train_epochs=-1, max_steps=1).max_steps == 1


def test_the_recipe_refuses_them_before_loading_data_or_building_a_model(tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("reached after the arguments were refused")

    monkeypatch.setattr(recipe, "load_data", never)
    monkeypatch.setattr(recipe, "build_model", never)
    with pytest.raises(ValueError, match=r"^num_train_epochs=-1.0: expected a positive number of epochs"):
        recipe.main(["--num_train_epochs", "-1", "--output_dir", str(tmp_path / "out")])
    with pytest.raises(ValueError, match=r"^max_steps=0: expected -1"):
        recipe.main(["--max_steps", "0", "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_petra_train_exits_with_an_error_naming_num_train_epochs(tmp_path):
    command = [sys.executable, "-c", "from petra_hub.recipe import main; main()",
               "--num_train_epochs", "-1", "--output_dir", str(tmp_path / "out")]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode != 0
    assert "ValueError: num_train_epochs=-1.0: expected a positive number of epochs" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing trained, evaluated or saved
