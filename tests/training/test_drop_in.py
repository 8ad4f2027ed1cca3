"""PetraTrainer honours what transformers' Trainer users rely on (one process; multi-process: test_multiprocess.py)."""

import math
from concurrent.futures import Future
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import IterableDataset

from petra_hub import RevNetForImageClassification
from petra_hub.data import collate_image_batch, load_image_dataset, take
from petra_hub.testing.models import small_config
from petra_hub.training import EpochSampler
from petra_hub.training.distributed import requested_processes
from tests.training.test_trainer import Recorder, make_trainer


def state_of(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_backprop_with_clipping_and_label_smoothing_equals_a_hand_written_loop(tmp_path):
    """max_grad_norm clips each stage's averaged gradient before its update; label smoothing is in the loss."""
    trainer = make_trainer(tmp_path, petra_mode="backprop", optim="sgd", optim_args="", weight_decay=0.0,
                           lr_scheduler_type="constant", max_steps=4, max_grad_norm=0.05, label_smoothing_factor=0.1,
                           logging_steps=1)
    reference = RevNetForImageClassification(small_config("revnet18", stem="cifar"))
    reference.load_state_dict(trainer.model.state_dict())
    recorder = Recorder()
    trainer.add_callback(recorder)
    trainer.train()

    stages = reference.get_stages()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.05)
    data = trainer.train_dataset
    data.set_epoch(0)
    order = list(EpochSampler(len(data), seed=0))
    reference.train()
    norms = []
    for step in range(4):
        optimizer.zero_grad()
        for micro in range(2):
            batch = collate_image_batch([data[i] for i in order[(2 * step + micro) * 8 : (2 * step + micro + 1) * 8]])
            logits = reference(batch["pixel_values"]).logits
            (torch.nn.functional.cross_entropy(logits, batch["labels"], label_smoothing=0.1) / 2).backward()
        norms.append([float(torch.nn.utils.clip_grad_norm_(stage.parameters(), 0.05)) for stage in stages])
        optimizer.step()
    for (name, want), got in zip(reference.named_parameters(), trainer.model.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, msg=name)
    logged = [log["grad_norm"] for log in recorder.logs if "grad_norm" in log]
    assert len(logged) == 4
    # The logged norm is over all stages' last updates, before clipping; clipping was active.
    assert logged[-1] == pytest.approx(math.sqrt(sum(n * n for n in norms[-1])), rel=1e-4)
    assert sum(n > 0.05 for n in norms[-1]) >= 3


def test_eval_on_start_and_the_best_model_loaded_at_the_end(tmp_path):
    recorder = Recorder()
    # "Best" = highest eval loss: the earliest evaluations win, so the final model is not the last one.
    trainer = make_trainer(tmp_path, callbacks=[recorder], eval_on_start=True, eval_strategy="steps", eval_steps=2,
                           save_strategy="steps", save_steps=2, save_total_limit=1, load_best_model_at_end=True,
                           metric_for_best_model="loss", greater_is_better=True)
    trainer.train()
    assert [step for step, _ in recorder.evaluations] == [0, 2, 4, 6]
    best = max(recorder.evaluations[1:], key=lambda item: item[1]["eval_loss"])[0]
    assert trainer.state.best_model_checkpoint == str(tmp_path / f"checkpoint-{best}")
    kept = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("checkpoint-"))
    assert kept == [f"checkpoint-{best}"]  # as in Trainer: with save_total_limit=1, the best alone at the end
    saved = load_file(str(tmp_path / f"checkpoint-{best}" / "model.safetensors"))
    current = trainer.model.state_dict()
    assert all(torch.equal(current[name], tensor) for name, tensor in saved.items())


