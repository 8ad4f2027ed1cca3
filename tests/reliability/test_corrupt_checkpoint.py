"""A checkpoint whose files load but hold the wrong content (corrupt, edited, from another run) is refused before
the first step and before any evaluation, naming the file; a best checkpoint that no longer exists is forgotten, as
Trainer does."""

import json
import logging
import shutil

import pytest
import torch

from tests.training.test_trainer import Recorder, make_trainer


@pytest.fixture(scope="module")
def genuine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    make_trainer(folder, max_steps=2, save_strategy="steps", save_steps=2).train()
    return folder / "checkpoint-2"


def _edit_json(name, change):
    def poison(folder):
        path = folder / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))
    return poison


def _edit_tensors(name, change):
    def poison(folder):
        path = folder / name
        state = torch.load(path, weights_only=True)
        change(state)
        torch.save(state, path)
    return poison


def _momentum_of_another_shape(state):
    buffers = state["optimizer"]["state"]
    first = next(iter(buffers))
    buffers[first]["momentum_buffer"] = torch.zeros(223)


def _small_torch_state(state):
    state["torch"] = torch.zeros(16, dtype=torch.uint8)


def _short_python_state(state):
    state["python"] = torch.zeros(3, dtype=torch.int64)


RNG, STAGE = "rng_state_0.pth", "petra_stage_000.pt"
POISONS = {
    "rng state of the wrong size": (RNG, _edit_tensors(RNG, _small_torch_state)),
    "rng state without a generator": (RNG, _edit_tensors(RNG, lambda state: state.pop("numpy_keys"))),
    "rng state with a short python entry": (RNG, _edit_tensors(RNG, _short_python_state)),
    "momentum of another shape": (STAGE, _edit_tensors(STAGE, _momentum_of_another_shape)),
    "scheduler state of another kind": (STAGE, _edit_tensors(STAGE, lambda state: state.update(scheduler={"x": 3}))),
    "trainer state with an unknown key": ("trainer_state.json", _edit_json("trainer_state.json",
                                                                          lambda state: {**state, "bogus": 1})),
    "trainer state with a text step": ("trainer_state.json", _edit_json("trainer_state.json",
                                                                       lambda state: {**state, "global_step": "2"})),
    "negative epoch offset": ("petra_state.json", _edit_json("petra_state.json",
                                                            lambda state: {**state, "epoch_offset": -3})),
    "micro-batch count as text": ("petra_state.json", _edit_json("petra_state.json",
                                                                lambda state: {**state, "micro_batches_fed": "4"})),
}


@pytest.mark.parametrize("case", POISONS)
def test_a_corrupt_checkpoint_is_refused_before_any_work_naming_the_file(case, genuine, tmp_path):
    file_name, poison = POISONS[case]
    folder = tmp_path / "checkpoint-2"
    shutil.copytree(genuine, folder)
    poison(folder)
    recorder = Recorder()
    resumed = make_trainer(tmp_path / "resumed", callbacks=[recorder], max_steps=4, eval_on_start=True)
    with pytest.raises(ValueError, match=rf"{file_name}|cannot resume from {folder}"):
        resumed.train(resume_from_checkpoint=str(folder))
    assert recorder.evaluations == [] and "step_begin" not in recorder.events


def test_a_best_checkpoint_that_is_gone_is_forgotten_as_trainer_does(tmp_path, caplog):
    first = make_trainer(tmp_path / "a", max_steps=4, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                         save_steps=2, metric_for_best_model="loss", greater_is_better=True)
    first.train()
    best = json.loads((tmp_path / "a" / "checkpoint-4" / "trainer_state.json").read_text())["best_model_checkpoint"]
    assert best is not None
    shutil.copytree(tmp_path / "a" / "checkpoint-4", tmp_path / "b" / "checkpoint-4")
    shutil.rmtree(tmp_path / "a")  # the run's folder moved: its best checkpoint is gone
    resumed = make_trainer(tmp_path / "b", max_steps=6, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                           save_steps=2, metric_for_best_model="loss", greater_is_better=True,
                           load_best_model_at_end=True)
    with caplog.at_level(logging.WARNING):
        output = resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-4"))
    assert output.global_step == 6 and caplog.text.count("does not exist anymore") == 1
    # as Trainer: the best metric stays the lost checkpoint's, so only a better model would be named the best
    assert resumed.state.best_metric == first.state.best_metric
    last = next(entry["eval_loss"] for entry in resumed.state.log_history
                if entry.get("step") == 6 and "eval_loss" in entry)
    better = last > first.state.best_metric
    assert resumed.state.best_model_checkpoint == (str(tmp_path / "b" / "checkpoint-6") if better else None)
