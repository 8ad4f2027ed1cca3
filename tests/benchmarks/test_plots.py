"""benchmarks/plots.py draws the memory-per-stage charts from memory.json: valid PNGs, one per model."""

from .conftest import load


def test_memory_charts_from_the_results(tmp_path):
    plots = load("plots")
    written = plots.main(["--images", str(tmp_path), "--k-sweep", str(tmp_path / "absent.json")])
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


def test_k_sweep_chart_from_accuracy_results(tmp_path):
    import json

    plots = load("plots")
    summary = [{"mode": "backprop", "k": 1}] + [
        {"mode": "petra", "k": k, "gap_mean": -k / 2, "gap_std": 0.3} for k in (4, 1, 2)
    ]
    result = {"summary": summary, "settings": {"num_stages": 10, "epochs": 12, "seeds": [0, 1, 2]}}
    assert plots.k_sweep(result) == ([1, 2, 4], [-0.5, -1.0, -2.0], [0.3, 0.3, 0.3])
    (tmp_path / "sweep.json").write_text(json.dumps(result))
    written = plots.main(["--images", str(tmp_path), "--k-sweep", str(tmp_path / "sweep.json")])
    assert written[-1].name == "accuracy-k-sweep.png" and written[-1].read_bytes()[:4] == b"\x89PNG"
