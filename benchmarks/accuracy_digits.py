#!/usr/bin/env python
"""Final test accuracy of PETRA against backprop on the embedded scikit-learn digits (1437 train / 360 test).

    python benchmarks/accuracy_digits.py             # 6 configurations x 3 seeds x 12 epochs (~15 min)
    python benchmarks/accuracy_digits.py --quick     # 1 seed, 1 epoch (~1 min): accuracy_digits-quick.json
    python benchmarks/accuracy_digits.py --configs backprop petra-k2 --seeds 0 1 2 3 4 --out out.json
    python benchmarks/accuracy_digits.py --configs petra-k1 petra-k1@bf16 --baseline petra-k1 --out out.json
    python benchmarks/accuracy_digits.py --model revvit-tiny --configs backprop reversible_backprop petra --seeds 0
    python benchmarks/accuracy_digits.py --model revvit-tiny-petra --configs petra --processes 2 --out out.json
    python benchmarks/accuracy_digits.py --model revvit-tiny --configs backprop+layerscale \
        petra-k1+delay-scaled+layerscale --seeds 0 1 2 --jobs 6 --fidelity-every 30 --recipe-args='--warmup_steps 0.2'

Every run is the recipe's `run(argv)` (`recipes/train_revnet.py`, loaded with `runpy`) in this process, one after
the other, one intra-op thread (with `--processes N`: the recipe under `accelerate launch` on N processes of one
thread each, the README's main job, its metrics read back from the run's all_results.json and trainer_state.json);
only the mode and k change, and the learning rate follows the paper's linear
scaling (lr = 0.4 * 32 * k / 256); `--model revvit-tiny` trains the RevViT of `recipes/configs/digits_revvit_tiny.yaml`
(AdamW, its own learning rate and epochs) instead of the recipe's RevNet18, and `--model revvit-tiny-petra` the
same ViT under its PETRA recipe, `recipes/configs/digits_revvit_tiny_petra.yaml` (the file gives its settings and
why); both train for their file's epochs unless `--epochs` says otherwise. A configuration is `MODE` or `MODE-kN`
(e.g. `petra-k4`, `delayed`, `backprop-k2`), optionally with `+REMEDY` (one of `REMEDIES`, e.g. `petra-k1+predict`)
and `@PRECISION` (one of `PRECISIONS`, e.g. `petra-k1@bf16`); remedies combine (`petra-k1+delay-scaled+layerscale`).
`--jobs N` runs N runs at once, each in a process of its own; `--fidelity-every N` probes each run's gradient
fidelity (`GradientFidelityCallback`) and records its stages' mean cosine to the end-to-end gradient beside its
accuracy; `--recipe-args` gives every run more recipe flags. Setup and discussion:
docs/benchmarks-accuracy.md and docs/benchmarks-precision.md; tables: `python benchmarks/report.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Read when transformers / huggingface_hub are imported (by common, through petra_hub).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import transformers  # noqa: E402

from common import add_out_argument, load_average, progress, results_path, write_results  # noqa: E402
from petra_hub.engine import Mode  # noqa: E402

RECIPE = HERE.parent / "recipes" / "train_revnet.py"
ACCELERATE_CONFIG = HERE.parent / "accelerate_config.yaml"
CONFIGS = HERE.parent / "recipes" / "configs"
# The models compared, by name: the recipe arguments that pick one, its default epochs (None: its recipe file's) and
# whether it trains at the paper's SGD learning rate BASE_LR scaled by k (else at its recipe file's).
MODELS = {
    "revnet18": ([], 12.0, True),  # the recipe's default model (stream widths 16-128)
    # RevNet34's layout (3 + 4 + 6 + 3 blocks: up to J = 18) at the recipe's widths
    "revnet34": (["--model", "revnet34"], 12.0, True),
    "revvit-tiny": ([str(CONFIGS / "digits_revvit_tiny.yaml")], None, False),
    # RevViT-Ti's PETRA recipe (its stages, regularisers and epochs: the file, which says why)
    "revvit-tiny-petra": ([str(CONFIGS / "digits_revvit_tiny_petra.yaml")], None, False),
}

DEFAULT_CONFIGS = ["backprop", "reversible_backprop", "delayed", "petra-k1", "petra-k2", "petra-k4"]
MODES = tuple(Mode.names())
BASE_LR = 0.4  # with --petra_scale_lr: lr = 0.4 * micro_batch * k / 256
MICRO_BATCH = 32
BASELINE = "backprop"
# Precision policies by name: the recipe flags that select them (docs/precision.md).
PRECISIONS = {
    "fp32": [],
    "bf16": ["--bf16", "true"],
    "bf16-streams": ["--bf16", "true", "--petra_streams", "bf16"],
    "fp16": ["--fp16", "true"],
    "wire-bf16": ["--petra_message_dtype", "bf16"],
    "wire-fp16": ["--petra_message_dtype", "fp16"],
    "bf16-wire-bf16": ["--bf16", "true", "--petra_message_dtype", "bf16"],
}
# Remedies for the delay by name (docs/delay-remedies.md): the recipe flags that turn them on, after NO_REMEDY,
# which turns off the one the recipe has on by default, so that "petra-k1" is the paper's PETRA.
NO_REMEDY = ["--petra_weight_prediction", "0"]
REMEDIES = {
    "none": [],
    "predict": ["--petra_weight_prediction", "1"],
    "predict-half": ["--petra_weight_prediction", "0.5"],
    "delay-momentum": ["--petra_delay_momentum", "true"],
    "delay-warmup": ["--petra_delay_lr_warmup", "0.25"],
    # a synchronous start of one or two epochs of the digits at micro-batch 32 and k = 1 (45 steps an epoch)
    "sync45": ["--petra_synchronous_steps", "45"],
    "sync90": ["--petra_synchronous_steps", "90"],
    "layerscale": ["--layer_scale_init_value", "1e-4"],  # RevViT only
    "sync90-layerscale": ["--petra_synchronous_steps", "90", "--layer_scale_init_value", "1e-4"],
    # each stage's learning rate divided by its delay for the whole run (the delay-aware warm-up, never ending)
    "delay-scaled": ["--petra_delay_lr_warmup", "inf"],
    "delay-scaled-layerscale": ["--petra_delay_lr_warmup", "inf", "--layer_scale_init_value", "1e-4"],
}


def parse_config(name: str) -> tuple[str, int, str, str]:
    """MODE[-kN][+REMEDY...][@PRECISION]: 'petra-k4' -> ('petra', 4, 'fp32', 'none'); 'delayed' -> ('delayed', 1, ..);
    'petra-k1+predict@bf16' -> ('petra', 1, 'bf16', 'predict'); remedies combine in the order given:
    'petra-k1+delay-scaled+layerscale' -> ('petra', 1, 'fp32', 'delay-scaled+layerscale')."""
    name, _, precision = name.partition("@")
    precision = precision or "fp32"
    if precision not in PRECISIONS:
        raise argparse.ArgumentTypeError(f"unknown precision {precision!r}; precisions: {', '.join(PRECISIONS)}")
    name, *remedies = name.split("+")
    remedies = [remedy for remedy in remedies if remedy != "none"]
    for remedy in remedies:
        if remedy not in REMEDIES:
            raise argparse.ArgumentTypeError(f"unknown remedy {remedy!r}; remedies: {', '.join(REMEDIES)}")
    if len(set(remedies)) != len(remedies):
        raise argparse.ArgumentTypeError(f"a remedy is listed twice in {name}+{'+'.join(remedies)}")
    remedy = "+".join(remedies) or "none"
    mode, k = name, 1
    if "-k" in name:
        mode, _, digits = name.rpartition("-k")
        if not digits.isdigit() or int(digits) < 1:
            raise argparse.ArgumentTypeError(f"bad k in configuration {name!r} (expected MODE-kN, N >= 1)")
        k = int(digits)
    if mode not in MODES:
        raise argparse.ArgumentTypeError(f"unknown mode in configuration {name!r}; modes: {', '.join(MODES)}")
    return mode, k, precision, remedy


def config_name(value: str) -> str:
    mode, k, precision, remedy = parse_config(value)
    name = mode if k == 1 and mode != "petra" else f"{mode}-k{k}"
    name = name if remedy == "none" else f"{name}+{remedy}"
    return name if precision == "fp32" else f"{name}@{precision}"


def default_epochs(model: str) -> float:
    """The epochs a model trains for unless told otherwise: MODELS', or those its recipe file gives as the recipe
    itself reads it (the recipe's default where the file is silent)."""
    recipe_argv, epochs, _ = MODELS[model]
    if epochs is not None:
        return epochs
    from petra_hub.recipe import train as recipe

    return float(recipe.parse(recipe_argv)[2].num_train_epochs)


def run_config(run: dict) -> str:
    """The configuration name of a run record."""
    return config_name(f"{run['mode']}-k{run['k']}+{run.get('remedy', 'none')}@{run.get('precision', 'fp32')}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--configs", nargs="+", type=config_name, default=None, help=f"default: {' '.join(DEFAULT_CONFIGS)}"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=None, help="default 0 1 2 (quick: 0)")
    parser.add_argument("--model", choices=list(MODELS), default="revnet18", help="default revnet18")
    parser.add_argument("--epochs", type=float, default=None,
                        help="default 12 for revnet18, else the model's recipe file's (quick: 1)")
    parser.add_argument("--num-stages", type=int, default=None,
                        help="pipeline stages J (--petra_num_stages); default: the model recipe's")
    parser.add_argument("--baseline", type=config_name, default=BASELINE,
                        help=f"the configuration gaps are paired against (default {BASELINE})")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--processes", type=int, default=1,
                        help="run each recipe under accelerate launch on this many processes (default 1: in this "
                             "process)")
    parser.add_argument("--fidelity-every", type=int, default=0,
                        help="probe the gradient fidelity every this many steps (GradientFidelityCallback; default "
                             "0: off); each run then records its stages' mean cosine to the end-to-end gradient")
    parser.add_argument("--recipe-args", type=shlex.split, default=[],
                        help="more recipe flags for every run, last (so they win), e.g. "
                             "--recipe-args='--warmup_steps 0.2'")
    parser.add_argument("--jobs", type=int, default=1,
                        help="runs at once, each in its own process (default 1: one after the other, in this one)")
    parser.add_argument("--quick", action="store_true", help="1 seed, 1 epoch: a smoke test of the script")
    parser.add_argument("--verbose", action="store_true", help="show the Trainer's own log lines of every run")
    add_out_argument(parser, "accuracy_digits")
    args = parser.parse_args(argv)
    args.configs = args.configs or list(DEFAULT_CONFIGS)
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    args.epochs = args.epochs if args.epochs is not None else (1.0 if args.quick else default_epochs(args.model))
    if len(set(args.configs)) != len(args.configs):
        parser.error("a configuration is listed twice")
    if args.processes < 1:
        parser.error(f"--processes: expected a positive count, got {args.processes}")
    if args.jobs < 1:
        parser.error(f"--jobs: expected a positive count, got {args.jobs}")
    if args.processes > 1 and args.threads != 1:
        parser.error("--threads: launched runs have one thread per process (OMP_NUM_THREADS=1)")
    return args


