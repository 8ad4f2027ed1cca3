"""benchmarks/predict.py --quick: predictions for 2-10 devices from this machine's profile, labelled as such."""

import pytest

from .conftest import run_quick


@pytest.mark.benchmark_run
def test_quick_predictions(tmp_path, report):
    out = tmp_path / "predict.json"
    # kept graphs of at most 1 MiB per profile: one pass per group on 10 devices (each holds more), fewer on 2
    result = run_quick("predict", out, "--kept-memory", str(2**-10))
    assert result["prediction"] is True and list(result["models"]) == ["revnet18"]
    model = result["models"]["revnet18"]
    assert len(model["stage_costs"]) == 10
    passes = model["kept_graph_passes"]
    assert passes["1-1-1-1-1-1-1-1-1-1"] == [[index] for index in range(9)]  # every group but the head's, one by one
    for sizes, chosen in passes.items():  # each pass a run of consecutive groups; together all but the last
        flat = [index for kept in chosen for index in kept]
        assert flat == list(range(len(sizes.split("-")) - 1)), sizes
    for row in model["rows"]:
        assert sum(row["partition"]) == 10 and len(row["partition"]) == row["devices"]
        assert row["speedup"] == row["naive_s"] / row["petra_s"] > 1
    assert {row["devices"] for row in model["rows"]} == {2, 4, 5, 10}
    for row in model["rows"]:  # the simulated 1F1B rivals: every checkpointing at m = W, 2W, 4W
        settings = [(x["checkpointing"], x["m"]) for x in row["rivals"] if x["schedule"] == "Schedule1F1B"]
        ranks = row["devices"]
        assert settings == [(c, m) for c in ("none", "but_last", "all") for m in (ranks, 2 * ranks, 4 * ranks)]
        by = {(x["checkpointing"], x["m"]): x for x in row["rivals"] if x["schedule"] == "Schedule1F1B"}
        # torch's multi-chunk schedules on 2W chunks, where 10 stages make them (not on 10 devices)
        multi = {(x["schedule"], x["checkpointing"], x["m"]): x
                 for x in row["rivals"] if x["schedule"] != "Schedule1F1B"}
        assert {schedule for schedule, _, _ in multi} == (set() if ranks == 10 else {
            "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV"})
        assert ("ScheduleDualPipeV", "none", ranks) not in multi  # torch wants m >= 2W
        for (schedule, checkpointing, m), x in multi.items():
            assert sum(x["partition"]) == 10 and len(x["partition"]) == 2 * ranks
            if checkpointing == "all":
                assert x["time_s"] > multi[schedule, "none", m]["time_s"]
        # more micro-batches per flush: a smaller bubble, the same micro-batches in flight
        assert by["none", 4 * ranks]["time_s"] < by["none", ranks]["time_s"]
        assert by["none", 4 * ranks]["peak_bytes"] == by["none", ranks]["peak_bytes"]
        # torch's receive buffers grow with m: one per micro-batch and chunk boundary
        assert all(x["torch_peak_bytes"] > x["peak_bytes"] for x in row["rivals"])
        assert by["none", 4 * ranks]["torch_peak_bytes"] > by["none", ranks]["torch_peak_bytes"]
        assert by["all", ranks]["time_s"] > by["none", ranks]["time_s"]
        assert (row["petra_per_device"] is None) == (ranks == 10)
        kept = row["petra_per_device_kept"]  # graphs kept instead of recomputed: more memory, less time
        budgets = row["petra_per_device_budgets"]  # keeping graphs where they fit: a front from none to all kept
        lightest = row["petra_per_device"] or {"peak_bytes": row["petra_peak_bytes"]}
        assert budgets[0]["peak_bytes"] <= 1.05 * lightest["peak_bytes"]  # none kept, or a setting as light
        assert budgets[-1]["time_s"] <= 1.05 * kept["time_s"]  # every graph kept, or a setting as fast
        assert all(
            a["peak_bytes"] < b["peak_bytes"] and a["time_s"] > b["time_s"] for a, b in zip(budgets, budgets[1:])
        )
        assert kept["peak_bytes"] > (row["petra_per_device"] or {"peak_bytes": row["petra_peak_bytes"]})["peak_bytes"]
    table = report.render("predict/rivals", tmp_path)
    # J = 10 on 2, 4, 5, 10 devices; one stage per device on 2, 4, 5; the same keeping graphs on all 4
    assert table.count("| RevNet18 |") == 4 + 3 + 4
    assert report.render("predict/rivals-allocated", tmp_path).count("| RevNet18 |") == 4 + 3 + 4
    goals = report.render("predict/equal-memory", tmp_path)
    assert goals.count("| RevNet18 |") == 4 and goals.count("x** |") == 4 * 4
