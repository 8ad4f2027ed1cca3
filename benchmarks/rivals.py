"""torch.distributed.pipelining's schedules as PETRA's rivals in the throughput benchmark, and the activation memory
any method holds at its peak (part 2 of benchmarks/throughput.py; docs/benchmarks-throughput.md).

The rivals, each run with and without activation checkpointing of its chunks, at every n_microbatches m asked:

- `Schedule1F1B`: one chunk per rank, the W-way partition PETRA uses. Also checkpointed on every chunk but the
  last ("1f1b_but_last"): the last rank runs each micro-batch's backward right after its forward, so recomputing
  its chunk only costs time (PETRA's last stage does not recompute either).
- `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`: 2W chunks, chunk c on rank c % W.
- `ScheduleZBVZeroBubble`, `ScheduleDualPipeV`: 2W chunks in a V, chunks c and 2W-1-c on rank c.

The 2W chunks are `Placement.auto`'s contiguous 2W-way split of part 1's per-stage costs. A setting torch's
constructor refuses (ValueError: too few micro-batches for DualPipeV, a count the interleaved rounds do not
divide...) is kept as "not applicable" with torch's message.

Memory (`allocation_peak`): the highest amount, during a window of work, of CPU tensor storage allocated inside the
window and still alive, gradient accumulators (`.grad` of the parameters) left out. What is allocated before the
window (parameters, optimizer state) is not counted. Each method is measured fresh, so that what it allocates on
first use and keeps (torch's per-micro-batch receive buffers, the engine's buffers) counts.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time

import torch
from torch import nn

# key: (torch.distributed.pipelining class, PipelineStage objects per rank, placement of the 2W chunks, how a
# checkpointed chunk recomputes: the zero-bubble schedules split the backward, see `recompute_once`)
SCHEDULES = {
    "1f1b": ("Schedule1F1B", 1, None, "torch"),
    "1f1b_but_last": ("Schedule1F1B", 1, None, "torch_but_last"),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", 2, "loop", "torch"),
    "interleaved_zero_bubble": ("ScheduleInterleavedZeroBubble", 2, "loop", "once"),
    "zbv_zero_bubble": ("ScheduleZBVZeroBubble", 2, "v", "once"),
    "dualpipev": ("ScheduleDualPipeV", 2, "v", "once"),
}


class NotApplicable(Exception):
    """This schedule cannot run this setting (the reason is kept in the results)."""


def contiguous_split(costs: list[float], parts: int) -> list[int]:
    """The contiguous split of the stages in `parts` groups minimising the largest group's cost (`Placement.auto`)."""
    from petra_hub.engine import Placement, StageCost

    placement = Placement.auto([StageCost(cost, 0.0, 0.0, 0, 0, 0) for cost in costs], parts)
    return [len(group) for group in placement.groups]


def chunk_owner(style: str, chunk: int, world_size: int) -> int:
    """The rank that holds chunk `chunk` of 2W: "loop" (interleaved) c % W, "v" c and 2W-1-c on rank c."""
    if style == "loop":
        return chunk % world_size
    return chunk if chunk < world_size else 2 * world_size - 1 - chunk


def chunk_layout(costs: list[float], partition: list[int], world_size: int) -> dict:
    """Stages per chunk and the rank of each chunk: "1f1b" (the W-way partition), "loop" and "v" (2W chunks)."""
    layout = {"1f1b": {"sizes": list(partition), "ranks": list(range(world_size))}}
    if 2 * world_size <= len(costs):
        sizes = contiguous_split(costs, 2 * world_size)
        for style in ("loop", "v"):
            layout[style] = {"sizes": sizes, "ranks": [chunk_owner(style, c, world_size) for c in range(len(sizes))]}
    return layout


def rival_key(schedule: str, checkpointed: bool, m: int) -> str:
    """The results key of a setting; checkpointed 1F1B keeps the name the benchmark always gave it."""
    if schedule == "1f1b" and checkpointed:
        return f"1f1b_m{m}"
    return f"{schedule}_{'ckpt' if checkpointed else 'no_ckpt'}_m{m}"