def recipe_argv(
    mode: str, k: int, seed: int, epochs: float, output_dir: str, num_stages: int | None = None,
    precision: str = "fp32", remedy: str = "none", model: str = "revnet18",
) -> list[str]:
    stages = ["--petra_num_stages", str(num_stages)] if num_stages else []
    recipe, _, scaled_lr = MODELS[model]
    learning_rate = ["--learning_rate", str(BASE_LR), "--petra_scale_lr", "true"] if scaled_lr else []
    remedies = [flag for name in remedy.split("+") for flag in REMEDIES[name]]
    return recipe + stages + PRECISIONS[precision] + NO_REMEDY + remedies + learning_rate + [
        "--output_dir", output_dir,
        "--petra_mode", mode,
        "--gradient_accumulation_steps", str(k),
        "--per_device_train_batch_size", str(MICRO_BATCH),
        "--num_train_epochs", f"{epochs:g}",
        "--seed", str(seed),
        "--save_strategy", "no",
        "--eval_strategy", "no",
        "--disable_tqdm", "true",
        "--report_to", "none",
        "--log_level", "error",
        "--logging_strategy", "no",
    ]  # fmt: skip


def run_recipe(run, argv: list[str], verbose: bool = False):
    """The recipe's `run(argv)` -> (trainer, metrics). The Trainer prints its log dicts (PrinterCallback) and the save
    its progress bar: kept, and shown only on failure (or always with `verbose`)."""
    if verbose:
        return run(argv)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            return run(argv)
    except BaseException:
        sys.stderr.write(captured.getvalue())
        raise


