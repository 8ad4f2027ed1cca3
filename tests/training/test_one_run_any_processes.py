"""One run, whatever the number of processes: each scenario runs on 1 and on 2 processes and must give the same
evaluation metrics and predictions, bit-identical final weights, the same trainer state, the same checkpoint folders
and the same numbers in the model card, on every rank.

The scenarios of a process count run one after the other in one launch (`run_ranks`), each into its own folder.
"""

import hashlib
import json
import os
import re

import pytest
import torch
from transformers import EarlyStoppingCallback, TrainerCallback

from petra_hub.testing.ranks import run_ranks
from petra_hub.training.agreement import shared_fields
from tests.training.test_multiprocess import as_launched
from tests.training.test_trainer import make_trainer

EVERY_2 = dict(eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2)
BEST_LOSS = dict(load_best_model_at_end=True, metric_for_best_model="loss", greater_is_better=False)
BEST_ACCURACY = dict(load_best_model_at_end=True, metric_for_best_model="accuracy", greater_is_better=True)
REMEDIES = dict(petra_synchronous_steps=2, petra_weight_prediction=0.5, petra_delay_momentum=True)


class Stop(Exception):
    """Ends a run at a checkpoint on every rank, as a machine going down right after it (the run is then resumed
    from that checkpoint by a new trainer)."""


class StopAfterSave(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Stop()


def summed(outputs, labels, num_items_in_batch=None):
    return torch.nn.functional.cross_entropy(outputs.logits.float(), labels.long(), reduction="sum") / max(
        1, int(num_items_in_batch or len(labels)))


# name -> (trainer settings, extra: stop step to resume from, callbacks, ...)
SCENARIOS = {
    "steps": dict(max_steps=6, **EVERY_2),
    "epochs": dict(max_steps=-1, num_train_epochs=2, eval_strategy="epoch", save_strategy="epoch"),
    "best_loss": dict(max_steps=8, **EVERY_2, **BEST_LOSS),
    "best_accuracy": dict(max_steps=8, **EVERY_2, **BEST_ACCURACY),
    "limit1_best": dict(max_steps=8, save_total_limit=1, **EVERY_2, **BEST_ACCURACY),
    "limit2_best": dict(max_steps=8, save_total_limit=2, **EVERY_2, **BEST_LOSS),
    "limit1": dict(max_steps=6, save_total_limit=1, **EVERY_2),
    "limit2": dict(max_steps=6, save_total_limit=2, **EVERY_2),
    "early_stopping": dict(max_steps=12, **EVERY_2, **BEST_ACCURACY, callbacks="early"),
    "resume_after_save": dict(max_steps=8, **EVERY_2, **BEST_ACCURACY, stop_at=4),
    "resume_mid_epoch_limit2": dict(max_steps=8, save_total_limit=2, **EVERY_2, **BEST_LOSS, stop_at=2),
    "resume_epoch_end_limit1": dict(max_steps=-1, num_train_epochs=2, eval_strategy="epoch", save_strategy="epoch",
                                    save_total_limit=1, **BEST_ACCURACY, stop_at=4),
    "compute_loss_func": dict(max_steps=4, **EVERY_2, compute_loss_func=summed),
    "model_init": dict(max_steps=4, **EVERY_2, model_init=True),
    # the delay remedies: a synchronous start of 2 steps, then PETRA with weight prediction and matched momenta
    "remedies": dict(max_steps=8, **EVERY_2, **REMEDIES),
    "remedies_resumed": dict(max_steps=8, **EVERY_2, **REMEDIES, stop_at=4),
}


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().contiguous().cpu().numpy().tobytes()).hexdigest()


def card_numbers(folder) -> list[str]:
    path = os.path.join(folder, "README.md")
    if not os.path.isfile(path):
        return []
    body = open(path, encoding="utf-8").read().split("---", 2)[-1]
    return re.findall(r"\d+\.\d+ ?%", body)


def _trainer(folder, settings):
    settings = dict(settings)
    stop_at = settings.pop("stop_at", None)
    callbacks = [EarlyStoppingCallback(early_stopping_patience=1)] if settings.pop("callbacks", None) else []
    loss_func = settings.pop("compute_loss_func", None)
    model_init = settings.pop("model_init", None)
    trainer = make_trainer(folder, callbacks=callbacks or None, **settings)
    if loss_func is not None:
        trainer.compute_loss_func = loss_func
    if model_init:
        template = trainer.model

        def init():
            torch.manual_seed(3)
            return type(template)(template.config)

        trainer.model_init = init
    return trainer, stop_at


