"""benchmarks/predict.py --quick: predictions for 2-10 devices from this machine's profile, labelled as such."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_quick_predictions(tmp_path):
    out = tmp_path / "predict.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "predict.py"), "--quick", "--out", str(out)], check=True,
                   capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["prediction"] is True and list(result["models"]) == ["revnet18"]
    model = result["models"]["revnet18"]
    assert len(model["stage_costs"]) == 10
    for row in model["rows"]:
        assert sum(row["partition"]) == 10 and len(row["partition"]) == row["devices"]
        assert row["speedup"] == row["naive_s"] / row["petra_s"] > 1
    assert {row["devices"] for row in model["rows"]} == {2, 4, 5, 10}
