"""Decisions the Trainer makes around the engine: made once and the same on every rank, and never taken from a path
written in a checkpoint file."""

import json
import os
import shutil

import torch

from transformers import TrainerCallback

from petra_hub.testing.ranks import run_ranks
from tests.training.test_multiprocess import as_launched
from tests.training.test_trainer import make_trainer

EVERY_2 = dict(eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2)
BEST = dict(load_best_model_at_end=True, metric_for_best_model="accuracy", greater_is_better=True)


def test_a_best_checkpoint_path_in_trainer_state_is_never_used(tmp_path):
    first = make_trainer(tmp_path / "run", max_steps=4, save_total_limit=1, **EVERY_2, **BEST)
    first.train()
    elsewhere = tmp_path / "elsewhere" / "checkpoint-2"
    shutil.copytree(tmp_path / "run" / "checkpoint-4", elsewhere)
    state_file = tmp_path / "run" / "checkpoint-4" / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["best_model_checkpoint"] = str(elsewhere)  # planted: a folder outside output_dir
    state_file.write_text(json.dumps(state))
    resumed = make_trainer(tmp_path / "run", max_steps=8, save_total_limit=1, **EVERY_2, **BEST)
    resumed.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-4"))
    best = resumed.state.best_model_checkpoint
    assert best is not None and os.path.dirname(best) == str(tmp_path / "run")
    assert sorted(os.listdir(tmp_path / "run")).count(os.path.basename(best)) == 1  # the run keeps its best
    assert (elsewhere / "model.safetensors").is_file()


def test_resuming_from_another_folders_checkpoint_keeps_this_folders_checkpoints(tmp_path):
    first = make_trainer(tmp_path / "A", max_steps=4, **EVERY_2, **BEST)
    first.train()
    resumed = make_trainer(tmp_path / "C", max_steps=8, save_total_limit=1, **EVERY_2, **BEST)
    resumed.train(resume_from_checkpoint=str(tmp_path / "A" / "checkpoint-4"))
    kept = [name for name in os.listdir(tmp_path / "C") if name.startswith("checkpoint-")]
    assert len(kept) == 1 and resumed.state.best_model_checkpoint in (None, str(tmp_path / "C" / kept[0]))
    assert os.path.isdir(tmp_path / "A" / "checkpoint-2")  # the other folder is not touched


def test_rewinding_keeps_the_new_checkpoints_and_drops_the_abandoned_ones(tmp_path, caplog):
    first = make_trainer(tmp_path, max_steps=8, save_strategy="steps", save_steps=2)
    first.train()
    assert (tmp_path / "checkpoint-8").is_dir()
    rewound = make_trainer(tmp_path, max_steps=6, save_strategy="steps", save_steps=2, save_total_limit=1)
    rewound.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert sorted(name for name in os.listdir(tmp_path) if name.startswith("checkpoint-")) == ["checkpoint-6"]
    assert "checkpoint-8" in caplog.text and "abandoned" in caplog.text


class CorruptOneRank(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2 and not state.is_world_process_zero:
            state.total_flos += 1.0


class StopOnOneRank(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 3 and not state.is_world_process_zero:
            control.should_training_stop = True  # ignored: rank 0's callbacks decide
        if state.global_step == 4 and state.is_world_process_zero:
            control.should_training_stop = True


def _train_with(rank, world_size, folder, callback_name):
    as_launched(rank, world_size)
    callback = {"corrupt": CorruptOneRank, "stop": StopOnOneRank}[callback_name]()
    trainer = make_trainer(folder, max_steps=8, callbacks=[callback], **EVERY_2)
    trainer.train()
    return trainer.state.global_step


def test_a_rank_whose_state_differs_is_named_at_the_next_drain_point(tmp_path):
    results, codes, _ = run_ranks(_train_with, 2, str(tmp_path), "corrupt", deadline=180)
    errors = [result["error"] for result in results]
    assert all("disagree on total_flos at global step 2" in error for error in errors), errors
    assert all("rank 0" in error and "rank 1" in error for error in errors)


def test_callbacks_decide_as_rank_zero_decides(tmp_path):
    results, codes, _ = run_ranks(_train_with, 2, str(tmp_path), "stop", deadline=180)
    assert [result.get("value") for result in results] == [4, 4], [r.get("traceback") for r in results]


def _killed_while_rotating(rank, world_size, folder, kill_at, resume):
    from petra_hub.training import checkpoint

    as_launched(rank, world_size)
    rotate = checkpoint.rotate

    def rotate_or_die(trainer, run_dir, final):
        if final.endswith(f"checkpoint-{kill_at}"):
            os._exit(0)  # the machine goes down after publishing, before rotating
        rotate(trainer, run_dir, final)

    checkpoint.rotate = rotate_or_die
    trainer = make_trainer(folder, max_steps=8, save_total_limit=2, **EVERY_2, **BEST)
    trainer.train(resume_from_checkpoint=resume)
    metrics = trainer.evaluate()
    return {"weights": {k: v.clone() for k, v in trainer.model.state_dict().items()},
            "accuracy": metrics["eval_accuracy"], "best": os.path.basename(trainer.state.best_model_checkpoint),
            "checkpoints": sorted(n for n in os.listdir(folder) if n.startswith("checkpoint-"))}


def test_a_run_killed_while_rotating_resumes_to_the_uninterrupted_result_on_two_processes(tmp_path):
    full, _, _ = run_ranks(_killed_while_rotating, 2, str(tmp_path / "full"), None, None, deadline=240)
    assert all(r and "value" in r for r in full), [r and r.get("traceback") for r in full]
    run_ranks(_killed_while_rotating, 2, str(tmp_path / "killed"), 6, None, deadline=240, expendable=(1,))
    assert (tmp_path / "killed" / "checkpoint-6").is_dir()
    resumed, _, _ = run_ranks(_killed_while_rotating, 2, str(tmp_path / "killed"), None, True, deadline=240)
    assert all(r and "value" in r for r in resumed), [r and r.get("traceback") for r in resumed]
    expected = full[0]["value"]
    for result in resumed:
        value = result["value"]
        assert all(torch.equal(value["weights"][name], expected["weights"][name]) for name in expected["weights"])
        assert (value["accuracy"], value["best"], value["checkpoints"]) == (
            expected["accuracy"], expected["best"], expected["checkpoints"])