def run_scenario(folder, settings):
    trainer, stop_at = _trainer(folder, settings)
    if stop_at is not None:
        trainer.add_callback(StopAfterSave(stop_at))
        with pytest.raises(Stop):
            trainer.train()
        trainer, _ = _trainer(folder, settings)
        trainer.train(resume_from_checkpoint=os.path.join(folder, f"checkpoint-{stop_at}"))
    else:
        trainer.train()
    metrics = {k: v for k, v in trainer.evaluate().items() if not re.search(r"runtime|per_second", k)}
    sets = {k: v for k, v in trainer.evaluate({"a": trainer.eval_dataset, "b": trainer.eval_dataset}).items()
            if not re.search(r"runtime|per_second", k)}
    prediction = trainer.predict(trainer.eval_dataset)
    if trainer.is_world_process_zero():  # the transformers examples' pattern: process 0 alone saves
        trainer.save_model()
    checkpoints = sorted(name for name in os.listdir(folder) if name.startswith("checkpoint-"))
    states = {name: json.load(open(os.path.join(folder, name, "trainer_state.json"))) for name in checkpoints}
    for state in states.values():
        state["best_model_checkpoint"] = state["best_model_checkpoint"] and os.path.basename(
            state["best_model_checkpoint"])
        for entry in state["log_history"]:
            for key in [k for k in entry if re.search(r"runtime|per_second", k)]:
                del entry[key]
    best = trainer.state.best_model_checkpoint
    if best is not None and trainer.args.load_best_model_at_end:  # the model reported is the best checkpoint's
        from safetensors.torch import load_file

        saved = load_file(os.path.join(best, "model.safetensors"))
        assert all(torch.equal(saved[name], tensor) for name, tensor in trainer.model.state_dict().items()
                   if name in saved), f"the model at the end is not {best}'s"
    fields = shared_fields(trainer.state)
    fields["best_model_checkpoint"] = fields["best_model_checkpoint"] and os.path.basename(
        fields["best_model_checkpoint"])
    return {
        "metrics": metrics,
        "sets": sets,
        "predictions": digest(torch.as_tensor(prediction.predictions)),
        "weights": {name: digest(tensor) for name, tensor in trainer.model.state_dict().items()},
        "state": fields,
        "checkpoints": checkpoints,
        "saved_states": states,
        "card": card_numbers(folder),
    }


def _all_scenarios(rank, world_size, root, names):
    if world_size > 1:
        as_launched(rank, world_size)
    return {name: run_scenario(os.path.join(root, name), SCENARIOS[name]) for name in names}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("matrix")
    names = list(SCENARIOS)
    outcome = {}
    for processes in (1, 2):
        results, codes, _ = run_ranks(_all_scenarios, processes, str(root / str(processes)), names, deadline=420)
        assert all(r and "value" in r for r in results), [r and r.get("traceback") for r in results]
        outcome[processes] = [r["value"] for r in results]
    return outcome


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_one_and_two_processes_give_the_same_run(runs, name):
    one = runs[1][0][name]
    assert one["card"] and one["checkpoints"], "the scenario saves checkpoints and a card"
    for rank, result in enumerate(runs[2]):
        two = result[name]
        for key in one:
            if key == "card" and rank > 0:
                continue  # one file, written by process 0 alone after training
            assert two[key] == one[key], f"rank {rank} of 2 processes differs from 1 process in {key}"


def test_the_scenarios_exercise_what_they_name(runs):
    one = runs[1][0]
    assert one["limit1"]["checkpoints"] == ["checkpoint-6"]
    assert one["limit2"]["checkpoints"] == ["checkpoint-4", "checkpoint-6"]
    for name in ("best_loss", "best_accuracy", "limit1_best", "limit2_best", "resume_after_save"):
        best = one[name]["state"]["best_model_checkpoint"]
        assert best in one[name]["checkpoints"], name
    assert one["limit1_best"]["checkpoints"] == [one["limit1_best"]["state"]["best_model_checkpoint"]]
    assert one["early_stopping"]["state"]["global_step"] < 12


@pytest.mark.parametrize("resumed, uninterrupted", [("resume_after_save", "best_accuracy"),
                                                    ("resume_mid_epoch_limit2", "limit2_best"),
                                                    ("remedies_resumed", "remedies")])
def test_a_resumed_run_ends_as_the_uninterrupted_one(runs, resumed, uninterrupted):
    for processes in (1, 2):
        for result in runs[processes]:
            a, b = result[resumed], result[uninterrupted]
            for key in ("metrics", "sets", "predictions", "weights", "checkpoints"):
                assert a[key] == b[key], f"{processes} processes: {resumed} differs from {uninterrupted} in {key}"
            assert a["state"]["best_model_checkpoint"] == b["state"]["best_model_checkpoint"]
            assert a["state"]["best_metric"] == b["state"]["best_metric"]
