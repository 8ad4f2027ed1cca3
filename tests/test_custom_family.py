"""A model family defined outside petra_hub (`examples/revmlp/`, registered with `petra_hub.register_family`) works
wherever RevNet and RevViT do, without any edit inside src/: PetraTrainer on 2 processes, save_model with a card, the
Auto classes after importing the family's package, a trust_remote_code folder without petra_hub, and the recipe's
`--model <preset>`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from petra_hub.testing.ranks import free_port

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _launch(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "accelerate.commands.launch",
               "--config_file", str(ROOT / "accelerate_config.yaml"), "--num_processes", "2",
               "--main_process_port", str(free_port()), str(EXAMPLES / script), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """examples/train_revmlp.py on 2 processes, 1 epoch: (output folder, what rank 0 printed)."""
    tmp = tmp_path_factory.mktemp("revmlp")
    result = _launch("train_revmlp.py", str(tmp / "out"), "1", cwd=tmp)
    printed = [json.loads(line) for line in result.stdout.splitlines() if line.startswith('{"eval_accuracy"')]
    assert len(printed) == 1, result.stdout[-2000:]  # rank 0 reports
    return tmp / "out", printed[0]


def _test_pixels() -> tuple[torch.Tensor, torch.Tensor]:
    from petra_hub.data import collate_image_batch, load_image_dataset

    batch = collate_image_batch([item for item in load_image_dataset("digits", "test")])
    return batch["pixel_values"], batch["labels"]


def test_the_example_family_trains_on_2_processes_and_is_saved_with_its_card(trained):
    folder, printed = trained
    assert printed["stages"] == 6  # embedding, 4 reversible blocks, head: one PETRA stage each
    assert printed["eval_accuracy"] > 0.4  # 10 classes, 1 epoch: far above chance
    assert {"config.json", "model.safetensors", "configuration_revmlp.py", "modeling_revmlp.py",
            "preprocessor_config.json", "README.md"} <= {path.name for path in folder.iterdir()}
    card = (folder / "README.md").read_text()
    assert "- revmlp\n" in card and "- petra\n" in card  # the family's tags beside petra_hub's
    assert "built on **RevMLP**, a reversible multilayer perceptron (RevMLP)" in card
    assert "4 reversible blocks of width 64 per stream" in card  # the family's architecture line
    assert "The embedding and the head (2 of this run's 6 pipeline stages) are not reversible" in card
    assert "from revmlp import RevMLPForImageClassification" in card  # the family's own package, not petra_hub
    assert f"value: {printed['eval_accuracy']}" in card
    assert "RevNet" not in card and "ResNet" not in card  # no other family's words


def test_the_saved_folder_loads_through_the_auto_classes_with_the_trained_weights(trained, revmlp):
    from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

    folder, printed = trained
    assert type(AutoConfig.from_pretrained(folder)) is revmlp.RevMLPConfig
    model = AutoModelForImageClassification.from_pretrained(folder).eval()
    assert type(model) is revmlp.RevMLPForImageClassification
    assert type(AutoModel.from_pretrained(folder)) is revmlp.RevMLPModel
    pixels, labels = _test_pixels()
    with torch.no_grad():
        accuracy = float((model(pixel_values=pixels).logits.argmax(-1) == labels).float().mean())
    assert accuracy == pytest.approx(printed["eval_accuracy"], abs=1e-6)  # the evaluated weights were saved


def test_the_saved_folder_loads_with_trust_remote_code_without_petra_hub_or_the_family(trained, revmlp, tmp_path):
    folder, _ = trained
    pixels, _ = _test_pixels()
    torch.save(pixels[:8], tmp_path / "pixels.pt")
    script = f"""
import sys
sys.modules["petra_hub"] = None  # importing petra_hub (or the family's package) would fail
sys.modules["revmlp"] = None
import torch
from transformers import AutoModelForImageClassification
model = AutoModelForImageClassification.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
with torch.no_grad():
    logits = model(pixel_values=torch.load({str(tmp_path / "pixels.pt")!r}, weights_only=True)).logits
torch.save(logits, {str(tmp_path / "logits.pt")!r})
print(type(model).__module__)
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().startswith("transformers_modules.")  # the folder's own copy of the code
    from transformers import AutoModelForImageClassification

    local = AutoModelForImageClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = local(pixel_values=pixels[:8]).logits
    assert torch.equal(torch.load(tmp_path / "logits.pt", weights_only=True), expected)


def test_the_recipe_trains_the_example_familys_preset_on_2_processes(tmp_path):
    out = tmp_path / "recipe"
    _launch("revmlp_recipe.py", "--model", "revmlp-small", "--num_train_epochs", "1", "--output_dir", str(out),
            "--logging_steps", "5", cwd=tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["preset"], config["num_blocks"], config["image_size"]) == (
        "revmlp", "revmlp-small", 4, 16)  # shaped to the digits' image size by the family
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_accuracy"] > 0.3
    card = (out / "README.md").read_text()
    assert "- revmlp\n" in card and "Pipeline stages (J) | 6" in card


def test_a_recipe_flag_of_another_family_is_refused_for_the_example_family(revmlp):
    from petra_hub.recipe import parse

    with pytest.raises(ValueError, match=r"--patch_size shapes RevViT models, not --model revmlp-small \(RevMLP\), "
                                         "whose own flags are none"):
        parse(["--model", "revmlp-small", "--patch_size", "4"])
