#!/usr/bin/env python
"""A screen of delay remedies and settings: one `accuracy_digits.py` run per line of a plan, many at once, gathered
into one JSON with each run's accuracy and gradient fidelity, and each setting's mean over its seeds.

    python benchmarks/remedy_screen.py benchmarks/plans/revvit_tiny_remedies.txt --jobs 16
    python benchmarks/remedy_screen.py PLAN --gather DIR [DIR ...]   # runs made elsewhere (their per-line JSONs)
    python benchmarks/remedy_screen.py PLAN --merge JSON [JSON ...]  # runs from earlier screens, summarised anew
    python benchmarks/remedy_screen.py PLAN ... --plot PNG            # and the gap against J, one line per setting

A plan line is `NAME MODEL CONFIG SEED EPOCHS [RECIPE FLAGS ...]`: a unique name, an accuracy_digits model and
configuration (`petra-k1+delay-scaled+layerscale`), the seed, the epochs, and recipe flags given last, so that they
win (`--learning_rate 2e-3 --petra_num_stages 8`); `#` starts a comment. Every run is one process of one thread,
with the gradient fidelity probed every `--fidelity-every` steps. A setting is (model, configuration, epochs,
stages, flags); its row holds the seeds' accuracies, mean and mean cosine to the end-to-end gradient, and, where
the plan has the baseline setting (`--baseline`: a configuration and its flags, if any, as in the plan; backprop at
the same stages) for the same seeds, the paired gap.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import accuracy_digits  # noqa: E402
from common import add_out_argument, progress, results_path, write_results  # noqa: E402


def read_plan(path: Path) -> list[dict]:
    lines = []
    for number, text in enumerate(path.read_text().splitlines(), 1):
        words = shlex.split(text, comments=True)
        if not words:
            continue
        if len(words) < 5:
            raise ValueError(f"{path}:{number}: expected NAME MODEL CONFIG SEED EPOCHS [RECIPE FLAGS ...], got "
                             f"{text!r}")
        name, model, config, seed, epochs, *flags = words
        lines.append({"name": name, "model": model, "config": config, "seed": int(seed), "epochs": float(epochs),
                      "recipe_args": flags})
    names = [line["name"] for line in lines]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: a name is used twice")
    return lines


def run_line(line: dict, folder: Path, fidelity_every: int) -> Path:
    out = folder / f"{line['name']}.json"
    result = accuracy_digits.run_alone(line["model"], line["config"], line["seed"], line["epochs"], out,
                                       fidelity_every=fidelity_every, recipe_args=line["recipe_args"])
    progress(f"{line['name']}: {100 * result['runs'][0]['test_accuracy']:.2f} %")
    return out


def gather(plan: list[dict], folders: list[Path]) -> list[dict]:
    """The plan's run records, read from the per-line JSONs in `folders` (each line's name, first found)."""
    records = []
    for line in plan:
        found = [folder / f"{line['name']}.json" for folder in folders if (folder / f"{line['name']}.json").exists()]
        if not found:
            raise FileNotFoundError(f"no result for plan line {line['name']!r} in {', '.join(map(str, folders))}")
        result = json.loads(found[0].read_text())
        if result["settings"].get("recipe_args", []) != line["recipe_args"]:
            raise ValueError(f"{found[0]} ran with {result['settings'].get('recipe_args', [])}, the plan says "
                             f"{line['recipe_args']}")
        run = result["runs"][0]
        fidelity = run.get("fidelity", {})
        records.append({**line, "num_stages": run["num_stages"], "test_accuracy": 100 * run["test_accuracy"],
                        "cosine_true_mean": fidelity.get("cosine_true_mean"),
                        "cosine_true_first_stage": (fidelity.get("cosine_true_by_stage") or [None])[0],
                        "learning_rate": run["learning_rate"], "optimizer_steps": run["optimizer_steps"],
                        "wall_s": run["wall_s"], "machine": result["machine"]})
    return records


def merge(plan: list[dict], screens: list[Path]) -> list[dict]:
    """The plan's run records, taken from earlier screens' JSONs (each line's name, first found), where the screen
    ran the same model, configuration, seed, epochs and flags."""
    runs = {}
    for screen in screens:
        for run in json.loads(screen.read_text())["runs"]:
            runs.setdefault(run["name"], run)
    records = []
    for line in plan:
        run = runs.get(line["name"])
        if run is None:
            raise FileNotFoundError(f"no run named {line['name']!r} in {', '.join(map(str, screens))}")
        differs = [key for key in line if run.get(key) != line[key]]
        if differs:
            raise ValueError(f"run {line['name']!r} differs from the plan in {', '.join(differs)}")
        records.append(run)
    return records


def setting_of(record: dict) -> tuple:
    flags = list(record["recipe_args"])
    if "--petra_num_stages" in flags:  # the stages are a column of their own
        at = flags.index("--petra_num_stages")
        del flags[at:at + 2]
    return record["model"], record["config"], record["epochs"], record["num_stages"], " ".join(flags)


def split_baseline(baseline: str) -> tuple[str, str]:
    """`--baseline`'s configuration and flags: 'backprop+layerscale --qk_norm true' -> the two, as rows hold them."""
    config, *flags = shlex.split(baseline)
    return config, " ".join(flags)


def summarise(records: list[dict], base_config: str, base_flags: str = "") -> list[dict]:
    """One row per setting; gaps paired by seed with the setting (base_config, base_flags) at the same stages."""
    settings: dict[tuple, list[dict]] = {}
    for record in records:
        settings.setdefault(setting_of(record), []).append(record)
    rows = []
    for (model, config, epochs, stages, flags), group in settings.items():
        accuracies = [r["test_accuracy"] for r in group]
        cosines = [r["cosine_true_mean"] for r in group if r["cosine_true_mean"] is not None]
        row = {"model": model, "config": config, "epochs": epochs, "stages": stages, "flags": flags,
               "seeds": [r["seed"] for r in group], "accuracies": accuracies, "mean": statistics.fmean(accuracies),
               "std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
               "cosine_true_mean": statistics.fmean(cosines) if cosines else None}
        base = {r["seed"]: r["test_accuracy"] for key, rs in settings.items() for r in rs
                if key == (model, base_config, epochs, stages, base_flags)}
        paired = [r["test_accuracy"] - base[r["seed"]] for r in group if r["seed"] in base]
        if paired and (config, flags) != (base_config, base_flags):
            row["gap_mean"] = statistics.fmean(paired)
            row["gap_std"] = statistics.stdev(paired) if len(paired) > 1 else 0.0
            row["gap_seeds"] = [r["seed"] for r in group if r["seed"] in base]
        rows.append(row)
    return rows


def plot_against_depth(rows: list[dict], path: Path, title: str, baseline: str) -> None:
    """depth_sweep.py's picture of a screen: the gap against J and the fidelity, one line per setting (its
    configuration and flags), for the settings paired with the baseline."""
    import depth_sweep

    lines = [{**row, "config": f"{row['config']} {row['flags']}".strip()} for row in rows if "gap_mean" in row]
    depth_sweep.plot(lines, path, title, baseline)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("plan", type=Path)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once (default: the CPUs)")
    parser.add_argument("--fidelity-every", type=int, default=30, help="probe every this many steps (default 30)")
    parser.add_argument("--baseline", default="backprop+layerscale",
                        help="the setting gaps are paired against: a configuration, and the recipe flags its plan "
                             "lines give, if any (default backprop+layerscale)")
    parser.add_argument("--gather", type=Path, nargs="+", default=None,
                        help="read the per-line JSONs of runs made elsewhere instead of running the plan")
    parser.add_argument("--merge", type=Path, nargs="+", default=None,
                        help="take the plan's runs from earlier screens' JSONs instead of running them")
    parser.add_argument("--plot", type=Path, default=None, help="also draw the gap against J into this PNG")
    add_out_argument(parser, "remedy_screen")
    args = parser.parse_args(argv)
    plan = read_plan(args.plan)
    if args.gather:
        records = gather(plan, args.gather)
    elif args.merge:
        records = merge(plan, args.merge)
    else:
        with tempfile.TemporaryDirectory(prefix="petra-screen-") as folder:
            with ThreadPoolExecutor(max_workers=args.jobs) as pool:
                list(pool.map(lambda line: run_line(line, Path(folder), args.fidelity_every), plan))
            records = gather(plan, [Path(folder)])
    base_config, base_flags = split_baseline(args.baseline)
    baseline = f"{base_config} {base_flags}".strip()  # as the rows write a setting, for the report's tables
    rows = summarise(records, base_config, base_flags)
    for row in rows:
        gap = f", gap {row['gap_mean']:+.2f}" if "gap_mean" in row else ""
        progress(f"{row['config']} J={row['stages']} {row['flags'] or '-'}: {row['mean']:.2f} % over seeds "
                 f"{row['seeds']}{gap}")
    if args.plot is not None:
        plot_against_depth(rows, args.plot, f"{args.plan.stem}: the gap against depth", baseline)
    settings = {"plan": str(args.plan), "fidelity_every": args.fidelity_every, "baseline": baseline,
                "gathered_from": [str(path) for path in args.gather or args.merge or []] or None}
    return write_results(results_path(args.out, "remedy_screen", False), "remedy_screen", "remedy_screen.py", argv,
                         settings, runs=records, rows=rows)


if __name__ == "__main__":
    main()
