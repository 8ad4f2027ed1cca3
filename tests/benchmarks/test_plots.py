"""benchmarks/plots.py draws the memory-per-stage charts from memory.json: valid PNGs, one per model."""

from .conftest import load


def test_memory_charts_from_the_results(tmp_path):
    plots = load("plots")
    written = plots.main(["--images", str(tmp_path)])
    assert [p.name for p in written] == ["memory-stages-revnet18-buffered.png", "memory-stages-revnet50-buffered.png"]
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_petra_holds_nothing_at_reversible_stages(tmp_path):
    import json

    plots = load("plots")
    buffers, layout = plots.stage_buffers(json.loads(plots.ROOT.joinpath("benchmarks/results/memory.json").read_text()),
                                          "revnet18 buffered")
    assert layout == "SRRDRDRDRH"
    assert [b for b, kind in zip(buffers["petra"], layout) if kind == "R"] == [0] * 5
    assert all(b > 0 for b, kind in zip(buffers["delayed"], layout) if kind == "R")
