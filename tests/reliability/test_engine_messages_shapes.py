"""What a stage sends must match the start-up handshake's spec of its boundary: batch first, the same per-sample
shapes and dtypes for every micro-batch. A stage that breaks this fails on the sending side with a
StageMismatchError naming it, before anything is posted, in one process as in two (before: gloo aborted the
receiving process, or the receiver decoded a buffer whose tail was never written).
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from petra_hub.engine import Pipeline, StageMismatchError
from petra_hub.testing.ranks import run_ranks


class Fold(nn.Module):
    """Returns its [B, 4] output as [2B, 2]: not batch-major (the next stage reshapes it back)."""

    reversible = False

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).reshape(-1, 2)


class Switching(nn.Module):
    """Its output is 4 wide in the handshake's dry run (its first call), `width` wide afterwards."""

    reversible = False

    def __init__(self, width):
        super().__init__()
        self.lin, self.width, self.calls = nn.Linear(4, 4), width, 0

    def forward(self, x):
        self.calls += 1
        y = self.lin(x)
        return y if self.calls == 1 else torch.cat([y, y], 1)[:, : self.width]


class Head(nn.Module):
    reversible = False

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, x):
        return self.lin(x.reshape(-1, 4))


class WrongGradient(nn.Module):
    """A reversible stage whose fused backward returns a gradient of the wrong width."""

    reversible = True

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return x + self.lin(x)

    def inverse(self, y):
        return y

    def reconstruct_and_backward(self, y, grad_y):
        return y, grad_y[:, :3]


def pipeline(stages, timeout=10.0):
    return Pipeline(stages, F.cross_entropy, mode="petra", timeout=timeout,
                    optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.1))


def train(run, steps=4):
    for step in range(steps):
        generator = torch.Generator().manual_seed(step)
        run.step(torch.randn(8, 4, generator=generator), torch.arange(8) % 2)
    run.drain()


NOT_BATCH_MAJOR = (
    "StageMismatchError: stage 0 (Fold) returns [4, 2] float32, whose first dimension is not the batch of 2 samples "
    "(a dry run on 2 samples): every tensor a stage passes on must have the batch as its first dimension"
)
SAME_FOR_EVERY_MICRO_BATCH = (
    "a stage must return the same structure, dtypes and per-sample shapes for every micro-batch, with the batch as the "
    "first dimension of every tensor"
)


def _outcome(function):
    try:
        function()
    except Exception as error:  # noqa: BLE001 - the test compares the errors
        return f"{type(error).__name__}: {error}"
    return None


def test_one_process_refuses_an_activation_that_is_not_batch_major():
    assert _outcome(lambda: train(pipeline([Fold(), Head()]))) == NOT_BATCH_MAJOR


@pytest.mark.parametrize("width", [3, 8])
def test_one_process_refuses_an_output_that_changes_after_the_handshake(width):
    run = pipeline([Switching(width), Head()])
    with pytest.raises(StageMismatchError) as raised:
        train(run)
    assert str(raised.value) == (
        f"stage 0 sends its output for micro-batch 0 (8 samples) as [8, {width}] float32, but the start-up handshake "
        f"recorded [B, 4] float32 for it (B = 8): {SAME_FOR_EVERY_MICRO_BATCH}"
    )


def test_one_process_inference_refuses_an_output_that_changes_after_the_handshake():
    """infer between two stages of one process: the same check as a message to another rank."""
    run = pipeline([Switching(8), Head()])
    with pytest.raises(StageMismatchError) as raised:
        run.infer(torch.randn(8, 4))
    assert str(raised.value) == (
        "stage 0 sends its output for the inference batch (8 samples) as [8, 8] float32, but the start-up handshake "
        f"recorded [B, 4] float32 for it (B = 8): {SAME_FOR_EVERY_MICRO_BATCH}"
    )


def test_a_wrong_gradient_is_refused_by_the_stage_that_sends_it():
    torch.manual_seed(0)
    run = pipeline([nn.Linear(4, 4), WrongGradient(), Head()])
    with pytest.raises(StageMismatchError, match=r"^stage 1 sends the gradient of its input for micro-batch 0 "
                                                 r"\(8 samples\) as \[8, 3\] float32, but the start-up handshake "
                                                 r"recorded \[B, 4\] float32"):
        train(run)


def _two_ranks(rank, world_size):
    outcomes = {"fold": _outcome(lambda: train(pipeline([Fold(), Head()])))}  # the handshake: both ranks raise
    # Last (the process group is not reusable after it): rank 0 refuses to post, rank 1 sees it leave.
    outcomes["switching"] = _outcome(lambda: train(pipeline([Switching(8), Head()], timeout=5.0)))
    return outcomes


def test_two_processes_raise_on_the_sender_instead_of_aborting_the_receiver(tmp_path):
    results, _, _ = run_ranks(_two_ranks, 2, out_dir=tmp_path, deadline=60)
    for rank, result in enumerate(results):
        assert result is not None, f"rank {rank} died (gloo aborts on a longer message than expected)"
        assert "error" not in result, result.get("traceback")
    first, second = results[0]["value"], results[1]["value"]
    assert first["fold"] == second["fold"] == NOT_BATCH_MAJOR  # the same error as one process, on both ranks
    assert first["switching"] == (
        "StageMismatchError: stage 0 on rank 0 (stage 0) sends its output for micro-batch 0 (8 samples) as [8, 8] "
        f"float32, but the start-up handshake recorded [B, 4] float32 for it (B = 8): {SAME_FOR_EVERY_MICRO_BATCH}"
    )
    assert second["switching"].startswith("PeerFailureError: rank 1 (stage 1) could not receive"), second["switching"]
