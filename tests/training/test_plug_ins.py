"""What a Trainer user passes besides TrainingArguments: honoured as transformers' Trainer honours it, or refused with
the reason (a plug-in that was once accepted and ignored trained with another optimizer, loss or metric input)."""

from concurrent.futures import Future

import numpy as np
import pytest
import torch

from petra_hub.data import collate_image_batch
from petra_hub.training import PetraTrainer
from tests.training.test_trainer import make_trainer


def with_plug_ins(tmp_path, trainer_class=PetraTrainer, **plug_ins):
    base = make_trainer(tmp_path, max_steps=2)
    return trainer_class(model=base.model, args=base.args, train_dataset=base.train_dataset,
                         eval_dataset=base.eval_dataset, data_collator=collate_image_batch, **plug_ins)


def test_a_whole_model_optimizer_is_refused(tmp_path):
    model = make_trainer(tmp_path).model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="optimizers=.*every pipeline stage has its own optimizer"):
        with_plug_ins(tmp_path, optimizers=(optimizer, None))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(ValueError, match="optimizers="):
        with_plug_ins(tmp_path, optimizers=(None, scheduler))


@pytest.mark.parametrize("method", ["compute_loss", "training_step", "create_optimizer", "create_scheduler",
                                    "prediction_step", "evaluation_loop", "_get_train_sampler", "_get_eval_sampler",
                                    "get_batch_samples", "_prepare_inputs", "compute_loss_context_manager",
                                    "_maybe_log_save_evaluate", "_load_best_model", "_load_rng_state"])
def test_overriding_a_method_the_loop_never_calls_is_refused(tmp_path, method):
    subclass = type("Custom", (PetraTrainer,), {method: lambda self, *args, **kwargs: None})
    with pytest.raises(TypeError, match=f"Custom overrides Trainer.{method}, which PetraTrainer never calls"):
        with_plug_ins(tmp_path, subclass)


def test_optimizer_cls_and_kwargs_builds_every_stage_optimizer(tmp_path):
    trainer = with_plug_ins(tmp_path, optimizer_cls_and_kwargs=(torch.optim.Adam, {"lr": 0.0, "betas": (0.5, 0.6)}))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))  # lr 0: nothing moved
    worker = next(iter(trainer.pipeline.workers.values()))
    assert type(worker.optimizer) is torch.optim.Adam and worker.optimizer.param_groups[0]["betas"] == (0.5, 0.6)
    # without "lr", the class's default rate, not learning_rate: the keyword arguments are used as given, as in Trainer
    trainer = with_plug_ins(tmp_path, optimizer_cls_and_kwargs=(torch.optim.Adam, {}))
    trainer.train()
    assert next(iter(trainer.pipeline.workers.values())).optimizer.param_groups[0]["initial_lr"] == 0.001


def test_compute_loss_func_is_the_loss_of_training_and_evaluation(tmp_path):
    calls = []

    def doubled(outputs, labels, num_items_in_batch):
        calls.append(num_items_in_batch)
        return 2 * torch.nn.functional.cross_entropy(outputs.logits, labels, reduction="sum") / num_items_in_batch

    trainer = with_plug_ins(tmp_path, compute_loss_func=doubled)
    trainer.train()
    assert calls and set(calls) == {16}  # as in Trainer: the items of the step (k = 2 micro-batches of 8)
    plain = make_trainer(tmp_path / "plain", max_steps=2)
    plain.model.load_state_dict(trainer.model.state_dict())
    calls.clear()
    assert trainer.evaluate()["eval_loss"] == pytest.approx(2 * plain.evaluate()["eval_loss"], rel=1e-6)
    assert calls == [16, 16, 8]  # evaluation: the items of each batch of 16 (40 images)


def test_preprocess_logits_for_metrics_shapes_what_metrics_and_predict_see(tmp_path):
    seen = []

    def metrics(prediction):
        seen.append(prediction.predictions.shape)
        return {"accuracy": float(np.mean(prediction.predictions == prediction.label_ids))}

    trainer = with_plug_ins(tmp_path, compute_metrics=metrics,
                            preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1))
    trainer.train()
    result = trainer.evaluate()
    assert seen == [(40,)] and 0.0 <= result["eval_accuracy"] <= 1.0 and result["eval_loss"] > 0
    assert trainer.predict(trainer.eval_dataset).predictions.shape == (40,)


def test_evaluate_takes_the_name_of_one_of_several_eval_sets(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=2)
    trainer.eval_dataset = {"digits": trainer.eval_dataset, "again": trainer.eval_dataset}
    both = trainer.evaluate()
    one = trainer.evaluate("digits")
    # as in Trainer: evaluate("name") keeps its prefix; only evaluating the whole dict adds the names
    assert one["eval_loss"] == both["eval_digits_loss"] and "eval_digits_loss" not in one
    with pytest.raises(KeyError, match=r"no set of that name \(named sets: 'digits', 'again'\)"):
        trainer.evaluate("digit")


def test_save_model_pushes_with_push_to_hub(tmp_path, monkeypatch):
    from huggingface_hub import HfApi, RepoUrl

    messages = []

    def upload_folder(self, **kwargs):
        messages.append(kwargs.get("commit_message"))
        done = Future()
        done.set_result("commit")
        return done

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    trainer = make_trainer(tmp_path, max_steps=2, push_to_hub=True, hub_model_id="user/revnet")
    trainer.train()
    messages.clear()
    trainer.save_model()
    assert messages == ["Model save"]  # as transformers' Trainer.save_model does
