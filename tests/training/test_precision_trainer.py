"""PetraTrainer's bf16 / fp16 / torch_compile and the reconstruction check: each argument changes what runs."""

import logging

import pytest
import torch
from transformers.utils import logging as hf_logging

from petra_hub.engine import Precision
from petra_hub.training import PetraTrainingArguments

from .test_trainer import make_trainer


def logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_arguments_build_the_engine_policy(tmp_path):
    make = lambda **kw: PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", **kw)  # noqa: E731
    assert make().precision() == Precision()
    assert make(bf16=True).precision() == Precision.of("bf16")
    assert make(fp16=True, petra_streams="bf16", petra_message_dtype="fp16").precision() == Precision.of(
        "fp16", streams="bf16", messages="fp16")
    assert make(torch_compile=True).compile_options() == {"backend": "inductor"}
    assert make(torch_compile_mode="max-autotune").compile_options() == {"backend": "inductor", "mode": "max-autotune"}
    for bad, named in ((dict(petra_streams="bf16"), "petra_streams"),
                       (dict(petra_streams="fp8", bf16=True), "petra_streams"),
                       (dict(petra_message_dtype="int8"), "petra_message_dtype"),
                       (dict(petra_check_reconstruction_every=-1), "petra_check_reconstruction_every")):
        with pytest.raises(ValueError, match=named):
            make(**bad)


def test_accelerate_launch_mixed_precision_is_honoured_like_transformers_trainer(tmp_path, monkeypatch):
    make = lambda **kw: PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", **kw)  # noqa: E731
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # what `accelerate launch --mixed_precision bf16` sets
    assert make().precision() == Precision.of("bf16")
    assert make(fp16=True).precision() == Precision.of("fp16")  # the arguments win, as in transformers
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    with pytest.raises(ValueError, match="mixed_precision='fp8'"):
        make()


def test_bf16_trains_like_float32_with_float32_weights(tmp_path):
    reference = make_trainer(tmp_path / "fp32", max_steps=16, logging_steps=4)
    reference.train()
    trainer = make_trainer(tmp_path / "bf16", bf16=True, max_steps=16, logging_steps=4)
    trainer.train()
    expected, losses = logged(reference, "loss"), logged(trainer, "loss")
    assert len(losses) == len(expected) == 3
    assert max(abs(a - b) for a, b in zip(losses, expected)) < 0.05
    assert losses != expected  # bf16 really ran
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    trainer.save_model(str(tmp_path / "saved"))
    assert "compute bf16, streams fp32" in (tmp_path / "saved" / "README.md").read_text()


def test_fp16_checkpoints_carry_each_stage_loss_scale(tmp_path):
    trainer = make_trainer(tmp_path, fp16=True, save_strategy="steps", save_steps=6)
    trainer.train()
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    files = sorted((tmp_path / "checkpoint-6").glob("petra_stage_*.pt"))
    scales = [torch.load(path, weights_only=True)["loss_scale"]["scale"] for path in files]
    assert len(scales) == len(trainer.stages) and all(scale == 2.0**16 for scale in scales)  # no overflow here


def test_reconstruction_check_is_logged_and_warns_above_the_threshold(tmp_path):
    messages = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())
    logger = hf_logging.get_logger("petra_hub.training.losses")
    logger.addHandler(handler)
    try:
        trainer = make_trainer(tmp_path, petra_check_reconstruction_every=1, petra_reconstruction_warning=1e-9,
                               max_steps=16, logging_steps=4)
        trainer.train()
    finally:
        logger.removeHandler(handler)
    errors = logged(trainer, "reconstruction_error")
    # 0 before the first reconstruction; then > 0: weights move between a micro-batch's forward and its backward
    assert len(errors) == 4 and all(0 <= error < 0.5 for error in errors) and errors[-1] > 0
    assert any("exceeds petra_reconstruction_warning" in message for message in messages)
    quiet = make_trainer(tmp_path / "off")
    quiet.train()
    assert not logged(quiet, "reconstruction_error")


def test_torch_compile_compiles_the_stages_and_trains_the_same(tmp_path):
    torch._dynamo.reset()
    eager = make_trainer(tmp_path / "eager", max_steps=16, logging_steps=4)
    eager.train()
    compiled = make_trainer(tmp_path / "compiled", torch_compile=True, torch_compile_backend="aot_eager",
                            max_steps=16, logging_steps=4)
    compiled.train()
    assert max(abs(a - b) for a, b in zip(logged(compiled, "loss"), logged(eager, "loss"))) < 1e-4
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs >= len(compiled.stages)  # every stage (or its F) became a graph
    torch._dynamo.reset()
