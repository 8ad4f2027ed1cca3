"""Smoke test of benchmarks/memory.py on tiny models: it runs, and its numbers have the structure they must."""

import json


def test_fast_run_reports_buffers_per_configuration(memory_benchmark, report, tmp_path):
    out = tmp_path / "memory.json"
    arguments = ["--fast", "--models", "revnet18", "--no-depth-study", "--no-table6", "--no-process-check",
                 "--out", str(out)]
    results = memory_benchmark.main(arguments)
    assert json.loads(out.read_text())["models"].keys() == results["models"].keys()
    rendered = report.render("memory/totals/revnet18-buffered", tmp_path)
    assert "| petra |" in rendered and "saving vs delayed" in rendered

    buffered = results["models"]["revnet18 buffered"]
    assert buffered["layout"] == "SRRDRDRDRH"
    modes = buffered["modes"]
    J = len(buffered["layout"])
    for name, result in modes.items():
        stages = result["stages"]
        pipelined = name not in ("backprop", "reversible_backprop")
        assert [s["in_flight"] for s in stages] == [2 * (J - 1 - i) if pipelined else 0 for i in range(J)]
        assert stages[-1]["activation_bytes"] == 0  # the head keeps nothing between ticks
    # Reversible stages keep nothing in PETRA; non-reversible ones keep their input; nobody stashes weights.
    for stage in modes["petra"]["stages"][:-1]:
        assert (stage["activation_bytes"] > 0) == (stage["kind"] != "R")
        assert stage["stash_bytes"] == 0
    # The stem keeps 2(J-1) image micro-batches (2 x 3 x 32 x 32 float32) in every pipelined configuration.
    assert modes["petra"]["stages"][0]["activation_bytes"] == 2 * (J - 1) * 2 * 3 * 32 * 32 * 4
    # Messages: every stage but the head waits for an input and a gradient; PETRA's also get outputs back.
    for name in ("delayed", "petra"):
        assert all(s["message_bytes"] for s in modes[name]["stages"][:-1]), name
    summary = buffered["summary"]
    assert summary["petra"]["messages_gb"] > summary["delayed"]["messages_gb"] > 0
    assert summary["backprop"]["messages_gb"] == summary["reversible_backprop"]["messages_gb"] == 0
    assert summary["delayed"]["total_gb"] > summary["input_buffer"]["total_gb"] > summary["petra"]["total_gb"]
    assert summary["delayed"]["total_gb"] > summary["weight_stash"]["total_gb"] > summary["petra"]["total_gb"]

    # Inside its operations a stage holds more than between them: at least what it keeps, plus its gradients, and at
    # twice the micro-batch more again. A reversible stage of PETRA keeps no input, but its backward rebuilds one
    # micro-batch's graph.
    for name, result in modes.items():
        for stage in result["stages"]:
            kept = stage["activation_bytes"] + stage["stash_bytes"] + stage["message_bytes"] + stage["gradient_bytes"]
            assert stage["peak_bytes"] >= kept, (name, stage)
            assert stage["peak_bytes_double"] > stage["peak_bytes"], (name, stage)
    petra = modes["petra"]["stages"]
    reversible = next(s for s in petra if s["kind"] == "R")
    assert reversible["peak_bytes"] > reversible["message_bytes"] + reversible["gradient_bytes"]
    for name, s in summary.items():
        assert s["peak_gb"] > s["total_gb"], name
    assert summary["delayed"]["peak_gb"] > summary["petra"]["peak_gb"]
    assert 0 < summary["petra"]["peak_saving_vs_delayed"] < summary["petra"]["saving_vs_delayed"]
    assert "saving at the peak" in report.render("memory/headline", tmp_path)

    # Every reversible stage in the invertible model: PETRA keeps only the stem's images.
    invertible = results["models"]["revnet18 invertible"]["modes"]["petra"]["stages"]
    assert all(s["activation_bytes"] == 0 for s in invertible[1:])

    # Stored inputs are exactly linear in the micro-batch.
    for name in ("delayed", "input_buffer", "weight_stash", "petra", "reversible_backprop"):
        assert results["batch_check"][name]["ratio"] == 2.0
        assert results["batch_check"][name]["stash_unchanged"]


def test_revvit_rows_keep_nothing_at_reversible_blocks(memory_benchmark, report, tmp_path):
    """RevViT measured in a run of its own: every block is reversible, so PETRA keeps only the stem's images, while
    the delayed configuration keeps 2(J-1-i) token inputs at block i."""
    import pytest

    out = tmp_path / "memory_revvit.json"
    results = memory_benchmark.main(["--fast", "--models", "--revvit", "revvit-tiny", "--modes", "delayed", "petra",
                                     "--no-peaks", "--out", str(out)])
    (label,) = results["models"]
    entry = results["models"][label]
    assert label == "revvit_tiny patch4" and entry["layout"] == "S" + "R" * 12 + "H"
    petra, delayed = entry["modes"]["petra"]["stages"], entry["modes"]["delayed"]["stages"]
    assert all(s["activation_bytes"] == 0 for s in petra[1:])
    tokens = 2 * 16 * 12 * 4  # micro-batch 2, 16 patches, width 12, float32
    assert [s["activation_bytes"] for s in delayed[1:-1]] == [2 * tokens * (2 * (13 - i)) for i in range(1, 13)]
    assert results["scale"] == 32  # micro-batch 2 scaled to 64, no area scaling: measured at the model's size
    assert "| petra |" in report.render("memory_revvit/totals/revvit_tiny-patch4", tmp_path)
    with pytest.raises(SystemExit):
        memory_benchmark.parse_args(["--revvit", "revvit-tiny"])  # not mixed with RevNets


def test_process_check_compares_the_engine_with_malloc(memory_benchmark, report, tmp_path):
    import pytest

    from petra_hub.engine import Mode
    from petra_hub.testing.malloc import malloc_available
    from petra_hub.testing.models import FAST_WIDTHS

    if not malloc_available():
        pytest.skip("needs glibc's mallinfo2")
    # in this process: the spawned ranks of `process_check` could not import a benchmark loaded by path
    growth = memory_benchmark.process_growth_job(0, 1, Mode.DELAYED.value, FAST_WIDTHS["basic"], 8)
    check = {"widths": FAST_WIDTHS["basic"], "batch": 8, "image_size": 32, "modes": {"delayed": {"1": [growth]}}}
    assert abs(growth["malloc_bytes"] / growth["process_bytes"] - 1) < 0.10, growth
    assert growth["stage_bytes"] > growth["process_bytes"]  # one process shares streams that devices would not
    (tmp_path / "memory.json").write_text(json.dumps({"benchmark": "memory", "process_check": check}))
    assert "| delayed | 1 | 0 |" in report.render("memory/process-check", tmp_path)
