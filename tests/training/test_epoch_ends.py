"""Epochs whose micro-batch count is not a multiple of k: the partial group at an epoch's end is a step of its own
(as in transformers' Trainer), each epoch evaluates and saves exactly once, and every micro-batch is trained."""

import torch
from transformers import TrainerCallback

from petra_hub.data import load_image_dataset, take
from tests.training.test_trainer import Recorder, make_trainer


def test_partial_groups_end_epochs_once_and_train_every_micro_batch(tmp_path):
    # 88 samples in micro-batches of 8: 11 per epoch, k = 2 -> 5 full groups and a partial one (6 steps) per epoch.
    train = take(load_image_dataset("digits", "train"), 88)
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path, train=train, callbacks=[recorder], max_steps=-1, num_train_epochs=3,
        eval_strategy="epoch", save_strategy="epoch",
    )
    output = trainer.train()

    assert output.global_step == 18
    assert trainer.state.epoch == 3.0
    assert [step for step, _ in recorder.evaluations] == [6, 12, 18]
    assert [event for event in recorder.events if event.startswith("save@")] == ["save@6", "save@12", "save@18"]
    assert recorder.events.count("step_begin") == recorder.events.count("step_end") == 18
    counters = trainer.pipeline.counters()
    # 33 micro-batches through every stage; 6 updates per epoch (5 groups of 2, then the epoch's last micro-batch).
    assert all((c.forwards, c.backwards, c.updates) == (33, 33, 18) for c in counters.values())
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-")) == [
        "checkpoint-12", "checkpoint-18", "checkpoint-6"
    ]


def test_resume_at_an_epoch_end_inside_a_group_equals_the_uninterrupted_run(tmp_path):
    train = take(load_image_dataset("digits", "train"), 88)
    full = make_trainer(tmp_path / "full", train=train, max_steps=-1, num_train_epochs=2, save_strategy="epoch")
    full.train()
    resumed = make_trainer(tmp_path / "resumed", train=train, init_seed=7, max_steps=-1, num_train_epochs=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-6"))
    assert resumed.state.global_step == 12
    expected, got = full.model.state_dict(), resumed.model.state_dict()
    assert all((got[name] == expected[name]).all() for name in expected)


class EpochEnds(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_epoch_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


def test_an_epoch_that_training_leaves_inside_still_ends_evaluates_and_saves(tmp_path):
    """64 samples are 4 steps an epoch: max_steps=6 leaves epoch 2 halfway. Trainer still ends that epoch (its
    callbacks, then the evaluation and checkpoint of the epoch strategies); the run once ended without them, so the
    trained model was never evaluated, saved or a candidate for the best."""
    recorder, ends = Recorder(), EpochEnds()
    trainer = make_trainer(tmp_path, callbacks=[recorder, ends], max_steps=6, eval_strategy="epoch",
                           save_strategy="epoch")
    trainer.train()
    assert ends.steps == [4, 6] and [step for step, _ in recorder.evaluations] == [4, 6]
    assert [event for event in recorder.events if event.startswith("save@")] == ["save@4", "save@6"]
    assert trainer.state.epoch == 1.5


def test_a_run_resumed_where_max_steps_left_an_epoch_goes_on_inside_it(tmp_path):
    """Ending an epoch that training left inside keeps the position there: resumed from checkpoint-6 (halfway through
    epoch 2), the run equals an uninterrupted one that drained where the cut run ended (here by evaluating)."""
    settings = dict(save_strategy="steps", save_steps=2, lr_scheduler_type="constant")
    make_trainer(tmp_path / "cut", max_steps=6, **settings).train()
    full = make_trainer(tmp_path / "full", max_steps=8, eval_strategy="steps", eval_steps=6, **settings)
    full.train()
    resumed = make_trainer(tmp_path / "resumed", init_seed=7, max_steps=8, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "cut" / "checkpoint-6"))
    expected, got = full.model.state_dict(), resumed.model.state_dict()
    assert resumed.state.global_step == 8 and all(torch.equal(got[name], expected[name]) for name in expected)
