"""benchmarks/fidelity.py: a short run writes every probe's record and draws the paper's Figures 5 and 6."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.benchmark_run
def test_a_short_run_writes_records_and_pictures(tmp_path):
    out = tmp_path / "fidelity.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "fidelity.py"), "--epochs", "0.5", "--every", "4",
               "--out", str(out), "--images", str(tmp_path)]
    subprocess.run(command, check=True, capture_output=True, timeout=300, cwd=ROOT)
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    run["records"] = [dict(zip(run["columns"], row)) for row in run["rows"]]
    # 0.5 epoch = 23 steps of 32 samples: probes at steps 0, 4, ..., 20; all ten stages each
    assert sorted({r["micro_batch"] for r in run["records"]}) == [0, 4, 8, 12, 16, 20]
    assert len(run["records"]) == 6 * 10
    for name in ("fidelity-over-training.png", "fidelity-by-stage.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
