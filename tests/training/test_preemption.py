"""Preemption and restarts: SIGTERM (or a first Ctrl-C) to any one process saves a checkpoint at the next step end on
every process and exits with status 75; a job that torchrun restarts resumes from its last complete checkpoint."""

import os
import re
import signal
import time

import pytest
import torch
from transformers import TrainerCallback

from petra_hub.testing.ranks import run_ranks
from petra_hub.training import PREEMPTED_EXIT_STATUS, Preempted
from petra_hub.training.preemption import PreemptionWatch, resume_after_restart
from tests.training.test_multiprocess import as_launched
from tests.training.test_trainer import make_trainer

STEPS = 8


class SignalAt(TrainerCallback):
    """Sends `signal` to this process at the end of global step `step` (on `rank` only, where given)."""

    def __init__(self, step: int, number=signal.SIGTERM, rank: int | None = None):
        self.step, self.number, self.rank = step, number, rank

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and self.rank in (None, int(os.environ.get("RANK", 0))):
            os.kill(os.getpid(), self.number)


def weights(trainer) -> dict:
    return {name: value.clone() for name, value in trainer.model.state_dict().items()}


def test_sigterm_saves_the_step_and_a_resumed_run_ends_where_a_run_that_never_stopped_does(tmp_path):
    preempted = make_trainer(tmp_path / "run", max_steps=STEPS, callbacks=[SignalAt(3)])
    with pytest.raises(Preempted) as caught:
        preempted.train()
    assert caught.value.code == PREEMPTED_EXIT_STATUS == 75
    assert caught.value.checkpoint == str(tmp_path / "run" / "checkpoint-3")
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-3"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler lasted as long as training
    resumed = make_trainer(tmp_path / "run", max_steps=STEPS)
    resumed.train(resume_from_checkpoint=True)
    reference = make_trainer(tmp_path / "reference", max_steps=STEPS)
    reference.train()  # never stopped, never saved
    expected = weights(reference)
    assert all(torch.equal(value, expected[name]) for name, value in weights(resumed).items())


def test_a_second_ctrl_c_stops_at_once_and_the_handlers_come_back():
    before = signal.getsignal(signal.SIGINT)
    watch = PreemptionWatch(grace=30)
    with pytest.raises(KeyboardInterrupt):
        with watch:
            os.kill(os.getpid(), signal.SIGINT)
            assert watch.received == "SIGINT"
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the second one interrupts this
    assert signal.getsignal(signal.SIGINT) is before


def _preempt_one(rank, world_size, folder):
    as_launched(rank, world_size)
    trainer = make_trainer(folder, max_steps=STEPS, callbacks=[SignalAt(3, rank=1)])
    try:
        trainer.train()
    except Preempted as stop:
        return stop.code, os.path.basename(stop.checkpoint), trainer.state.global_step
    return "trained on"


def test_sigterm_to_one_of_two_processes_stops_both_with_the_same_checkpoint(tmp_path):
    results, _, _ = run_ranks(_preempt_one, 2, str(tmp_path), deadline=180)
    assert [r.get("value") for r in results] == [(PREEMPTED_EXIT_STATUS, "checkpoint-3", 3)] * 2, \
        [r and r.get("traceback") for r in results]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3"]
    assert not list(tmp_path.glob("*tmp*"))  # published whole


def _slow_save(rank, world_size, folder):
    trainer = make_trainer(folder, max_steps=STEPS, save_strategy="steps", save_steps=2,
                           petra_preemption_grace=1.0, callbacks=[SignalAt(3)])
    save = trainer._save_checkpoint

    def slowly(*args, **kwargs):
        if trainer.state.global_step == 3:
            time.sleep(10)  # past the grace
        return save(*args, **kwargs)

    trainer._save_checkpoint = slowly
    trainer.train()


def test_a_save_that_outlasts_the_grace_leaves_the_last_complete_checkpoint(tmp_path):
    started = time.monotonic()
    results, codes, _ = run_ranks(_slow_save, 1, str(tmp_path), deadline=120)
    assert codes == [PREEMPTED_EXIT_STATUS] and time.monotonic() - started < 60
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]


