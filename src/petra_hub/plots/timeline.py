"""A per-rank timeline (Gantt chart) of a traced run: one row per stage, one bar per operation."""

from __future__ import annotations

from pathlib import Path

from ..engine.trace import EXCHANGE, Event
from .figures import pyplot, save

COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "forward+backward": "#8172b3", "update": "#55a868",
           "exchange": "#c0c0c0"}


def plot_timeline(events: list[Event], path: str | Path, title: str = "PETRA schedule as it ran") -> Path:
    """Draw `events` (`Pipeline.trace_events()`) as a PNG at `path`: rows are (rank, stage), time runs right, in
    milliseconds from the first event."""
    plt = pyplot()
    origin = min(e.start for e in events)
    rows = sorted({(e.rank, e.stage) for e in events}, key=lambda row: (row[0], row[1] == EXCHANGE, row[1]))
    index = {row: i for i, row in enumerate(rows)}
    height = 0.45 * len(rows) + 1.8
    figure, axes = plt.subplots(figsize=(12, height))
    for kind, colour in COLOURS.items():
        chosen = [e for e in events if e.kind == kind]
        for event in chosen:
            axes.barh(index[(event.rank, event.stage)], 1e3 * (event.end - event.start),
                      left=1e3 * (event.start - origin), color=colour, edgecolor="none", height=0.8)
        if chosen:
            axes.barh(0, 0, color=colour, label=kind)  # one legend entry per kind
    axes.set_yticks(range(len(rows)))
    axes.set_yticklabels([f"rank {r}, " + ("exchange" if s == EXCHANGE else f"stage {s}") for r, s in rows])
    axes.invert_yaxis()
    axes.set_xlabel("milliseconds")
    axes.set_title(title)
    figure.legend(loc="lower center", ncol=len(COLOURS), frameon=False)
    return save(figure, path, rect=(0, 0.35 / height, 1, 1))
