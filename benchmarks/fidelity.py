#!/usr/bin/env python
r"""Gradient fidelity over training (the paper's Figures 5 and 6) on the embedded digits.

    python benchmarks/fidelity.py            # RevNet18, J = 10, PETRA k = 1, 12 epochs, 15 probes per epoch (~2 min)
    python benchmarks/fidelity.py --quick    # 1 epoch: fidelity-quick.json, no pictures
    python benchmarks/fidelity.py --seeds 0 1 2 --every 3
    python benchmarks/fidelity.py --seeds 0 1 2 --remedy predict --no-pictures \
        --out benchmarks/results/fidelity_predict.json

Each run is the recipe (`recipes/train_revnet.py`, as in accuracy_digits.py: micro-batch 32, lr 0.05, cosine
schedule) with `--petra_gradient_fidelity_steps EVERY`, i.e. `GradientFidelityCallback`: the first micro-batch of
every EVERY-th step is probed, and each stage's PETRA gradient for it is compared with the end-to-end gradient at
the current weights and with the delayed gradient with stashed weights (definitions: docs/fidelity.md). As in the
paper's Figure 5 there is no accumulation (k = 1), to show the delay at its largest. Writes
benchmarks/results/fidelity.json (every record) and, unless --quick, docs/images/fidelity-over-training.png and
docs/images/fidelity-by-stage.png; the table: `python benchmarks/report.py`.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from accuracy_digits import RECIPE, REMEDIES, recipe_argv, run_recipe  # noqa: E402
from common import add_out_argument, load_average, progress, results_path, write_results  # noqa: E402
from report_tables.fidelity import run_records  # noqa: E402
from petra_hub.training import GradientFidelityCallback  # noqa: E402

IMAGES = HERE.parent / "docs" / "images"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--epochs", type=float, default=None, help="default 12 (quick: 1)")
    parser.add_argument("--every", type=int, default=3, help="probe every this many steps (default 3: 15 per epoch)")
    parser.add_argument("--mode", default="petra", help="the pipeline's mode (default petra)")
    parser.add_argument("--remedy", choices=list(REMEDIES), default="none",
                        help="a delay remedy of accuracy_digits.py (default none)")
    parser.add_argument("--no-pictures", action="store_true", help="write the JSON only")
    parser.add_argument("--quick", action="store_true", help="1 epoch, no pictures: a smoke test of the script")
    parser.add_argument("--images", type=Path, default=IMAGES, help="where the pictures go (default docs/images)")
    add_out_argument(parser, "fidelity")
    args = parser.parse_args(argv)
    args.epochs = args.epochs if args.epochs is not None else (1.0 if args.quick else 12.0)
    return args


def one_run(run, mode: str, seed: int, epochs: float, every: int, workdir: str, remedy: str = "none") -> dict:
    output_dir = tempfile.mkdtemp(prefix=f"fidelity-s{seed}-", dir=workdir)
    argv = recipe_argv(mode, 1, seed, epochs, output_dir, remedy=remedy)
    argv += ["--petra_gradient_fidelity_steps", str(every)]
    start = time.perf_counter()
    trainer, metrics = run_recipe(run, argv)
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, GradientFidelityCallback)]
    columns = list(callback.history[0]) if callback.history else []
    return {"seed": seed, "test_accuracy": metrics["eval_accuracy"], "optimizer_steps": trainer.state.global_step,
            "num_stages": len(trainer.stages), "wall_s": time.perf_counter() - start,
            "columns": columns, "rows": [[round(r[c], 6) for c in columns] for r in callback.history]}


def draw(result: dict, images: Path) -> list[Path]:
    from petra_hub.plots import plot_fidelity_by_stage, plot_fidelity_history

    run = result["runs"][0]
    history = run_records(run)
    settings = result["settings"]
    mode = "PETRA" if settings["mode"] == "petra" else settings["mode"]
    what = f"RevNet18 on digits, J = {run['num_stages']}, {mode} k = 1, seed {run['seed']}"
    epochs = int(settings["epochs"])
    marks = sorted({1, max(1, epochs // 3), max(1, 2 * epochs // 3), epochs})
    return [
        plot_fidelity_history(history, images / "fidelity-over-training.png",
                              f"Gradient fidelity per stage over training (epoch means), {what}"),
        plot_fidelity_by_stage(history, images / "fidelity-by-stage.png", marks,
                               f"Cosine similarities by stage, {what}"),
    ]


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    run = runpy.run_path(str(RECIPE))["run"]
    runs = []
    with tempfile.TemporaryDirectory(prefix="petra-fidelity-") as workdir:
        for seed in args.seeds:
            runs.append(one_run(run, args.mode, seed, args.epochs, args.every, workdir, args.remedy))
            r = runs[-1]
            progress(f"seed {seed}: {len(r['rows'])} records, test accuracy {100 * r['test_accuracy']:.2f} %, "
                     f"{r['wall_s']:.1f} s (load {load_average()})")
    settings = {"mode": args.mode, "k": 1, "remedy": args.remedy, "epochs": args.epochs, "every_n_steps": args.every,
                "seeds": args.seeds, "threads": 1}
    result = write_results(results_path(args.out, "fidelity", args.quick), "fidelity", "fidelity.py", argv, settings,
                           runs=runs)
    if not (args.quick or args.no_pictures):
        for path in draw(result, args.images):
            progress(f"wrote {path}")
    return result


if __name__ == "__main__":
    main()
