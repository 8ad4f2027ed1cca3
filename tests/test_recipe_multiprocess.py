"""The recipe under `accelerate launch` with 2 CPU processes (gloo), end to end."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from huggingface_hub import ModelCard

from petra_hub import RevNetForImageClassification
from petra_hub.testing.ranks import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_two_process_recipe_ends_with_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "run"
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_config.yaml"),
        "--num_processes", "2", "--main_process_port", str(free_port()),
        str(ROOT / "tests" / "scripts" / "run_recipe.py"),
        "--output_dir", str(out), "--max_steps", "12", "--gradient_accumulation_steps", "2",
        "--max_train_samples", "256", "--max_eval_samples", "64", "--eval_strategy", "no",
        "--hidden_sizes", "8,8,16,16", "--embedding_size", "8", "--disable_tqdm", "true",
        "--petra_timeout", "60",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in reports] == [2, 2]
    assert reports[0]["local_stages"] == [0, 1, 2, 3, 4] and reports[1]["local_stages"] == [5, 6, 7, 8, 9]
    for report in reports:  # 12 steps x k=2, every micro-batch backpropagated at every stage
        assert set(report["backwards"].values()) == {24}
    assert 0.0 <= reports[1]["metrics"]["eval_accuracy"] <= 1.0
    for key in ("eval_accuracy", "eval_loss"):  # evaluated on the last rank, shared with all
        assert reports[0]["metrics"][key] == reports[1]["metrics"][key]

    loaded = RevNetForImageClassification.from_pretrained(out).eval()
    expected = torch.load(out / "expected_logits.pt")
    torch.testing.assert_close(loaded(expected["images"]).logits, expected["logits"], rtol=0, atol=1e-6)
    card = ModelCard.load(out / "README.md")
    assert card.data.eval_results[0].metric_value == reports[0]["metrics"]["eval_accuracy"]
    assert "2" in card.text
