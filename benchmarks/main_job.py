"""Run the README's main command from a fresh clone and record its wall time and test accuracy.

    python benchmarks/main_job.py                 # benchmarks/results/main_job.json (about 1 min on 2 cores)
    python benchmarks/main_job.py --install       # also run the command's `pip install -e .` in the clone

The command is read from README.md (the first `accelerate launch` line of its set-up section), so the figures
recorded here are those of the command a reader copies. The clone is `git clone` of this checkout's HEAD into a
temporary folder: uncommitted changes are not measured. Without `--install` the clone's `src/` goes first on
PYTHONPATH instead, so the installed environment is left as it is. Wall time is the launch's, start to exit, as a
reader would time it; the accuracy is the `eval_accuracy` the recipe writes to `eval_results.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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


def run(install: bool) -> dict:
    command = readme_main_command()
    launch = command if install else command.split("&&", 1)[-1].strip()
    with tempfile.TemporaryDirectory() as folder:
        clone = Path(folder) / "petra_hub"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout
        env = dict(os.environ)
        if not install:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(clone / "src"), env.get("PYTHONPATH")]))
        start = time.perf_counter()
        subprocess.run(launch, shell=True, cwd=clone, env=env, check=True)
        wall = time.perf_counter() - start
        outputs = clone / "outputs"
        (evaluation,) = outputs.glob("*/eval_results.json")
        accuracy = json.loads(evaluation.read_text())["eval_accuracy"]
    return {
        "benchmark": "main_job",
        "command": "python benchmarks/main_job.py" + (" --install" if install else ""),
        "measured_command": launch,
        "commit": commit.strip(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"nproc": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "note": "wall time of the README's main command in a fresh clone, launch to exit; accuracy on the 360 "
        "digits test images, as the recipe's eval_results.json reports it",
        "wall_s": wall,
        "accuracy": 100 * accuracy,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--install", action="store_true", help="run the command's pip install step too")
    parser.add_argument("--out", type=Path, default=RESULTS / "main_job.json")
    args = parser.parse_args(argv)
    result = run(args.install)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['wall_s']:.1f} s, {result['accuracy']:.2f}% -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
