"""The schedule as it really ran: timestamped events of every stage's work, exported as a Chrome / Perfetto trace.

With `Pipeline(trace=True)` each worker records its forwards, backwards, last-stage forward+backward and updates,
and each rank its exchanges with its neighbours: one `Event` per operation, timed with `time.perf_counter()`
(CLOCK_MONOTONIC on Linux, one clock for all processes of a machine). Recording appends a tuple per operation;
nothing is recorded without the flag. `Pipeline.trace_events()` gathers every rank's events (a collective) and
`write_chrome_trace` writes them in the Trace Event Format that chrome://tracing and ui.perfetto.dev open: one
process per rank, one thread per stage.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch.distributed as dist

from .wire import WireError, all_gather_json

EXCHANGE = -1  # the `stage` of a rank's exchange with its neighbours
TRACE_LIMIT = 1024 * 2**20  # bytes of one rank's events as JSON (about 12 million events)


@dataclass(frozen=True)
class Event:
    kind: str  # "forward", "backward", "forward+backward", "update" or "exchange" ("backward (weights)": the
    # weight half of a split backward, as torch's zero-bubble schedules run it; the engine never splits one)
    rank: int
    stage: int  # EXCHANGE for an exchange
    micro_batch: int | None  # None for updates and exchanges
    start: float  # seconds, time.perf_counter()
    end: float


_WORKER_EVENTS = {"forward": "forward", "backward": "backward", "forward_backward_last": "forward+backward",
                  "_update": "update"}


def timed(method):
    """For a `StageWorker` operation: add its CPU time to `counters.compute_seconds` (CPU, not wall, time: other
    processes sharing the cores do not count), and with a trace, record it as an event (an update only when it
    happened)."""
    kind = _WORKER_EVENTS[method.__name__]

    @functools.wraps(method)
    def timed_method(self, *args, **kwargs):
        start, wall = time.process_time(), time.perf_counter() if self.trace is not None else 0.0
        result = None
        try:
            result = method(self, *args, **kwargs)
            return result
        finally:
            self.counters.compute_seconds += time.process_time() - start
            if self.trace is not None and (kind != "update" or result is True):
                micro_batch = None if kind == "update" else args[0]
                self.trace.add(kind, self.index, micro_batch, wall, time.perf_counter())

    return timed_method


class Trace:
    """The events of one rank."""

    def __init__(self, rank: int = 0):
        self.rank = rank
        self.events: list[Event] = []

    @contextlib.contextmanager
    def record(self, kind: str, stage: int, micro_batch: int | None = None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.events.append(Event(kind, self.rank, stage, micro_batch, start, time.perf_counter()))

    def add(self, kind: str, stage: int, micro_batch: int | None, start: float, end: float) -> None:
        self.events.append(Event(kind, self.rank, stage, micro_batch, start, end))


def gather_events(trace: Trace, distributed: bool, group: dist.ProcessGroup | None = None) -> list[Event]:
    """Every rank's events, on every rank of `group` (all_gather over it when distributed; None: the default group).
    Events carry global ranks, whatever the group."""
    if not distributed:
        return list(trace.events)
    rows = [[e.kind, e.rank, e.stage, e.micro_batch, e.start, e.end] for e in trace.events]
    gathered = all_gather_json(rows, group, limit=TRACE_LIMIT)  # JSON, never pickled (see `wire`)
    return [_event(row) for rows in gathered for row in (rows if isinstance(rows, list) else [None])]


def _event(row) -> Event:
    """An event another rank sent (as `gather_events` lays it out), checked."""
    if (isinstance(row, list) and len(row) == 6 and isinstance(row[0], str) and type(row[1]) is int
            and type(row[2]) is int and (row[3] is None or type(row[3]) is int)
            and all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in row[4:])):
        return Event(row[0], row[1], row[2], row[3], float(row[4]), float(row[5]))
    raise WireError(f"a rank sent a trace event that is not one: {str(row)[:80]}")


def chrome_trace(events: list[Event]) -> dict:
    """The Trace Event Format: complete ("X") events in microseconds from the first event."""
    origin = min((e.start for e in events), default=0.0)
    trace_events = []
    for event in events:
        entry = {
            "name": event.kind if event.micro_batch is None else f"{event.kind} {event.micro_batch}",
            "cat": event.kind,
            "ph": "X",
            "ts": (event.start - origin) * 1e6,
            "dur": (event.end - event.start) * 1e6,
            "pid": event.rank,
            "tid": "exchange" if event.stage == EXCHANGE else f"stage {event.stage}",
        }
        if event.micro_batch is not None:
            entry["args"] = {"micro_batch": event.micro_batch}
        trace_events.append(entry)
    names = [{"name": "process_name", "ph": "M", "pid": rank, "args": {"name": f"rank {rank}"}}
             for rank in sorted({e.rank for e in events})]
    return {"traceEvents": names + trace_events, "displayTimeUnit": "ms"}


def write_chrome_trace(events: list[Event], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(events)))
    return path


def events_as_dicts(events: list[Event]) -> list[dict]:
    return [asdict(event) for event in events]