class Part(nn.Module):
    """A contiguous group of RevNet stages as one `PipelineStage` submodule, checkpointed as a whole by default.

    The two streams cross the boundary as one tensor (concatenated on channels, split on arrival), which is the
    simplest thing `PipelineStage` accepts; the engine flattens its messages the same way. `checkpointing`:
    "torch" (`torch.utils.checkpoint`, non-reentrant), "once" (`recompute_once`) or None. `runs` counts the
    forwards of the group, recomputations included."""

    def __init__(self, stages, first: bool, last: bool, checkpointing: str | None = "torch"):
        super().__init__()
        self.body = nn.ModuleList(stages)
        self.first, self.last, self.checkpointing = first, last, checkpointing
        self.runs = 0

    def run(self, x):
        self.runs += 1
        value = x if self.first else tuple(t.contiguous() for t in x.chunk(2, dim=1))
        for stage in self.body:
            value = stage(value)
        return value if self.last else torch.cat(value, dim=1)

    def forward(self, x):
        if self.checkpointing == "once":
            return recompute_once(self.run, x)
        if self.checkpointing == "torch":
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self.run, x, use_reentrant=False)
        return self.run(x)


class _Recomputation:
    """What autograd saved in one forward of `function(x)`: nothing until the first unpack, which runs the forward
    again (same RNG state) and keeps every tensor it saves, detached, until the graph that refers to them is freed."""

    def __init__(self, function, x):
        self.function, self.x, self.rng, self.tensors = function, x, torch.get_rng_state(), None

    def unpack(self, index: int) -> torch.Tensor:
        if self.tensors is None:
            saved = []

            def keep(tensor):  # detached: an op saving its own output would otherwise hold itself in a cycle
                saved.append(tensor.detach())
                return saved[-1]

            leaf = self.x.detach().requires_grad_(self.x.requires_grad)
            with torch.random.fork_rng(devices=[]), torch.enable_grad():
                torch.set_rng_state(self.rng)
                with torch.autograd.graph.saved_tensors_hooks(keep, _identity):
                    self.function(leaf)
            self.tensors = saved
        return self.tensors[index]


def recompute_once(function, x):
    """`function(x)` keeping only `x` for the backward: activation checkpointing for the zero-bubble schedules.

    Their backward is several `torch.autograd.grad` calls over one graph (the input gradient, then the weight
    gradient of each group of parameters), and `torch.utils.checkpoint` recomputes the forward in each call (it
    keys its recomputation on the autograd graph task and lets each saved tensor be unpacked once per task). Here
    the forward is recomputed once per micro-batch, at the first unpack, and what it saves is kept until the graph
    is freed, i.e. from the input-gradient pass until the last weight-gradient pass."""
    frame = _Recomputation(function, x)
    count = itertools.count()
    with torch.autograd.graph.saved_tensors_hooks(lambda _: next(count), frame.unpack):
        return function(x)


@contextlib.contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null inside the block (for messages printed by C++ code)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _identity(tensor):
    return tensor


