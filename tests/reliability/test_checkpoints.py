"""Nothing lost, nothing mixed: poisoned weights stop the run before a save, checkpoints appear whole or not at
all, the output folder is checked before the first step, and a checkpoint is only resumed by its own run."""

import json
import os
import socket
from pathlib import Path

import pytest
import torch
from transformers.trainer_utils import get_last_checkpoint

import petra_hub.training.checkpoint as checkpoint_module
from petra_hub.training.guards import LOCK_NAME, RunLock
from petra_hub.data import load_image_dataset, take
from tests.training.test_trainer import make_trainer


def checkpoints(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("checkpoint-"))


def test_one_huge_pixel_stops_the_run_naming_the_stage_and_tensor(tmp_path):
    base = take(load_image_dataset("digits", "train"), 64)

    class OneHugePixel(torch.utils.data.Dataset):
        info, labels = base.info, base.labels

        def __len__(self):
            return len(base)

        def __getitem__(self, index):
            item = dict(base[index])
            if index == 5:
                item["pixel_values"] = item["pixel_values"].clone()
                item["pixel_values"][0, 0, 0] = 1e30
            return item

    trainer = make_trainer(tmp_path, train=OneHugePixel(), max_steps=8, save_strategy="steps", save_steps=1)
    with pytest.raises(FloatingPointError, match=r"in stage 0 \(layers\.0\.weight, .*running_mean"):
        trainer.train()
    for name in checkpoints(tmp_path):  # every checkpoint written is finite
        from safetensors.torch import load_file

        assert all(
            torch.isfinite(t).all() for t in load_file(str(tmp_path / name / "model.safetensors")).values()
        ), name


def test_divergence_never_writes_a_poisoned_checkpoint(tmp_path):
    trainer = make_trainer(tmp_path, learning_rate=1e8, max_steps=20, save_strategy="steps", save_steps=1)
    with pytest.raises(FloatingPointError):
        trainer.train()
    from safetensors.torch import load_file

    for name in checkpoints(tmp_path):
        assert all(
            torch.isfinite(t).all() for t in load_file(str(tmp_path / name / "model.safetensors")).values()
        ), name