def one_run(run, mode: str, k: int, seed: int, epochs: float, workdir: str, verbose: bool = False,
            num_stages: int | None = None, precision: str = "fp32", remedy: str = "none",
            model: str = "revnet18", processes: int = 1, fidelity_every: int = 0,
            extra: list[str] | None = None) -> dict:
    output_dir = tempfile.mkdtemp(prefix=f"{mode}-k{k}-s{seed}-", dir=workdir)
    argv = recipe_argv(mode, k, seed, epochs, output_dir, num_stages, precision, remedy, model) + (extra or [])
    if fidelity_every:
        argv += ["--petra_gradient_fidelity_steps", str(fidelity_every)]
    start = time.perf_counter()
    if processes > 1:
        stages, learning_rate, steps, metrics, history = launched_run(argv, processes, output_dir, verbose)
    else:
        trainer, metrics = run_recipe(run, argv, verbose)
        stages, learning_rate = len(trainer.stages), trainer.args.micro_batch_learning_rate()
        steps, history = trainer.state.global_step, trainer.state.log_history
    wall = time.perf_counter() - start
    history = [entry for entry in history if "train_loss" in entry]
    return {
        "model": model,
        "mode": mode,
        "k": k,
        "precision": precision,
        "remedy": remedy,
        "seed": seed,
        "epochs": epochs,
        "processes": processes,
        "num_stages": stages,
        "learning_rate": learning_rate,
        "optimizer_steps": steps,
        "test_accuracy": metrics["eval_accuracy"],
        "test_loss": metrics["eval_loss"],
        "train_loss": history[-1]["train_loss"] if history else None,
        "train_runtime_s": history[-1].get("train_runtime") if history else None,
        "wall_s": wall,
        **({"fidelity": fidelity_summary(Path(output_dir, "gradient_fidelity.json"))} if fidelity_every else {}),
    }


