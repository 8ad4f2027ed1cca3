#!/usr/bin/env python
"""PETRA's cost against depth: the paired gap to backprop on digits at several numbers of stages J, per remedy.

    python benchmarks/depth_sweep.py --model revnet18 --stages 4 10 --seeds 0 1 2 3 4
    python benchmarks/depth_sweep.py --model revvit-tiny --stages 4 8 14 --configs backprop petra-k1 \\
        petra-k1+layerscale petra-k1+sync90 --seeds 0 1 2 --epochs 30
    python benchmarks/depth_sweep.py --quick     # J = 4 and 10, 1 seed, 1 epoch: depth_sweep-quick.json
    python benchmarks/depth_sweep.py --model revnet34 --stages 4 10 18 --configs backprop petra-k1+delay-momentum \
        --plot PNG --plot-with benchmarks/results/depth_sweep_revnet34.json   # one more line in an earlier picture

Each J is one `benchmarks/accuracy_digits.py` run (`--num-stages J`: the model's stages merged into J pipeline
stages, so J is at most the model's own count: 10 for RevNet18, 14 for RevViT-Ti); every configuration is paired
with the baseline by seed. The JSON holds, per J and configuration, the accuracies and the paired gap (mean, std,
extremes), and the picture (`--plot`) draws the gap against J, one line per configuration. Seeds 17 and 29 are
kept for checking what was tuned on the others.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import accuracy_digits  # noqa: E402
from common import add_out_argument, progress, results_path, write_results  # noqa: E402

DEFAULT_CONFIGS = ["backprop", "petra-k1", "petra-k1+sync45"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=list(accuracy_digits.MODELS), default="revnet18")
    parser.add_argument("--stages", nargs="+", type=int, default=None, help="the J to measure (default 4 10)")
    parser.add_argument("--configs", nargs="+", type=accuracy_digits.config_name, default=None,
                        help=f"default {' '.join(DEFAULT_CONFIGS)}; the first is the baseline")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default 0 1 2 (quick: 0)")
    parser.add_argument("--epochs", type=float, default=None, help="default: the model's (quick: 1)")
    parser.add_argument("--fidelity-every", type=int, default=0,
                        help="probe the gradient fidelity every this many steps (default 0: off); the picture then "
                             "draws the stages' mean cosine to the end-to-end gradient beside the gap")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, each in its own process (default 1)")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the gap against J into this PNG")
    parser.add_argument("--plot-with", type=Path, nargs="+", default=[], metavar="JSON",
                        help="earlier sweeps of the same model, seeds and epochs, drawn in the same picture (a "
                             "configuration measured again here is drawn from this run)")
    parser.add_argument("--quick", action="store_true", help="J = 4 and 10, 1 seed, 1 epoch: a smoke test")
    add_out_argument(parser, "depth_sweep")
    args = parser.parse_args(argv)
    args.stages = args.stages or [4, 10]
    args.configs = args.configs or list(DEFAULT_CONFIGS)
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    if args.quick:
        args.epochs = 1.0
    return args


def sweep_rows(model: str, stages: list[int], configs: list[str], seeds: list[int], epochs: float | None,
               jobs: int = 1, fidelity_every: int = 0) -> list:
    """One accuracy_digits run per J -> rows {stages, config, accuracies, mean, gap_mean, ...}."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="petra-depth-") as folder:
        for count in stages:
            progress(f"J = {count}")
            argv = ["--model", model, "--num-stages", str(count), "--configs", *configs, "--baseline", configs[0],
                    "--seeds", *map(str, seeds), "--out", str(Path(folder, f"J{count}.json"))]
            if epochs is not None:
                argv += ["--epochs", str(epochs)]
            argv += ["--jobs", str(jobs), "--fidelity-every", str(fidelity_every)]
            result = accuracy_digits.main(argv)
            rows += [{"stages": count, **row} for row in result["summary"]]
    return rows


def plot(rows: list[dict], path: Path, title: str, baseline: str = "backprop") -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    fidelity = any("cosine_true_mean" in row for row in rows)
    figure, panels = pyplot.subplots(1, 2 if fidelity else 1, figsize=(10 if fidelity else 6, 3.6), squeeze=False)
    gap_axes = panels[0][0]
    for config in dict.fromkeys(row["config"] for row in rows if "gap_mean" in row):
        points = sorted((row["stages"], row["gap_mean"], row["gap_std"], row.get("cosine_true_mean")) for row in rows
                        if row["config"] == config and "gap_mean" in row)
        line = gap_axes.errorbar([p[0] for p in points], [p[1] for p in points], yerr=[p[2] for p in points],
                                 marker="o", capsize=3, label=config)
        if fidelity:
            probed = [p for p in points if p[3] is not None]
            panels[0][1].plot([p[0] for p in probed], [p[3] for p in probed], marker="o",
                              color=line.lines[0].get_color(), label=config)
    gap_axes.axhline(0.0, color="grey", linewidth=0.8)
    gap_axes.set_xlabel("pipeline stages J")
    gap_axes.set_ylabel(f"gap to {baseline} (points)")
    gap_axes.legend(fontsize=8)
    if fidelity:
        panels[0][1].set_xlabel("pipeline stages J")
        panels[0][1].set_ylabel("mean cosine to the end-to-end gradient")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def earlier_rows(paths: list[Path], settings: dict, configs: list[str]) -> list[dict]:
    """The rows of earlier sweeps to draw beside this one's: same model, baseline, seeds and epochs (else a
    ValueError naming the file), leaving out the configurations this run measured."""
    rows = []
    for path in paths:
        earlier = json.loads(path.read_text())
        for key in ("model", "baseline", "seeds", "epochs"):
            if earlier["settings"][key] != settings[key]:
                raise ValueError(f"{path}: swept with {key} = {earlier['settings'][key]!r}, this run with "
                                 f"{settings[key]!r}: their gaps do not share a picture")
        rows += [row for row in earlier["rows"] if row["config"] not in configs]
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    settings = {"model": args.model, "stages": args.stages, "configs": args.configs, "baseline": args.configs[0],
                "seeds": args.seeds, "epochs": args.epochs, "fidelity_every": args.fidelity_every}
    drawn_with = earlier_rows(args.plot_with, settings, args.configs)  # refused before any run
    rows = sweep_rows(args.model, args.stages, args.configs, args.seeds, args.epochs, args.jobs, args.fidelity_every)
    if args.plot is not None:
        plot(drawn_with + rows, args.plot, f"{args.model} on digits: the gap against depth", args.configs[0])
    return write_results(results_path(args.out, "depth_sweep", args.quick), "depth_sweep", "depth_sweep.py", argv,
                         settings, rows=rows)


if __name__ == "__main__":
    main()