class Rival:
    """One torch schedule at one setting on this rank: its chunks of a model copy, their `PipelineStage`s, the
    schedule, SGD over the local chunks. Raises NotApplicable where torch refuses the setting."""

    def __init__(self, schedule, checkpointing, m, stages, layout, rank, world_size, loss_fn, optimizer_factory):
        from torch.distributed import pipelining

        name, per_rank, style, _ = SCHEDULES[schedule]
        chunks = layout.get(style or "1f1b")
        if chunks is None:
            raise NotApplicable(f"2W = {2 * world_size} chunks of the {len(stages)} stages: fewer stages than chunks")
        bounds = [sum(chunks["sizes"][:c]) for c in range(len(chunks["sizes"]) + 1)]
        count = len(chunks["ranks"])
        mine = [c for c, owner in enumerate(chunks["ranks"]) if owner == rank]
        self.parts = [
            Part(stages[bounds[c] : bounds[c + 1]], first=c == 0, last=c == count - 1,
                 checkpointing=chunk_checkpointing(checkpointing, c == count - 1))
            for c in mine
        ]  # fmt: skip
        for part in self.parts:
            part.train()
        device = torch.device("cpu")
        local = [pipelining.PipelineStage(part, c, count, device) for part, c in zip(self.parts, mine)]
        try:
            self.schedule = getattr(pipelining, name)(local[0] if per_rank == 1 else local, m, loss_fn=loss_fn)
        except ValueError as error:
            raise NotApplicable(f"{name}(n_microbatches={m}): {error}") from error
        self.chunks, self.m = mine, m
        self.pipeline_stages = local  # torch's PipelineStage of each local chunk, in `chunks` order
        self.first_stages = [bounds[c] for c in mine]  # the model stage each local chunk starts with
        self.first, self.last = any(p.first for p in self.parts), any(p.last for p in self.parts)
        self.params = [p for part in self.parts for p in part.parameters()]
        self.optimizer = optimizer_factory(nn.ModuleList(self.parts))

    def step(self, batches, first_micro_batch: int, update: bool = True) -> None:
        """One `schedule.step()` over m micro-batches (pre-split), then SGD and zero_grad (unless not `update`)."""
        m = self.m
        chosen = [batches[(first_micro_batch + i) % len(batches)] for i in range(m)]
        arguments = {"arg_mbs": [(images,) if self.first else () for images, _ in chosen], "kwarg_mbs": [{}] * m}
        if self.last:
            arguments.update(target_mbs=[labels for _, labels in chosen], losses=[], return_outputs=False)
        self.schedule.step(**arguments)
        if update:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def runs(self) -> list[int]:
        return [part.runs for part in self.parts]


def chunk_checkpointing(checkpointing: str | None, last: bool) -> str | None:
    """A chunk's recomputation under a schedule's `checkpointing` ("torch_but_last": the last chunk keeps its graph)."""
    if checkpointing == "torch_but_last":
        return None if last else "torch"
    return checkpointing


def rival_settings(schedules: list[str], microbatches: list[int]) -> list[tuple[str, bool, int]]:
    """(schedule, checkpointed, m) to run: checkpointed 1F1B at every m (what the benchmark always compared
    with), then every schedule of `schedules` with and without checkpointing at every m ("1f1b_but_last" only
    checkpointed: without, it is "1f1b")."""
    chosen = [("1f1b", True, m) for m in microbatches]
    for schedule in schedules:
        options = (True,) if SCHEDULES[schedule][3] == "torch_but_last" else (True, False)
        chosen += [(schedule, checkpointed, m) for checkpointed in options for m in microbatches]
    return list(dict.fromkeys(chosen))


def build_rivals(settings, make_stages, layout, rank, world_size, loss_fn, optimizer_factory) -> dict:
    """{(schedule, checkpointed, m): Rival, or the reason it is not applicable} for `rival_settings`."""
    rivals = {}
    for schedule, checkpointed, m in rival_settings(settings.rivals, settings.pp_microbatches):
        checkpointing = SCHEDULES[schedule][3] if checkpointed else None
        try:
            rivals[schedule, checkpointed, m] = Rival(
                schedule, checkpointing, m, make_stages(), layout, rank, world_size, loss_fn, optimizer_factory
            )
        except NotApplicable as reason:
            rivals[schedule, checkpointed, m] = str(reason)
    return rivals