def test_the_evaluation_on_start_is_no_candidate_for_the_best_model(tmp_path):
    """As in Trainer: where the untrained model scores best, the best model is still a checkpoint's (it used to be
    step 0's, which no checkpoint holds, so nothing was loaded at the end and rotation deleted the real best)."""
    scores = []

    def falling_score(prediction):  # the best at step 0, then worse at every evaluation
        scores.append(-len(scores))
        return {"score": scores[-1]}

    trainer = make_trainer(tmp_path, eval_on_start=True, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                           save_steps=2, save_total_limit=2, load_best_model_at_end=True, metric_for_best_model="score")
    trainer.compute_metrics = falling_score
    trainer.train()
    assert scores == [0, -1, -2, -3]
    assert trainer.state.best_global_step == 2 and trainer.state.best_metric == -1
    assert trainer.state.best_model_checkpoint == str(tmp_path / "checkpoint-2")
    saved = load_file(str(tmp_path / "checkpoint-2" / "model.safetensors"))
    assert all(torch.equal(trainer.model.state_dict()[name], tensor) for name, tensor in saved.items())


def test_hub_strategy_every_save_pushes_each_checkpoint(tmp_path, monkeypatch):
    from huggingface_hub import HfApi, RepoUrl

    uploads = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: RepoUrl(f"https://huggingface.co/{repo_id}"))
    def upload_folder(self, **kwargs):
        uploads.append(kwargs.get("commit_message"))
        done = Future()
        done.set_result("commit")
        return done  # transformers uploads checkpoints with run_as_future=True

    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    trainer = make_trainer(tmp_path, max_steps=4, save_strategy="steps", save_steps=2, push_to_hub=True,
                           hub_model_id="user/revnet", hub_strategy="every_save")
    trainer.train()
    assert uploads == ["Training in progress, step 2", "Training in progress, step 4"]


def test_model_init_builds_the_model(tmp_path):
    calls = []

    def model_init():
        calls.append(1)
        torch.manual_seed(0)
        return RevNetForImageClassification(small_config("revnet18", stem="cifar"))

    trainer = make_trainer(tmp_path, max_steps=2)
    trainer = type(trainer)(model_init=model_init, args=trainer.args, train_dataset=trainer.train_dataset,
                            data_collator=collate_image_batch)
    trainer.train()
    assert len(calls) == 2  # at construction and again at train(), as transformers' Trainer does
    assert all(c.updates == 2 for c in trainer.pipeline.counters().values())


def test_predict_agrees_with_evaluate_and_dicts_of_eval_sets(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=6)
    trainer.train()
    metrics = trainer.evaluate()
    prediction = trainer.predict(trainer.eval_dataset)
    assert prediction.predictions.shape == (40, 10)
    assert float((prediction.predictions.argmax(-1) == prediction.label_ids).mean()) == metrics["eval_accuracy"]
    assert prediction.metrics["test_accuracy"] == metrics["eval_accuracy"]
    # prediction_step and trainer.model see the trained weights.
    batch = collate_image_batch([trainer.eval_dataset[i] for i in range(4)])
    trainer.model.eval()  # as transformers' evaluation loop does before calling prediction_step
    _, logits, _ = trainer.prediction_step(trainer.model, batch, prediction_loss_only=False)
    torch.testing.assert_close(logits, torch.as_tensor(prediction.predictions[:4]), rtol=1e-5, atol=1e-5)
    both = trainer.evaluate({"first": take(trainer.eval_dataset, 16), "all": trainer.eval_dataset})
    assert both["eval_all_accuracy"] == metrics["eval_accuracy"] and "eval_first_loss" in both


class Streamed(IterableDataset):
    def __init__(self, base):
        self.base = base

    def __iter__(self):
        return (self.base[i] for i in range(len(self.base)))


def test_iterable_train_dataset_needs_max_steps_and_trains(tmp_path):
    stream = Streamed(take(load_image_dataset("digits", "train"), 40))
    with pytest.raises(ValueError, match="max_steps"):
        make_trainer(tmp_path, train=stream, max_steps=-1, num_train_epochs=1).train()
    trainer = make_trainer(tmp_path, train=stream, max_steps=4)  # 5 micro-batches per pass, k = 2: 3 steps a pass
    trainer.train()
    assert trainer.state.global_step == 4
    assert all((c.forwards, c.updates) == (7, 4) for c in trainer.pipeline.counters().values())


