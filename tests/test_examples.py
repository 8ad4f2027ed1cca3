"""The user scripts in examples/ run as their docstrings say (under `accelerate launch`, 2 CPU processes)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from petra_hub.testing.ranks import free_port

ROOT = Path(__file__).resolve().parents[1]


def test_datasets_image_classification_example(tmp_path):
    out = tmp_path / "model"
    command = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ROOT / "accelerate_config.yaml"),
        "--num_processes", "2", "--main_process_port", str(free_port()),
        str(ROOT / "examples" / "train_datasets_image_classification.py"), "--output_dir", str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULTS ")]
    reports = sorted((json.loads(line.split(" ", 1)[1]) for line in lines), key=lambda r: r["rank"])
    assert [(r["rank"], r["world_size"]) for r in reports] == [(0, 2), (1, 2)]
    for report in reports:  # predict agrees with evaluate on every rank, over the whole test split in order
        assert report["num_predictions"] == 360 and report["labels_match"]
        assert report["predict_accuracy"] == report["predict_metric_accuracy"] == report["eval_accuracy"]
        assert report["eval_accuracy"] == reports[0]["eval_accuracy"]
    assert reports[0]["eval_accuracy"] > 0.3  # 10 classes: well above chance after 2 epochs
    first = reports[0]
    assert first["reloaded_max_logit_difference"] < 1e-4  # from_pretrained gives the predicting model back
    assert first["pipeline_label"] == first["predicted_label"]  # pipeline("image-classification") agrees
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= set(first["saved_files"])
    card = (out / "README.md").read_text()
    assert "scikit-learn digits" in card and "20% stratified test split" in card and "custom data set" not in card
