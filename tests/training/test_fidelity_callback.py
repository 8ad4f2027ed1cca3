"""GradientFidelityCallback: it measures without perturbing training, logs through the Trainer's loggers
(tensorboard, offline), keeps a JSON history, and gives the same numbers on 2 processes as on one."""

import json
from pathlib import Path

import pytest
import torch

from petra_hub.testing.ranks import run_ranks
from petra_hub.training import GradientFidelityCallback
from petra_hub.training.fidelity import HISTORY_FILE, METRICS
from tests.training.test_multiprocess import as_launched
from tests.training.test_trainer import make_trainer

STEPS = 12
SETTINGS = dict(max_steps=STEPS, gradient_accumulation_steps=1, logging_steps=4)


def fidelity_run(folder, callback=None, **overrides):
    trainer = make_trainer(folder, callbacks=[callback] if callback else None, **{**SETTINGS, **overrides})
    trainer.train()
    return trainer


def tensorboard_tags(folder: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in folder.rglob("events.out.tfevents.*"):
        accumulator = EventAccumulator(str(events))
        accumulator.Reload()
        tags.update(accumulator.Tags()["scalars"])
    return tags


def test_the_callback_measures_every_stage_without_changing_the_run(tmp_path):
    plain = fidelity_run(tmp_path / "plain")
    callback = GradientFidelityCallback(every_n_steps=3)
    probed = fidelity_run(tmp_path / "probed", callback, report_to=["tensorboard"])

    expected = plain.model.state_dict()
    assert all(torch.equal(probed.model.state_dict()[name], value) for name, value in expected.items())

    num_stages = len(probed.stages)
    # probes at steps 0, 3, 6, 9 (first micro-batch of each); k = 1 so micro-batch m is step m's
    assert sorted({r["micro_batch"] for r in callback.history}) == [0, 3, 6, 9]
    assert len(callback.history) == 4 * num_stages
    for record in callback.history:
        # ready once its backward reached stage 0, 2(J-1) ticks after it entered; the last ones at the final drain
        assert record["step"] == min(record["micro_batch"] + 2 * (num_stages - 1) + 1, STEPS)
        assert all(abs(record[m]) <= 1 + 1e-9 for m in METRICS if m.startswith("cosine"))
    first_step = [r for r in callback.history if r["micro_batch"] == 0]
    assert all(r["cosine_true"] == pytest.approx(1, abs=1e-5) for r in first_step)  # nothing had been updated yet
    late = [r for r in callback.history if r["micro_batch"] == 9 and r["stage"] == 1]
    assert late[0]["cosine_true"] < 0.9999  # the delay shows

    saved = json.loads((tmp_path / "probed" / HISTORY_FILE).read_text())
    assert saved["records"] == callback.history and saved["every_n_steps"] == 3
    logged = [entry for entry in probed.state.log_history if "fidelity/stage_0/cosine_true" in entry]
    assert len(logged) == len({r["step"] for r in callback.history})
    tags = tensorboard_tags(tmp_path / "probed")  # transformers' TensorBoardCallback prefixes "train/"
    assert {f"train/fidelity/stage_{i}/{m}" for i in range(num_stages) for m in METRICS} <= tags


def test_selected_stages_and_bad_settings(tmp_path):
    callback = GradientFidelityCallback(every_n_steps=4, stages=[1, 8], history_file=None)
    fidelity_run(tmp_path / "some", callback)
    assert {r["stage"] for r in callback.history} == {1, 8}
    assert not (tmp_path / "some" / HISTORY_FILE).exists()

    with pytest.raises(ValueError, match="every_n_steps"):
        GradientFidelityCallback(every_n_steps=0)
    with pytest.raises(ValueError, match=r"stages=\[12\].*stages 0..9"):
        fidelity_run(tmp_path / "bad", GradientFidelityCallback(stages=[12]))
    with pytest.raises(TypeError, match="needs a PetraTrainer"):
        GradientFidelityCallback().on_train_begin(None, None, None)


def _fidelity_on_ranks(rank, world_size, folder):
    as_launched(rank, world_size)
    callback = GradientFidelityCallback(every_n_steps=4)
    fidelity_run(folder, callback)
    return callback.history


def test_two_processes_log_what_one_process_logs(tmp_path):
    outcome, codes, _ = run_ranks(_fidelity_on_ranks, 2, str(tmp_path / "two"), deadline=240)
    assert codes == [0, 0], [r and r.get("traceback") for r in outcome]
    callback = GradientFidelityCallback(every_n_steps=4)
    fidelity_run(tmp_path / "one", callback)
    expected = callback.history
    assert expected and all(result["value"] == expected for result in outcome)


def test_the_training_argument_adds_the_callback(tmp_path):
    trainer = fidelity_run(tmp_path / "argument", petra_gradient_fidelity_steps=6)
    callback = [c for c in trainer.callback_handler.callbacks if isinstance(c, GradientFidelityCallback)]
    assert len(callback) == 1 and callback[0].every_n_steps == 6
    assert sorted({r["micro_batch"] for r in callback[0].history}) == [0, 6]
    with pytest.raises(ValueError, match="petra_gradient_fidelity_steps"):
        make_trainer(tmp_path / "negative", petra_gradient_fidelity_steps=-1)
