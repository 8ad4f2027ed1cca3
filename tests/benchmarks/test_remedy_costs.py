"""benchmarks/remedy_costs.py --quick: every remedy measured beside PETRA, its own state counted, the table renders."""

import pytest

from .conftest import run_quick


@pytest.mark.benchmark_run
def test_quick_run(tmp_path, report):
    out = tmp_path / "remedy_costs.json"
    result = run_quick("remedy_costs", out, "--repeats", "1", "--updates", "2")
    held, within = result["held"], result["peak_within_bytes"]
    assert result["ratio_to_petra"]["petra"] == 1.0 and all(t > 0 for t in result["median_s"].values())
    # weight prediction keeps one copy of every stage's weights but the last's; delay-matched momentum keeps nothing
    assert held["petra"]["remedy_bytes"] == held["delay-momentum"]["remedy_bytes"] == 0
    assert held["predict-half"]["remedy_bytes"] == held["predict-half+delay-momentum"]["remedy_bytes"] > 0
    assert held["predict-half"]["total_bytes"] == held["petra"]["total_bytes"] + held["predict-half"]["remedy_bytes"]
    assert held["delay-momentum"]["total_bytes"] == held["petra"]["total_bytes"]
    # inside its operations a predicting stage also holds the predicted weights of the forward it runs
    assert within["predict-half"] > within["petra"] + held["predict-half"]["remedy_bytes"]
    # micro-batches of 8 hold a quarter of the activations of micro-batches of 32
    assert held["k4-over-8"]["total_bytes"] < held["petra"]["total_bytes"]
    table = report.render("remedy_costs/main", tmp_path)
    assert "| PETRA, k = 1 over 32 (the reference) |" in table and "| both |" in table
