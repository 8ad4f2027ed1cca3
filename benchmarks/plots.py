"""Pictures drawn from the benchmarks' JSON files (no measuring here).

    python benchmarks/plots.py    # docs/images/memory-stages-<model>.png and accuracy-k-sweep.png

- memory per stage by buffer configuration (benchmarks/results/memory.json): the numbers of
  docs/benchmarks-memory.md's per-stage tables, activations held for pending backwards (scaled to micro-batch 64,
  224x224) plus stashed weights;
- the paper's Figure 4 on digits (benchmarks/results/accuracy_digits_k_sweep.json): PETRA's test-accuracy gap to
  backprop as k grows, at a fixed number of samples.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from petra_hub.plots import plot_stage_memory
from petra_hub.plots.figures import pyplot, save

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("revnet18 buffered", "revnet50 buffered")


def stage_buffers(result: dict, model: str) -> tuple[dict[str, list[float]], str]:
    modes, scale = result["models"][model]["modes"], result["scale"]
    buffers = {name: [s["activation_bytes"] * scale + s["stash_bytes"] for s in mode["stages"]]
               for name, mode in modes.items()}
    layout = "".join(s["kind"] for s in next(iter(modes.values()))["stages"])
    return buffers, layout


def k_sweep(result: dict) -> tuple[list[int], list[float], list[float]]:
    """(k, mean gap to backprop, std of the paired gaps) of every PETRA configuration, by k."""
    rows = sorted((s for s in result["summary"] if s["mode"] == "petra"), key=lambda s: s["k"])
    return [s["k"] for s in rows], [s["gap_mean"] for s in rows], [s["gap_std"] for s in rows]


def plot_k_sweep(result: dict, path: Path) -> Path:
    plt = pyplot()
    ks, means, stds = k_sweep(result)
    settings = result["settings"]
    figure, axes = plt.subplots(figsize=(6.5, 4))
    axes.errorbar(ks, means, yerr=stds, marker="o", capsize=4)
    axes.axhline(0.0, color="grey", linewidth=0.8)
    axes.set_xscale("log", base=2)
    axes.set_xticks(ks)
    axes.set_xticklabels([str(k) for k in ks])
    axes.set_xlabel("k (micro-batches accumulated per update)")
    axes.set_ylabel("test accuracy gap to backprop (points)")
    axes.set_title(f"PETRA on digits, J = {settings['num_stages']}, {settings['epochs']:g} epochs, "
                   f"{len(settings['seeds'])} seeds (mean ± std)", fontsize=10)
    return save(figure, path)


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "memory.json")
    parser.add_argument(
        "--k-sweep", type=Path, default=ROOT / "benchmarks" / "results" / "accuracy_digits_k_sweep.json"
    )
    parser.add_argument("--images", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    result = json.loads(args.results.read_text())
    written = []
    for model in MODELS:
        buffers, layout = stage_buffers(result, model)
        name = model.replace(" ", "-")
        title = f"{model.replace('revnet', 'RevNet')}: buffers per stage (micro-batch 64, 224x224)"
        written.append(plot_stage_memory(buffers, layout, args.images / f"memory-stages-{name}.png", title))
        print(f"wrote {written[-1]}")
    if args.k_sweep.exists():
        written.append(plot_k_sweep(json.loads(args.k_sweep.read_text()), args.images / "accuracy-k-sweep.png"))
        print(f"wrote {written[-1]}")
    return written


if __name__ == "__main__":
    main()
