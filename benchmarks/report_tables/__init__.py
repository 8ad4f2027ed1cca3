"""The tables `benchmarks/report.py` writes into the docs, one module per family of benchmarks.

A renderer takes a results file's JSON (and the marker's ARG, or None) and returns a markdown table; `@renders`
files it under the benchmark that wrote those results. compile.py and gpu.py render their own tables (they are
imported, with torch, only when one of their tables is asked for).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from . import accuracy, fidelity, memory, numerics, simulation, speed, throughput, throughput_rivals  # noqa: F401
from .base import REGISTRY, Missing, renders

__all__ = ["Missing", "RENDERERS", "renders"]


def _from_benchmark(module_name: str):
    def render(r, arg=None):
        benchmarks = str(Path(__file__).resolve().parent.parent)
        if benchmarks not in sys.path:
            sys.path.insert(0, benchmarks)
        return importlib.import_module(module_name).markdown_tables(r).rstrip("\n")

    return render


for _name in ("compile", "gpu"):
    renders(_name, "main")(_from_benchmark(_name))

RENDERERS = REGISTRY  # benchmark -> table name -> renderer
