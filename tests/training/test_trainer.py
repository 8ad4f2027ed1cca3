"""PetraTrainer in one process: Trainer behaviour (callbacks, logs, evaluation, checkpoints, resume) and errors."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import TrainerCallback

from petra_hub import RevNetForImageClassification
from petra_hub.data import DatasetInfo, collate_image_batch, image_processor_for, load_image_dataset, take
from petra_hub.training import EpochSampler, PetraTrainer, PetraTrainingArguments
from petra_hub.testing.models import small_config


def accuracy(prediction):
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def make_trainer(tmp_path, train=None, callbacks=None, seed=0, widths=None, init_seed=None, **overrides):
    train = train if train is not None else take(load_image_dataset("digits", "train"), 64)
    test = take(load_image_dataset("digits", "test"), 40)
    torch.manual_seed(seed if init_seed is None else init_seed)
    sizes = {"hidden_sizes": widths, "embedding_size": widths[0]} if widths else {}
    model = RevNetForImageClassification(small_config("revnet18", stem="cifar", **sizes))
    settings = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        gradient_accumulation_steps=2,
        learning_rate=0.05,
        optim="sgd",
        optim_args="momentum=0.9,nesterov=True",
        max_grad_norm=0.0,  # these tests compare with unclipped references (clipping: tests/training/test_drop_in.py)
        max_steps=6,
        logging_steps=2,
        eval_strategy="no",
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=seed,
    )
    settings.update(overrides)
    args = PetraTrainingArguments(**settings)
    return PetraTrainer(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=test,
        data_collator=collate_image_batch,
        processing_class=(
            image_processor_for(train.info) if isinstance(getattr(train, "info", None), DatasetInfo) else None
        ),
        compute_metrics=accuracy,
        callbacks=callbacks,
    )


class Recorder(TrainerCallback):
    def __init__(self):
        self.events, self.logs, self.evaluations = [], [], []

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.append("train_begin")

    def on_step_begin(self, args, state, control, **kwargs):
        self.events.append("step_begin")

    def on_substep_end(self, args, state, control, **kwargs):
        self.events.append("substep_end")

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.events.append("pre_optimizer_step")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.events.append("optimizer_step")

    def on_step_end(self, args, state, control, **kwargs):
        self.events.append("step_end")

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.evaluations.append((state.global_step, dict(metrics)))

    def on_save(self, args, state, control, **kwargs):
        self.events.append(f"save@{state.global_step}")

    def on_train_end(self, args, state, control, **kwargs):
        self.events.append("train_end")


def test_callbacks_logging_evaluation_and_drain(tmp_path):
    recorder = Recorder()
    trainer = make_trainer(tmp_path, callbacks=[recorder], eval_strategy="steps", eval_steps=3)
    output = trainer.train()
    assert output.global_step == 6
    assert recorder.events.count("step_begin") == recorder.events.count("step_end") == 6
    # as in transformers' Trainer (k = 2): one substep, then the optimizer events, which under PETRA mark the step's
    # close (each stage applies the group at its own tick)
    assert recorder.events[1:6] == ["step_begin", "substep_end", "pre_optimizer_step", "optimizer_step", "step_end"]
    assert recorder.events.count("substep_end") == recorder.events.count("optimizer_step") == 6
    assert recorder.events[0] == "train_begin" and recorder.events[-1] == "train_end"
    training_logs = [log for log in recorder.logs if "learning_rate" in log]
    assert len(training_logs) == 3  # logging_steps=2 over 6 steps
    assert all(log["samples_per_second"] > 0 for log in training_logs)
    # The rate the logged step's update uses, as Trainer logs it (linear decay over 6 updates), though stage 0 has
    # applied none of them at step 2, 3 at step 4 (the evaluation at step 3 drained the pipeline), all 6 at the end.
    assert [log["learning_rate"] for log in training_logs] == pytest.approx([0.05 * 5 / 6, 0.05 * 3 / 6, 0.05 / 6])
    # the gradient norm, clipping or not (max_grad_norm=0 here), as Trainer logs it: once any stage has updated
    assert "grad_norm" not in training_logs[0] and all(log["grad_norm"] > 0 for log in training_logs[1:])
    # The head sees micro-batch b at tick b + J - 1 = b + 9: the step-2 log (4 micro-batches fed) has no loss yet.
    assert "loss" not in training_logs[0]
    losses = [log["loss"] for log in training_logs[1:]]
    assert len(losses) == 2 and all(math.isfinite(x) and 1.0 < x < 4.0 for x in losses)
    assert [step for step, _ in recorder.evaluations] == [3, 6]
    for _, metrics in recorder.evaluations:
        assert 0.0 <= metrics["eval_accuracy"] <= 1.0 and metrics["eval_loss"] > 0
    # Drained: every micro-batch (6 steps x k=2) went forward and backward through all 10 stages once.
    counters = trainer.pipeline.counters()
    assert len(counters) == 10
    assert all((c.forwards, c.backwards, c.updates) == (12, 12, 6) for c in counters.values())
    assert "train_runtime" in recorder.logs[-1]


def test_training_reduces_the_loss(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=120, logging_steps=20, gradient_accumulation_steps=1, learning_rate=0.01,
                           widths=[16, 32, 64, 128], train=take(load_image_dataset("digits", "train"), 1024))
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert losses[-1] < 0.7 * losses[0], losses


def state_of(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_from_checkpoint_equals_the_uninterrupted_run(tmp_path):
    full = make_trainer(tmp_path / "full", max_steps=8, save_strategy="steps", save_steps=2, save_total_limit=2)
    full.train()
    expected = state_of(full.model)
    checkpoints = sorted(p.name for p in (tmp_path / "full").iterdir() if p.name.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-6", "checkpoint-8"]  # save_total_limit=2 rotated out 2 and 4
    assert sorted(
        p.name for p in (tmp_path / "full" / "checkpoint-6").iterdir() if p.name.startswith("petra_stage_")
    ) == [f"petra_stage_{i:03d}.pt" for i in range(10)]

    resumed = make_trainer(tmp_path / "resumed", init_seed=123, max_steps=8, save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-6"))
    assert resumed.state.global_step == 8
    got = state_of(resumed.model)
    assert got.keys() == expected.keys()
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_save_model_gives_a_loadable_folder_with_a_card(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=4)
    trainer.train()
    trainer.evaluate()
    folder = tmp_path / "saved"
    trainer.save_model(str(folder))
    for name in ("config.json", "model.safetensors", "preprocessor_config.json", "README.md"):
        assert (folder / name).exists(), name
    loaded = RevNetForImageClassification.from_pretrained(folder).eval()
    model = trainer.model.eval()
    images = torch.randn(3, 3, 16, 16)
    torch.testing.assert_close(loaded(images).logits, model(images).logits, rtol=0, atol=1e-6)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "transformers" and "petra" in card.data.tags
    assert "10" in card.text and "petra" in card.text  # J and mode stated in the body


def test_backprop_mode_is_a_plain_training_baseline(tmp_path):
    """mode=backprop equals a hand-written loop over the same micro-batches: average k gradients, then step."""
    trainer = make_trainer(tmp_path, petra_mode="backprop", optim="sgd", optim_args="", weight_decay=0.0,
                           lr_scheduler_type="constant", max_steps=4)
    reference = RevNetForImageClassification(small_config("revnet18", stem="cifar"))
    reference.load_state_dict(trainer.model.state_dict())
    trainer.train()

    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    data = trainer.train_dataset
    data.set_epoch(0)
    order = list(EpochSampler(len(data), seed=0))
    reference.train()
    for step in range(4):
        optimizer.zero_grad()
        for micro in range(2):
            indices = order[(2 * step + micro) * 8 : (2 * step + micro + 1) * 8]
            batch = collate_image_batch([data[i] for i in indices])
            (reference(batch["pixel_values"], labels=batch["labels"]).loss / 2).backward()
        optimizer.step()
    for (name, want), got in zip(reference.named_parameters(), trainer.model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)


class OneChannel(torch.utils.data.Dataset):
    def __init__(self, base):
        self.base, self.info = base, base.info

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        item = dict(self.base[index])
        item["pixel_values"] = item["pixel_values"][:1]
        return item


class NoLabels(OneChannel):
    def __getitem__(self, index):
        return {"pixel_values": self.base[index]["pixel_values"]}


def test_bad_data_fails_before_any_step(tmp_path):
    base = take(load_image_dataset("digits", "train"), 32)
    trainer = make_trainer(tmp_path, train=OneChannel(base))
    with pytest.raises(ValueError, match="1 channels but the model expects config.num_channels=3"):
        trainer.train()
    assert trainer.state.global_step == 0
    trainer = make_trainer(tmp_path, train=NoLabels(base))
    with pytest.raises(ValueError, match="'pixel_values' and 'labels'"):
        trainer.train()


def test_bad_settings(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        make_trainer(tmp_path, gradient_accumulation_steps=0)
    with pytest.raises(ValueError, match="Unknown PETRA mode"):
        make_trainer(tmp_path, petra_mode="gpipe")
    with pytest.raises(ValueError, match="petra_partition"):
        make_trainer(tmp_path, petra_partition="five,five")
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *a: 12)
    with pytest.raises(ValueError, match="12 processes for 10 pipeline stages"):
        make_trainer(tmp_path)


class Poison(TrainerCallback):
    def __init__(self, at_step):
        self.at_step, self.model = at_step, None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.at_step:
            with torch.no_grad():
                model.classifier.weight.fill_(float("nan"))


def test_nan_loss_stops_with_the_step_and_saves_nothing_after(tmp_path):
    # The weights turn NaN after step 2; saving checkpoint-2 first checks every stage's weights (as a drain
    # would, through the losses): the run stops naming the head stage and step 2, and checkpoint-2 is never written.
    trainer = make_trainer(tmp_path, callbacks=[Poison(at_step=2)], save_strategy="steps", save_steps=1)
    with pytest.raises(FloatingPointError, match=r"non-finite weights .* in stage 9 \(classifier.weight\) at global "
                                                 r"step 2"):
        trainer.train()
    checkpoints = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-1"]


def test_fewer_pipeline_stages(tmp_path):
    trainer = make_trainer(tmp_path, petra_num_stages=4, max_steps=2)
    trainer.train()
    assert len(trainer.stages) == 4
    assert [s.reversible for s in trainer.stages] == [False, False, False, False]  # each group holds a D or S/H
    assert all(c.backwards == 4 for c in trainer.pipeline.counters().values())


def test_explicit_stage_groups(tmp_path):
    """petra_stage_groups keeps the two reversible blocks after the stem together: a reversible pipeline stage."""
    trainer = make_trainer(tmp_path, petra_stage_groups="1,2,7", max_steps=2)
    trainer.train()
    assert [len(getattr(s, "members", [s])) for s in trainer.stages] == [1, 2, 7]
    assert [s.reversible for s in trainer.stages] == [False, True, False]
    assert all(c.backwards == 4 for c in trainer.pipeline.counters().values())
    with pytest.raises(ValueError, match="petra_stage_groups .* adding up to the model's 10 stages.*'1,2,6'"):
        make_trainer(tmp_path, petra_stage_groups="1,2,6")
    with pytest.raises(ValueError, match="petra_stage_groups must be comma-separated"):
        make_trainer(tmp_path, petra_stage_groups="one,nine")
    with pytest.raises(ValueError, match="petra_stage_groups or petra_num_stages, not both"):
        make_trainer(tmp_path, petra_stage_groups="5,5", petra_num_stages=2)


def test_push_to_hub_uploads_the_gathered_folder_with_its_card(tmp_path, monkeypatch):
    from huggingface_hub import HfApi

    uploads = []

    def create_repo(self, repo_id, **kwargs):
        from huggingface_hub import RepoUrl

        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, **kwargs):
        uploads.append((repo_id, sorted(p.name for p in Path(folder_path).iterdir()), kwargs.get("ignore_patterns")))
        return "commit"

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    trainer = make_trainer(tmp_path, max_steps=2, hub_model_id="user/revnet-digits")
    trainer.train()
    trainer.evaluate()
    trainer.push_to_hub()
    (repo_id, files, ignored), = uploads
    assert repo_id == "user/revnet-digits"
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "README.md"} <= set(files)
    assert "checkpoint-*" in ignored
    card = ModelCard.load(tmp_path / "README.md")
    assert card.data.eval_results[0].metric_value == trainer._last_eval_metrics["eval_accuracy"]


def test_logs_hold_only_what_happened(tmp_path):
    """No grad_norm before any stage has updated (the head closes its first group, micro-batches 0 and 1, at tick
    J = 10: in the last step's drain); no training-loss entry with logging_strategy="no" (both were logged)."""
    recorder = Recorder()
    trainer = make_trainer(tmp_path / "a", callbacks=[recorder], logging_steps=1, max_grad_norm=1.0)
    trainer.train()
    steps = [log for log in recorder.logs if "learning_rate" in log]
    assert ["grad_norm" in log for log in steps] == [False] * 5 + [True] and steps[-1]["grad_norm"] > 0
    recorder = Recorder()
    make_trainer(tmp_path / "b", callbacks=[recorder], logging_strategy="no").train()
    assert [sorted(log) for log in recorder.logs if "loss" in log] == []
