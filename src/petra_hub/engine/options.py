"""The pipeline's knobs, grouped by what they are about, each group a small frozen dataclass that checks its own
fields once, when it is built:

* `Layout`: where the stages run (the partition over the ranks, data-parallel replicas, the device);
* `Remedies`: what counters the staleness of delayed gradients (weight prediction; the next remedies join it here);
* `MemoryOptions`: which stages keep their forward's graph instead of recomputing it;
* `Diagnostics`: what the pipeline records beside training (traces, reconstruction checks).

`Pipeline` takes one of each (default: all off), beside its core arguments; `Precision` (see `precision`) is the
same kind of object. A new knob goes into the group it belongs to, not into `Pipeline`'s signature.

An invalid value raises `OptionError` (a ValueError) naming the field and what it expects. A front end whose own names
differ (`PetraTrainingArguments`' `petra_*` fields) builds the objects inside `fields_named` to have its names in the
message: each check lives here, once.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch


class OptionError(ValueError):
    """`field` must be `expected`, got `value`."""

    def __init__(self, field: str, expected: str, value):
        self.field, self.expected, self.value = field, expected, value
        super().__init__(f"{field} must be {expected}, got {value!r}")


@contextlib.contextmanager
def fields_named(names: Mapping[str, str | tuple[str, str]]) -> Iterator[None]:
    """Inside the block, an `OptionError` about an engine field in `names` is raised again under the caller's name
    for it (`{"weight_prediction": "petra_weight_prediction"}`), or under (name, what it expects) where the caller's
    field takes other values (`("petra_check_every", "a whole number >= 0 (0: off)")`)."""
    try:
        yield
    except OptionError as error:
        if error.field not in names:
            raise
        name, expected = names[error.field] if isinstance(names[error.field], tuple) else (names[error.field],
                                                                                           error.expected)
        raise OptionError(name, expected, error.value) from None


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_accumulation_steps(value) -> None:
    """k, the micro-batches each stage averages before an update."""
    if not _is_whole(value) or value < 1:
        raise OptionError("accumulation_steps", "a whole number >= 1 (k)", value)


def check_timeout(value) -> None:
    """Seconds to wait for a neighbour before it counts as failed."""
    if not _is_number(value) or not value > 0:
        raise OptionError("timeout", "a positive number of seconds", value)


def check_max_grad_norm(value) -> None:
    """The norm each stage clips its averaged gradient to (None or 0: no clipping)."""
    if value is not None and (not _is_number(value) or not value >= 0):
        raise OptionError("max_grad_norm", ">= 0 (0 or None: no clipping)", value)


@dataclass(frozen=True)
class Layout:
    """Where the stages run.

    partition: stages per pipeline rank (contiguous), e.g. (5, 5); None: an even split; "auto": pipeline rank 0
        measures the stages on the pipeline's `profile_batch` and picks the fastest split (`partitioning`).
    data_parallel_size: D pipeline replicas over W = P x D ranks (replica d = ranks d*P .. d*P+P-1); each is fed its
        own micro-batches and the D copies of a stage average their gradients before every update.
    device: where this rank's stages and tensors live (None: where they are).
    """

    partition: tuple[int, ...] | str | None = None
    data_parallel_size: int = 1
    device: torch.device | None = None

    def __post_init__(self):
        partition = self.partition
        if isinstance(partition, str):
            if partition != "auto":
                raise OptionError("partition", "'auto', None or the number of stages of each rank", partition)
        elif partition is not None:
            if not isinstance(partition, Sequence) or not partition or not all(
                    _is_whole(size) and size >= 1 for size in partition):
                raise OptionError("partition", "'auto', None or the number of stages of each rank (each >= 1)",
                                  partition)
            object.__setattr__(self, "partition", tuple(int(size) for size in partition))
        if not _is_whole(self.data_parallel_size) or self.data_parallel_size < 1:
            raise OptionError("data_parallel_size", "a whole number >= 1", self.data_parallel_size)
        if self.device is not None:
            try:
                device = torch.device(self.device)
            except (RuntimeError, TypeError):
                raise OptionError("device", "a torch.device or a device name such as 'cuda:0'", self.device) from None
            object.__setattr__(self, "device", device)


@dataclass(frozen=True)
class Remedies:
    """What counters the staleness of PETRA's delayed gradients (all off by default).

    weight_prediction: h > 0 runs each forward at the stage's weights extrapolated along its last update over h times
        the updates before the matching backward (see `prediction`); 0: off.
    synchronous_updates: the first N updates of every stage run without delay, in `reversible_backprop` (PETRA's
        memory, exact gradients); the pipeline then drains and goes on in `petra` with the same weights and optimizer
        states. Early training, when the weights move fastest, is where stale gradients hurt most. PETRA only; 0: off.
    delay_momentum: True lowers each stage's optimizer momentum so that its lag plus the stage's delay is the lag
        of the optimizer's own momentum (see `momentum`); pipelined modes only, the optimizer's own elsewhere.
    """

    weight_prediction: float = 0.0
    synchronous_updates: int = 0
    delay_momentum: bool = False

    def __post_init__(self):
        if not _is_number(self.weight_prediction) or not self.weight_prediction >= 0:
            raise OptionError("weight_prediction", ">= 0 (0: off)", self.weight_prediction)
        if not _is_whole(self.synchronous_updates) or self.synchronous_updates < 0:
            raise OptionError("synchronous_updates", "a whole number >= 0 (0: off)", self.synchronous_updates)
        if not isinstance(self.delay_momentum, bool):
            raise OptionError("delay_momentum", "True or False", self.delay_momentum)

    @property
    def active(self) -> bool:
        return self.weight_prediction > 0 or self.synchronous_updates > 0 or self.delay_momentum


@dataclass(frozen=True)
class MemoryOptions:
    """Stages that keep their forward's graph instead of recomputing it in the backward (a reversible one then skips
    its reconstruction; the gradient is that of the forward's weights); see `graph_budget`. One or the other:

    keep_graphs: those stages, by index (any stage but the last);
    memory_budget: the stages that fit this many bytes of activations per rank, measured on the pipeline's
        `profile_batch`.
    """

    keep_graphs: tuple[int, ...] | None = None
    memory_budget: int | None = None

    def __post_init__(self):
        if self.keep_graphs is not None:
            if not isinstance(self.keep_graphs, Sequence) or isinstance(self.keep_graphs, str) or not all(
                    _is_whole(index) and index >= 0 for index in self.keep_graphs):
                raise OptionError("keep_graphs", "stage indexes (whole numbers >= 0) or None", self.keep_graphs)
            object.__setattr__(self, "keep_graphs", tuple(int(index) for index in self.keep_graphs))
        if self.memory_budget is not None and (not _is_whole(self.memory_budget) or self.memory_budget < 0):
            raise OptionError("memory_budget", "a whole number >= 0 bytes, or None (off)", self.memory_budget)
        if self.keep_graphs is not None and self.memory_budget is not None:
            raise ValueError("give keep_graphs or memory_budget, not both")


@dataclass(frozen=True)
class Diagnostics:
    """What the pipeline records beside training (all off by default).

    trace: record every operation with timestamps (`Pipeline.trace_events()`, see `trace`).
    check_reconstruction_every: every this many micro-batches, each reconstructing stage measures the relative error
        of the input it rebuilds against a copy of the one it received (`Pipeline.counters()`); None: off.
    grad_norms: every update measures the norm of the gradient it applies (`StageCounters.grad_norm`, what Trainer
        logs as grad_norm); one more pass over the gradients per update. Clipping measures it whatever this says.
    """

    trace: bool = False
    check_reconstruction_every: int | None = None
    grad_norms: bool = False

    def __post_init__(self):
        for name in ("trace", "grad_norms"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(name, "True or False", getattr(self, name))
        every = self.check_reconstruction_every
        if every is not None and (not _is_whole(every) or every < 1):
            raise OptionError("check_reconstruction_every", "a whole number >= 1, or None (off)", every)
