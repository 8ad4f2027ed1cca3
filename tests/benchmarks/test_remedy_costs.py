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


@pytest.mark.benchmark_run
def test_quick_run_of_the_revvit_s_stems(tmp_path):
    """--model revvit-tiny: the convolutional stem beside the patchify one. Between ticks the first stage holds its
    input, the images, with either stem; inside its operations the stem's feature maps add to the peak, and its
    weights to the model."""
    out = tmp_path / "remedy_costs_revvit.json"
    result = run_quick("remedy_costs", out, "--model", "revvit-tiny", "--repeats", "1", "--updates", "2")
    assert result["settings"]["model"] == "revvit-tiny" and result["settings"]["stages"] == 4  # quick: 2 blocks
    assert result["ratio_to_petra"]["petra"] == 1.0 and result["median_s"]["conv-stem"] > 0
    held, within, weights = result["held"], result["peak_within_bytes"], result["weight_bytes"]
    assert held["conv-stem"]["total_bytes"] == held["petra"]["total_bytes"]
    assert within["conv-stem"] > within["petra"] and weights["conv-stem"] > weights["petra"]
