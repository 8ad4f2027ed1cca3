"""The paper's recipe files parse into the paper's hyper-parameters, and run where their data is present."""

import runpy
from pathlib import Path

import numpy as np
import pytest

from petra_hub.testing.data_files import tar_folder as _tar, write_cifar10 as _write_cifar10

ROOT = Path(__file__).resolve().parents[1]
RECIPE = runpy.run_path(str(ROOT / "recipes" / "train_revnet.py"))
CONFIGS = sorted((ROOT / "recipes" / "configs").glob("*.yaml"))

PAPER = {  # (preset, mode, micro-batch, k, effective lr, weight decay, epochs, milestones)
    "cifar10_revnet18_petra": ("revnet18", "petra", 64, 2, 0.05, 5e-4, 300, [150, 225]),
    "cifar10_revnet18_backprop": ("revnet18", "backprop", 128, 1, 0.05, 5e-4, 300, [150, 225]),
    "imagenet32_revnet34_petra": ("revnet34", "petra", 64, 2, 0.05, 1e-4, 90, [30, 60, 80]),
    "imagenet32_revnet34_backprop": ("revnet34", "backprop", 128, 1, 0.05, 1e-4, 90, [30, 60, 80]),
    "imagenet_revnet50_petra": ("revnet50", "petra", 64, 4, 0.1, 1e-4, 90, [30, 60, 80]),
    "imagenet_revnet50_backprop": ("revnet50", "backprop", 128, 1, 0.05, 1e-4, 90, [30, 60, 80]),
}


def test_every_paper_recipe_is_there():
    assert sorted(c.stem for c in CONFIGS) == sorted(PAPER)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_recipe_holds_the_paper_hyper_parameters(config, tmp_path):
    model_args, data_args, args = RECIPE["parse"]([str(config), "--output_dir", str(tmp_path)])
    preset, mode, micro_batch, k, lr, weight_decay, epochs, milestones = PAPER[config.stem]
    assert (model_args.preset, args.petra_mode, args.per_device_train_batch_size) == (preset, mode, micro_batch)
    assert args.gradient_accumulation_steps == k and args.petra_scale_lr
    assert args.learning_rate * micro_batch * k / 256 == pytest.approx(lr)
    assert (args.weight_decay, args.num_train_epochs, args.milestones()) == (weight_decay, epochs, milestones)
    assert args.warmup_steps * epochs == pytest.approx(5, abs=1e-3)  # 5 warm-up epochs
    assert (args.optim, args.optim_args) == ("sgd", "momentum=0.9,nesterov=True")
    assert model_args.hidden_sizes == "paper" and model_args.embedding_size == 0


def test_cifar10_recipe_runs_on_local_files(tmp_path):
    """The CIFAR-10 recipe as written, on a tiny archive in the original format, shortened to 2 steps."""
    _write_cifar10(tmp_path / "data", np.random.default_rng(0))
    _tar(tmp_path / "data", "cifar-10-batches-py", "cifar-10-python.tar.gz")
    config = ROOT / "recipes" / "configs" / "cifar10_revnet18_petra.yaml"
    trainer, metrics = RECIPE["run"]([
        str(config), "--data_dir", str(tmp_path / "data"), "--output_dir", str(tmp_path / "out"),
        "--max_steps", "2", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
        "--hidden_sizes", "4,8,8,8", "--embedding_size", "4", "--dataloader_num_workers", "0",
        "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true",
    ])
    assert trainer.state.global_step == 2 and len(trainer.stages) == 10
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0
    assert (tmp_path / "out" / "model.safetensors").exists()
