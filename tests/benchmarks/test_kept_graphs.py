"""benchmarks/kept_graphs.py --quick: every method measured, the budget between the two extremes, the table renders."""

import sys

import pytest
import torch

from .conftest import load, run_quick


def test_the_staged_loop_trains_what_the_plain_loop_trains():
    """The plain loop split into the model's stages (a graph, a backward and an SGD step per stage) is a reference
    for the split's own cost only if it computes the same thing: after three steps from the same weights, the same
    weights."""
    kept_graphs = load("kept_graphs")
    common = sys.modules["common"]
    config = common.revnet_config("revnet18", width=4, num_labels=10)
    plain = kept_graphs.PlainLoop(common.build_model(config))
    staged = kept_graphs.StagedLoop(common.build_model(config))
    for images, labels in common.random_batches(3, 4, 16):
        plain.step(images, labels)
        staged.step(images, labels)
    ours = [p for stage in staged.stages for p in stage.parameters()]
    assert len(ours) == len(list(plain.model.parameters())) > 10
    for theirs, mine in zip(plain.model.parameters(), ours):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.benchmark_run
def test_quick_run(tmp_path, report):
    out = tmp_path / "kept_graphs.json"
    result = run_quick("kept_graphs", out, "--repeats", "1", "--micro-batches", "2")
    assert result["recomputing"] == [0, 3, 5, 7] and result["kept"]["petra_kept"] == [0, 3, 5, 7]
    assert result["kept"]["petra_all_kept"] == list(range(9))
    assert result["kept"]["petra"] == [] and set() < set(result["kept"]["petra_budget"]) < set(range(9))
    held = result["held_bytes"]
    assert held["backprop"] == 0 < held["petra"] < held["petra_kept"] < held["petra_all_kept"]
    assert held["petra"] <= held["petra_budget"] <= result["budget_bytes"]  # the budget counts what memory() reads
    assert all(value > 0 for value in result["median_s"].values())
    # the plain loops are the reference: a window over itself is 1, and nothing is held between their steps
    assert result["ratio_to_plain"]["plain"] == 1.0 and result["ratio_to_backprop"]["backprop"] == 1.0
    assert result["ratio_to_operations"]["plain_second_forward"] == result["ratio_to_staged"]["plain_staged"] == 1.0
    assert held["plain"] == held["plain_second_forward"] == held["plain_staged"] == 0
    peak = result["peak_bytes"]  # within a tick, after each operation: at least what is held between ticks
    assert all(peak[name] >= held[name] for name in peak) and peak["backprop"] > 0
    table = report.render("kept_graphs/main", tmp_path)
    assert "PETRA, stored-input stages' graphs kept | 0, 3, 5, 7 |" in table
    assert "PETRA, every stage's graph kept | 0, 1, 2, 3, 4, 5, 6, 7, 8 |" in table
    assert "| plain torch loop (the reference) | - |" in table
