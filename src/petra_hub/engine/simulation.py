"""What a schedule would take on given hardware: an event simulation of the engine's tick loop from measured costs.

The engine runs in ticks. In each tick every rank runs, stage by stage, the forward and the backward its stages
have in that tick (and an update where an accumulation group closes), then swaps messages with both neighbouring
ranks and cannot start the next tick before what they send it has arrived. `simulate` replays exactly that with the
costs of `profile_stages`: rank r starts tick t + 1 at

    max(its own end of tick t, each neighbour's end of tick t + the transfer of what that neighbour sends it),

a transfer taking 2 x `latency` (the header both sides swap first, then the payload) + bytes / `link_bandwidth`;
every stage also spends its measured share of the engine's own time (`StageCost.overhead_s`) in every tick. It returns the time per micro-batch
in steady state, each rank's utilisation, the bubble fraction, each rank's peak memory (the sum of its stages'
measured `held_bytes`, held between operations, plus the largest `graph_bytes` among them: the graph an operation
builds while it runs) and the simulated operations as trace `Event`s, so that a simulated and a recorded run can
be drawn with the same `plot_timeline`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .modes import Mode
from .placement import Placement
from .profiling import StageCost
from .schedule import Schedule
from .trace import EXCHANGE, Event


@dataclass(frozen=True)
class Simulation:
    time_per_micro_batch: float  # seconds, steady state
    utilisation: tuple[float, ...]  # per rank: busy time / simulated time
    bubble_fraction: float  # 1 - busy time of all ranks / (ranks x simulated time)
    peak_memory: tuple[int, ...]  # per rank, bytes
    events: tuple[Event, ...]


def simulate(
    mode: Mode | str,
    costs: list[StageCost],
    placement: Placement,
    link_bandwidth: float | None = None,
    latency: float = 0.0,
    accumulation_steps: int = 1,
    micro_batches: int | None = None,
) -> Simulation:
    """Simulate `micro_batches` (default 4J) micro-batches of `mode` on `placement`, stages costing `costs` (from
    `profile_stages` in the same mode); `link_bandwidth` in bytes/s (None: free transfers)."""
    mode = Mode.parse(mode)
    count = len(costs)
    if placement.num_stages != count:
        raise ValueError(f"placement covers {placement.num_stages} stages, costs give {count}")
    schedule = Schedule(count, mode.pipelined)
    fed = micro_batches or 4 * count
    ticks = schedule.backward_tick(fed - 1, 0) + 1
    ranks = len(placement.groups)

    def transfer(size: int) -> float:
        return 2 * latency + (size / link_bandwidth if size and link_bandwidth else 0.0)

    ready = [0.0] * ranks
    busy = [0.0] * ranks
    backwards = [0] * count
    entered: dict[int, float] = {}  # micro-batch -> when rank 0 started the tick of its first forward
    events: list[Event] = []
    for tick in range(ticks):
        ends, sent_right, sent_left = [], [0] * ranks, [0] * ranks
        for rank, group in enumerate(placement.groups):
            clock = ready[rank]
            for stage in group:
                forward = schedule.forward_at(stage, tick, fed)
                backward = schedule.backward_at(stage, tick, fed)
                if stage == 0 and forward is not None:
                    entered[forward] = ready[rank]
                cost = costs[stage]
                clock += cost.overhead_s
                for kind, micro_batch, seconds in (("forward", forward, cost.forward_s),
                                                  ("backward", backward, cost.backward_s)):
                    if micro_batch is None or (kind == "forward" and stage == count - 1):
                        continue  # the last stage's forward is part of its fused backward
                    kind = "forward+backward" if stage == count - 1 else kind
                    events.append(Event(kind, rank, stage, micro_batch, clock, clock + seconds))
                    clock += seconds
                    if kind != "forward":
                        backwards[stage] += 1
                        if backwards[stage] % accumulation_steps == 0 or backwards[stage] == fed:
                            events.append(Event("update", rank, stage, None, clock, clock + cost.update_s))
                            clock += cost.update_s
                if stage == group.stop - 1 and forward is not None and stage < count - 1:
                    sent_right[rank] += cost.forward_bytes
                if stage == group.start and backward is not None and stage > 0:
                    sent_left[rank] += cost.backward_bytes
            busy[rank] += clock - ready[rank]
            ends.append(clock)
        for rank in range(ranks):
            arrivals = [ends[rank]]
            if rank > 0:
                arrivals.append(ends[rank - 1] + transfer(sent_right[rank - 1]))
            if rank < ranks - 1:
                arrivals.append(ends[rank + 1] + transfer(sent_left[rank + 1]))
            if len(arrivals) > 1 and max(arrivals) > ends[rank]:
                events.append(Event("exchange", rank, EXCHANGE, None, ends[rank], max(arrivals)))
            ready[rank] = max(arrivals)
    total = max(ready)
    steady = sorted(entered)[fed // 2:]
    steady = steady[(len(steady) - 1) % 2:]  # an even number of intervals: neighbours can settle into a 2-tick beat
    per_micro_batch = ((entered[steady[-1]] - entered[steady[0]]) / (len(steady) - 1) if len(steady) > 1
                       else total / fed)
    return Simulation(
        time_per_micro_batch=per_micro_batch,
        utilisation=tuple(b / total for b in busy),
        bubble_fraction=1.0 - sum(busy) / (ranks * total),
        peak_memory=tuple(sum(costs[i].held_bytes for i in group) + max(costs[i].graph_bytes for i in group)
                          for group in placement.groups),
        events=tuple(events),
    )


Checkpointing = Literal["none", "all", "but_last"]


def simulate_1f1b(
    costs: list[StageCost],
    placement: Placement,
    micro_batches: int,
    checkpointing: Checkpointing = "none",
    link_bandwidth: float | None = None,
    latency: float = 0.0,
    steps: int = 4,
) -> Simulation:
    """The synchronous rival: 1F1B with a flush and an update every `micro_batches` (as torch's `Schedule1F1B` runs
    it, one chunk per rank), from the costs of `profile_stages(..., mode="backprop")` (a forward, and a backward
    through the graph it kept).

    Rank r runs min(m, W - r) forwards, then alternately a backward and a forward, then its last backwards and its
    update; a forward waits for the previous rank's forward of the same micro-batch plus its transfer (`latency` +
    bytes / `link_bandwidth`), a backward for the next rank's backward plus its transfer. Checkpointed chunks ("all",
    or "but_last": every rank's but the last one's) run their forward again in the backward and keep, per micro-batch
    in flight, their input and output instead of the graph. Peak memory per rank: its parameters, plus for each of
    the min(m, W - r) micro-batches in flight the chunk's graph (its stages' `graph_bytes`, less the activations
    passed between them, which the chunk holds once) or its input and output, plus for a checkpointed chunk the
    graph its recomputation builds for one micro-batch (the data the first rank reads is not counted). The engine's
    own time per tick (`overhead_s`) is not charged: torch's runtime is another program."""
    if checkpointing not in ("none", "all", "but_last"):
        raise ValueError(f"checkpointing must be 'none', 'all' or 'but_last', got {checkpointing!r}")
    if micro_batches < 1 or steps < 2:
        raise ValueError(f"need micro_batches >= 1 and steps >= 2, got {micro_batches} and {steps}")
    if placement.num_stages != len(costs):
        raise ValueError(f"placement covers {placement.num_stages} stages, costs give {len(costs)}")
    groups, m = placement.groups, micro_batches
    ranks = len(groups)

    def transfer(size: int) -> float:
        return latency + (size / link_bandwidth if size and link_bandwidth else 0.0)

    def recomputes(rank: int) -> bool:
        return checkpointing == "all" or (checkpointing == "but_last" and rank < ranks - 1)

    forward = [sum(costs[i].forward_s for i in group) for group in groups]
    backward = [sum(costs[i].backward_s for i in group) + (forward[r] if recomputes(r) else 0.0)
                for r, group in enumerate(groups)]
    update = [sum(costs[i].update_s for i in group) for group in groups]
    sends_right = [costs[group.stop - 1].forward_bytes for group in groups]
    sends_left = [costs[group.start].backward_bytes for group in groups]

    def order(rank: int) -> list[tuple[str, int | None]]:
        warm = min(m, ranks - rank)
        ops = [("forward", i) for i in range(warm)]
        for i in range(m - warm):
            ops += [("backward", i), ("forward", warm + i)]
        return ops + [("backward", i) for i in range(m - warm, m)] + [("update", None)]

    queues = [[(kind, None if i is None else step * m + i) for step in range(steps) for kind, i in order(rank)]
              for rank in range(ranks)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, rank, micro-batch) -> end
    clock, busy, position = [0.0] * ranks, [0.0] * ranks, [0] * ranks
    updates: list[float] = []  # rank 0's update ends
    events: list[Event] = []
    while any(position[r] < len(queues[r]) for r in range(ranks)):
        moved = False
        for rank in range(ranks):
            while position[rank] < len(queues[rank]):
                kind, micro_batch = queues[rank][position[rank]]
                start = clock[rank]
                if kind == "forward" and rank > 0:
                    if ("forward", rank - 1, micro_batch) not in done:
                        break
                    start = max(start, done["forward", rank - 1, micro_batch] + transfer(sends_right[rank - 1]))
                if kind == "backward" and rank < ranks - 1:
                    if ("backward", rank + 1, micro_batch) not in done:
                        break
                    start = max(start, done["backward", rank + 1, micro_batch] + transfer(sends_left[rank + 1]))
                seconds = {"forward": forward, "backward": backward, "update": update}[kind][rank]
                clock[rank], busy[rank] = start + seconds, busy[rank] + seconds
                done[kind, rank, micro_batch] = clock[rank]
                events.append(Event(kind, rank, groups[rank].start, micro_batch, start, clock[rank]))
                if kind == "update" and rank == 0:
                    updates.append(clock[rank])
                position[rank] += 1
                moved = True
        if not moved:
            raise RuntimeError("1F1B simulation made no progress (a schedule that waits on itself)")
    total = max(clock)

    def peak(rank: int) -> int:
        group = groups[rank]
        graph = sum(costs[i].graph_bytes for i in group) - sum(costs[i].forward_bytes for i in group[:-1])
        boundary = costs[group.start].backward_bytes + costs[group.stop - 1].forward_bytes
        held, working = (boundary, graph) if recomputes(rank) else (graph, 0)
        return sum(costs[i].parameter_bytes for i in group) + min(m, ranks - rank) * held + working

    return Simulation(
        time_per_micro_batch=(updates[-1] - updates[0]) / ((steps - 1) * m),
        utilisation=tuple(b / total for b in busy),
        bubble_fraction=1.0 - sum(busy) / (ranks * total),
        peak_memory=tuple(peak(rank) for rank in range(ranks)),
        events=tuple(events),
    )
