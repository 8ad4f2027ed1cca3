"""When each stage runs the forward and the backward of each micro-batch (paper-notes section 2).

Micro-batch b enters the pipeline at tick `start(b)`; at stage i (0-based, J stages) its forward runs at tick
start(b) + i and its backward at tick start(b) + 2(J-1) - i; the last stage does both in tick start(b) + J - 1.
A message produced at tick t is consumed by the neighbouring stage at tick t + 1.

Pipelined modes start a micro-batch every tick (start(b) = b), so stage i keeps 2(J-1-i) micro-batches in
flight. Synchronous modes start the next micro-batch only when the previous one has finished its backward at
every stage (start(b) = b (2J - 1)): naive model parallelism, exact gradients.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    num_stages: int
    pipelined: bool

    def __post_init__(self):
        if self.num_stages < 1:
            raise ValueError(f"a pipeline needs at least one stage, got {self.num_stages}")

    @property
    def ticks_per_micro_batch(self) -> int:
        """Ticks between the starts of consecutive micro-batches."""
        return 1 if self.pipelined else 2 * self.num_stages - 1

    @property
    def latency(self) -> int:
        """Ticks from a micro-batch's start to its last backward (at stage 0), inclusive."""
        return 2 * (self.num_stages - 1) + 1

    def start(self, micro_batch: int) -> int:
        return micro_batch * self.ticks_per_micro_batch

    def forward_tick(self, micro_batch: int, stage: int) -> int:
        return self.start(micro_batch) + stage

    def backward_tick(self, micro_batch: int, stage: int) -> int:
        return self.start(micro_batch) + 2 * (self.num_stages - 1) - stage

    def _micro_batch_at(self, offset: int, tick: int, fed: int) -> int | None:
        """The micro-batch b < fed with start(b) + offset == tick, if any."""
        started = tick - offset
        if started < 0 or started % self.ticks_per_micro_batch:
            return None
        micro_batch = started // self.ticks_per_micro_batch
        return micro_batch if micro_batch < fed else None

    def forward_at(self, stage: int, tick: int, fed: int) -> int | None:
        """The micro-batch whose forward stage `stage` runs at `tick`, given `fed` micro-batches fed so far."""
        return self._micro_batch_at(stage, tick, fed)

    def backward_at(self, stage: int, tick: int, fed: int) -> int | None:
        return self._micro_batch_at(2 * (self.num_stages - 1) - stage, tick, fed)

    def work_at(self, stages: range, tick: int, fed: int) -> list[tuple[int, int | None, int | None]]:
        """(stage, forward micro-batch, backward micro-batch) for each of `stages` that has work at `tick`, in stage
        order (None where it has no forward or no backward). A synchronous schedule looks only at the (at most two)
        stages its one micro-batch in flight can be at, so an idle stage costs nothing."""
        if self.pipelined:
            candidates = stages
        else:
            offset = tick % self.ticks_per_micro_batch  # where the micro-batch in flight stands in its ticks
            candidates = sorted({stage for stage in (offset, 2 * (self.num_stages - 1) - offset) if stage in stages})
        work = []
        for stage in candidates:
            forward, backward = self.forward_at(stage, tick, fed), self.backward_at(stage, tick, fed)
            if forward is not None or backward is not None:
                work.append((stage, forward, backward))
        return work

    def in_flight(self, stage: int) -> int:
        """Steady-state number of micro-batches between forward and backward at `stage`."""
        return 2 * (self.num_stages - 1 - stage) if self.pipelined else 0

    def table(self, num_micro_batches: int) -> list[list[str]]:
        """A printable grid: one row per stage, one column per tick; cells like 'F3 B1'."""
        last_tick = self.backward_tick(num_micro_batches - 1, 0)
        rows = []
        for stage in range(self.num_stages):
            row = []
            for tick in range(last_tick + 1):
                cell = []
                forward = self.forward_at(stage, tick, num_micro_batches)
                backward = self.backward_at(stage, tick, num_micro_batches)
                if forward is not None:
                    cell.append(f"F{forward}")
                if backward is not None:
                    cell.append(f"B{backward}")
                row.append(" ".join(cell) or ".")
            rows.append(row)
        return rows

    def grid(self, num_micro_batches: int) -> str:
        """`table` as text: one line per stage, aligned columns (`print(schedule.grid(4))`)."""
        rows = self.table(num_micro_batches)
        width = max(len(cell) for row in rows for cell in row)
        header = "tick     " + " ".join(f"{tick:<{width}}" for tick in range(len(rows[0])))
        lines = [f"stage {stage:<2} " + " ".join(f"{cell:<{width}}" for cell in row) for stage, row in enumerate(rows)]
        return "\n".join(line.rstrip() for line in [header, *lines])
