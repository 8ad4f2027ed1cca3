"""A checkpoint from someone else must never run code when a run resumes from it."""

import os

import pytest
import torch

from tests.training.test_trainer import make_trainer


class _Payload:
    """Unpickling this runs `touch <marker>`: what an attacker plants in a stage file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_resume_refuses_a_stage_file_that_would_run_code(tmp_path):
    trainer = make_trainer(tmp_path / "run", max_steps=2, save_strategy="steps", save_steps=2)
    trainer.train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    stage_file = checkpoint / "petra_stage_000.pt"
    genuine = torch.load(stage_file, weights_only=True)  # every genuine stage file loads without pickled code
    marker = tmp_path / "PWNED"
    torch.save({**genuine, "extra": _Payload(marker)}, stage_file)

    resumed = make_trainer(tmp_path / "resumed", max_steps=4)
    with pytest.raises(Exception, match="petra_stage_000.pt"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert not marker.exists()
