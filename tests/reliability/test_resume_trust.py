"""A resume trusts nothing a checkpoint says that can be checked first: its weights against the model, its
positions against each other and against the trainer state."""

import json

import pytest
from safetensors.torch import load_file, save_file

from tests.training.test_trainer import make_trainer

SAVES = dict(max_steps=4, save_strategy="steps", save_steps=2)


@pytest.fixture
def checkpoint(tmp_path):
    make_trainer(tmp_path / "run", **SAVES).train()
    return tmp_path / "run" / "checkpoint-2"


def resume(checkpoint, tmp_path):
    trainer = make_trainer(tmp_path / "resumed", **SAVES)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    return trainer


def test_weights_missing_from_the_checkpoint_are_refused_before_training(checkpoint, tmp_path):
    weights = load_file(str(checkpoint / "model.safetensors"))
    kept = dict(list(weights.items())[:8])
    kept["renamed.weight"] = next(iter(weights.values())).clone()
    save_file(kept, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{len(weights) - 8} of the model's {len(weights)} tensors are missing"):
        resume(checkpoint, tmp_path)
    assert not (tmp_path / "resumed" / "checkpoint-4").exists()


@pytest.mark.parametrize("petra, trainer_state", [
    ({"epoch_offset": 9}, {}),  # past the end of an epoch of 8 micro-batches
    ({"epoch": 10**18}, {}),
    ({"micro_batches_fed": 10**18}, {}),
    ({}, {"global_step": 10**6}),
])
def test_positions_that_disagree_are_refused_naming_the_checkpoint(checkpoint, tmp_path, petra, trainer_state):
    for name, changes in (("petra_state.json", petra), ("trainer_state.json", trainer_state)):
        values = json.loads((checkpoint / name).read_text())
        values.update(changes)
        (checkpoint / name).write_text(json.dumps(values))
    with pytest.raises(ValueError, match=f"{checkpoint}.*positions disagree"):
        resume(checkpoint, tmp_path)


def test_a_deeply_nested_state_file_names_itself(checkpoint, tmp_path):
    (checkpoint / "trainer_state.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="trainer_state.json"):
        resume(checkpoint, tmp_path)


def test_a_full_device_names_the_file_and_the_last_complete_checkpoint(tmp_path, monkeypatch):
    import collections
    import errno

    from petra_hub.training import checkpoint as checkpoint_module

    trainer = make_trainer(tmp_path / "run", max_steps=6, save_strategy="steps", save_steps=2)
    real_save, real_usage = checkpoint_module.save_stage_states, checkpoint_module.shutil.disk_usage
    usage = collections.namedtuple("usage", "total used free")
    full = []

    def save_until_full(folder, pipeline):
        if trainer.state.global_step == 4:  # what torch.save raises on a full device
            full.append(True)
            (tmp_path / "run" / "_tmp-checkpoint-4" / "petra_stage_000.pt").write_bytes(b"partial")
            raise RuntimeError("[enforce fail at inline_container.cc] . basic_ios::clear: iostream error")
        real_save(folder, pipeline)

    monkeypatch.setattr(checkpoint_module, "save_stage_states", save_until_full)
    monkeypatch.setattr(checkpoint_module.shutil, "disk_usage",
                        lambda path: usage(1 << 30, 1 << 30, 0) if full else real_usage(path))
    with pytest.raises(OSError) as caught:
        trainer.train()
    message = str(caught.value)
    assert caught.value.errno == errno.ENOSPC and "is full" in message and "petra_stage_000.pt" in message
    assert str(tmp_path / "run" / "checkpoint-2") in message
    assert not (tmp_path / "run" / "_tmp-checkpoint-4").exists()
