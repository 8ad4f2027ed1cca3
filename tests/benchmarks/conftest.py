"""The benchmark scripts are files, not a package: load them by path (they find `benchmarks/common.py` themselves)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(spec.name, None)
        raise
    return module


def run_quick(name: str, out: Path, *flags: str) -> dict:
    """`python benchmarks/NAME.py --quick FLAGS --out OUT` in a process of its own, as a user runs it (the scripts
    that spawn ranks need their module importable by name there); returns the JSON it wrote."""
    subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick", *flags, "--out", str(out)],
                   check=True, capture_output=True, timeout=300)
    return json.loads(Path(out).read_text())


@pytest.fixture(scope="session")
def report():
    return load("report")


@pytest.fixture(scope="module")
def memory_benchmark():
    yield load("memory")
    sys.modules.pop("benchmark_memory", None)
