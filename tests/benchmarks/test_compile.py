"""Smoke test of benchmarks/compile.py: a quick run with dynamo's "eager" backend (tracing, no code generation)
writes the fields the report reads, with sane numbers; a compiler that fails is recorded and replaced."""

import json
import math
import sys

import pytest

from .conftest import load


@pytest.fixture(scope="module")
def compile_benchmark():
    yield load("compile")
    sys.modules.pop("benchmark_compile", None)


@pytest.mark.benchmark_run
def test_quick_run_measures_eager_against_compiled_in_both_precisions(compile_benchmark, tmp_path):
    out = tmp_path / "compile.json"
    arguments = ["--quick", "--backends", "eager", "--batch", "4", "--image-size", "16", "--micro-batches", "2",
                 "--out", str(out)]
    results = compile_benchmark.main(arguments)
    stored = json.loads(out.read_text())
    assert stored["benchmark"] == "compile" and stored["command"].endswith(" ".join(arguments))
    assert stored["configurations"] == json.loads(json.dumps(results["configurations"]))
    assert stored["machine"]["torch"] and stored["threads"] == 1 and len(stored["loads"]) == 3
    settings = stored["settings"]
    assert settings["precisions"] == ["fp32", "bf16"] and settings["repeats"] == 2

    configurations = stored["configurations"]
    assert [(c["precision"], c["variant"]) for c in configurations] == [("fp32", "eager"), ("bf16", "eager")]
    for entry in configurations:
        assert "error" not in entry and entry["compile_options"] == {"backend": "eager"}
        fill = entry["fill_micro_batches"]
        assert entry["num_stages"] == 10 and fill == 2 * (10 - 1) + 1
        assert all(len(entry["fill_s"][key]) == fill and min(entry["fill_s"][key]) > 0 for key in ("eager", "compiled"))
        assert entry["compile_s"] > 0  # tracing the graphs costs seconds; one eager step costs milliseconds
        assert isinstance(entry["compile_first_J_s"], float)
        for key in ("eager", "compiled"):
            assert len(entry["times"][key]) == 2 and min(entry["times"][key]) > 0
            assert entry["median_s"][key] > 0
        assert entry["ratios"] == [c / e for c, e in zip(entry["times"]["compiled"], entry["times"]["eager"])]
        assert 0 < entry["median_ratio"] < math.inf
        loss = entry["loss"]
        assert loss["micro_batches"] == fill + 2 * 2  # fill, then 2 windows of 2, all drained
        assert loss["max_abs_diff"] < 1e-5
        assert loss["first_micro_batch_abs_diff"] <= loss["max_abs_diff_in_fill"] <= loss["max_abs_diff"]
        assert len(loss["eager"]) == len(loss["compiled"]) == loss["micro_batches"]
        assert loss["max_abs_diff"] == max(abs(a - b) for a, b in zip(loss["eager"], loss["compiled"]))
        assert all(math.isfinite(value) for value in loss["eager_first_last"])
        dynamo = entry["dynamo"]
        assert dynamo["graphs"] >= 10 and dynamo["graphs_in_windows"] == 0 and dynamo["recompile_limit"] >= 1

    table = compile_benchmark.markdown_tables(stored)
    assert "| fp32 | eager |" in table and "| bf16 | eager |" in table


def test_a_failing_compiler_is_recorded_and_replaced_by_aot_eager(compile_benchmark, monkeypatch):
    assert compile_benchmark.compile_options("inductor+isolated") == {"backend": "inductor", "isolate_recompiles": True}

    def fake_measure(settings, precision, variant, batches):
        if variant.startswith("inductor"):
            raise RuntimeError("no C++ compiler")
        return {"precision": precision, "variant": variant, "measured": True}

    monkeypatch.setattr(compile_benchmark, "measure", fake_measure)
    failure, fallback = compile_benchmark.measure_or_fall_back(None, "fp32", "inductor+isolated", [])
    assert failure["error"] == "RuntimeError: no C++ compiler" and "Traceback" in failure["traceback"]
    assert fallback == {"precision": "fp32", "variant": "aot_eager+isolated", "measured": True,
                        "fallback_for": "inductor+isolated"}
    settings = {"width": 4, "image_size": 16, "batch": 4, "repeats": 2, "micro_batches": 2}
    table = compile_benchmark.markdown_tables({"settings": settings, "configurations": [failure]})
    assert "| fp32 | inductor+isolated | failed: RuntimeError: no C++ compiler" in table