def measure_all(rivals: dict, batches, gather) -> tuple[list[dict], dict]:
    """The results record of every setting of `build_rivals` (per-rank values collected by `gather`), each rival
    measured fresh (`measure_fresh`) then warmed up with 2 steps; and {results key: Rival} of those that run."""
    records, running = [], {}
    for (schedule, checkpointed, m), rival in rivals.items():
        key = rival_key(schedule, checkpointed, m)
        record = {"schedule": schedule, "torch_class": SCHEDULES[schedule][0], "checkpointed": checkpointed,
                  "checkpointing": SCHEDULES[schedule][3] if checkpointed else None, "m": m, "key": key}  # fmt: skip
        if isinstance(rival, str):
            records.append(record | {"status": "not applicable", "reason": rival})
            continue
        peak, forwards = measure_fresh(rival, batches)
        records.append(record | {"status": "measured", "peak_bytes": gather(peak),
                                 "forwards_per_micro_batch": gather(forwards), "chunks": gather(rival.chunks)})
        rival.step(batches, 0)
        rival.step(batches, m)
        running[key] = rival
    return records, running


def measure_fresh(rival: Rival, batches) -> tuple[int, list[float]]:
    """On a rival never stepped: the allocation peak of its first two steps (shape inference, the buffers it keeps,
    then a step like any other) and the forwards per micro-batch of each local chunk in the second step."""
    counted = {}

    def two_steps():
        rival.step(batches, 0, update=False)
        counted["before"] = rival.runs()
        rival.step(batches, rival.m, update=False)

    peak = allocation_peak(two_steps, rival.params)
    rival.optimizer.zero_grad(set_to_none=True)
    forwards = [(after - before) / rival.m for before, after in zip(counted["before"], rival.runs())]
    return peak, forwards


def pipeline_peak(pipeline, batches) -> int:
    """`allocation_peak` of an engine `Pipeline` never stepped, from empty through twice its fill and the drain (its
    steady state included; a synchronous mode: 3 micro-batches), fed `batches` = [(images, labels), ...] in turn."""
    count = 2 * pipeline.schedule.latency if pipeline.mode.pipelined else 3

    def work():
        for index in range(count):
            pipeline.step(*batches[index % len(batches)])
        pipeline.drain()

    return allocation_peak(work, [p for stage in pipeline.stages for p in stage.parameters()])


def allocation_peak(work, params) -> int:
    """Run `work()` under the profiler's memory tracking and return the largest number of bytes of CPU tensor
    storage that was allocated during `work` and was still alive, storages that became a parameter's `.grad`
    excluded (recognised by a hook after each gradient accumulation, and at the end of `work`). Frees of storages
    allocated before `work` are ignored: they were never counted."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    marks = []  # (time, data pointer) of gradient accumulators, on the profiler's clock (time.time_ns)

    def mark(param):
        marks.append((time.time_ns(), param.grad.untyped_storage().data_ptr()))

    hooks = [p.register_post_accumulate_grad_hook(mark) for p in params]
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    try:
        with _quiet_stderr():  # Kineto logs every start and stop (and that it found no GPU)
            prof.start()
        try:
            work()
            for param in params:
                if param.grad is not None:
                    mark(param)
        finally:
            with _quiet_stderr():
                prof.stop()
    finally:
        for hook in hooks:
            hook.remove()

    # (time, order at one instant: a free, an allocation, a gradient mark; data pointer, bytes: < 0 for a free)
    timeline = [(t, 2, ptr, 0) for t, ptr in marks]
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        node = pending.pop()
        pending.extend(node.children)
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == "cpu":
            size = node.typed[1].alloc_size
            timeline.append((node.start_time_ns, int(size > 0), node.typed[1].ptr, size))
    timeline.sort(key=lambda event: event[:2])

    # first pass: which allocations became gradients; second: the live bytes of the others, at their highest
    live, gradients = {}, set()
    for index, (_, kind, ptr, size) in enumerate(timeline):
        if kind == 2:
            if ptr in live:
                gradients.add(live[ptr])
        elif kind == 1:
            live[ptr] = index
        else:
            live.pop(ptr, None)
    live, current, peak = {}, 0, 0
    for index, (_, kind, ptr, size) in enumerate(timeline):
        if kind == 1 and index not in gradients:
            live[ptr] = size
            current += size
            peak = max(peak, current)
        elif kind == 0 and ptr in live:
            current -= live.pop(ptr)
    return peak
