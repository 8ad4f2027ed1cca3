"""What a schedule would take on given hardware: an event simulation of the engine's tick loop from measured costs.

The engine runs in ticks. In each tick every rank runs, stage by stage, the forward and the backward its stages
have in that tick (and an update where an accumulation group closes), then swaps messages with both neighbouring
ranks and cannot start the next tick before what they send it has arrived. The headers are posted when a tick
starts, the payloads once a rank's work of the tick is done, so a link's payloads start moving only when both of its
ranks have finished the tick. `simulate` replays exactly that with the costs of `profile_stages`: rank r starts
tick t + 1 when, for each neighbour n,

    payloads on the link (r, n):  max(r's end of tick t, n's end of tick t) + transfer
    headers only:                 n's end of tick t + transfer (the header n posted at its start is there already)

have passed, and not before its own end of tick t; a transfer takes 2 x `latency` (the header, then the payload)
+ bytes / `link_bandwidth`. Where payloads go both ways, a full-duplex link (NVLink, PCIe, a network) carries them at
once: the larger direction's bytes; a half-duplex one (`duplex=False`: processes of one machine on loopback, whose
CPUs copy every byte) one after the other, each with its latency: 3 latencies and the bytes of both. Every stage also
spends its measured share of the engine's own time (`StageCost.overhead_s`) in every tick. It returns the time per
micro-batch in steady state, each rank's utilisation, the bubble fraction, each rank's peak memory (the sum of its
stages' measured `held_bytes`, held between operations, plus the largest `graph_bytes` among them: the graph an
operation builds while it runs) and the simulated operations as trace `Event`s, so that a simulated and a recorded
run can be drawn with the same `plot_timeline`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.modes import Mode
from ..engine.partitioning import StageCost
from ..engine.placement import Placement
from ..engine.schedule import Schedule
from ..engine.trace import EXCHANGE, Event


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
    overlap_transfers: bool = False,
    duplex: bool = True,
) -> Simulation:
    """Simulate `micro_batches` (default 4J) micro-batches of `mode` on `placement`, stages costing `costs` (from
    `profile_stages` in the same mode); `link_bandwidth` in bytes/s (None: free transfers). `overlap_transfers`:
    each payload leaves when its sender is done, whatever the receiver is doing (the first version's model, kept
    to compare with; the engine posts a tick's payloads only once its work is done). `duplex`: whether the two
    directions of a link move at once (see above)."""
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

    def swap(right: int, left: int) -> float:  # payloads both ways on one link (either may be empty)
        if duplex or not (right and left):
            return transfer(max(right, left))
        return transfer(right) + transfer(left) - latency  # one header, then one payload after the other

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
        done = list(ends)
        for left in range(ranks - 1):
            right = left + 1
            if (sent_right[left] or sent_left[right]) and not overlap_transfers:
                # the payloads move once both ranks have posted theirs
                both = max(ends[left], ends[right]) + swap(sent_right[left], sent_left[right])
                arrivals = ((left, both), (right, both))
            else:  # headers only (or overlapped transfers): each rank waits for what its neighbour sent at its end
                arrivals = ((left, ends[right] + transfer(sent_left[right])),
                            (right, ends[left] + transfer(sent_right[left])))
            for rank, when in arrivals:
                done[rank] = max(done[rank], when)
        for rank in range(ranks):
            if done[rank] > ends[rank]:
                events.append(Event("exchange", rank, EXCHANGE, None, ends[rank], done[rank]))
            ready[rank] = done[rank]
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
