"""PetraTrainer against transformers' own Trainer: the same tiny RevNet, data, order and seed. In `backprop` mode the
two run the same arithmetic (PETRA's schedule aside), so everything a user reads must agree: the trained weights,
the logged losses, learning rates and gradient norms, when evaluations and checkpoints happen, which checkpoint is
the best and which are left."""

import math
import os

import numpy as np
import pytest
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from petra_hub import RevNetForImageClassification
from petra_hub.data import collate_image_batch, load_image_dataset, take
from petra_hub.testing.ranks import run_ranks
from petra_hub.testing.models import small_config
from petra_hub.training import EpochSampler, PetraTrainer, PetraTrainingArguments


class OrderedTrainer(Trainer):
    """transformers' Trainer reading the training set in PetraTrainer's order (the one change)."""

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return EpochSampler(len(dataset), self.args.seed)


class Events(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_epoch_end(self, args, state, control, **kwargs):
        self.seen.append(("epoch_end", state.global_step))

    def on_evaluate(self, args, state, control, **kwargs):
        self.seen.append(("evaluate", state.global_step))

    def on_save(self, args, state, control, **kwargs):
        self.seen.append(("save", state.global_step))


def accuracy(prediction):
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def run_both(tmp_path, train_size=64, trainer_kwargs=None, mixin=None, train=None, **settings):
    """Train with Trainer and with PetraTrainer (backprop); returns both trainers and their callbacks' events.
    `mixin`: a class both trainers derive from first (overrides); `train`: the training set."""
    train = train if train is not None else take(load_image_dataset("digits", "train", augment=False), train_size)
    test = take(load_image_dataset("digits", "test"), 40)
    common = dict(per_device_train_batch_size=8, per_device_eval_batch_size=16, learning_rate=0.05, optim="sgd",
                  max_grad_norm=0.0, report_to=[], disable_tqdm=True, seed=0, logging_steps=1) | settings
    runs = {}
    for name, trainer_class, arguments in (("trainer", OrderedTrainer, TrainingArguments(
            output_dir=str(tmp_path / "trainer"), **common)), ("petra", PetraTrainer, PetraTrainingArguments(
            output_dir=str(tmp_path / "petra"), petra_mode="backprop", **common))):
        torch.manual_seed(0)
        events = Events()
        trainer_class = type(trainer_class.__name__, (mixin, trainer_class), {}) if mixin else trainer_class
        trainer = trainer_class(model=RevNetForImageClassification(small_config("revnet18", stem="cifar")),
                                args=arguments, train_dataset=train, eval_dataset=test, compute_metrics=accuracy,
                                callbacks=[events], **({"data_collator": collate_image_batch} | (trainer_kwargs or {})))
        trainer.train()
        runs[name] = trainer, events.seen
    return runs["trainer"], runs["petra"]


def entries(trainer, keys):
    return [{k: entry[k] for k in keys if k in entry} | {"step": entry["step"]}
            for entry in trainer.state.log_history if any(k in entry for k in keys)]


def assert_same_weights(reference, petra, tolerance=1e-5):
    expected = reference.model.state_dict()
    for name, value in petra.model.state_dict().items():
        torch.testing.assert_close(value, expected[name], rtol=tolerance, atol=tolerance, msg=name)


def checkpoints(folder):
    return sorted(path.name for path in folder.iterdir() if path.name.startswith("checkpoint-"))


def test_logs_and_weights_equal_trainers_over_two_epochs(tmp_path):
    (reference, _), (petra, _) = run_both(tmp_path, gradient_accumulation_steps=2, num_train_epochs=2,
                                          lr_scheduler_type="linear")
    assert_same_weights(reference, petra)
    expected, got = entries(reference, ("loss", "learning_rate", "grad_norm")), entries(petra, ("loss", "learning_rate",
                                                                                              "grad_norm"))
    assert [entry["step"] for entry in got] == [entry["step"] for entry in expected] == list(range(1, 9))
    for want, have in zip(expected, got):
        assert have == pytest.approx(want, rel=1e-4), (want, have)  # the rate each step used, the norm unclipped
    assert petra.state.log_history[-1]["train_loss"] == pytest.approx(reference.state.log_history[-1]["train_loss"],
                                                                      rel=1e-5)
    assert petra.state.total_flos == reference.state.total_flos > 0  # Trainer's estimate, from the same batches
    assert petra.state.log_history[-1]["total_flos"] == reference.state.log_history[-1]["total_flos"]


def test_compute_loss_func_weighs_every_item_of_a_ragged_step_as_trainer_does(tmp_path):
    """70 images in micro-batches of 8, k = 3: the third step's micro-batches hold 8, 8 and 6 images, and a loss
    summed over a micro-batch and divided by num_items_in_batch weighs all 22 alike."""
    seen = {}

    def summed(outputs, labels, num_items_in_batch=None):
        seen.setdefault(torch.is_grad_enabled(), []).append(int(num_items_in_batch))
        return torch.nn.functional.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch

    (reference, _), (petra, _) = run_both(tmp_path, train_size=70, gradient_accumulation_steps=3, num_train_epochs=1,
                                          lr_scheduler_type="constant", trainer_kwargs={"compute_loss_func": summed})
    assert seen[True] == ([24] * 6 + [22] * 3) * 2  # Trainer's nine calls, then PetraTrainer's: the same counts
    assert_same_weights(reference, petra)
    expected, got = entries(reference, ("loss",)), entries(petra, ("loss",))
    assert [e["loss"] for e in got] == pytest.approx([e["loss"] for e in expected], rel=1e-5)


def test_evaluations_checkpoints_and_the_best_model_as_trainers(tmp_path):
    """Evaluated at the start and at each epoch's end, saved at each epoch's end, including where max_steps leaves
    the second epoch (7 steps, 4 an epoch); the best is the highest loss (so not the last model); one checkpoint
    is kept."""
    (reference, expected), (petra, got) = run_both(
        tmp_path, gradient_accumulation_steps=2, max_steps=7, lr_scheduler_type="constant", eval_on_start=True,
        eval_strategy="epoch", save_strategy="epoch", save_total_limit=1, load_best_model_at_end=True,
        metric_for_best_model="loss", greater_is_better=True)
    assert got == expected
    assert ("epoch_end", 7) in got and ("save", 7) in got  # the epoch max_steps leaves still ends and saves
    names = {name: (trainer.state.best_global_step, checkpoints(tmp_path / name), trainer.state.best_metric)
             for name, trainer in (("trainer", reference), ("petra", petra))}
    assert names["petra"][:2] == names["trainer"][:2] and len(names["petra"][1]) == 1
    assert math.isclose(names["petra"][2], names["trainer"][2], rel_tol=1e-5)
    assert_same_weights(reference, petra)  # the best checkpoint's weights, loaded at the end


@pytest.mark.parametrize("limit, metric, greater", [(2, "accuracy", True), (2, "loss", False), (None, "loss", True)])
def test_best_model_tracking_and_rotation_by_steps_as_trainers(tmp_path, limit, metric, greater):
    """Evaluated and saved every 2 steps of 8: the best step, best metric, the checkpoints kept by save_total_limit
    (never the best) and the model at the end are Trainer's."""
    (reference, expected), (petra, got) = run_both(
        tmp_path, gradient_accumulation_steps=2, max_steps=8, lr_scheduler_type="constant", eval_strategy="steps",
        eval_steps=2, save_strategy="steps", save_steps=2, save_total_limit=limit, load_best_model_at_end=True,
        metric_for_best_model=metric, greater_is_better=greater)
    assert got == expected
    assert petra.state.best_global_step == reference.state.best_global_step
    assert math.isclose(petra.state.best_metric, reference.state.best_metric, rel_tol=1e-5)
    assert checkpoints(tmp_path / "petra") == checkpoints(tmp_path / "trainer")
    assert os.path.basename(petra.state.best_model_checkpoint) == os.path.basename(
        reference.state.best_model_checkpoint)
    assert_same_weights(reference, petra)


def test_logged_losses_are_means_of_step_means_as_trainers(tmp_path):
    """70 images in micro-batches of 8, k = 2: each epoch's last step holds one micro-batch (of 6 images). Trainer
    logs the mean of the steps' mean losses; PetraTrainer averaged micro-batches (0.0006 off at step 5)."""
    (reference, _), (petra, _) = run_both(tmp_path, train_size=70, gradient_accumulation_steps=2, num_train_epochs=2,
                                          lr_scheduler_type="constant", logging_steps=5)
    assert_same_weights(reference, petra)
    expected, got = entries(reference, ("loss",)), entries(petra, ("loss",))
    assert [e["step"] for e in got] == [e["step"] for e in expected] == [5, 10]
    assert [e["loss"] for e in got] == pytest.approx([e["loss"] for e in expected], rel=1e-6)
    assert petra.state.log_history[-1]["train_loss"] == pytest.approx(reference.state.log_history[-1]["train_loss"],
                                                                      rel=1e-6)


class TrainersDecayRule:
    """Trainer's own weight-decay rule (it decays batch-norm weights, which PetraTrainer's default spares)."""

    def get_decay_parameter_names(self, model):
        return Trainer.get_decay_parameter_names(self, model)


class MomentumOptimizer:
    @staticmethod
    def get_optimizer_cls_and_kwargs(args, model=None):
        return torch.optim.SGD, {"lr": args.learning_rate, "momentum": 0.9}


@pytest.mark.parametrize("mixin, weight_decay", [(TrainersDecayRule, 0.5), (MomentumOptimizer, 0.0)])
def test_the_optimizer_overrides_a_subclass_makes_are_honoured_as_in_trainer(tmp_path, mixin, weight_decay):
    """Before, PetraTrainer called Trainer's get_optimizer_cls_and_kwargs and its own decay rule whatever a subclass
    overrode: the weights were 0.31 (decay rule) and 0.10 (optimizer) away from Trainer's."""
    (reference, _), (petra, _) = run_both(tmp_path, mixin=mixin, num_train_epochs=1, weight_decay=weight_decay,
                                          lr_scheduler_type="constant")
    assert_same_weights(reference, petra)


def test_optimizer_cls_and_kwargs_are_used_as_given_as_in_trainer(tmp_path):
    """Without an "lr" the optimizer class's default rate trains (SGD: 0.001), not `learning_rate`, as in Trainer."""
    (reference, _), (petra, _) = run_both(tmp_path, num_train_epochs=1, lr_scheduler_type="constant",
                                          trainer_kwargs={"optimizer_cls_and_kwargs": (torch.optim.SGD,
                                                                                       {"momentum": 0.5})})
    assert_same_weights(reference, petra)
    assert entries(petra, ("learning_rate",))[-1]["learning_rate"] == 0.001


class WithBoxes(torch.utils.data.Dataset):
    """A plain torch data set whose items hold a column the model does not take (ragged: it cannot be stacked)."""

    def __init__(self):
        self.items = take(load_image_dataset("digits", "train", augment=False), 64)

    def __len__(self):
        return 64

    def __getitem__(self, index):
        return {**self.items[index], "boxes": torch.zeros(index % 3 + 1, 4)}


def test_remove_unused_columns_drops_a_plain_datasets_extra_columns_as_trainer(tmp_path):
    """Trainer's collator drops what the model's forward does not take; PetraTrainer failed on its first batch."""
    from transformers import default_data_collator

    (reference, _), (petra, _) = run_both(tmp_path, train=WithBoxes(), num_train_epochs=1,
                                          lr_scheduler_type="constant",
                                          trainer_kwargs={"data_collator": default_data_collator})
    assert_same_weights(reference, petra)


# -- data parallelism: num_items_in_batch over the replicas (average_tokens_across_devices) ----------------------------
ORDER = torch.randperm(64, generator=torch.Generator().manual_seed(0)).tolist()  # EpochSampler's epoch 0, seed 0
REPLICAS = [ORDER[0::2], ORDER[1::2]]  # what each of the 2 replicas reads
IGNORED = set(REPLICAS[0][:6])  # replica 0's first step holds 10 counted items, replica 1's 16


class Masked(torch.utils.data.Dataset):
    def __init__(self):
        self.items = [load_image_dataset("digits", "train", augment=False)[i] for i in range(64)]

    def __len__(self):
        return 64

    def __getitem__(self, index):
        return {**self.items[index], "labels": -100 if index in IGNORED else self.items[index]["labels"]}


def summed_over_items(outputs, labels, num_items_in_batch=None):
    return torch.nn.functional.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch


DATA_PARALLEL = dict(per_device_train_batch_size=8, learning_rate=0.05, optim="sgd", max_grad_norm=0.0,
                     report_to=[], disable_tqdm=True, seed=0, num_train_epochs=1, lr_scheduler_type="constant")


def _replicas(rank, world_size, folder):
    from tests.training.test_multiprocess import as_launched

    as_launched(rank, world_size)
    torch.manual_seed(0)
    trainer = PetraTrainer(model=RevNetForImageClassification(small_config("revnet18", stem="cifar")),
                           args=PetraTrainingArguments(output_dir=folder, petra_mode="backprop", petra_data_parallel=2,
                                                       gradient_accumulation_steps=2, **DATA_PARALLEL),
                           train_dataset=Masked(), data_collator=collate_image_batch,
                           compute_loss_func=summed_over_items)
    trainer.train()
    return {name: value.clone() for name, value in trainer.model.state_dict().items()}


class ReplicasInOneStep(Trainer):
    """One process, k = 4: each step reads the two replicas' two micro-batches, as Trainer's DDP over 2 processes
    with k = 2 and average_tokens_across_devices (the default) counts them."""

    def _get_train_sampler(self, train_dataset=None):
        return [index for step in range(4) for replica in REPLICAS for index in replica[8 * step: 8 * step + 8]]


def test_data_parallel_replicas_count_the_step_items_over_all_replicas_as_trainer(tmp_path):
    results, _, _ = run_ranks(_replicas, 2, str(tmp_path / "petra"), deadline=180)
    assert all(r is not None and "value" in r for r in results), [r and r.get("traceback") for r in results]
    torch.manual_seed(0)
    reference = ReplicasInOneStep(model=RevNetForImageClassification(small_config("revnet18", stem="cifar")),
                                  args=TrainingArguments(output_dir=str(tmp_path / "trainer"),
                                                         gradient_accumulation_steps=4, **DATA_PARALLEL),
                                  train_dataset=Masked(), data_collator=collate_image_batch,
                                  compute_loss_func=summed_over_items)
    reference.train()
    expected = reference.model.state_dict()
    for name, value in results[0]["value"].items():  # parameters: batch-norm statistics are per replica
        if "running" not in name and "num_batches" not in name:
            torch.testing.assert_close(value, expected[name], rtol=1e-5, atol=1e-6, msg=name)
