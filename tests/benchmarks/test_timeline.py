"""benchmarks/timeline.py --quick: traced 2-process runs become PNG timelines, Chrome traces and busy fractions."""

import json
from pathlib import Path

import pytest

from .conftest import run_quick


@pytest.mark.benchmark_run
def test_quick_timelines(tmp_path):
    # a subprocess: the benchmark spawns its ranks, which import it by its module name
    result = run_quick("timeline", tmp_path / "timeline.json", "--images", str(tmp_path))
    torch_schedules = {"1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv_zero_bubble", "dualpipev"}
    assert set(result["summary"]) == {"petra", "reversible_backprop", "backprop"} | torch_schedules
    kinds = {}
    for mode, entry in result["summary"].items():
        assert Path(entry["png"]).read_bytes()[:4] == b"\x89PNG", mode  # every schedule runs at m = 4 on 2 ranks
        trace = json.loads(Path(entry["chrome_trace"]).read_text())
        assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
        assert all(0 < busy <= 1 for busy in entry["busy_fraction"].values())
        kinds[mode] = {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"}
    # the zero-bubble schedules split each backward into its input and weight halves; 1F1B does not
    assert "backward (weights)" in kinds["zbv_zero_bubble"] and "backward (weights)" not in kinds["1f1b"]
    assert {"forward", "backward", "update"} <= kinds["interleaved_1f1b"]
    for picture in ("timeline-comparison.png", "timeline-torch.png", "timeline-simulated.png"):
        assert (tmp_path / picture).read_bytes()[:4] == b"\x89PNG"
    # PETRA keeps rank 0 busier than naive model parallelism does (its stages never wait for a full round trip)
    petra, naive = (result["summary"][m]["busy_fraction"]["0"] for m in ("petra", "backprop"))
    assert petra > naive