def fidelity_summary(path: Path) -> dict:
    """A run's gradient-fidelity probes (GradientFidelityCallback's history) -> per stage, the mean over the run of
    the cosine and of the norm ratio of its PETRA gradient to the end-to-end gradient, and their means over stages."""
    records = json.loads(path.read_text())["records"]
    stages = sorted({record["stage"] for record in records})
    summary = {"probes": len({record["step"] for record in records}), "stages": stages}
    for metric in ("cosine_true", "norm_ratio_true"):
        by_stage = [statistics.fmean(r[metric] for r in records if r["stage"] == stage) for stage in stages]
        summary[f"{metric}_by_stage"] = [round(value, 6) for value in by_stage]
        summary[f"{metric}_mean"] = round(statistics.fmean(by_stage), 6)
    return summary


def launched_run(argv: list[str], processes: int, output_dir: str, verbose: bool):
    """The recipe under `accelerate launch` on `processes` processes -> (stages, learning rate per micro-batch,
    optimizer steps, final metrics, log history), read back from the run's output_dir (JSON only)."""
    from petra_hub.recipe import train as recipe

    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIG),
               "--num_processes", str(processes), str(RECIPE), *argv]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, text=True, capture_output=not verbose)
    if done.returncode != 0:
        sys.stderr.write((done.stdout or "") + (done.stderr or ""))
        raise RuntimeError(f"the launched recipe failed (exit code {done.returncode}): {' '.join(command)}")
    folder = Path(output_dir)
    metrics = json.loads((folder / "all_results.json").read_text())
    state = json.loads((folder / "trainer_state.json").read_text())
    args = recipe.parse(argv)[2]
    return args.petra_num_stages, args.micro_batch_learning_rate(), state["global_step"], metrics, \
        state["log_history"]


def run_alone(model: str, config: str, seed: int, epochs: float, out: Path, *, num_stages: int | None = None,
              fidelity_every: int = 0, recipe_args: list[str] | None = None, processes: int = 1,
              threads: int = 1) -> dict:
    """One configuration and seed in a process of this script of its own, written to `out` -> what it wrote. A
    failed run raises with its output."""
    command = [sys.executable, str(Path(__file__).resolve()), "--model", model, "--configs", config, "--baseline",
               config, "--seeds", str(seed), "--epochs", f"{epochs:g}", "--processes", str(processes), "--threads",
               str(threads), "--fidelity-every", str(fidelity_every), "--out", str(out)]
    if num_stages:
        command += ["--num-stages", str(num_stages)]
    if recipe_args:
        command.append("--recipe-args=" + shlex.join(recipe_args))
    done = subprocess.run(command, env={**os.environ, "OMP_NUM_THREADS": str(threads)}, text=True,
                          capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"{config} seed {seed} failed (exit code {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(Path(out).read_text())


def parallel_runs(args: argparse.Namespace, plan: list[tuple], workdir: str):
    """Each planned run in its own process (`run_alone`), `args.jobs` at a time -> (configuration, run record) as
    each finishes. A failed run stops the whole measurement with its output."""
    from concurrent.futures import ThreadPoolExecutor, as_completed

    def one(index: int, name: str, seed: int) -> tuple[str, dict]:
        result = run_alone(args.model, name, seed, args.epochs, Path(workdir, f"run-{index}.json"),
                           num_stages=args.num_stages, fidelity_every=args.fidelity_every,
                           recipe_args=args.recipe_args, processes=args.processes, threads=args.threads)
        return name, result["runs"][0]

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(one, index, name, seed) for index, (name, *_, seed) in enumerate(plan)]
        for future in as_completed(futures):
            yield future.result()


