#!/usr/bin/env python
"""Final test accuracy of PETRA against backprop on the embedded scikit-learn digits (1437 train / 360 test).

    python benchmarks/accuracy_digits.py                     # 6 configurations x 3 seeds x 12 epochs (~20 min)
    python benchmarks/accuracy_digits.py --quick             # 1 seed, 1 epoch: checks that everything runs
    python benchmarks/accuracy_digits.py --configs backprop petra-k2 --seeds 0 1 2 3 4 --json out.json

Every run is the recipe's `run(argv)` (`recipes/train_revnet.py`, loaded with `runpy`), in this one process,
sequentially, one intra-op thread: the same small RevNet18 (widths 16,32,64,128, J = 10 pipeline stages), the
same data, the same number of epochs (so the same samples seen), micro-batch 32, SGD Nesterov 0.9, weight decay
5e-4, cosine schedule with 5 % linear warm-up. Only the training mode and k (`gradient_accumulation_steps`) change.

Learning rate: the paper's linear scaling, `--learning_rate 0.4 --petra_scale_lr true`, i.e.
lr = 0.4 * 32 * k / 256 = 0.05 * k (0.05 for every k = 1 row, the recipe's default). With k > 1 the same epochs
give k times fewer optimizer steps.

The seed (`--seed`) fixes both the initial weights and the data order / augmentation; for a given seed every
configuration starts from the same weights and reads the same micro-batches, so differences to backprop are also
reported paired by seed.

A configuration is `MODE` or `MODE-kN`, MODE one of backprop, reversible_backprop, delayed, input_buffer,
weight_stash, petra (e.g. `petra-k4`, `delayed`, `backprop-k2`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import runpy
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "train_revnet.py"

DEFAULT_CONFIGS = ["backprop", "reversible_backprop", "delayed", "petra-k1", "petra-k2", "petra-k4"]
MODES = ("backprop", "reversible_backprop", "delayed", "input_buffer", "weight_stash", "petra")
BASE_LR = 0.4  # with --petra_scale_lr: lr = 0.4 * micro_batch * k / 256
MICRO_BATCH = 32
BASELINE = "backprop"


def parse_config(name: str) -> tuple[str, int]:
    """'petra-k4' -> ('petra', 4); 'delayed' -> ('delayed', 1)."""
    mode, k = name, 1
    if "-k" in name:
        mode, _, digits = name.rpartition("-k")
        if not digits.isdigit() or int(digits) < 1:
            raise argparse.ArgumentTypeError(f"bad k in configuration {name!r} (expected MODE-kN, N >= 1)")
        k = int(digits)
    if mode not in MODES:
        raise argparse.ArgumentTypeError(f"unknown mode in configuration {name!r}; modes: {', '.join(MODES)}")
    return mode, k


def config_name(value: str) -> str:
    mode, k = parse_config(value)
    return mode if k == 1 and mode != "petra" else f"{mode}-k{k}"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--configs", nargs="+", type=config_name, default=None, help=f"default: {' '.join(DEFAULT_CONFIGS)}"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default 0 1 2 (quick: 0)")
    parser.add_argument("--epochs", type=float, default=None, help="default 12 (quick: 1)")
    parser.add_argument(
        "--num-stages", type=int, default=None, help="pipeline stages J (--petra_num_stages); default: the model's 10"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 1 epoch: a smoke test of the script")
    parser.add_argument("--verbose", action="store_true", help="show the Trainer's own log lines of every run")
    parser.add_argument("--json", type=Path, default=None, help="write every run and the summary here")
    args = parser.parse_args(argv)
    args.configs = args.configs or list(DEFAULT_CONFIGS)
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    args.epochs = args.epochs if args.epochs is not None else (1.0 if args.quick else 12.0)
    if len(set(args.configs)) != len(args.configs):
        parser.error("a configuration is listed twice")
    return args


def recipe_argv(
    mode: str, k: int, seed: int, epochs: float, output_dir: str, num_stages: int | None = None
) -> list[str]:
    stages = ["--petra_num_stages", str(num_stages)] if num_stages else []
    return stages + [
        "--output_dir", output_dir,
        "--petra_mode", mode,
        "--gradient_accumulation_steps", str(k),
        "--per_device_train_batch_size", str(MICRO_BATCH),
        "--learning_rate", str(BASE_LR),
        "--petra_scale_lr", "true",
        "--num_train_epochs", f"{epochs:g}",
        "--seed", str(seed),
        "--save_strategy", "no",
        "--eval_strategy", "no",
        "--disable_tqdm", "true",
        "--report_to", "none",
        "--log_level", "error",
        "--logging_strategy", "no",
    ]  # fmt: skip


def one_run(run, mode: str, k: int, seed: int, epochs: float, workdir: str, verbose: bool = False,
            num_stages: int | None = None) -> dict:
    output_dir = tempfile.mkdtemp(prefix=f"{mode}-k{k}-s{seed}-", dir=workdir)
    argv = recipe_argv(mode, k, seed, epochs, output_dir, num_stages)
    start = time.perf_counter()
    if verbose:
        trainer, metrics = run(argv)
    else:
        # The Trainer prints its log dicts (PrinterCallback) and the save its progress bar: kept, shown on failure.
        captured = io.StringIO()
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                trainer, metrics = run(argv)
        except BaseException:
            sys.stderr.write(captured.getvalue())
            raise
    wall = time.perf_counter() - start
    history = [entry for entry in trainer.state.log_history if "train_loss" in entry]
    return {
        "mode": mode,
        "k": k,
        "seed": seed,
        "epochs": epochs,
        "num_stages": len(trainer.stages),
        "learning_rate": trainer._learning_rate(),
        "optimizer_steps": trainer.state.global_step,
        "test_accuracy": metrics["eval_accuracy"],
        "test_loss": metrics["eval_loss"],
        "train_loss": history[-1]["train_loss"] if history else None,
        "train_runtime_s": history[-1].get("train_runtime") if history else None,
        "wall_s": wall,
    }


def summarise(runs: list[dict], configs: list[str]) -> list[dict]:
    by_config: dict[str, list[dict]] = {c: [] for c in configs}
    for r in runs:
        by_config[config_name(f"{r['mode']}-k{r['k']}")].append(r)
    base = {r["seed"]: r["test_accuracy"] for r in by_config.get(BASELINE, [])}
    rows = []
    for name, group in by_config.items():
        if not group:
            continue
        accs = [100 * r["test_accuracy"] for r in group]
        row = {
            "config": name,
            "mode": group[0]["mode"],
            "k": group[0]["k"],
            "learning_rate": group[0]["learning_rate"],
            "optimizer_steps": group[0]["optimizer_steps"],
            "seeds": [r["seed"] for r in group],
            "accuracies": accs,
            "mean": statistics.fmean(accs),
            "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
            "min": min(accs),
            "max": max(accs),
            "mean_wall_s": statistics.fmean(r["wall_s"] for r in group),
        }
        paired = [100 * (r["test_accuracy"] - base[r["seed"]]) for r in group if r["seed"] in base]
        if paired and name != BASELINE:
            row["gap_mean"] = statistics.fmean(paired)
            row["gap_std"] = statistics.stdev(paired) if len(paired) > 1 else 0.0
            row["gap_min"], row["gap_max"] = min(paired), max(paired)
        rows.append(row)
    return rows


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| configuration | mode | k | lr | optimizer steps | test accuracy % (mean ± std) | min | max | per seed "
        "| gap to backprop (pts, paired mean ± std) | s / run |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for r in rows:
        if "gap_mean" in r:
            gap = f"{r['gap_mean']:+.2f} ± {r['gap_std']:.2f}"
        else:
            gap = "(reference)" if r["config"] == BASELINE else "n/a"
        per_seed = ", ".join(f"{a:.2f}" for a in r["accuracies"])
        lines.append(
            f"| {r['config']} | {r['mode']} | {r['k']} | {r['learning_rate']:g} | {r['optimizer_steps']} | "
            f"{r['mean']:.2f} ± {r['std']:.2f} | {r['min']:.2f} | {r['max']:.2f} | {per_seed} | {gap} | "
            f"{r['mean_wall_s']:.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    run = runpy.run_path(str(RECIPE))["run"]
    plan = [(name, *parse_config(name), seed) for seed in args.seeds for name in args.configs]
    print(
        f"# {len(args.configs)} configurations x {len(args.seeds)} seeds, {args.epochs:g} epochs, "
        f"micro-batch {MICRO_BATCH}, lr = {BASE_LR} * {MICRO_BATCH} * k / 256, "
        f"J = {args.num_stages or 'model default'}; torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    runs: list[dict] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="petra-accuracy-") as workdir:
        for index, (name, mode, k, seed) in enumerate(plan, 1):
            r = one_run(run, mode, k, seed, args.epochs, workdir, args.verbose, args.num_stages)
            runs.append(r)
            print(
                f"[{index}/{len(plan)}] {name:20s} seed {seed}: test accuracy {100 * r['test_accuracy']:.2f} %, "
                f"lr {r['learning_rate']:g}, {r['optimizer_steps']} steps, {r['wall_s']:.1f} s "
                f"(load {os.getloadavg()[0]:.2f})",
                flush=True,
            )
    total = time.perf_counter() - start
    rows = summarise(runs, args.configs)
    table = markdown_table(rows)
    print()
    print(table)
    print(f"\ntotal wall time {total:.0f} s ({total / 60:.1f} min) for {len(runs)} runs")
    if args.json:
        payload = {
            "settings": {
                "configs": args.configs,
                "seeds": args.seeds,
                "epochs": args.epochs,
                "num_stages": runs[0]["num_stages"] if runs else None,
                "micro_batch": MICRO_BATCH,
                "base_learning_rate": BASE_LR,
                "petra_scale_lr": True,
                "threads": torch.get_num_threads(),
                "cpus": os.cpu_count(),
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "python": platform.python_version(),
                "argv": sys.argv,
            },
            "runs": runs,
            "summary": rows,
            "total_wall_s": total,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
