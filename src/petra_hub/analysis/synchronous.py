"""PETRA's synchronous rivals replayed from measured costs: torch.distributed.pipelining's schedules as data.

A synchronous pipeline schedule is, for each rank, a list of operations on chunks (contiguous groups of stages)
and micro-batches: F (forward), B (backward), or, as the zero-bubble schedules split it, I (the gradient of the
chunk's input, which the previous chunk waits for) then W (the gradient of its weights, which nobody waits for).
Each rank runs its list in order. An operation starts once the rank is free and what it needs has arrived: F of
chunk c waits for F of chunk c - 1 of the same micro-batch, B or I of chunk c for B or I of chunk c + 1, each plus a
transfer (`latency` + bytes / `link_bandwidth`) where the two chunks live on different ranks. After its list a rank
updates its chunks, and the next step's list follows: a flush every m micro-batches.

The lists are torch's own. Every multi-chunk schedule class computes the order of all ranks when it is constructed
(`pipeline_order`, with the chunk-to-rank map `stage_index_to_group_rank`), so `schedule_order` constructs it on
stand-in stages that carry only what the constructor reads, and the replay runs torch's schedule rather than a
re-derivation of it. 1F1B's list is written here: `Schedule1F1B` holds one stage and keeps only its own rank's.

Memory per rank, followed operation by operation: the chunks' parameters; from a forward until its backward is
done, the chunk's graph (its stages' `graph_bytes`, less the activations passed inside the chunk, held once), or
for a checkpointed chunk its input and output; while a checkpointed chunk's backward runs, the graph its
recomputation builds (kept from I until W where the backward is split: torch's zero-bubble schedules recompute once
per micro-batch in our benchmark, `recompute_once`). The data the first chunk reads is not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Literal

from ..engine.partitioning import StageCost
from ..engine.placement import Placement
from ..engine.trace import Event
from .simulation import Simulation

Checkpointing = Literal["none", "all", "but_last"]
Buffers = Literal["needed", "torch"]

ONE_F_ONE_B = "Schedule1F1B"
SPLIT_BACKWARD = ("I", "W")  # the zero-bubble schedules' halves of a backward
_EVENT_KINDS = {"F": "forward", "B": "backward", "I": "backward", "W": "backward (weights)"}


@dataclass(frozen=True)
class Operation:
    kind: str  # "F", "B", "I" or "W"
    chunk: int
    micro_batch: int


def order_1f1b(world_size: int, micro_batches: int) -> list[list[tuple[Operation, ...]]]:
    """1F1B's list for each rank (chunk r on rank r): min(m, W - r) forwards, then a backward and a forward in turn,
    then its last backwards."""
    orders = []
    for rank in range(world_size):
        warm = min(micro_batches, world_size - rank)
        ops = [Operation("F", rank, i) for i in range(warm)]
        for i in range(micro_batches - warm):
            ops += [Operation("B", rank, i), Operation("F", rank, warm + i)]
        ops += [Operation("B", rank, i) for i in range(micro_batches - warm, micro_batches)]
        orders.append([(op,) for op in ops])
    return orders


def schedule_order(schedule: str, world_size: int, chunks: int,
                   micro_batches: int) -> tuple[list[list[tuple[Operation, ...]]], list[int]]:
    """(each rank's list of operations, the rank of each chunk) of torch's `schedule` class (e.g.
    "ScheduleInterleaved1F1B") with `chunks` chunks on `world_size` ranks and `micro_batches` per step. An entry of
    a list is a tuple of operations run back to back once all they wait for has arrived (DualPipeV overlaps a
    forward and a backward). Raises ValueError with torch's reason where torch refuses the setting."""
    if schedule == ONE_F_ONE_B:
        if chunks != world_size:
            raise ValueError(f"Schedule1F1B runs one chunk per rank: {chunks} chunks on {world_size} ranks")
        return order_1f1b(world_size, micro_batches), list(range(world_size))
    import torch
    from torch.distributed import pipelining

    if not hasattr(pipelining, schedule) or chunks % world_size:
        raise ValueError(f"unknown schedule {schedule!r} or {chunks} chunks not a multiple of {world_size} ranks")
    stand_ins = [SimpleNamespace(group_size=world_size, num_stages=chunks, group_rank=0, stage_index=c,
                                 is_first=c == 0, is_last=c == chunks - 1, submod=torch.nn.Identity())
                 for c in range(0, chunks, world_size)]  # fmt: skip
    built = getattr(pipelining, schedule)(stand_ins, micro_batches)
    owners = [built.stage_index_to_group_rank[c] for c in range(chunks)]
    orders = []
    for rank in range(world_size):
        entries = []
        for action in built.pipeline_order[rank]:
            if action is None:
                continue  # a bubble in torch's lock-step picture; the replay finds its own
            leaves = action.sub_actions or (action,)
            ops = tuple(Operation(a.computation_type.value, a.stage_index, a.microbatch_index) for a in leaves
                        if a.computation_type.value in _EVENT_KINDS)  # fmt: skip
            if ops:
                entries.append(ops)
        orders.append(entries)
    return orders, owners


def simulate_schedule(
    schedule: str,
    costs: list[StageCost],
    chunks: Placement,
    world_size: int,
    micro_batches: int,
    checkpointing: Checkpointing = "none",
    link_bandwidth: float | None = None,
    latency: float = 0.0,
    steps: int = 4,
    *,
    overlap_transfers: bool = True,
    buffers: Buffers = "needed",
) -> Simulation:
    """torch's `schedule` (a class of torch.distributed.pipelining: "Schedule1F1B", "ScheduleInterleaved1F1B",
    "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV") on `world_size` ranks, the model's
    stages cut into the contiguous `chunks` (placed on ranks as the schedule places them), `micro_batches` per step,
    from the costs of `profile_stages(..., mode="backprop")` (a forward, and a backward through the graph it kept;
    the split schedules also need `input_backward_s`, and take `weight_backward_s` where it was measured).
    Checkpointed chunks ("all", or "but_last": all but the last) run their forward again in their backward (in I
    where it is split, in W for the first chunk, whose I torch skips). The engine's own time per tick
    (`overhead_s`) is not charged: torch's runtime is another program.

    `overlap_transfers`: True, a message between ranks takes `latency` + bytes / `link_bandwidth` to arrive while
    both ranks go on computing (copy engines and NCCL on GPUs). False, the ranks also pay for it: the sender spends
    bytes / `link_bandwidth` of its own time after the operation that produced it, the receiver as much before the
    operation that needs it (processes that share CPU cores and copy through sockets, e.g. gloo on one machine).

    `buffers`: "needed", the peak memory is what the schedule itself must hold; "torch", also what torch 2.14's
    `PipelineStage` allocates around it: a receive buffer for every micro-batch of a step on every chunk (its input,
    and its output's gradient), kept between steps, and, in the multi-chunk schedules' runtime, every message sent to
    another rank, held until the step ends."""
    if checkpointing not in ("none", "all", "but_last"):
        raise ValueError(f"checkpointing must be 'none', 'all' or 'but_last', got {checkpointing!r}")
    if buffers not in ("needed", "torch"):
        raise ValueError(f"buffers must be 'needed' or 'torch', got {buffers!r}")
    if micro_batches < 1 or steps < 2:
        raise ValueError(f"need micro_batches >= 1 and steps >= 2, got {micro_batches} and {steps}")
    if chunks.num_stages != len(costs):
        raise ValueError(f"the chunks cover {chunks.num_stages} stages, costs give {len(costs)}")
    orders, owners = schedule_order(schedule, world_size, len(chunks.groups), micro_batches)
    split = any(op.kind in SPLIT_BACKWARD for entries in orders for entry in entries for op in entry)
    if split and any(c.input_backward_s is None for c in costs[chunks.groups[0].stop:]):
        raise ValueError(f"{schedule} splits the backward: the costs need input_backward_s "
                         "(profile_stages(..., mode='backprop') measures it)")
    return _replay(orders, owners, [_ChunkCost.of(costs, group) for group in chunks.groups], world_size,
                   micro_batches, checkpointing, link_bandwidth, latency, steps, overlap_transfers,
                   buffers == "torch", buffers == "torch" and schedule != ONE_F_ONE_B)


def simulate_1f1b(
    costs: list[StageCost],
    placement: Placement,
    micro_batches: int,
    checkpointing: Checkpointing = "none",
    **options,
) -> Simulation:
    """torch's `Schedule1F1B` (one chunk per rank: `placement`'s groups): `simulate_schedule`'s simplest case, with
    its keyword `options` (link_bandwidth, latency, steps, overlap_transfers, buffers)."""
    return simulate_schedule(ONE_F_ONE_B, costs, placement, len(placement.groups), micro_batches, checkpointing,
                             **options)


@dataclass(frozen=True)
class _ChunkCost:
    first_stage: int
    forward_s: float
    backward_s: float
    input_backward_s: float  # a split backward's halves: the gradient of the chunk's input, then of its weights
    weight_backward_s: float
    update_s: float
    sends_right: int
    sends_left: int
    parameter_bytes: int
    graph_bytes: int
    boundary_bytes: int  # its input and output: what a checkpointed chunk keeps per micro-batch

    @classmethod
    def of(cls, costs: list[StageCost], group: range) -> "_ChunkCost":
        mine = costs[group.start : group.stop]
        return cls(
            first_stage=group.start,
            forward_s=sum(c.forward_s for c in mine),
            backward_s=sum(c.backward_s for c in mine),
            input_backward_s=0.0 if group.start == 0 else sum(c.input_backward_s or 0.0 for c in mine),
            weight_backward_s=sum(c.backward_s - (c.input_backward_s or 0.0) if c.weight_backward_s is None
                                  else c.weight_backward_s for c in mine),
            update_s=sum(c.update_s for c in mine),
            sends_right=mine[-1].forward_bytes,
            sends_left=mine[0].backward_bytes,
            parameter_bytes=sum(c.parameter_bytes for c in mine),
            graph_bytes=sum(c.graph_bytes for c in mine) - sum(c.forward_bytes for c in mine[:-1]),
            boundary_bytes=mine[0].backward_bytes + mine[-1].forward_bytes,
        )


def _replay(orders, owners, chunk_costs: list[_ChunkCost], world_size: int, m: int, checkpointing: str,
            link_bandwidth: float | None, latency: float, steps: int, overlap_transfers: bool,
            receive_buffers: bool, holds_sends: bool) -> Simulation:
    """`receive_buffers`: every chunk keeps m receive buffers for its input and m for its output's gradient;
    `holds_sends`: what a rank sends to another is held until its step ends (see `simulate_schedule`'s buffers)."""
    count = len(chunk_costs)
    recomputes = [checkpointing == "all" or (checkpointing == "but_last" and c < count - 1) for c in range(count)]
    mine = [[c for c in range(count) if owners[c] == rank] for rank in range(world_size)]

    def copying(size: int) -> float:
        return size / link_bandwidth if size and link_bandwidth else 0.0

    def needs(op: Operation) -> tuple[tuple, float, float] | None:
        """What `op` waits for from another chunk (F of the chunk before, or the input gradient of the chunk after),
        the transfer between their ranks, and the time the receiving rank spends on it."""
        if op.kind == "F" and op.chunk > 0:
            other, size = ("F", op.chunk - 1, op.micro_batch), chunk_costs[op.chunk - 1].sends_right
        elif op.kind in ("B", "I") and op.chunk < count - 1:
            other, size = ("grad", op.chunk + 1, op.micro_batch), chunk_costs[op.chunk + 1].sends_left
        else:
            return None
        if owners[other[1]] == owners[op.chunk]:
            return other, 0.0, 0.0
        return other, latency + copying(size), 0.0 if overlap_transfers else copying(size)

    def outgoing(op: Operation) -> int:
        """The bytes `op` sends to another rank (its output, or its input's gradient), if any."""
        if op.kind not in ("F", "B", "I"):
            return 0
        target = op.chunk + 1 if op.kind == "F" else op.chunk - 1
        if not 0 <= target < count or owners[target] == owners[op.chunk]:
            return 0
        return chunk_costs[op.chunk].sends_right if op.kind == "F" else chunk_costs[op.chunk].sends_left

    def buffered(c: int) -> int:
        """Chunk c's receive buffers: one input and one output gradient per micro-batch of a step."""
        return m * ((chunk_costs[c].sends_left if c > 0 else 0) + (chunk_costs[c].sends_right if c < count - 1 else 0))

    memory = _Memory(chunk_costs, recomputes,
                     [sum(chunk_costs[c].parameter_bytes + (buffered(c) if receive_buffers else 0) for c in chunks)
                      for chunks in mine])  # fmt: skip

    def in_step(step: int, entry: tuple[Operation, ...]) -> tuple[Operation, ...]:
        return tuple(Operation(op.kind, op.chunk, step * m + op.micro_batch) for op in entry)

    # each rank's list once per step, then its update
    queues = [[e for step in range(steps) for e in [*(in_step(step, entry) for entry in order), _UPDATE]]
              for order in orders]  # fmt: skip
    done: dict[tuple, float] = {}
    clock, busy, position = [0.0] * world_size, [0.0] * world_size, [0] * world_size
    updates: list[float] = []  # rank 0's update ends
    events: list[Event] = []
    while any(position[r] < len(queues[r]) for r in range(world_size)):
        moved = False
        for rank in range(world_size):
            while position[rank] < len(queues[rank]):
                entry, start = queues[rank][position[rank]], clock[rank]
                if entry is _UPDATE:
                    took = sum(chunk_costs[c].update_s for c in mine[rank])
                    events.append(Event("update", rank, chunk_costs[mine[rank][0]].first_stage, None, start,
                                        start + took))
                    start += took
                    busy[rank] += took
                    if rank == 0:
                        updates.append(start)
                    memory.release_sends(rank)
                else:
                    waits = [need for need in map(needs, entry) if need]
                    if any(other not in done for other, _, _ in waits):
                        break
                    start = max([start + sum(receive for _, _, receive in waits)]
                                + [done[other] + hop for other, hop, _ in waits])
                    for op in entry:
                        took = _seconds(op, chunk_costs[op.chunk], recomputes[op.chunk])
                        memory.run(rank, op)
                        events.append(Event(_EVENT_KINDS[op.kind], rank, chunk_costs[op.chunk].first_stage,
                                            op.micro_batch, start, start + took))
                        start += took
                        busy[rank] += took
                        done["grad" if op.kind in ("B", "I") else op.kind, op.chunk, op.micro_batch] = start
                        start += 0.0 if overlap_transfers else copying(outgoing(op))
                        if holds_sends:
                            memory.hold_send(rank, outgoing(op))
                clock[rank] = start
                position[rank] += 1
                moved = True
        if not moved:
            raise RuntimeError("the schedule's replay made no progress (a schedule that waits on itself)")
    total = max(clock)
    return Simulation(
        time_per_micro_batch=(updates[-1] - updates[0]) / ((steps - 1) * m),
        utilisation=tuple(b / total for b in busy),
        bubble_fraction=1.0 - sum(busy) / (world_size * total),
        peak_memory=tuple(memory.peak),
        events=tuple(events),
    )


_UPDATE = ("update",)


def _seconds(op: Operation, cost: _ChunkCost, recomputes: bool) -> float:
    """An operation's time; a checkpointed chunk's forward again in the first part of its backward that runs (W
    for the first chunk, whose I torch skips)."""
    again = cost.forward_s if recomputes and _recomputation_runs_in(op) else 0.0
    if op.kind == "F":
        return cost.forward_s
    if op.kind == "B":
        return cost.backward_s + again
    if op.kind == "I":
        return cost.input_backward_s + again
    return (cost.backward_s if op.chunk == 0 else cost.weight_backward_s) + again


def _recomputation_runs_in(op: Operation) -> bool:
    """Whether a checkpointed chunk recomputes its forward in `op`: B, or the first part of a split backward that
    runs (I, except for the first chunk, whose I torch skips: its W runs the whole backward)."""
    return op.kind == "B" or (op.kind == "I" and op.chunk > 0) or (op.kind == "W" and op.chunk == 0)


class _Memory:
    """Bytes each rank holds, followed operation by operation, and the most it held."""

    def __init__(self, chunk_costs: list[_ChunkCost], recomputes: list[bool], parameters: list[int]):
        """`parameters`: what each rank holds throughout (its chunks' parameters, and any persistent buffers)."""
        self.costs, self.recomputes = chunk_costs, recomputes
        self.held, self.peak = list(parameters), list(parameters)
        self.sends = [0] * len(parameters)  # bytes sent and held until the step ends

    def hold_send(self, rank: int, size: int) -> None:
        self.sends[rank] += size
        self.held[rank] += size
        self.peak[rank] = max(self.peak[rank], self.held[rank])

    def release_sends(self, rank: int) -> None:
        self.held[rank] -= self.sends[rank]
        self.sends[rank] = 0

    def run(self, rank: int, op: Operation) -> None:
        cost, recomputes = self.costs[op.chunk], self.recomputes[op.chunk]
        kept = cost.boundary_bytes if recomputes else cost.graph_bytes  # from the forward until the backward ends
        rebuilt = cost.graph_bytes if recomputes else 0  # the recomputation's graph while the backward runs
        if op.kind == "F":
            self.held[rank] += kept
            self.peak[rank] = max(self.peak[rank], self.held[rank])
        elif _recomputation_runs_in(op):
            self.peak[rank] = max(self.peak[rank], self.held[rank] + rebuilt)
        if op.kind == "B":
            self.held[rank] -= kept
        elif op.kind == "I" and op.chunk > 0:
            self.held[rank] += rebuilt  # kept until W
        elif op.kind == "W":
            self.held[rank] -= kept + (rebuilt if op.chunk > 0 else 0)
