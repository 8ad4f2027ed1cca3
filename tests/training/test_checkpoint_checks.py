"""The checks of a checkpoint before a resume: its weights' names, shapes and dtypes against the model's (a file
missing 114 of the 122 tensors of a RevNet was loaded with one "missing keys" log line), and its positions
(petra_state.json, trainer_state.json's global step) against each other, on every checkpoint real runs write."""

import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import IterableDataset
from transformers import PretrainedConfig, PreTrainedModel, TrainerCallback, TrainerState

from petra_hub.data import load_image_dataset, take
from petra_hub.testing.models import small_model, small_revvit
from petra_hub.training.checkpoint import PetraState
from petra_hub.training.checkpoint_checks import check_model_tensors, check_positions
from tests.training.test_trainer import make_trainer


# -- model tensors ----------------------------------------------------------------------------------------------------
def tensors_of(model):
    return {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}


def written(folder: Path, tensors: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("make", [small_model, small_revvit], ids=["revnet", "revvit"])
def test_a_saved_model_passes(tmp_path, make):
    model = make()
    model.save_pretrained(tmp_path)
    check_model_tensors(tmp_path, model)


class TiedConfig(PretrainedConfig):
    model_type = "petra-test-tied"

    def __init__(self, tie_word_embeddings=True, **kwargs):
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)