def test_a_kill_while_saving_keeps_the_last_complete_checkpoint(tmp_path, monkeypatch):
    trainer = make_trainer(tmp_path, max_steps=6, save_strategy="steps", save_steps=2, save_total_limit=1)
    real_save = checkpoint_module.save_stage_states

    def dies_at_step_4(folder, pipeline):
        if "checkpoint-4" in str(folder):
            torch.save({}, Path(folder, "petra_stage_000.pt"))  # half of the files are there...
            raise KeyboardInterrupt("killed while saving")  # ...when the process dies
        real_save(folder, pipeline)

    monkeypatch.setattr(checkpoint_module, "save_stage_states", dies_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert checkpoints(tmp_path) == ["checkpoint-2"]
    assert get_last_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-2")
    monkeypatch.setattr(checkpoint_module, "save_stage_states", real_save)
    resumed = make_trainer(tmp_path, max_steps=6, save_strategy="steps", save_steps=2, save_total_limit=1)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert checkpoints(tmp_path) == ["checkpoint-6"] and not list(tmp_path.glob("*tmp-*"))


def test_an_unwritable_or_full_output_dir_fails_before_the_first_step(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(OSError, match="a-file"):  # transformers' Trainer creates output_dir when it is built
        make_trainer(blocker / "out", max_steps=2).train()
    trainer = make_trainer(tmp_path / "writable", max_steps=2)
    trainer.args.output_dir = str(blocker / "out")  # the folder went away between construction and train()
    with pytest.raises(PermissionError, match="not writable"):
        trainer.train()
    assert trainer.state.global_step == 0

    import petra_hub.training.guards as guards

    monkeypatch.setattr(guards.shutil, "disk_usage", lambda path: type("Usage", (), {"free": 1000})())
    trainer = make_trainer(tmp_path / "full", max_steps=2)
    with pytest.raises(OSError, match="MiB free"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_another_runs_folder_is_refused_unless_overwritten(tmp_path):
    make_trainer(tmp_path, max_steps=2, save_strategy="steps", save_steps=2).train()
    with pytest.raises(FileExistsError, match="already holds another run"):
        make_trainer(tmp_path, max_steps=2, overwrite_output_dir=False).train()
    # Resuming the folder's own checkpoint is not "another run".
    make_trainer(tmp_path, max_steps=4, overwrite_output_dir=False).train(
        resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    make_trainer(tmp_path, max_steps=2, overwrite_output_dir=True).train()
    assert not (tmp_path / "checkpoint-2").exists()  # the earlier run's checkpoints went with it


def test_a_folder_in_use_is_refused_and_a_dead_runs_lock_is_taken_over(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    lock = tmp_path / LOCK_NAME
    holder = RunLock(str(tmp_path))  # a run training into the folder: it holds the file's flock
    holder.acquire()
    with pytest.raises(FileExistsError, match=rf"another run \(process {os.getpid()} on "):
        make_trainer(tmp_path, max_steps=2).train()
    holder.release()
    # What a killed run leaves: its file, unlocked (the kernel dropped its flock), naming a pid that may be reused.
    lock.write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname()}))
    make_trainer(tmp_path, max_steps=2).train()
    assert not lock.exists()  # released at the end


def test_a_checkpoint_of_another_set_up_is_refused(tmp_path):
    make_trainer(tmp_path / "run", max_steps=2, save_strategy="steps", save_steps=2).train()
    with pytest.raises(ValueError, match="accumulation_steps: checkpoint 2, this run 1"):
        make_trainer(tmp_path / "other", gradient_accumulation_steps=1, max_steps=4).train(
            resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    with pytest.raises(ValueError, match="micro_batch_size"):
        make_trainer(tmp_path / "other", per_device_train_batch_size=4, max_steps=4).train(
            resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))
    # written with 2 pipeline replicas (petra_data_parallel=2): its epoch position counts micro-batches per replica,
    # so another D would skip or repeat data
    state = tmp_path / "run" / "checkpoint-2" / "petra_state.json"
    assert json.loads(state.read_text())["data_parallel"] == 1
    state.write_text(json.dumps(json.loads(state.read_text()) | {"data_parallel": 2}))
    with pytest.raises(ValueError, match="data_parallel: checkpoint 2, this run 1"):
        make_trainer(tmp_path / "other", max_steps=4).train(resume_from_checkpoint=str(state.parent))
    # as many pipeline stages, grouped differently: the stage files hold other stages' optimizer states
    make_trainer(tmp_path / "groups", max_steps=2, save_strategy="steps", save_steps=2,
                 petra_stage_groups="1,2,7").train()  # fmt: skip
    with pytest.raises(ValueError, match=r"stage_groups: checkpoint \[1, 2, 7\], this run \[4, 3, 3\]"):
        make_trainer(tmp_path / "other", petra_num_stages=3, max_steps=4).train(
            resume_from_checkpoint=str(tmp_path / "groups" / "checkpoint-2"))


@pytest.mark.parametrize("name,damage", [
    ("model.safetensors", lambda p: p.write_bytes(p.read_bytes()[:100])),
    ("trainer_state.json", lambda p: p.write_text(p.read_text()[:20])),
    ("petra_stage_003.pt", lambda p: p.write_bytes(b"")),
    ("petra_state.json", lambda p: p.unlink()),
])
def test_a_damaged_checkpoint_names_the_file(tmp_path, name, damage):
    make_trainer(tmp_path / "run", max_steps=2, save_strategy="steps", save_steps=2).train()
    damage(tmp_path / "run" / "checkpoint-2" / name)
    with pytest.raises((ValueError, FileNotFoundError), match=name.replace(".", r"\.")):
        make_trainer(tmp_path / "resumed", max_steps=4).train(
            resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2")
        )


def test_every_label_is_checked_before_training(tmp_path):
    import datasets

    from tests.training.test_drop_in import example_collate, example_transform, image_label_dataset

    data = image_label_dataset(32)
    labels = list(data["label"])
    labels[20] = 12  # one bad label deep in the data set
    bad = data.cast_column("label", datasets.Value("int64")).remove_columns("label").add_column("label", labels)
    trainer = make_trainer(tmp_path, train=bad.with_transform(example_transform), remove_unused_columns=False)
    trainer.data_collator = example_collate
    with pytest.raises(ValueError, match="item 20 is labelled 12"):
        trainer.train()
    floats = data.remove_columns("label").add_column("label", [float(x) + 0.7 for x in list(data["label"])])
    trainer = make_trainer(tmp_path, train=floats.with_transform(example_transform), remove_unused_columns=False)
    trainer.data_collator = example_collate
    with pytest.raises(ValueError, match="floating-point labels"):
        trainer.train()
    assert trainer.state.global_step == 0


def test_loading_weights_with_nan_warns_naming_them(tmp_path):
    from petra_hub import RevNetForImageClassification
    from petra_hub.testing.models import small_model

    model = small_model("revnet18", dtype=torch.float32)
    with torch.no_grad():
        model.classifier.weight[0, 0] = float("nan")
        model.revnet.embedder.layers[1].running_var.fill_(float("inf"))
    model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match=r"classifier\.weight.*running_var|running_var.*classifier\.weight"):
        RevNetForImageClassification.from_pretrained(tmp_path)


@pytest.mark.parametrize("damage,message", [
    (lambda folder: (folder / "config.json").unlink(), "needs its config.json"),
    (lambda folder: (folder / "config.json").write_text("[1, 2]"), "must hold a JSON object"),
    (lambda folder: (folder / "config.json").write_text("{"), "not valid JSON"),
])
def test_a_bad_config_file_names_itself(tmp_path, damage, message):
    from petra_hub import RevNetForImageClassification
    from petra_hub.testing.models import small_model

    small_model("revnet18", dtype=torch.float32).save_pretrained(tmp_path)
    damage(tmp_path)
    with pytest.raises((ValueError, FileNotFoundError), match=message):
        RevNetForImageClassification.from_pretrained(tmp_path)


def test_a_bad_processor_normalisation_is_refused():
    from types import SimpleNamespace

    from petra_hub.recipe.data import normalisation

    assert normalisation(None)[0] == (0.485, 0.456, 0.406)
    with pytest.raises(ValueError, match="image_std must be positive"):
        normalisation(SimpleNamespace(image_mean=[0.5] * 3, image_std=[0.5, 0.0, 0.5]))
    with pytest.raises(ValueError, match="image_mean must be 1 or 3 finite numbers"):
        normalisation(SimpleNamespace(image_mean=[0.5, "x"], image_std=[0.5] * 3))