def test_a_streaming_datasets_set_trains(tmp_path):
    """A Hub stream (`datasets.IterableDataset`, as `load_dataset(..., streaming=True)` gives): the label check
    before training once read its label column as if it were in memory, and failed."""
    base = take(load_image_dataset("digits", "train", augment=False), 40)
    rows = [base[i] for i in range(len(base))]
    table = datasets.Dataset.from_dict({"pixel_values": [r["pixel_values"].numpy() for r in rows],
                                        "labels": [int(r["labels"]) for r in rows]})
    stream = table.to_iterable_dataset().with_format("torch")
    assert isinstance(stream, datasets.IterableDataset)
    trainer = make_trainer(tmp_path, train=stream, max_steps=3, remove_unused_columns=False)
    trainer.train()
    assert trainer.state.global_step == 3


def image_label_dataset(count=48):
    """A `datasets` image/label set as transformers' image-classification example uses it."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = [np.uint8(np.kron(img, np.ones((2, 2))) * 15) for img in digits.images[:count]]
    from PIL import Image

    data = datasets.Dataset.from_dict({"image": [Image.fromarray(i).convert("RGB") for i in images],
                                       "label": digits.target[:count].tolist()})
    return data.cast_column("label", datasets.ClassLabel(names=[str(d) for d in range(10)]))


def example_transform(batch):
    from torchvision.transforms import v2

    convert = v2.Compose([v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.3] * 3, [0.3] * 3)])
    batch["pixel_values"] = [convert(image) for image in batch["image"]]
    return batch


def example_collate(examples):
    return {"pixel_values": torch.stack([e["pixel_values"] for e in examples]),
            "labels": torch.tensor([e["label"] for e in examples])}


def test_the_image_classification_example_conventions(tmp_path):
    data = image_label_dataset().with_transform(example_transform)
    trainer = make_trainer(tmp_path, train=data, max_steps=-1, num_train_epochs=1, remove_unused_columns=False,
                           learning_rate=0.0)
    trainer.data_collator = example_collate
    trainer.eval_dataset = data
    trainer.train()
    assert trainer.state.global_step == 3
    trainer.evaluate()
    trainer.save_model()
    assert (Path(tmp_path) / "model.safetensors").is_file()


def test_a_launch_that_asked_for_more_processes_is_recognised():
    assert requested_processes(["python", "/bin/accelerate", "launch", "--num_processes", "2", "x.py"]) == 2
    assert requested_processes(["python", "/bin/accelerate", "launch", "--num_processes=3", "x.py"]) == 3
    assert requested_processes(["python", "x.py", "--num_processes", "2"]) is None
    # the config file's count: `--cpu` or a MULTI_CPU config with it once ran one process without a word
    config = str(Path(__file__).resolve().parents[2] / "accelerate_config.yaml")
    assert requested_processes(["/bin/accelerate", "launch", "--config_file", config, "--cpu", "x.py"]) == 2
    assert requested_processes(["/bin/accelerate", "launch", f"--config-file={config}", "x.py"]) == 2
    assert requested_processes(["/bin/accelerate", "launch", "--config_file", "/no/such.yaml", "x.py"]) is None


def test_a_single_process_launch_with_cpu_names_the_flag(monkeypatch):
    from petra_hub.training import distributed

    config = str(Path(__file__).resolve().parents[2] / "accelerate_config.yaml")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    command = b"\0".join([b"/bin/accelerate", b"launch", b"--config_file", config.encode(), b"--cpu", b"x.py"])
    real_open = open

    def parent_cmdline(path, *args, **kwargs):
        if str(path).startswith("/proc/") and str(path).endswith("/cmdline"):
            import io

            return io.BytesIO(command)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", parent_cmdline)
    with pytest.raises(RuntimeError, match="--cpu makes it run a single process"):
        distributed.check_launch()


def test_more_processes_than_gpus_is_refused_naming_num_processes(monkeypatch):
    """The shipped accelerate_config.yaml asks for 2 processes: on a 1-GPU machine the second once died with CUDA's
    bare "invalid device ordinal"."""
    import torch.distributed as dist

    from petra_hub.training import distributed

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed, "check_launch", lambda: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("set to a GPU that does not exist"))
    with pytest.raises(RuntimeError, match=r"1 GPU\(s\) and NCCL needs one per process; launch at most 1 processes "
                                           r"per machine \(accelerate launch --num_processes 1"):
        distributed.init_distributed(timeout=5)
