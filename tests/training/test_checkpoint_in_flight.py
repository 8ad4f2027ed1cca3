"""Checkpoints keep the micro-batches in flight instead of draining the pipeline: a run that saves trains the model of
a run that never saves, and a run resumed from any of its checkpoints ends there too, with the same logs."""

import json
import logging

import torch
from safetensors.torch import load_file

from petra_hub.training.checkpoint import STAGE_STATE_PATTERN
from petra_hub.testing.ranks import run_ranks
from tests.training.test_multiprocess import as_launched
from tests.training.test_trainer import make_trainer

STEPS = 8


def weights(trainer) -> dict:
    return {name: value.clone() for name, value in trainer.model.state_dict().items()}


def losses(trainer) -> list:
    return [(entry["step"], entry["loss"]) for entry in trainer.state.log_history if "loss" in entry]


def test_saving_every_step_trains_the_model_of_a_run_that_never_saves(tmp_path):
    """Saves at every step (each with micro-batches in flight at every stage but the last) change nothing: the
    weights and the logged losses are those of save_strategy="no", to the bit."""
    never = make_trainer(tmp_path / "never", max_steps=STEPS)
    never.train()
    every = make_trainer(tmp_path / "every", max_steps=STEPS, save_strategy="steps", save_steps=1,
                         save_total_limit=None)
    every.train()
    expected = weights(never)
    assert all(torch.equal(value, expected[name]) for name, value in weights(every).items())
    assert losses(every) == losses(never) and losses(never)

    folder = tmp_path / "every" / "checkpoint-3"
    stage_0 = torch.load(folder / STAGE_STATE_PATTERN.format(0), weights_only=True)["in_flight"]
    assert sorted(stage_0["pending"]) == list(range(6))  # J = 10: every micro-batch fed is still in flight
    assert stage_0["position"]["fed"] == 6 and stage_0["position"]["updates"] == 3
    state = json.loads((folder / "petra_state.json").read_text())
    assert [pair[0] for pair in state["loss_steps"]] == list(range(6))  # none has reached the loss yet
    assert all(size == 2 for _, size in state["loss_steps"])
    saved = load_file(folder / "model.safetensors")  # the weights as they stood at step 3
    assert not all(torch.equal(saved[name], value) for name, value in expected.items() if name in saved)


def test_a_run_resumed_from_a_checkpoint_with_micro_batches_in_flight_ends_as_one_that_never_stopped(tmp_path):
    """Resumed from checkpoint-3, and from checkpoint-6 of another epoch: the weights, and the losses logged
    at every step, are the uninterrupted run's."""
    never = make_trainer(tmp_path / "never", max_steps=STEPS, logging_steps=1)
    never.train()
    expected = weights(never)
    saving = make_trainer(tmp_path / "run", max_steps=STEPS, save_strategy="steps", save_steps=3, logging_steps=1)
    saving.train()
    for step in (3, 6):
        resumed = make_trainer(tmp_path / "run", max_steps=STEPS, logging_steps=1)
        resumed.train(resume_from_checkpoint=str(tmp_path / "run" / f"checkpoint-{step}"))
        assert all(torch.equal(value, expected[name]) for name, value in weights(resumed).items()), step
        assert losses(resumed) == losses(never), step  # the checkpoint's log history, then the same losses


def test_where_the_work_in_flight_cannot_be_kept_a_save_drains_and_says_why(tmp_path, caplog):
    """Stages that keep their forward's graph (all of them, in a roomy memory budget): the save drains first (as
    evaluating does) and logs why."""
    trainer = make_trainer(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, petra_memory_budget="1GiB")
    with caplog.at_level(logging.INFO, logger="petra_hub.training.trainer"):
        trainer.train()
    assert "checkpoint-2 drains the pipeline first: stages [0, 1, 2, 3, 4, 5, 6, 7, 8] keep their forward's " \
        "autograd graph" in caplog.text
    stage_0 = torch.load(tmp_path / "checkpoint-2" / STAGE_STATE_PATTERN.format(0), weights_only=True)
    assert stage_0["in_flight"]["pending"] == {}


def _save_or_resume(rank, world_size, folder, resume):
    as_launched(rank, world_size)
    trainer = make_trainer(folder, max_steps=STEPS, save_strategy="steps", save_steps=3,
                           petra_partition={2: "6,4", 3: "3,3,4"}[world_size])
    trainer.train(resume_from_checkpoint=f"{folder}/checkpoint-3" if resume else None)
    return weights(trainer) if rank == 0 else None


def test_two_processes_save_in_flight_and_three_resume_as_one_process_that_never_stopped(tmp_path):
    results, codes, _ = run_ranks(_save_or_resume, 2, str(tmp_path / "run"), False, deadline=240)
    assert codes == [0, 0], [r and r.get("traceback") for r in results]
    results, codes, _ = run_ranks(_save_or_resume, 3, str(tmp_path / "run"), True, deadline=240)
    assert codes == [0, 0, 0], [r and r.get("traceback") for r in results]
    never = make_trainer(tmp_path / "never", max_steps=STEPS)
    never.train()
    expected = weights(never)
    assert all(torch.equal(value, expected[name]) for name, value in results[0]["value"].items())
