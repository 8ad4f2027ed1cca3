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


def test_earlier_sweeps_are_drawn_in_the_same_picture_and_a_mismatched_one_is_refused(tmp_path, monkeypatch):
    sweep = load("depth_sweep")
    settings = {"model": "revnet18", "baseline": "backprop", "seeds": [0, 1], "epochs": None}
    earlier = [{"stages": 4, "config": "backprop", "accuracies": [99.0, 98.0]},
               {"stages": 4, "config": "petra-k1", "gap_mean": -1.0, "gap_std": 0.5, "accuracies": [98.0, 97.0]},
               {"stages": 4, "config": "petra-k1+delay-momentum", "gap_mean": -0.9, "gap_std": 0.1,
                "accuracies": [0.0, 0.0]}]
    (tmp_path / "earlier.json").write_text(json.dumps({"settings": settings, "rows": earlier}))
    measured = [{"stages": 4, "config": "backprop", "accuracies": [99.0, 98.0]},
                {"stages": 4, "config": "petra-k1+delay-momentum", "gap_mean": -0.2, "gap_std": 0.1,
                 "accuracies": [98.8, 97.8]}]
    monkeypatch.setattr(sweep, "sweep_rows", lambda *args, **kwargs: measured)
    drawn = []
    monkeypatch.setattr(sweep, "plot", lambda rows, *args: drawn.extend(rows))
    argv = ["--configs", "backprop", "petra-k1+delay-momentum", "--seeds", "0", "1", "--stages", "4", "--plot",
            str(tmp_path / "p.png"), "--plot-with", str(tmp_path / "earlier.json"), "--out", str(tmp_path / "d.json")]
    sweep.main(argv)
    # the earlier sweep's other configuration joins the picture; what this run measured again is drawn from this run
    assert drawn == [earlier[1], *measured]
    assert json.loads((tmp_path / "d.json").read_text())["rows"] == measured  # the JSON holds this run's rows

    monkeypatch.setattr(sweep, "sweep_rows", lambda *args, **kwargs: pytest.fail("ran before refusing"))
    with pytest.raises(ValueError, match="earlier.json: swept with seeds = \\[0, 1\\], this run with \\[0\\]"):
        sweep.main([*argv[:3], "--seeds", "0", *argv[6:]])