def test_a_restarted_job_resumes_from_the_last_complete_checkpoint_unless_told_otherwise(tmp_path, monkeypatch):
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "_tmp-checkpoint-6").mkdir()  # a save cut short
    assert resume_after_restart(None, str(tmp_path)) is None  # a first launch
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert resume_after_restart(None, str(tmp_path)) == str(tmp_path / "checkpoint-4")
    for chosen in (False, True, str(tmp_path / "checkpoint-2")):
        assert resume_after_restart(chosen, str(tmp_path)) == chosen
    assert resume_after_restart(None, str(tmp_path / "empty")) is None


def _leg(rank, world_size, folder, kill_at, saves=True):
    """One leg of a run saved every 2 steps: resumed from the folder's last checkpoint (if any), killed right after
    saving step `kill_at` (None: trained to the end)."""
    from tests.training.test_multiprocess import Kill

    if world_size > 1:
        as_launched(rank, world_size)
    trainer = make_trainer(folder, max_steps=STEPS, save_strategy="steps" if saves else "no", save_steps=2,
                           callbacks=[Kill(kill_at)] if kill_at else None,
                           petra_partition={3: "4,3,3", 2: "5,5"}.get(world_size))
    trainer.train(resume_from_checkpoint=any(p.name.startswith("checkpoint-") for p in os.scandir(folder))
                  if os.path.isdir(folder) else None)
    return weights(trainer)


def test_a_run_goes_on_from_two_to_three_to_one_process_as_if_uninterrupted(tmp_path):
    """Checkpoints are per stage: a job restarted on another number of processes regroups them."""
    run = str(tmp_path / "run")
    for processes, kill_at in ((2, 2), (3, 4)):
        results, codes, _ = run_ranks(_leg, processes, run, kill_at, deadline=240)
        assert codes == [0] * processes and all(r is None for r in results), results
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    finished = _leg(0, 1, run, None)
    uninterrupted = _leg(0, 1, str(tmp_path / "uninterrupted"), None, saves=False)
    assert all(torch.equal(value, uninterrupted[name]) for name, value in finished.items())


def test_a_job_under_torchrun_resumes_after_a_killed_process_and_saves_when_the_launcher_is_told_to_stop(tmp_path):
    """One torchrun job (`tests/scripts/restarted_run.py`): a process killed after checkpoint-4, the job restarted
    and resumed by itself, then SIGTERM to torchrun at step 6, passed on to both processes, which save checkpoint-6
    and exit with status 75. Resumed once more to step 8, the weights are those of a run that never stopped nor
    saved."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run, marks = tmp_path / "run", tmp_path / "marks"
    marks.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "--max-restarts", "1", str(root / "tests" / "scripts" / "restarted_run.py"), str(run), str(marks)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    log = output[-6000:]
    assert [(marks / f"attempt-{rank}").read_text() for rank in (0, 1)] == ["1", "1"], log
    assert f"restart 1 of this job: resuming from {run / 'checkpoint-4'}" in output, log
    assert re.search(r"preempted \(SIGTERM on process (0, SIGTERM on process )?1\) at global step 6", output), log
    assert [(marks / f"preempted-{rank}").read_text() for rank in (0, 1)] == ["75 checkpoint-6"] * 2, log
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    finished = make_trainer(run, max_steps=STEPS, save_strategy="steps", save_steps=2)
    finished.train(resume_from_checkpoint=True)
    reference = make_trainer(tmp_path / "reference", max_steps=STEPS)
    reference.train()
    expected = weights(reference)
    assert all(torch.equal(value, expected[name]) for name, value in weights(finished).items())


def test_outside_the_main_thread_the_signals_keep_their_effect_and_it_says_so(caplog):
    import threading

    before, seen = signal.getsignal(signal.SIGTERM), []

    def enter():
        with PreemptionWatch(grace=30):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == [before] and "outside the main thread" in caplog.text
