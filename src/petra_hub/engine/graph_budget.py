"""Which stages keep their forward's graph for the backward instead of recomputing it: chosen by the user
(`keep_graphs`) or from a memory budget per rank (`memory_budget`), as selective activation checkpointing chooses
what to recompute.

A stage that does not rebuild its input by inversion (a non-reversible stage, or any stage in a mode without
reconstruction) stores its input and runs its forward again in the backward; a reversible stage under PETRA stores
nothing and runs its inverse and its forward again. Keeping the graph spares that second evaluation and holds the
graph's saved tensors (and, in a pipelined mode, a copy of the weights) instead, for every micro-batch in flight at
that stage. Any stage but the last may keep its graph (the last one's forward and backward are one operation).

The budget counts, per rank, the activation bytes the rank's stages hold at the steady state between ticks (what
`Pipeline.memory()` reports): what the mode holds anyway (stored inputs) plus, for each kept graph, its graph, its input
(which the worker keeps for the input's gradient, also where the graph does not save it) and weight copy, minus the
input it replaces. Graphs are kept smallest extra cost first, while the total fits. Within a tick a stage briefly holds
one micro-batch more (the forward runs before the backward), which the budget leaves out as the memory readings do.
Every rank works out every rank's choice from the same measurements, so a stage's neighbours know whether it still needs
its output sent back for reconstruction.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .accounting import graph_bytes, nbytes
from .batchnorm import frozen_running_stats
from .modes import Mode
from .options import MemoryOptions
from .randomness import preserved
from .schedule import Schedule
from .tensors import Activation, as_tuple

__all__ = ["keepable_stages", "kept_graph_bytes", "kept_graphs", "recomputing_stages", "stage_inputs"]


def recomputing_stages(stages: list[nn.Module], mode: Mode) -> list[int]:
    """The stages whose backward recomputes their forward in `mode` (the last stage never does: its forward and
    backward are one operation; in `backprop` none does)."""
    if mode.keeps_graph:
        return []
    return [index for index, stage in enumerate(stages[:-1])
            if not mode.rebuilds_input(stage)]


def keepable_stages(stages: list[nn.Module], mode: Mode) -> list[int]:
    """The stages that can keep their graph in `mode`: every stage but the last, unless the mode keeps every
    graph anyway (`backprop`)."""
    return [] if mode.keeps_graph else list(range(len(stages) - 1))


def kept_graphs(
    stages: list[nn.Module],
    mode: Mode,
    groups: Sequence[Sequence[int]],
    options: MemoryOptions,
    sample_inputs: Activation | None = None,
) -> set[int]:
    """The stages, on every rank, that keep their graph: `options.keep_graphs` as given (checked against the
    stages), or those that fit `options.memory_budget` bytes on each rank (`groups`: the stages of each rank),
    measured on `sample_inputs` (one micro-batch of the pipeline's input)."""
    candidates = keepable_stages(stages, mode)
    keep_graphs, memory_budget = options.keep_graphs, options.memory_budget
    if keep_graphs is not None:
        wrong = [index for index in keep_graphs if index not in candidates]
        if wrong:
            raise ValueError(f"keep_graphs: stage {wrong[0]} cannot keep its graph in mode {mode.value!r} (it is the "
                             f"last stage, the mode keeps every graph, or it does not exist); stages that can: "
                             f"{candidates}")
        return set(keep_graphs)
    if memory_budget is None:
        return set()
    if sample_inputs is None:
        raise ValueError("memory_budget needs a sample micro-batch (profile_batch) to measure the graphs on")
    if not candidates:
        return set()
    schedule = Schedule(len(stages), mode.pipelined)
    inputs = stage_inputs(stages, sample_inputs, max(candidates))
    recomputing = set(recomputing_stages(stages, mode))
    kept = set()
    with preserved(as_tuple(sample_inputs)[0].device):  # dropout in a measured forward draws nothing for training
        for group in groups:
            held, extras = 0, []
            for index in (i for i in group if i in candidates):
                count = schedule.in_flight(index) if mode.pipelined else 1
                stored = count * nbytes(as_tuple(inputs[index])) if index in recomputing else 0
                held += stored
                extras.append((kept_graph_bytes(stages[index], inputs[index], count, mode.pipelined) - stored, index))
            for extra, index in sorted(extras):
                if held + extra <= memory_budget:
                    held += extra
                    kept.add(index)
    return kept


def kept_graph_bytes(stage: nn.Module, inputs: Activation, in_flight: int, pipelined: bool) -> int:
    """What `stage` holds keeping its graph for `in_flight` micro-batches (measured on `inputs`): each one's graph,
    its input (the worker keeps it to read the input's gradient from, whether or not the graph saves it) and, in a
    pipelined mode, the copy of the weights it was built on."""
    copy = sum(p.nbytes for p in stage.parameters() if p.requires_grad) if pipelined else 0
    return in_flight * (graph_bytes(stage, inputs, with_inputs=True) + copy)


def stage_inputs(stages: list[nn.Module], inputs: Activation, last: int) -> list[Activation]:
    """The inputs of stages 0..last on one sample, without touching running statistics or the generators."""
    found = []
    with torch.no_grad(), preserved(as_tuple(inputs)[0].device):
        for stage in stages[: last + 1]:
            found.append(inputs)
            with frozen_running_stats(stage):
                inputs = stage(inputs)
    return found