def summarise(runs: list[dict], configs: list[str], baseline: str = BASELINE) -> list[dict]:
    by_config: dict[str, list[dict]] = {c: [] for c in configs}
    for r in runs:
        by_config[run_config(r)].append(r)
    base = {r["seed"]: r["test_accuracy"] for r in by_config.get(baseline, [])}
    rows = []
    for name, group in by_config.items():
        if not group:
            continue
        accs = [100 * r["test_accuracy"] for r in group]
        row = {
            "config": name,
            "mode": group[0]["mode"],
            "k": group[0]["k"],
            "precision": group[0].get("precision", "fp32"),
            "remedy": group[0].get("remedy", "none"),
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
        if all("fidelity" in r for r in group):
            row["cosine_true_mean"] = statistics.fmean(r["fidelity"]["cosine_true_mean"] for r in group)
            row["cosine_true_first_stage"] = statistics.fmean(r["fidelity"]["cosine_true_by_stage"][0] for r in group)
        paired = [100 * (r["test_accuracy"] - base[r["seed"]]) for r in group if r["seed"] in base]
        if paired and name != baseline:
            row["gap_mean"] = statistics.fmean(paired)
            row["gap_std"] = statistics.stdev(paired) if len(paired) > 1 else 0.0
            row["gap_min"], row["gap_max"] = min(paired), max(paired)
        rows.append(row)
    return rows


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    run = runpy.run_path(str(RECIPE))["run"]
    plan = [(name, *parse_config(name), seed) for seed in args.seeds for name in args.configs]
    scaled_lr = MODELS[args.model][2]
    rate = f"{BASE_LR} * {MICRO_BATCH} * k / 256" if scaled_lr else "the model's recipe file's"
    if args.baseline not in args.configs:
        progress(f"note: the baseline {args.baseline} is not among the configurations: no gaps")
    progress(
        f"{args.model}: {len(args.configs)} configurations x {len(args.seeds)} seeds, {args.epochs:g} epochs, "
        f"micro-batch {MICRO_BATCH}, lr = {rate}, "
        f"J = {args.num_stages or 'as in the recipe'}; "
        f"{args.processes} process(es) of {torch.get_num_threads()} thread(s), load average {load_average()}"
    )
    runs: list[dict] = []
    start = time.perf_counter()

    def report(index: int, name: str, r: dict) -> None:
        runs.append(r)
        progress(
            f"[{index}/{len(plan)}] {name:20s} seed {r['seed']}: test accuracy {100 * r['test_accuracy']:.2f} %, "
            f"lr {r['learning_rate']:g}, {r['optimizer_steps']} steps, {r['wall_s']:.1f} s (load {load_average()})"
        )

    with tempfile.TemporaryDirectory(prefix="petra-accuracy-") as workdir:
        if args.jobs > 1:
            for index, (name, r) in enumerate(parallel_runs(args, plan, workdir), 1):
                report(index, name, r)
        else:
            for index, (name, mode, k, precision, remedy, seed) in enumerate(plan, 1):
                report(index, name, one_run(run, mode, k, seed, args.epochs, workdir, args.verbose, args.num_stages,
                                            precision, remedy, args.model, args.processes,
                                            args.fidelity_every, args.recipe_args))
    order = [(name, seed) for name, *_, seed in plan]
    runs.sort(key=lambda r: order.index((run_config(r), r["seed"])))
    total = time.perf_counter() - start
    rows = summarise(runs, args.configs, args.baseline)
    for row in rows:
        progress(f"{row['config']:20s} test accuracy {row['mean']:.2f} ± {row['std']:.2f} %")
    progress(f"total wall time {total:.0f} s ({total / 60:.1f} min) for {len(runs)} runs")
    settings = {
        "model": args.model,
        "configs": args.configs,
        "baseline": args.baseline,
        "seeds": args.seeds,
        "epochs": args.epochs,
        "num_stages": runs[0]["num_stages"] if runs else None,
        "micro_batch": MICRO_BATCH,
        "base_learning_rate": BASE_LR if scaled_lr else None,  # else the model's recipe file's
        "petra_scale_lr": scaled_lr,
        "threads": torch.get_num_threads(),
        "processes": args.processes,
        "jobs": args.jobs,
        "fidelity_every": args.fidelity_every,
        "recipe_args": args.recipe_args,
        "transformers": transformers.__version__,
    }
    out = results_path(args.out, "accuracy_digits", args.quick)
    return write_results(
        out, "accuracy_digits", "accuracy_digits.py", argv, settings, runs=runs, summary=rows, total_wall_s=total
    )


if __name__ == "__main__":
    main()
