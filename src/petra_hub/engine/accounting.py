"""What a stage holds and what it did: memory measured from live tensors, operation counters, CPU time.

The one copy of the byte counting and the saved-tensor recorder: the workers use it for `Pipeline.memory()`, and
the benchmarks use it to measure what a recomputation or a kept graph costs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from .batchnorm import frozen_running_stats
from .tensors import Activation, as_tuple, detached


@dataclass
class MemoryStats:
    """Bytes a stage worker holds. `peak_bytes` is the largest total seen after any operation since reset."""

    activation_bytes: int = 0  # stored inputs, or kept autograd graphs, waiting for their backward
    stash_bytes: int = 0  # weight copies kept for the backward of in-flight micro-batches
    gradient_bytes: int = 0  # gradient accumulators (.grad) of the stage's parameters
    message_bytes: int = 0  # messages delivered to the stage and waiting for its next tick
    remedy_bytes: int = 0  # state a delay remedy keeps: weight prediction's last update (a copy of the weights)
    peak_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.stash_bytes + self.gradient_bytes + self.message_bytes + self.remedy_bytes


@dataclass
class StageCounters:
    forwards: int = 0
    backwards: int = 0
    updates: int = 0
    last_backward: int = -1  # micro-batches are backpropagated in order, each exactly once
    compute_seconds: float = 0.0  # CPU time (time.process_time) spent in this stage's forwards, backwards, updates
    skipped_updates: int = 0  # fp16: accumulation groups dropped for a non-finite gradient (see precision)
    reconstruction_error: float | None = None  # sampled check: relative error of the last rebuilt input checked
    reconstruction_checks: int = 0
    learning_rate: float | None = None  # the learning rate the last update used
    # the norm of the averaged gradient of the last update, before clipping, kept on the stage's device: reading it
    # at every update would make the host wait for the device (`grad_norm` reads it)
    last_grad_norm: torch.Tensor | None = field(default=None, repr=False)

    @property
    def grad_norm(self) -> float | None:
        return None if self.last_grad_norm is None else float(self.last_grad_norm)


def nbytes(values: Iterable[torch.Tensor], exclude: Iterable[torch.Tensor] = (), seen: set | None = None) -> int:
    """Bytes held by distinct storages among `values` (views of one storage count once), leaving out the storages
    of `exclude` (e.g. the parameters) and those already in `seen` (which gains the ones counted here)."""
    skipped = {(t.untyped_storage().data_ptr(), t.device) for t in exclude}
    seen = set() if seen is None else seen
    total = 0
    for tensor in values:
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), tensor.device)
        if key not in seen and key not in skipped:
            seen.add(key)
            total += storage.nbytes()
    return total


@contextlib.contextmanager
def recording_saved_tensors(exclude: Iterable[torch.Tensor] = ()) -> Iterator[list[torch.Tensor]]:
    """Collect the tensors autograd saves for the backward inside the block (leaving out `exclude`, the weights)."""
    skipped = {t.untyped_storage().data_ptr() for t in exclude}
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.untyped_storage().data_ptr() not in skipped:
            saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, _identity):
        yield saved


def memory_of(held: dict[str, list[torch.Tensor]], seen: set | None = None) -> MemoryStats:
    """`MemoryStats` of tensors by kind ("activation", "stash", "gradient", "message", "remedy"), each storage counted
    once (in the first kind that holds it); `seen` carries the storages already counted across calls."""
    seen = set() if seen is None else seen
    return MemoryStats(**{f"{kind}_bytes": nbytes(tensors, seen=seen) for kind, tensors in held.items()})


def graph_bytes(module: nn.Module, inputs: Activation, with_inputs: bool = False) -> int:
    """Bytes of the activations autograd keeps for the backward of `module(inputs)`, output included and parameters
    excluded (and buffers: batch norm saves its running statistics, which are the model's): what a recomputation (or
    a kept graph) holds for one micro-batch. `with_inputs`: the inputs too, where the graph does not save them
    already (a RevNet coupling saves one stream of two). Running statistics are untouched."""
    leaves = detached(inputs, requires_grad=True)
    params = [*module.parameters(), *module.buffers()]
    with torch.enable_grad(), frozen_running_stats(module), recording_saved_tensors(exclude=params) as saved:
        outputs = module(leaves)
    held = saved + list(as_tuple(outputs)) + (list(as_tuple(leaves)) if with_inputs else [])
    return nbytes(held, exclude=params)  # each storage once: an input the graph saves is not counted twice


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def relative_error(value: Activation, reference: Activation) -> float:
    """||value - reference|| / ||reference|| over all tensors of an activation, in float64."""
    pairs = [(a.double(), b.double()) for a, b in zip(as_tuple(value), as_tuple(reference))]
    difference = sum(float((a - b).pow(2).sum()) for a, b in pairs) ** 0.5
    norm = sum(float(b.pow(2).sum()) for _, b in pairs) ** 0.5
    return difference / norm if norm > 0 else difference
