"""benchmarks/depth_sweep.py: one accuracy_digits run per J, the gap of each configuration paired by seed."""

import json

import pytest

from .conftest import load


def test_a_short_sweep_pairs_each_configuration_with_the_baseline_at_each_depth(tmp_path):
    """With the gradient fidelity probed beside each point."""
    sweep = load("depth_sweep")
    out = tmp_path / "depth.json"
    result = sweep.main(["--stages", "2", "4", "--configs", "backprop", "petra-k1+delay-warmup+predict-half", "--seeds",
                         "0", "--epochs", "0.1", "--fidelity-every", "2", "--out", str(out), "--plot",
                         str(tmp_path / "depth.png")])
    rows = json.loads(out.read_text())["rows"]
    assert rows == json.loads(json.dumps(result["rows"]))
    remedied = "petra-k1+delay-warmup+predict-half"
    assert [(row["stages"], row["config"]) for row in rows] == [
        (2, "backprop"), (2, remedied), (4, "backprop"), (4, remedied)]
    for row in rows:  # backprop's gradient is the end-to-end one; PETRA's is not
        assert row["cosine_true_mean"] == pytest.approx(1.0, abs=1e-6) if row["config"] == "backprop" else (
            -1 <= row["cosine_true_mean"] < 1 - 1e-6)
    for row in rows:
        if row["config"] == "backprop":
            assert "gap_mean" not in row  # the baseline
        else:
            assert row["gap_mean"] == pytest.approx(row["accuracies"][0] - next(
                r["accuracies"][0] for r in rows if r["stages"] == row["stages"] and r["config"] == "backprop"))
    assert (tmp_path / "depth.png").stat().st_size > 1000
