"""A per-rank timeline (Gantt chart) of a traced run: one row per stage, one bar per operation."""

from __future__ import annotations

from pathlib import Path

from ..engine.trace import EXCHANGE, Event
from .figures import pyplot, save

COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "forward+backward": "#8172b3",
           "backward (weights)": "#c44e52", "update": "#55a868", "exchange": "#c0c0c0"}


def plot_timeline(events: list[Event], path: str | Path, title: str = "PETRA schedule as it ran") -> Path:
    """Draw `events` (`Pipeline.trace_events()`) as a PNG at `path`: rows are (rank, stage), time runs right, in
    milliseconds from the first event."""
    return plot_timelines({title: events}, path)


def plot_timelines(runs: dict[str, list[Event]], path: str | Path, chunked: dict[str, int] | None = None) -> Path:
    """Several traced runs, one panel each (titled by its key), on one time scale so that their lengths compare.
    `chunked`: {title: J} for the runs whose events name the first stage of a chunk of the J stages (torch's
    schedules): their rows are labelled with the chunk's stages, each chunk running up to the next one's first."""
    plt = pyplot()
    chunked = chunked or {}
    rows = {title: sorted({(e.rank, e.stage) for e in events}, key=lambda row: (row[0], row[1] == EXCHANGE, row[1]))
            for title, events in runs.items()}
    heights = [0.45 * len(r) + 0.9 for r in rows.values()]
    height = sum(heights) + 0.9
    figure, panels = plt.subplots(len(runs), 1, figsize=(12, height), sharex=True, squeeze=False,
                                  gridspec_kw={"height_ratios": heights})
    drawn = set()
    for axes, (title, events) in zip(panels[:, 0], runs.items()):
        origin = min(e.start for e in events)
        index = {row: i for i, row in enumerate(rows[title])}
        for kind, colour in COLOURS.items():
            chosen = [e for e in events if e.kind == kind]
            for event in chosen:
                axes.barh(index[(event.rank, event.stage)], 1e3 * (event.end - event.start),
                          left=1e3 * (event.start - origin), color=colour, edgecolor="none", height=0.8)
            if chosen and kind not in drawn:
                axes.barh(0, 0, color=colour, label=kind)  # one legend entry per kind, in the figure's legend
                drawn.add(kind)
        axes.set_yticks(range(len(rows[title])))
        names = _chunk_names(events, chunked[title]) if title in chunked else {}
        axes.set_yticklabels([f"rank {r}, " + ("exchange" if s == EXCHANGE else names.get(s, f"stage {s}"))
                              for r, s in rows[title]])
        axes.invert_yaxis()
        axes.set_title(title)
    panels[-1, 0].set_xlabel("milliseconds")
    figure.legend(loc="lower center", ncol=len(COLOURS), frameon=False)
    return save(figure, path, rect=(0, 0.35 / height, 1, 1))


def _chunk_names(events: list[Event], num_stages: int) -> dict[int, str]:
    """{a chunk's first stage: "stages a-b"}, each chunk ending where the next one starts."""
    firsts = sorted({e.stage for e in events if e.stage != EXCHANGE})
    ends = [*firsts[1:], num_stages]
    return {first: f"stages {first}-{end - 1}" if end - first > 1 else f"stage {first}"
            for first, end in zip(firsts, ends)}
