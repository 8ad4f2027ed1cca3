"""benchmarks/chaos.py: its progress marks and its weights comparison (the torchrun job itself is what
tests/training/test_preemption.py runs end to end)."""

import json

import torch
from safetensors.torch import save_file

from .conftest import load


def test_marks_are_read_in_time_order_and_a_line_being_written_is_skipped(tmp_path):
    chaos = load("chaos")
    (tmp_path / "rank0.jsonl").write_text(json.dumps({"event": "step", "step": 2, "time": 3.0}) + "\n"
                                          + '{"event": "st')
    (tmp_path / "rank1.jsonl").write_text(json.dumps({"event": "start", "step": 0, "time": 1.0}) + "\n")
    assert [(event["rank"], event["step"]) for event in chaos.read_marks(tmp_path)] == [(1, 0), (0, 2)]


def test_weights_are_the_same_only_bit_for_bit(tmp_path):
    chaos = load("chaos")
    weight = torch.randn(3, 3)
    for name, value in (("a", weight), ("b", weight.clone()), ("c", weight + 1e-7)):
        save_file({"w": value}, str(tmp_path / f"{name}.safetensors"))
    assert chaos.same_weights(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    assert not chaos.same_weights(tmp_path / "a.safetensors", tmp_path / "c.safetensors")


def test_faults_land_around_their_share_of_the_run_and_the_summary_counts_each_kind():
    chaos = load("chaos")
    plan = chaos.fault_plan(chaos.FAULTS, 80, seed=3)
    assert [name for name, _ in plan] == list(chaos.FAULTS)
    assert all(abs(step - 13 * (index + 1)) <= 4 for index, (_, step) in enumerate(plan))
    assert plan != chaos.fault_plan(chaos.FAULTS, 80, seed=4)
    runs = [{"faults": [{"fault": "SIGKILL", "seconds_to_training": s, "steps_recomputed": n}]} for s, n in
            ((4.0, 2), (6.0, 5), (5.0, 3))]
    assert chaos.summary(runs) == [{"fault": "SIGKILL", "count": 3, "median_seconds_to_training": 5.0,
                                    "max_seconds_to_training": 6.0, "median_steps_recomputed": 3}]