class Tied(PreTrainedModel):
    """An output layer tied to the embedding (save_pretrained writes one of the two names) and a non-persistent
    buffer (never written)."""

    config_class = TiedConfig
    _tied_weights_keys = {"head.weight": "embed.weight"}

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(5, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.register_buffer("scale", torch.ones(3), persistent=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head


def test_tied_weights_and_non_persistent_buffers_are_what_save_pretrained_writes(tmp_path):
    model = Tied(TiedConfig())
    assert model.head.weight is model.embed.weight
    model.save_pretrained(tmp_path / "saved")
    check_model_tensors(tmp_path / "saved", model)
    weight = model.embed.weight.detach().clone()
    check_model_tensors(written(tmp_path / "other-name", {"head.weight": weight}), model)  # either name of the two
    with pytest.raises(ValueError, match=r"2 of the model's 2 tensors are missing: embed.weight, head.weight"):
        check_model_tensors(written(tmp_path / "neither", {}), model)
    with pytest.raises(ValueError, match=r"1 are not the model's: scale"):
        check_model_tensors(written(tmp_path / "buffer", {"embed.weight": weight, "scale": torch.ones(3)}), model)


def test_missing_unexpected_and_mismatched_tensors_are_named(tmp_path):
    model = small_model()
    tensors = tensors_of(model)
    assert len(tensors) == 122
    names = sorted(tensors)
    kept = written(tmp_path / "eight", {name: tensors[name] for name in names[:8]})
    with pytest.raises(ValueError) as error:
        check_model_tensors(kept, model)
    message = str(error.value)
    assert str(kept / "model.safetensors") in message and "(8 tensors in the file)" in message
    assert f"114 of the model's 122 tensors are missing: {', '.join(names[8:13])}, ... (109 more)" in message

    renamed = dict(tensors)
    renamed["classifier.renamed"] = renamed.pop(names[-1])
    renamed["extra"] = torch.zeros(2)
    with pytest.raises(ValueError, match=rf"1 of the model's 122 tensors are missing: {names[-1]}; 2 are not the "
                                         r"model's: classifier.renamed, extra"):
        check_model_tensors(written(tmp_path / "renamed", renamed), model)

    name = next(name for name in names if tensors[name].dim() == 4)
    shape = list(tensors[name].shape)
    wrong = dict(tensors)
    wrong[name] = torch.zeros(shape[0] + 1, *shape[1:], dtype=torch.float64)
    other = next(other for other in names if other != name)
    wrong[other] = tensors[other].float()
    with pytest.raises(ValueError) as error:
        check_model_tensors(written(tmp_path / "mismatched", wrong), model)
    message = str(error.value)
    assert "are missing" not in message and "2 have another shape or dtype" in message
    assert f"{name} (expected {shape} float64, found {[shape[0] + 1, *shape[1:]]} float64)" in message
    assert f"{other} (expected {list(tensors[other].shape)} float64, found {list(tensors[other].shape)} float32)" \
        in message


def test_an_unreadable_or_absent_file_is_named(tmp_path):
    model = small_model()
    with pytest.raises(FileNotFoundError, match="holds no model weights"):
        check_model_tensors(tmp_path, model)
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ValueError, match="model.safetensors is unreadable"):
        check_model_tensors(tmp_path, model)


# -- positions --------------------------------------------------------------------------------------------------------
class Streamed(IterableDataset):
    def __init__(self, base):
        self.base = base

    def __iter__(self):
        return (self.base[i] for i in range(len(self.base)))


class StopEpochAt(TrainerCallback):
    """Ends the first epoch after its first step, as a callback may (`should_epoch_stop`)."""

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            control.should_epoch_stop = True


def saved_positions(folder: Path) -> dict[int, tuple[PetraState, int]]:
    checkpoints = {}
    for path in folder.glob("checkpoint-*"):
        state = TrainerState.load_from_json(str(path / "trainer_state.json"))
        checkpoints[int(path.name.split("-")[1])] = (PetraState.load(path), state.global_step)
    return dict(sorted(checkpoints.items()))


def check_all(folder: Path, per_epoch, k: int, **options) -> dict:
    checkpoints = saved_positions(folder)
    for step, (petra, global_step) in checkpoints.items():
        assert global_step == step
        check_positions(petra, global_step, per_epoch, k, folder / f"checkpoint-{step}", **options)
    return checkpoints


# 40 images in micro-batches of 8: 5 micro-batches an epoch
RUNS = {
    "k=3, every step": (dict(gradient_accumulation_steps=3, max_steps=6, save_strategy="steps", save_steps=1),
                        {1: (0, 3), 2: (0, 5), 3: (1, 3), 4: (1, 5), 5: (2, 3), 6: (2, 5)}),
    "k=3, epoch ends": (dict(gradient_accumulation_steps=3, max_steps=-1, num_train_epochs=2, save_strategy="epoch"),
                        {2: (1, 0), 4: (2, 0)}),
    "k=1, every step": (dict(gradient_accumulation_steps=1, max_steps=7, save_strategy="steps", save_steps=1),
                        {step: divmod(step, 5) if step % 5 else (step // 5 - 1, 5) for step in range(1, 8)}),
    "k=2, every 2 steps, a stream": (dict(gradient_accumulation_steps=2, max_steps=7, save_strategy="steps",
                                          save_steps=2, stream=True), {2: (0, 4), 4: (1, 2), 6: (1, 5), 7: (2, 2)}),
}


@pytest.mark.parametrize("run", RUNS)
def test_every_checkpoint_of_a_run_passes(tmp_path, run):
    settings, positions = RUNS[run]
    settings = dict(settings)
    train = take(load_image_dataset("digits", "train"), 40)
    if settings.pop("stream", False):
        train = Streamed(train)
    trainer = make_trainer(tmp_path, train=train, widths=[4, 4, 4, 4], logging_steps=100, **settings)
    trainer.train()
    per_epoch = None if isinstance(train, IterableDataset) else len(trainer.get_train_dataloader())
    assert per_epoch in (None, 5)
    checkpoints = check_all(tmp_path, per_epoch, settings["gradient_accumulation_steps"])
    assert {step: (petra.epoch, petra.epoch_offset) for step, (petra, _) in checkpoints.items()} == positions
    if per_epoch is not None:  # the same without the position, as older checkpoints
        for step, (petra, global_step) in checkpoints.items():
            old = dataclasses.replace(petra, epoch=None, epoch_offset=None)
            check_positions(old, global_step, per_epoch, settings["gradient_accumulation_steps"], tmp_path)


def test_a_resumed_runs_checkpoints_pass(tmp_path):
    settings = dict(train=take(load_image_dataset("digits", "train"), 40), widths=[4, 4, 4, 4], logging_steps=100,
                    gradient_accumulation_steps=3, max_steps=7, save_strategy="steps", save_steps=1)
    make_trainer(tmp_path, **settings).train()
    make_trainer(tmp_path, **settings).train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert list(check_all(tmp_path, 5, 3)) == list(range(1, 8))


def test_an_epoch_a_callback_ends_early_passes_the_bounds_only(tmp_path):
    """Epoch 0 ends after its first step (3 micro-batches): the next ones count 3 fewer than the epochs imply."""
    trainer = make_trainer(tmp_path, train=take(load_image_dataset("digits", "train"), 40), widths=[4, 4, 4, 4],
                           gradient_accumulation_steps=3, max_steps=4, save_strategy="steps", save_steps=1,
                           logging_steps=100, callbacks=[StopEpochAt()])
    trainer.train()
    checkpoints = check_all(tmp_path, 5, 3, strict=False)
    assert {step: (p.epoch, p.epoch_offset, p.micro_batches_fed) for step, (p, _) in checkpoints.items()} == {
        1: (0, 3, 3), 2: (1, 3, 6), 3: (1, 5, 8), 4: (2, 3, 11)}
    with pytest.raises(ValueError, match="micro_batches_fed is 6, but epoch 1 and epoch_offset 3 imply 8"):
        check_positions(*checkpoints[2], 5, 3, tmp_path / "checkpoint-2")


def position(fed, epoch, offset, k=3):
    return PetraState(micro_batches_fed=fed, num_stages=10, mode="petra", accumulation_steps=k, epoch=epoch,
                      epoch_offset=offset)


@pytest.mark.parametrize("fed, epoch, offset, global_step, match", [
    (30, 10**18, 0, 10, r"micro_batches_fed is 30, but epoch 1000000000000000000 and epoch_offset 0 imply "
                        r"5000000000000000000 \(5 micro-batches an epoch\); global_step \(trainer_state.json\) is 10, "
                        r"but epoch 1000000000000000000 and epoch_offset 0 imply 2000000000000000000"),
    (10**18, 6, 0, 12, r"micro_batches_fed is 1000000000000000000, but epoch 6 and epoch_offset 0 imply 30"),
    (30, 6, 0, 10**6, r"global_step \(trainer_state.json\) is 1000000, but epoch 6 and epoch_offset 0 imply 12 \(2 "
                      r"steps of k = 3 micro-batches an epoch of 5\)"),
    (30, 5, 6, 12, r"epoch_offset 6 is outside 0 \.\. 5"),
    (29, 5, 5, 12, r"micro_batches_fed is 29, but epoch 5 and epoch_offset 5 imply 30"),
    (30, 6, 0, 11, r"global_step \(trainer_state.json\) is 11, but epoch 6 and epoch_offset 0 imply 12"),
    (30, None, None, 11, r"global_step \(trainer_state.json\) is 11, but micro_batches_fed 30 \(epoch 6, offset 0\) "
                         r"implies 12"),
])
def test_positions_that_disagree_are_refused(tmp_path, fed, epoch, offset, global_step, match):
    path = tmp_path / "checkpoint-12"
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: the checkpoint's positions disagree: {match}"):
        check_positions(position(fed, epoch, offset), global_step, 5, 3, path)
    check_positions(position(30, 6, 0), 12, 5, 3, path)  # what they were
    check_positions(position(30, 5, 5), 12, 5, 3, path)  # saved at the epoch's last step


@pytest.mark.parametrize("fed, epoch, offset, global_step, strict, match", [
    (30, 10**18, 0, 10, False, r"micro_batches_fed is 30, but epoch 1000000000000000000 and epoch_offset 0 imply at "
                               r"least 1000000000000000000"),
    (10**18, 6, 0, 12, False, r"global_step \(trainer_state.json\) is 12, but micro_batches_fed 1000000000000000000 "
                              r"makes 333333333333333334 to 1000000000000000000 steps"),
    (30, 6, 0, 10**6, False, r"global_step \(trainer_state.json\) is 1000000, but micro_batches_fed 30 makes 10 to 30"),
    (30, 1, 4, 10**6, True, r"global_step \(trainer_state.json\) is 1000000, but micro_batches_fed 30 makes 10 to 11 "
                            r"steps of 1 to k = 3 micro-batches over 2 epochs"),
    (30, 0, 4, 10, True, r"micro_batches_fed is 30, but epoch 0 and epoch_offset 4 imply 4\. The checkpoint"),
    (30, None, None, 9, True, r"global_step \(trainer_state.json\) is 9, but micro_batches_fed 30 makes 10 to 30"),
])
def test_a_streams_positions_are_bounded(tmp_path, fed, epoch, offset, global_step, strict, match):
    with pytest.raises(ValueError, match=match):
        check_positions(position(fed, epoch, offset), global_step, None, 3, tmp_path, strict=strict)
    check_positions(position(30, 1, 4), 11, None, 3, tmp_path)  # epochs of 26 then 4: 9 + 2 steps
    check_positions(position(30, 1, 4), math.ceil(30 / 3), None, 3, tmp_path)


def test_the_bounds_refuse_absurd_values_of_a_known_epoch_length(tmp_path):
    with pytest.raises(ValueError, match=r"imply at most 33 \(5 micro-batches an epoch\)"):
        check_positions(position(10**18, 6, 3), 12, 5, 3, tmp_path, strict=False)
    check_positions(position(6, 1, 3), 2, 5, 3, tmp_path, strict=False)  # an epoch ended after 3 micro-batches
