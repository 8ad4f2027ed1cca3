"""Run the README's main command from a fresh clone and record its wall time and test accuracy, beside the same job
in the engine's `backprop` mode (what the same processes do without PETRA's pipelining).

    python benchmarks/main_job.py                 # benchmarks/results/main_job.json (about 5 min on 2 cores)
    python benchmarks/main_job.py --install       # also run the command's `pip install -e .` in the clone
    python benchmarks/main_job.py --repeats 1 --modes petra    # the README's job once

The command is read from README.md (the first `accelerate launch` line of its set-up section), so the figures
recorded here are those of the command a reader copies. The clone is `git clone` of this checkout's HEAD into a
temporary folder: uncommitted changes are not measured. Without `--install` the clone's `src/` goes first on
PYTHONPATH instead, so the installed environment is left as it is. Wall time is the launch's, start to exit, as a
reader would time it; the accuracy is the `eval_accuracy` the recipe writes to `eval_results.json`. Each mode other
than PETRA runs the same command with `--petra_mode MODE` added (the same processes, data, epochs, evaluations and
saves); the modes alternate, `--repeats` times, and the summary gives each mode's median wall time and the median
of the paired ratios to PETRA's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def readme_main_command(readme: Path = ROOT / "README.md") -> str:
    """The README's main command: the first bash line that runs `accelerate launch`."""
    for block in re.findall(r"```bash\n(.*?)```", readme.read_text(), flags=re.S):
        for line in block.splitlines():
            if "accelerate launch" in line:
                return line.strip()
    raise SystemExit("README.md has no `accelerate launch` command")


def run_once(launch: str, clone: Path, env: dict, mode: str) -> dict:
    """One launch of the job in `mode` (PETRA: the README's command as it is), into a fresh output folder."""
    command = launch if mode == "petra" else f"{launch} --petra_mode {mode}"
    outputs = clone / "outputs"
    if outputs.exists():
        shutil.rmtree(outputs)
    start = time.perf_counter()
    subprocess.run(command, shell=True, cwd=clone, env=env, check=True)
    wall = time.perf_counter() - start
    (evaluation,) = outputs.glob("*/eval_results.json")
    return {"wall_s": wall, "accuracy": 100 * json.loads(evaluation.read_text())["eval_accuracy"]}


def run(install: bool, modes: list[str], repeats: int) -> dict:
    command = readme_main_command()
    launch = command if install else command.split("&&", 1)[-1].strip()
    runs = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as folder:
        clone = Path(folder) / "petra_hub"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout
        env = dict(os.environ)
        if not install:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(clone / "src"), env.get("PYTHONPATH")]))
        for repeat in range(repeats):
            for mode in modes if repeat % 2 == 0 else modes[::-1]:
                runs[mode].append(run_once(launch, clone, env, mode))
                print(f"{mode}, run {repeat + 1}: {runs[mode][-1]['wall_s']:.1f} s", flush=True)
    petra = runs["petra"]
    result = {
        "benchmark": "main_job",
        "command": "python benchmarks/main_job.py" + (" --install" if install else ""),
        "measured_command": launch,
        "commit": commit.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "note": "wall time of the README's main command in a fresh clone, launch to exit (median over the repeats); "
        "accuracy on the 360 digits test images, as the recipe's eval_results.json reports it",
        "repeats": repeats,
        "wall_s": statistics.median(r["wall_s"] for r in petra),
        "accuracy": petra[0]["accuracy"],
        "modes": {mode: {"wall_s": statistics.median(r["wall_s"] for r in results),
                         "runs": results,
                         "petra_speedup": statistics.median(r["wall_s"] / p["wall_s"] for r, p in zip(results, petra))}
                  for mode, results in runs.items()},
    }
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", action="store_true", help="run the command's pip install step too")
    parser.add_argument("--out", type=Path, default=RESULTS / "main_job.json")
    parser.add_argument("--modes", default="petra,backprop", help="engine modes to run the job in (petra first)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    if modes[0] != "petra":
        parser.error("--modes must start with petra, the README's job")
    result = run(args.install, modes, args.repeats)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['wall_s']:.1f} s, {result['accuracy']:.2f}% -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
