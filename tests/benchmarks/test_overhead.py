"""benchmarks/overhead.py: plain backprop against one-process PETRA, operator by operator."""

import json

import pytest

from .conftest import run_quick


@pytest.mark.benchmark_run
def test_quick_run_profiles_both_loops(tmp_path, report):
    out = tmp_path / "overhead.json"
    result = run_quick("overhead", out, "--repeats", "1", "--micro-batches", "2")
    plain, petra = result["plain"]["ops"], result["petra"]["ops"]
    # PETRA runs every convolution twice (forward, then the recomputation under autograd) and backward once
    assert petra["aten::mkldnn_convolution"][0] == 2 * plain["aten::mkldnn_convolution"][0] > 0
    assert petra["aten::convolution_backward"][0] == plain["aten::convolution_backward"][0]
    assert result["petra"]["unprofiled_wall_s"] > result["plain"]["unprofiled_wall_s"] > 0
    assert "`aten::mkldnn_convolution` | 20 |" in report.render("overhead/main", tmp_path)


def test_time_outside_operators_comes_from_the_profiled_windows(tmp_path, report):
    """Outside operators = the profiled windows' wall time - their time in operators, not the bare windows' wall
    time (other windows, a few ms apart on a loaded machine: plain backprop once came out at -2.8 ms)."""

    def loop(bare, profiled, conv):
        return {"unprofiled_wall_s": bare, "wall_s": profiled, "in_ops_s": conv + 0.002,
                "ops": {"aten::mkldnn_convolution": [20, conv], "aten::add": [10, 0.002]}}

    result = {"benchmark": "overhead", "plain": loop(0.1052, 0.1116, 0.106), "petra": loop(0.1590, 0.1601, 0.1459)}
    (tmp_path / "overhead.json").write_text(json.dumps(result))
    rows = {line.split(" | ")[0].strip("| "): [cell.strip(" |") for cell in line.split(" | ")[1:]]
            for line in report.render("overhead/main", tmp_path).splitlines()[2:]}
    outside = next(cells for label, cells in rows.items() if label.startswith("outside operators"))
    assert outside == ["", "3.6", "", "12.2", "+8.6"]  # 111.6 - 108.0, 160.1 - 147.9
    assert rows["**wall time**, not profiled"] == ["", "105.2", "", "159.0", "+53.8"]
    assert rows["wall time under the profiler"] == ["", "111.6", "", "160.1", "+48.5"]
