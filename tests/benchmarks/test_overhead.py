"""benchmarks/overhead.py: plain backprop against one-process PETRA, operator by operator."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_run_profiles_both_loops(tmp_path, report):
    out = tmp_path / "overhead.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "overhead.py"), "--quick", "--repeats", "1", "--micro-batches",
                    "2", "--out", str(out)], check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    plain, petra = result["plain"]["ops"], result["petra"]["ops"]
    # PETRA runs every convolution twice (forward, then the recomputation under autograd) and backward once
    assert petra["aten::mkldnn_convolution"][0] == 2 * plain["aten::mkldnn_convolution"][0] > 0
    assert petra["aten::convolution_backward"][0] == plain["aten::convolution_backward"][0]
    assert result["petra"]["unprofiled_wall_s"] > result["plain"]["unprofiled_wall_s"] > 0
    assert "`aten::mkldnn_convolution` | 20 |" in report.render("overhead/main", tmp_path)
