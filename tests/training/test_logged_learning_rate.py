"""The logged learning rate is the schedule's at the logged global step, as transformers' Trainer logs it, though
PETRA's stages apply a step's update 2(J-1-i) micro-batches after it closes (stage i of J). Before, the log read
stage 0's last update: with J = 10 and k = 2 it lagged 9 steps (0.0 at step 10 of a 13-step warm-up)."""

import pytest
import torch
from torch import nn
from transformers import Trainer, TrainingArguments

from petra_hub.data import collate_image_batch, load_image_dataset, take
from petra_hub.training import PetraTrainingArguments
from petra_hub.training.optimization import scheduler_factory
from tests.training.test_trainer import make_trainer

MAX_STEPS, WARMUP, LR = 25, 13, 0.05


class Linear(nn.Module):
    """A plain torch model for transformers' Trainer: only its schedule matters here."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 10)

    def forward(self, pixel_values, labels):
        return {"loss": nn.functional.cross_entropy(self.head(pixel_values.float().flatten(1)[:, :64]), labels)}


def logged_rates(log_history) -> dict[int, float]:
    return {entry["step"]: entry["learning_rate"] for entry in log_history if "learning_rate" in entry}


def trainers_rates(tmp_path, **settings) -> dict[int, float]:
    train = take(load_image_dataset("digits", "train"), 64)
    args = TrainingArguments(output_dir=str(tmp_path / "trainer"), per_device_train_batch_size=8, learning_rate=LR,
                             optim="sgd", report_to=[], disable_tqdm=True, save_strategy="no", **settings)
    trainer = Trainer(model=Linear(), args=args, train_dataset=train, data_collator=collate_image_batch)
    trainer.train()
    return logged_rates(trainer.state.log_history)


def by_hand(step: int) -> float:
    """transformers' linear schedule with warm-up, after `step - 1` updates (the rate step `step` used)."""
    done = step - 1
    return LR * (done / WARMUP if done < WARMUP else (MAX_STEPS - done) / (MAX_STEPS - WARMUP))


@pytest.mark.parametrize("accumulation, delay", [(2, 0), (3, 10)])
def test_the_logged_learning_rate_is_trainers_at_every_step(tmp_path, accumulation, delay):
    """10 pipelined stages; k = 3 leaves an epoch of 8 micro-batches with a step of 2; with the delay warm-up each
    stage's rate has its own factor, and the log holds the schedule's without it."""
    settings = dict(lr_scheduler_type="linear", warmup_steps=WARMUP, max_steps=MAX_STEPS, logging_steps=1,
                    gradient_accumulation_steps=accumulation)
    petra = make_trainer(tmp_path / "petra", widths=[8, 8, 8, 8], learning_rate=LR, petra_delay_lr_warmup=delay,
                         **settings)
    assert len(petra.stages) == 10
    petra.train()
    got, expected = logged_rates(petra.state.log_history), trainers_rates(tmp_path, **settings)
    assert sorted(got) == sorted(expected) == list(range(1, MAX_STEPS + 1))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], abs=1e-12, rel=0), step
        assert got[step] == pytest.approx(by_hand(step), abs=1e-12, rel=0), step


def test_a_resumed_run_logs_the_rates_of_the_uninterrupted_one(tmp_path):
    """The rate of each step after a resume, at the base rate the checkpoint's schedulers hold."""
    settings = dict(lr_scheduler_type="linear", warmup_steps=WARMUP, max_steps=MAX_STEPS, logging_steps=1,
                    widths=[8, 8, 8, 8], learning_rate=LR, save_strategy="steps", save_steps=11)
    make_trainer(tmp_path, **settings).train()
    resumed = make_trainer(tmp_path, **settings)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-11"))
    rates = logged_rates(resumed.state.log_history)
    assert sorted(rates) == list(range(1, MAX_STEPS + 1))
    assert [rates[step] for step in rates] == pytest.approx([by_hand(step) for step in rates], abs=1e-12, rel=0)


def test_milestones_are_logged_at_their_step(tmp_path):
    """The paper's warm-up and step decay: x0.1 after epoch 1 (4 steps of k = 2), read without stepping a stage."""
    args = PetraTrainingArguments(output_dir=str(tmp_path), learning_rate=0.1, warmup_steps=2, report_to=[],
                                  petra_lr_milestones="1", lr_scheduler_type="constant")
    schedules = scheduler_factory(args, 20, 4.0, num_stages=3)
    assert schedules.learning_rate(5) is None  # no stage's scheduler yet: no base rate
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    scheduler = schedules(2, optimizer)
    rates = []
    for _ in range(8):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert [schedules.learning_rate(step) for step in range(1, 9)] == pytest.approx(rates, abs=1e-15)
    assert rates == pytest.approx([0.0, 0.05, 0.1, 0.1, 0.01, 0.01, 0.01, 0.01])
