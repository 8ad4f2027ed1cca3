"""benchmarks/simulator.py --quick: profiled, simulated and measured 2-process runs land side by side in the JSON
(the accuracy of the predictions is a benchmark result, docs/benchmarks-throughput.md, not a test)."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_run_writes_predictions_beside_measurements(tmp_path):
    out = tmp_path / "simulator.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "simulator.py"), "--quick", "--out", str(out)], check=True,
                   capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert [(row["mode"], row["partition"]) for row in result["rows"]] == [("petra", [5, 5]), ("backprop", [5, 5])]
    for row in result["rows"]:
        assert row["measured_s"] > 0 and row["predicted_s"] > 0 and len(row["windows_s"]) == 3
        assert row["error"] == row["predicted_s"] / row["measured_s"] - 1
    assert result["bandwidth_Bps"] > 0 and result["latency_s"] >= 0
    assert set(result["auto_partition"]) == {"petra", "backprop"} and all(
        sum(sizes) == 10 for sizes in result["auto_partition"].values())
