"""Gradient fidelity pictures (the paper's Figures 5 and 6) from `GradientFidelityCallback`'s history records."""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from .figures import pyplot, save

# (metric, the run's gradient against what, line style): the panels of the paper's Figure 5
PANELS = (
    ("cosine", "cosine similarity", (("cosine_stashed", "PETRA vs stashed-weight delayed", "-"),)),
    ("cosine", "cosine similarity to the end-to-end gradient",
     (("cosine_true", "PETRA", "-"), ("cosine_stashed_true", "stashed-weight delayed", "--"))),
    ("norm", "norm ratio", (("norm_ratio_stashed", "PETRA / stashed-weight delayed", "-"),)),
    ("norm", "norm ratio to the end-to-end gradient",
     (("norm_ratio_true", "PETRA", "-"), ("norm_ratio_stashed_true", "stashed-weight delayed", "--"))),
)


def by_epoch(records: list[dict], metric: str) -> dict[int, list[tuple[int, float]]]:
    """Per stage, (epoch, mean of `metric` over the records of that epoch), epochs counted from 1."""
    values: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        epoch = int(record["epoch"] - 1e-9) + 1 if record["epoch"] else 1
        values[record["stage"]][epoch].append(record[metric])
    return {stage: sorted((e, statistics.fmean(v)) for e, v in epochs.items()) for stage, epochs in values.items()}


def plot_fidelity_history(records: list[dict], path: str | Path, title: str) -> Path:
    """Four panels over training (one colour per stage, epoch means): PETRA against the stashed-weight delayed
    gradient (cosine, norm ratio), and PETRA (solid) and the delayed gradient (dashed) against the end-to-end one."""
    plt = pyplot()
    figure, grid = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    stages = sorted({r["stage"] for r in records})
    colours = [plt.get_cmap("viridis")(i / max(1, len(stages) - 1)) for i in range(len(stages))]
    for axes, (kind, label, lines) in zip(grid.flat, PANELS):
        for metric, name, style in lines:
            for colour, (stage, points) in zip(colours, sorted(by_epoch(records, metric).items())):
                axes.plot([e for e, _ in points], [v for _, v in points], style, color=colour,
                          label=f"stage {stage}" if style == "-" else None)
        axes.set_title(f"{label}: " + ", ".join(f"{name} ({style})" for _, name, style in lines), fontsize=9)
        axes.set_ylabel(label if kind == "cosine" else "norm ratio")
        if kind == "norm":
            axes.axhline(1.0, color="grey", linewidth=0.8)
            axes.set_xlabel("epoch")
    grid[0][0].legend(fontsize=7, ncol=2)
    figure.suptitle(title, fontsize=11)
    return save(figure, path, rect=(0, 0, 1, 0.96))


def plot_fidelity_by_stage(records: list[dict], path: str | Path, epochs: list[int], title: str) -> Path:
    """Cosine similarities against the stage index at the given epochs (one panel each): PETRA vs end-to-end,
    stashed-weight delayed vs end-to-end, PETRA vs stashed-weight delayed."""
    plt = pyplot()
    figure, grid = plt.subplots(1, len(epochs), figsize=(4 * len(epochs), 3.8), sharey=True, squeeze=False)
    comparisons = (("cosine_true", "PETRA vs end-to-end"), ("cosine_stashed_true", "delayed (stash) vs end-to-end"),
                   ("cosine_stashed", "PETRA vs delayed (stash)"))
    for axes, epoch in zip(grid[0], epochs):
        for metric, label in comparisons:
            points = {stage: dict(values).get(epoch) for stage, values in by_epoch(records, metric).items()}
            stages = sorted(s for s, v in points.items() if v is not None)
            axes.plot(stages, [points[s] for s in stages], marker="o", label=label)
        axes.set_title(f"epoch {epoch}", fontsize=10)
        axes.set_xlabel("stage")
        axes.set_xticks(sorted({r["stage"] for r in records}))
    grid[0][0].set_ylabel("cosine similarity")
    grid[0][0].legend(fontsize=8)
    figure.suptitle(title, fontsize=11)
    return save(figure, path, rect=(0, 0, 1, 0.93))
