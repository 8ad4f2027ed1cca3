"""The most a stage holds at any moment inside one of its operations, not only between them.

`Pipeline.memory()` counts what each stage keeps between operations: stored inputs or graphs, weight copies,
gradients, waiting messages. Inside an operation a stage holds more: the graph a backward rebuilds, the outputs
before they are sent, autograd's temporaries. `OperationPeaks` measures that from torch's profiler, which records
every CPU allocation and free with the allocator's running total ("Total Allocated"). For each operation of each
stage it takes what the stage held as it began (the engine's exact count) plus the largest rise of that total
while it ran. Stages run one after another in one process, so every allocation inside an operation belongs to
its stage, as on a device of its own.

The profiler must see every tensor alive in the operations measured allocated (a tensor allocated before it
started is not in its total, and its free would not lower it): start it before the pipeline's first micro-batch.
"""

from __future__ import annotations

import json
import tempfile
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path

from torch.profiler import ProfilerActivity, profile, record_function

OPERATIONS = ("forward", "backward", "forward_backward_last", "maybe_update")
LABEL = "op_peaks"


@dataclass
class Operation:
    stage: int
    name: str
    tick: int  # the pipeline's tick when it began
    held_bytes: int  # what the stage held as it began (`StageWorker.memory().total_bytes`)
    rise_bytes: int = 0  # the largest rise of the allocator's total while it ran

    @property
    def peak_bytes(self) -> int:
        return self.held_bytes + self.rise_bytes


class OperationPeaks:
    """Profile a pipeline's operations; after the `with` block, `operations` holds every one, measured."""

    def __init__(self, pipeline):
        self.pipeline = pipeline
        self.operations: list[Operation] = []
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def __enter__(self) -> OperationPeaks:
        for index, worker in self.pipeline.workers.items():
            for name in OPERATIONS:
                setattr(worker, name, self._wrapped(index, worker, name, getattr(worker, name)))
        self._profile.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._profile.__exit__(*exc)
        for worker in self.pipeline.workers.values():
            for name in OPERATIONS:
                delattr(worker, name)  # the class's method again
        if exc[0] is None:
            self._measure()

    def stage_peaks(self, from_tick: int = 0) -> dict[int, int]:
        """Per stage, the largest `peak_bytes` among its operations that began at tick `from_tick` or later."""
        peaks: dict[int, int] = {}
        for op in self.operations:
            if op.tick >= from_tick:
                peaks[op.stage] = max(peaks.get(op.stage, 0), op.peak_bytes)
        return peaks

    def _wrapped(self, index: int, worker, name: str, method):
        def operation(*args, **kwargs):
            op = Operation(index, name, self.pipeline.tick, worker.memory().total_bytes)
            self.operations.append(op)
            with record_function(f"{LABEL}/{len(self.operations) - 1}"):
                return method(*args, **kwargs)

        return operation

    def _measure(self) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "trace.json"
            self._profile.export_chrome_trace(str(path))
            events = json.loads(path.read_text())["traceEvents"]
        # (time, the allocator's total after the event, the event's bytes: negative for a free). The total counts
        # every tensor allocated while any profiler recorded memory in this process, so the level an operation
        # starts from is read off its own first event (total less bytes), not assumed to be zero.
        memory = sorted((e["ts"], e["args"]["Total Allocated"], e["args"]["Bytes"]) for e in events
                        if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)
        times = [ts for ts, _, _ in memory]
        for event in events:
            name = event.get("name", "")
            if event.get("ph") != "X" or not name.startswith(LABEL + "/"):
                continue
            op = self.operations[int(name.rpartition("/")[2])]
            start, end = event["ts"], event["ts"] + event["dur"]
            inside = memory[bisect_left(times, start):bisect_right(times, end)]
            if inside:
                _, total, size = inside[0]
                op.rise_bytes = max(0, max(total for _, total, _ in inside) - (total - size))

