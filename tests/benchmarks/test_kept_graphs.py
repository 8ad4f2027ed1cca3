"""benchmarks/kept_graphs.py --quick: every method measured, the budget between the two extremes, the table renders."""

import pytest

from .conftest import run_quick


@pytest.mark.benchmark_run
def test_quick_run(tmp_path, report):
    out = tmp_path / "kept_graphs.json"
    result = run_quick("kept_graphs", out, "--repeats", "1", "--micro-batches", "2")
    assert result["recomputing"] == [0, 3, 5, 7] and result["kept"]["petra_kept"] == [0, 3, 5, 7]
    assert result["kept"]["petra_all_kept"] == list(range(9))
    assert result["kept"]["petra"] == [] and set() < set(result["kept"]["petra_budget"]) < set(range(9))
    held = result["held_bytes"]
    assert held["backprop"] == 0 < held["petra"] < held["petra_kept"] < held["petra_all_kept"]
    assert held["petra"] <= held["petra_budget"] <= result["budget_bytes"]  # the budget counts what memory() reads
    assert all(value > 0 for value in result["median_s"].values())
    # the plain loops are the reference: a window over itself is 1, and nothing is held between their steps
    assert result["ratio_to_plain"]["plain"] == 1.0 and result["ratio_to_backprop"]["backprop"] == 1.0
    assert held["plain"] == held["plain_second_forward"] == 0
    peak = result["peak_bytes"]  # within a tick, after each operation: at least what is held between ticks
    assert all(peak[name] >= held[name] for name in peak) and peak["backprop"] > 0
    table = report.render("kept_graphs/main", tmp_path)
    assert "PETRA, stored-input stages' graphs kept | 0, 3, 5, 7 |" in table
    assert "PETRA, every stage's graph kept | 0, 1, 2, 3, 4, 5, 6, 7, 8 |" in table
    assert "| plain torch loop (the reference) | - |" in table
