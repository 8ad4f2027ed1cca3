"""The repository passes its own lint settings (pyproject.toml [tool.ruff]): no line over 120 characters, no unused
or undefined name."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    checked = ["src", "tests", "benchmarks", "recipes", "examples", "setup.py"]
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *checked], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
