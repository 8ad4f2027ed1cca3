"""benchmarks/simulator.py --quick: profiled, simulated and measured 2-process runs land side by side in the JSON
(the accuracy of the predictions is a benchmark result, docs/benchmarks-throughput.md, not a test)."""

import json

import pytest

from .conftest import run_quick


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One quick run of the engine's modes and of torch's schedules (Schedule1F1B at each checkpointing, and a
    multi-chunk schedule on its 2W chunks, at m = 4): the two kinds of rows land in one file."""
    out = tmp_path_factory.mktemp("simulator") / "simulator.json"
    return run_quick("simulator", out, "--modes", "petra", "backprop", "--rival-microbatches", "4",
                     "--rival-schedules", "1f1b", "zbv_zero_bubble")


def engine_rows(result: dict) -> list[dict]:
    return [row for row in result["rows"] if row.get("m") is None]


@pytest.mark.benchmark_run
def test_quick_run_writes_predictions_beside_measurements(quick_run, tmp_path, report):
    result = {**quick_run, "rows": engine_rows(quick_run)}  # as a run of the engine's modes alone writes them
    (tmp_path / "simulator.json").write_text(json.dumps(result))
    assert [(row["mode"], row["partition"]) for row in result["rows"]] == [("petra", [5, 5]), ("backprop", [5, 5])]
    for row in result["rows"]:
        assert row["measured_s"] > 0 and row["predicted_s"] > 0 and len(row["windows_s"]) == 3
        assert row["error"] == row["predicted_s"] / row["measured_s"] - 1
        # the traced windows: each rank's operations and exchanges per micro-batch, beside the profile's operations
        for key in ("measured_operations_s", "measured_exchange_s", "profiled_operations_s"):
            assert len(row[key]) == 2 and all(value > 0 for value in row[key]), key
        assert all(ops + exchange <= sum(row["windows_s"]) / 3 * 1.001 for ops, exchange in  # inside the windows
                   zip(row["measured_operations_s"], row["measured_exchange_s"]))
        assert row["error_from_run"] == row["predicted_from_run_s"] / row["measured_s"] - 1
    assert result["bandwidth_Bps"] > 0 and result["latency_s"] >= 0
    assert result["duplex"] == (result["swap_4MB_s"] < 1.5 * result["one_way_4MB_s"])
    assert "| petra | 5,5 |" in report.render("simulator/main", tmp_path)
    assert "error from the run's operation times" in report.render("simulator/main", tmp_path)
    assert set(result["auto_partition"]) == {"petra", "backprop"} and all(
        sum(sizes) == 10 for sizes in result["auto_partition"].values())


@pytest.mark.benchmark_run
def test_grouped_stages_are_profiled_and_simulated_as_grouped(tmp_path, report):
    """--groups: PETRA on coarser engine stages, each grouping profiled as grouped (and keeping its graph, k); the
    report names the groups."""
    out = tmp_path / "simulator_groups.json"
    result = run_quick("simulator", out, "--modes", "petra", "--groups", "1,2/7", "4/6", "4k/6")
    rows = [(row["groups"], row["partition"], row["kept"]) for row in result["rows"]]
    assert rows == [([1, 2, 7], [2, 1], []), ([4, 6], [1, 1], []), ([4, 6], [1, 1], [0])]
    assert all(row["measured_s"] > 0 and row["predicted_s"] > 0 for row in result["rows"])
    assert result["rows"][2]["measured_peak_bytes"][0] > result["rows"][1]["measured_peak_bytes"][0]  # graphs held
    table = report.render("simulator_groups/main", tmp_path)
    assert "| petra | 1,2/7 |" in table and "| petra | 4/6 |" in table and "| petra | 4k/6 |" in table


@pytest.mark.benchmark_run
def test_torch_schedules_are_measured_beside_their_simulation(quick_run, tmp_path, report):
    """--rival-microbatches: Schedule1F1B at each checkpointing and m, and a multi-chunk schedule on its 2W chunks,
    measured and predicted by simulate_schedule."""
    result = {**quick_run, "rows": [row for row in quick_run["rows"] if row.get("m") is not None]}  # torch's alone
    (tmp_path / "simulator_1f1b.json").write_text(json.dumps(result))
    rows = [(row["mode"], row["m"]) for row in result["rows"]]
    assert rows == [(f"1f1b ({c})", 4) for c in ("none", "all", "but_last")] + [
        (f"ScheduleZBVZeroBubble ({c})", 4) for c in ("none", "all")]
    for row in result["rows"]:
        assert row["measured_s"] > 0 and row["predicted_s"] > 0
        assert 0 < row["predicted_overlapped_s"] < row["predicted_s"]  # ranks that copy messages take longer
        assert all(0 < n < p for n, p in zip(row["predicted_needed_peak_bytes"], row["predicted_peak_bytes"]))
        assert len(row["measured_peak_bytes"]) == len(row["predicted_peak_bytes"]) == 2
        assert all(b > 0 for b in row["measured_peak_bytes"] + row["predicted_peak_bytes"])
        assert sum(row["partition"]) == 10 and len(row["partition"]) == (2 if row["mode"].startswith("1f1b") else 4)
    assert "| 1f1b (all), m = 4 | 5,5 |" in report.render("simulator_1f1b/main", tmp_path)
    assert "| 1f1b (none), m = 4 | 5,5 |" in report.render("simulator_1f1b/memory", tmp_path)
    assert "| ScheduleZBVZeroBubble (all), m = 4 |" in report.render("simulator_1f1b/main", tmp_path)
    assert "error if transfers overlapped compute" in report.render("simulator_1f1b/main", tmp_path)
    assert "the schedule's own need" in report.render("simulator_1f1b/memory", tmp_path)
