"""Smoke test of benchmarks/numerics.py on a tiny RevNet18: it runs, its numbers are sane, its tables render."""

import json
import math
import sys

import pytest

from .conftest import load


@pytest.fixture(scope="module")
def numerics_benchmark():
    yield load("numerics")
    sys.modules.pop("benchmark_numerics", None)


@pytest.mark.benchmark_run
def test_quick_run_measures_every_policy_and_stage(numerics_benchmark, report, tmp_path):
    out, png = tmp_path / "numerics.json", tmp_path / "numerics.png"
    arguments = ["--quick", "--steps", "20", "--frozen-batches", "2", "--grad-batches", "1", "--out", str(out),
                 "--plot", str(png)]
    results = numerics_benchmark.main(arguments)
    assert json.loads(out.read_text())["datasets"].keys() == results["datasets"].keys() == {"digits", "random"}
    assert results["benchmark"] == "numerics" and "machine" in results and "--quick" in results["command"]
    assert results["layout"] == "SRRDRDRDRH" and results["reversible_stages"] == [1, 2, 4, 6, 8]
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    for dataset, entry in results["datasets"].items():
        policies = entry["policies"]
        assert list(policies) == ["fp32", "bf16", "bf16-streams", "fp16"], dataset
        for name, policy in policies.items():
            training, frozen = policy["training"]["reconstruction"], policy["frozen"]["reconstruction"]
            for values in (training["median"], training["last"], training["max"], frozen["median"], frozen["max"]):
                assert len(values) == 5 and all(math.isfinite(v) and v >= 0 for v in values), (dataset, name)
            assert all(n >= 1 for n in training["samples"] + frozen["samples"])
            assert policy["training"]["finite_losses"]
            stages = policy["gradients"]["stages"]
            assert [s["kind"] for s in stages] == list("SRRDRDRDRH")
            for s in stages:
                for key in ("cosine", "min_cosine", "backprop_cosine"):
                    assert -1 - 1e-9 <= s[key] <= 1 + 1e-9, (dataset, name, s)
                assert math.isfinite(s["norm_ratio"]) and s["norm_ratio"] > 0
        # float32 at frozen weights: rounding only. bf16 streams round the couplings: far larger than fp32 streams.
        assert max(policies["fp32"]["frozen"]["reconstruction"]["median"]) < 1e-5
        bf16 = policies["bf16"]["frozen"]["reconstruction"]["median"]
        bf16_streams = policies["bf16-streams"]["frozen"]["reconstruction"]["median"]
        assert all(b > a for a, b in zip(bf16, bf16_streams)), (bf16, bf16_streams)
        # The float32 pipeline's gradient is the float64 one up to float32 rounding.
        assert min(s["cosine"] for s in policies["fp32"]["gradients"]["stages"]) > 1 - 1e-6

    summary = report.render("numerics/summary", tmp_path)
    assert len(summary.splitlines()) == 2 + 2 * 4 and "| digits | float32 (baseline) |" in summary
    assert "`python benchmarks/numerics.py --quick" in report.render("numerics/run", tmp_path)
    for dataset in ("digits", "random"):
        reconstruction = report.render(f"numerics/reconstruction/{dataset}", tmp_path).splitlines()
        assert reconstruction[0].endswith("| stage 1 | stage 2 | stage 4 | stage 6 | stage 8 |")
        assert len(reconstruction) == 2 + 3 * 4
        gradients = report.render(f"numerics/gradients/{dataset}", tmp_path).splitlines()
        assert len(gradients) == 2 + 10 and gradients[2].startswith("| 0 S |")
    with pytest.raises(report.Missing):
        report.render("numerics/gradients", tmp_path)  # the data set is needed
