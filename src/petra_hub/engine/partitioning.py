"""Partitioning the stages by measurement (`Pipeline(partition="auto")`): what each stage costs, measured, and the
contiguous split of the stages whose slowest rank is fastest (`Placement.auto`).

`measure_stages` runs copies of the stages in one process through the real schedule of the chosen mode (so a
reversible stage's backward is its fused reconstruction and backward under PETRA, a buffered stage's is its
recomputation and backward), traced, on one sample micro-batch fed again and again with frozen weights (the run's
optimizer, plain SGD by default, at learning rate 0, so that updates cost what they cost without moving the
weights). After 2J-1 micro-batches (what fills a pipelined run) and `warmup` more, it takes the median of `repeats`
timings of each stage's forward, backward and update, the bytes of its messages from the handshake's shapes, the
bytes it held at its peak, the bytes of one micro-batch's graph, and its share of the engine's own time per tick (the
timed window's wall time minus the time inside the operations).

Only what a run needs lives here; `petra_hub.analysis.profiling.profile_stages` builds on `measure_stages` for the
benchmarks' predictions (and adds the halves of a split backward).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn

from .accounting import graph_bytes, nbytes
from .graph_budget import kept_graphs, stage_inputs
from .messages import message_bytes
from .modes import Mode
from .options import Diagnostics, MemoryOptions
from .placement import Placement
from .randomness import preserved
from .tensors import Activation, as_tuple, to_device
from .wire import WireError, broadcast_json


@dataclass(frozen=True)
class StageCost:
    """One stage's measured cost per micro-batch (seconds are medians of wall time)."""

    forward_s: float  # the last stage's forward, loss and backward run as one operation: counted in backward_s
    backward_s: float
    update_s: float
    forward_bytes: int  # what it sends to the next stage per micro-batch (0 for the last)
    backward_bytes: int  # what it sends back to the previous stage (gradient, and its input when that one rebuilds)
    held_bytes: int  # peak bytes held for pending backwards, waiting messages and gradients, plus its parameters
    overhead_s: float = 0.0  # the engine's own time per tick (routing, bookkeeping), an equal share per stage
    parameter_bytes: int = 0  # its parameters' share of held_bytes
    # what autograd keeps for one micro-batch's forward, output included: what a backward builds (0 where a pipelined
    # stage keeps its forward's graph: its backward builds none, and held_bytes counts the graphs it keeps)
    graph_bytes: int = 0
    # under `backprop`, the halves of a backward split as torch's zero-bubble schedules split it: the input's
    # gradient, then the weights' (walking the graph twice, they may add up to more than backward_s); measured by
    # `petra_hub.analysis.profile_stages`, None from `measure_stages`
    input_backward_s: float | None = None
    weight_backward_s: float | None = None

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.update_s


@dataclass(frozen=True)
class Measurement:
    """What `measure_stages` measured, with what a finer analysis of the same run reuses."""

    costs: list[StageCost]
    copies: list[nn.Module]  # the stages measured (copies of the caller's, at the weights they started from)
    stage_inputs: list  # stage_inputs[j]: stage j's input for the sample micro-batch (on `device`)
    device: torch.device | None  # where the copies ran (None: where the stages were)


