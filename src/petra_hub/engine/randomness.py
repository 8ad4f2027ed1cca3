"""Random stages (dropout, stochastic depth): every evaluation of a micro-batch at a stage draws what its forward drew.

The recomputing modes evaluate a stage again for its backward: the recomputation from a stored input, the
reconstruction of the input by inversion. A random stage must draw there the numbers (the dropout mask) of its
forward, or the gradient belongs to another function and the reconstructed input is wrong. So the worker captures
the RNG state before each forward (the CPU generator, and the CUDA generator of the stage's device when it runs on
one), keeps it while the micro-batch is in flight if the forward drew anything (a stage that drew nothing keeps
nothing), and replays it around the later evaluations, restoring the generators afterwards. The global RNG thus
advances once per forward, exactly as in a plain run, and never for a recomputation or a dry run.

A reversible `StageGroup` reconstructs its members last to first, so each member's state is kept and replayed
separately (`units`). A reversible stage whose own inverse evaluates random sub-functions in another order than
its forward must replay them itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from .stages import StageGroup


@dataclass(frozen=True)
class RngState:
    """The state of the generators an evaluation draws from (None: a generator left alone)."""

    cpu: torch.Tensor | None  # torch.random.get_rng_state(): 5056 bytes (Mersenne twister)
    cuda: torch.Tensor | None  # torch.cuda.get_rng_state(device): 16 bytes (Philox seed and offset)
    device: int | None  # the CUDA device index of `cuda`

    @property
    def nbytes(self) -> int:
        return sum(t.numel() for t in (self.cpu, self.cuda) if t is not None)


def capture(device: torch.device | None) -> RngState:
    """The CPU generator's state, and that of `device`'s generator if it is a CUDA device."""
    index = None
    if device is not None and device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
    cuda = torch.cuda.get_rng_state(index) if index is not None else None
    return RngState(torch.random.get_rng_state(), cuda, index)


def drawn_since(before: RngState) -> RngState | None:
    """`before`, keeping only the generators that have moved since it was captured; None if none has."""
    cpu = before.cpu if not torch.equal(torch.random.get_rng_state(), before.cpu) else None
    cuda = None
    if before.cuda is not None and not torch.equal(torch.cuda.get_rng_state(before.device), before.cuda):
        cuda = before.cuda
    return None if cpu is None and cuda is None else RngState(cpu, cuda, before.device)


@contextlib.contextmanager
def replaying(state: RngState | None) -> Iterator[None]:
    """Run the block from `state` (a no-op for None), then put the generators back where they were."""
    if state is None:
        yield
        return
    saved = RngState(
        torch.random.get_rng_state() if state.cpu is not None else None,
        torch.cuda.get_rng_state(state.device) if state.cuda is not None else None,
        state.device,
    )
    _set(state)
    try:
        yield
    finally:
        _set(saved)


@contextlib.contextmanager
def preserved(device: torch.device | None) -> Iterator[None]:
    """Run the block without moving the generators (the start-up dry run)."""
    saved = capture(device)
    try:
        yield
    finally:
        _set(saved)


def units(stage: nn.Module) -> list[nn.Module]:
    """The pieces a stage reconstructs one at a time: the members of a reversible `StageGroup` (recursively),
    else the stage itself."""
    if isinstance(stage, StageGroup) and stage.reversible:
        return [unit for member in stage.members for unit in units(member)]
    return [stage]


def _set(state: RngState) -> None:
    if state.cpu is not None:
        torch.random.set_rng_state(state.cpu)
    if state.cuda is not None:
        torch.cuda.set_rng_state(state.cuda, state.device)


def reconstruct_replaying(stage: nn.Module, stage_units: list[nn.Module], outputs, grad_outputs, rng: RngState | None,
                          unit_rngs: list[RngState | None] | None):
    """Rebuild a reversible stage's input from `outputs` by inversion (`grad_outputs` None) or by the fused
    reconstruction and backward (returns (input, gradient of input)), replaying the forward's randomness: `rng` for
    the stage as a whole, or `unit_rngs` per member of a reversible StageGroup, run last to first."""
    fused = grad_outputs is not None
    if unit_rngs is None:
        with replaying(rng):
            return stage.reconstruct_and_backward(outputs, grad_outputs) if fused else stage.inverse(outputs)
    for unit, state in zip(reversed(stage_units), reversed(unit_rngs)):
        with replaying(state):
            if fused:
                outputs, grad_outputs = unit.reconstruct_and_backward(outputs, grad_outputs)
            else:
                outputs = unit.inverse(outputs)
    return (outputs, grad_outputs) if fused else outputs
