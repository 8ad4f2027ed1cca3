"""Memory per stage by buffer configuration (the paper's Table 6 as a bar chart)."""

from __future__ import annotations

from pathlib import Path

from .figures import pyplot, save


def plot_stage_memory(buffers: dict[str, list[float]], layout: str, path: str | Path, title: str) -> Path:
    """Grouped bars: for each stage (x, labelled with its layout letter), the bytes each configuration
    (`buffers[name][stage]`) holds for pending backwards, in GB on a log scale (PETRA's reversible stages hold
    nothing: drawn at the axis floor)."""
    plt = pyplot()
    names = list(buffers)
    width = 0.8 / len(names)
    figure, axes = plt.subplots(figsize=(max(8, 0.5 * len(layout) + 3), 4.5))
    floor = min((b for values in buffers.values() for b in values if b > 0), default=1.0) / 1e9 / 10
    for offset, name in enumerate(names):
        values = [max(b / 1e9, floor) for b in buffers[name]]
        axes.bar([i + (offset - (len(names) - 1) / 2) * width for i in range(len(layout))], values, width, label=name)
    axes.set_yscale("log")
    axes.set_ylim(bottom=floor)
    axes.set_xticks(range(len(layout)))
    axes.set_xticklabels([f"{i}\n{letter}" for i, letter in enumerate(layout)])
    axes.set_xlabel("stage (S stem, R reversible, D downsampling, H head)")
    axes.set_ylabel("buffers held (GB, log)")
    axes.set_title(title)
    axes.legend(ncol=min(len(names), 3), fontsize=8)
    return save(figure, path)
