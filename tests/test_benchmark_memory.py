"""Smoke test of benchmarks/memory.py on tiny models: it runs, and its numbers have the structure they must."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "memory.py"


@pytest.fixture(scope="module")
def memory_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_memory", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_fast_run_reports_buffers_per_configuration(memory_benchmark, tmp_path, capsys):
    out = tmp_path / "memory.json"
    report = memory_benchmark.main(
        ["--fast", "--models", "revnet18", "--no-depth-study", "--no-table6", "--json", str(out)]
    )
    assert json.loads(out.read_text())["models"].keys() == report["models"].keys()
    printed = capsys.readouterr().out
    assert "| petra |" in printed and "saving vs delayed" in printed

    buffered = report["models"]["revnet18 buffered"]
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
    summary = buffered["summary"]
    assert summary["delayed"]["total_gb"] > summary["input_buffer"]["total_gb"] > summary["petra"]["total_gb"]
    assert summary["delayed"]["total_gb"] > summary["weight_stash"]["total_gb"] > summary["petra"]["total_gb"]

    # Every reversible stage in the invertible model: PETRA keeps only the stem's images.
    invertible = report["models"]["revnet18 invertible"]["modes"]["petra"]["stages"]
    assert all(s["activation_bytes"] == 0 for s in invertible[1:])

    # Stored inputs are exactly linear in the micro-batch.
    for name in ("delayed", "input_buffer", "weight_stash", "petra", "reversible_backprop"):
        assert report["batch_check"][name]["ratio"] == 2.0
        assert report["batch_check"][name]["stash_unchanged"]
