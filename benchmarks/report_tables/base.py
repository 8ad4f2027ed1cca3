"""What every table renderer shares: the registry of tables, access to a results file, and cell formatting."""

from __future__ import annotations

import statistics
from collections.abc import Callable

GB, MIB = 1e9, 2**20

# benchmark name (the "benchmark" field of its results file) -> table name -> renderer(results, arg)
REGISTRY: dict[str, dict[str, Callable]] = {}


def renders(benchmark: str, name: str):
    """Register the decorated function as table `name` of the results that `benchmark` writes."""

    def register(function: Callable) -> Callable:
        REGISTRY.setdefault(benchmark, {})[name] = function
        return function

    return register


class Missing(Exception):
    """The results file does not hold what the table needs (e.g. a partial run)."""


def need(mapping: dict, key):
    if key not in mapping:
        raise Missing(f"no {key!r}")
    return mapping[key]


def table(header: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    lines = ["| " + " | ".join(str(cell) for cell in row) + " |" for row in [header, *rows]]
    return "\n".join([lines[0], rule, *lines[1:]])


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def mib(size: float) -> str:
    return f"{size / MIB:.1f}"


def percent(fraction) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def summary(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def per_rank_median(rows: list[list[float]]) -> list[float]:
    """Median over repetitions of each rank's value (rows: one list of per-rank values per repetition)."""
    return [statistics.median(column) for column in zip(*rows)]
