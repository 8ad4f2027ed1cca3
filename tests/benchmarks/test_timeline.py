"""benchmarks/timeline.py --quick: traced 2-process runs become PNG timelines, Chrome traces and busy fractions."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_timelines(tmp_path):
    # a subprocess: the benchmark spawns its ranks, which import it by its module name
    command = [sys.executable, str(BENCHMARKS / "timeline.py"), "--quick", "--out", str(tmp_path / "timeline.json"),
               "--images", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    result = json.loads((tmp_path / "timeline.json").read_text())
    assert set(result["summary"]) == {"petra", "reversible_backprop", "backprop", "1f1b"}
    for mode, entry in result["summary"].items():
        assert Path(entry["png"]).read_bytes()[:4] == b"\x89PNG"
        trace = json.loads(Path(entry["chrome_trace"]).read_text())
        assert {e["pid"] for e in trace["traceEvents"] if e["ph"] == "X"} == {0, 1}
        assert all(0 < busy <= 1 for busy in entry["busy_fraction"].values())
    assert (tmp_path / "timeline-comparison.png").read_bytes()[:4] == b"\x89PNG"
    # PETRA keeps rank 0 busier than naive model parallelism does (its stages never wait for a full round trip)
    petra, naive = (result["summary"][m]["busy_fraction"]["0"] for m in ("petra", "backprop"))
    assert petra > naive