def measure_stages(
    pipeline_class: type,
    stages: list[nn.Module],
    sample_batch: tuple[Activation, object],
    loss_fn: Callable = torch.nn.functional.cross_entropy,
    *,
    mode: Mode | str = Mode.PETRA,
    repeats: int = 5,
    warmup: int = 2,
    optimizer_factory: Callable | None = None,
    **options,
) -> Measurement:
    """Measure every stage on `sample_batch` = (inputs, targets) in one process (the stages themselves are not
    touched: copies run) in a `pipeline_class` (the `Pipeline`, given by the caller: the pipeline's module is the one
    that imports this one). `optimizer_factory` is the run's `(index, stage) -> optimizer`, whose step the update
    timings measure (default: plain SGD); it runs at learning rate 0. `options` go to the pipeline (e.g.
    `precision`, `device`). The global generators are left where they were (`generators_kept`)."""
    if repeats < 1 or warmup < 0:
        raise ValueError(f"profiling the stages needs repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    with generators_kept(stages, _device(options)):
        return _measure(pipeline_class, stages, sample_batch, loss_fn, Mode.parse(mode), repeats, warmup,
                        optimizer_factory, options)


def _device(options: dict) -> torch.device | None:
    """The device the pipeline `options` name (their `Layout`'s)."""
    layout = options.get("layout")
    return layout.device if layout is not None else None


@contextlib.contextmanager
def generators_kept(stages: list[nn.Module], device: torch.device | str | None) -> Iterator[None]:
    """Run the block without moving the global generators: the CPU one, and that of every CUDA device the profile
    runs on (`device`, else where the stages are). The copies' forwards draw (dropout); were the run's generators to
    move, ranks seeded alike would disagree (pipeline rank 0 alone profiles: its data order, its dropout masks), and
    partition="auto" would train otherwise than the same partition given explicitly."""
    if device is not None:
        devices = {torch.device(device)}
    else:
        devices = {t.device for stage in stages for t in itertools.chain(stage.parameters(), stage.buffers())}
    with contextlib.ExitStack() as stack:
        for each in [d for d in devices if d.type == "cuda"] or [None]:
            stack.enter_context(preserved(each))
        yield


def _measure(pipeline_class: type, stages: list[nn.Module], sample_batch: tuple[Activation, object],
             loss_fn: Callable, mode: Mode, repeats: int, warmup: int, optimizer_factory: Callable | None,
             options: dict) -> Measurement:
    """`measure_stages`' measurement (the generators left to it)."""
    copies = [copy.deepcopy(stage) for stage in stages]
    diagnostics = replace(options.pop("diagnostics", None) or Diagnostics(), trace=True)
    pipeline = pipeline_class(copies, loss_fn, mode=mode, distributed=False, diagnostics=diagnostics,
                              optimizer_factory=at_zero_learning_rate(optimizer_factory), **options)
    inputs, targets = sample_batch
    # untimed: as many micro-batches as fill a pipelined run (2J-1), in every mode, so that a fresh process has
    # warmed up (allocator, first calls) before anything is timed
    first_timed = pipeline.schedule.latency + warmup
    for step in range(first_timed + repeats):
        if step == first_timed:
            start = time.perf_counter()
        pipeline.step(inputs, targets)
    window = (start, time.perf_counter())
    pipeline.drain()
    events = pipeline.trace_events()
    inside = sum(e.end - e.start for e in events if window[0] <= e.start < window[1])
    ticks = repeats * pipeline.schedule.ticks_per_micro_batch
    overhead = max(0.0, window[1] - window[0] - inside) / (ticks * len(copies))
    batch = as_tuple(inputs)[0].shape[0]
    router, memory = pipeline.router, pipeline.memory()
    stage_samples = stage_inputs(copies, to_device(inputs, pipeline.device), len(copies) - 1)
    costs = []
    for index, stage in enumerate(copies):
        mine = [e for e in events if e.stage == index]

        def median(kinds, first=first_timed):
            timed = [e.end - e.start for e in mine
                     if e.kind in kinds and (e.micro_batch is None or e.micro_batch >= first)]
            return statistics.median(timed[-repeats:]) if timed else 0.0

        last = index == len(copies) - 1
        costs.append(StageCost(
            forward_s=0.0 if last else median(("forward",)),
            backward_s=median(("backward", "forward+backward")),
            update_s=median(("update",)),
            forward_bytes=0 if last else message_bytes(router.forward_parts(index), batch),
            backward_bytes=message_bytes(router.backward_parts(index - 1), batch) if index else 0,
            held_bytes=memory[index].peak_bytes + nbytes(stage.parameters()),
            overhead_s=overhead,
            parameter_bytes=nbytes(stage.parameters()),
            graph_bytes=0 if index in pipeline.kept_graphs else graph_bytes(stage, stage_samples[index]),
        ))
    return Measurement(costs, copies, stage_samples, pipeline.device)


def at_zero_learning_rate(optimizer_factory: Callable | None) -> Callable:
    """`optimizer_factory` (None: plain SGD) with every parameter group's learning rate set to 0, so that its steps
    cost what they cost (momentum, Adam's moments, weight decay's arithmetic) without moving the weights. A stage
    without parameters gets no default optimizer, and one the factory gives None keeps None, as in the run."""

    def make(index: int, stage: nn.Module) -> torch.optim.Optimizer | None:
        optimizer = (optimizer_factory or plain_sgd)(index, stage)
        for group in optimizer.param_groups if optimizer is not None else ():
            group["lr"] = 0.0
        return optimizer

    return make


def plain_sgd(index: int, stage: nn.Module) -> torch.optim.Optimizer | None:
    """SGD over the stage's parameters (None for a stage without any: torch refuses an empty optimizer)."""
    parameters = list(stage.parameters())
    return torch.optim.SGD(parameters, lr=0.0) if parameters else None


def auto_partition(pipeline_class: type, stages: list[nn.Module], loss_fn: Callable, sample_batch, num_ranks: int,
                   mode: Mode | str, group=None, distributed: bool = False, **options) -> list[int]:
    """`Placement.auto` from `measure_stages` (in a `pipeline_class`) on rank 0 of `group` with the run's `options`
    (the Pipeline's, those that change what a stage costs), the sizes broadcast over `group` so that every rank agrees
    (a collective when distributed; an error on rank 0 is raised on every rank). `group` holds every rank of the run:
    with data parallelism, every replica (the default group, whose rank 0 is pipeline rank 0 of replica 0), since
    replicas profiling on their own could choose different splits, and their gradient averages would pair different
    stages. A `memory_budget` is profiled as the graphs it keeps on an even split (`graphs_an_even_split_keeps`)."""
    if sample_batch is None:
        raise ValueError("partition='auto' needs profile_batch=(inputs, targets): a micro-batch to measure the stages "
                         "on")
    outcome = None
    if not distributed or dist.get_rank(group) == 0:
        try:
            with generators_kept(stages, _device(options)):  # rank 0 alone runs this: the others' stay put
                options = graphs_an_even_split_keeps(stages, mode, sample_batch[0], num_ranks, options)
                costs = measure_stages(pipeline_class, stages, sample_batch, loss_fn, mode=mode, **options).costs
            placement = Placement.auto(costs, num_ranks, accumulation_steps=options.get("accumulation_steps", 1))
            outcome = ["sizes", [len(g) for g in placement.groups]]
        except Exception as error:  # noqa: BLE001 - every rank must learn of it, or the others would wait forever
            if not distributed:
                raise
            outcome = ["error", f"{type(error).__name__}: {error}"]
    if distributed:
        outcome = broadcast_json(outcome, dist.get_global_rank(group, 0) if group is not None else 0, group)
        if not _is_outcome(outcome):
            raise WireError(f"partition='auto': pipeline rank 0 sent {str(outcome)[:80]}, not a partition")
    if outcome[0] == "error":
        raise RuntimeError(f"partition='auto': profiling the stages on pipeline rank 0 failed: {outcome[1]}")
    return outcome[1]


def _is_outcome(value) -> bool:
    """["sizes", [positive integers]] or ["error", text]: what pipeline rank 0 sends (JSON)."""
    if not isinstance(value, list) or len(value) != 2:
        return False
    kind, body = value
    if kind == "sizes":
        return isinstance(body, list) and bool(body) and all(type(size) is int and size > 0 for size in body)
    return kind == "error" and isinstance(body, str)


def graphs_an_even_split_keeps(stages: list[nn.Module], mode: Mode | str, sample_inputs: Activation, num_ranks: int,
                               options: dict) -> dict:
    """`options` with a `memory_budget` replaced by the graphs it keeps on an even split of the stages over
    `num_ranks`: which graphs fit a rank's budget depends on the split that the profile is there to choose, so the
    profile measures those of the split the search starts from (the run keeps those of the split chosen)."""
    memory = options.get("memory")
    if memory is None or memory.memory_budget is None:
        return options
    groups = Placement.balanced(len(stages), num_ranks).groups
    kept = kept_graphs(stages, Mode.parse(mode), groups, memory, sample_inputs)
    return options | {"memory": MemoryOptions(keep_graphs=tuple(sorted(kept)))}
