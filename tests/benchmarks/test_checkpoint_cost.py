"""benchmarks/checkpoint_cost.py: a run saving with the work in flight trains the model of a run that never saves,
one that drains before each save does not, and both write the same files."""

import pytest
import torch

from .conftest import load


@pytest.mark.benchmark_run
def test_saves_in_flight_leave_the_weights_alone_and_drained_saves_do_not(tmp_path):
    cost = load("checkpoint_cost")
    runs = {way: cost.run(way, tmp_path / way.replace(" ", "-"), steps=4, save_steps=2) for way in cost.WAYS}
    never = runs["no saves"]["weights"]
    assert all(torch.equal(runs["in flight"]["weights"][name], value) for name, value in never.items())
    assert not all(torch.equal(runs["drained"]["weights"][name], value) for name, value in never.items())
    assert runs["no saves"]["saves"] == 0 and runs["in flight"]["saves"] == runs["drained"]["saves"] == 2
    # the stage files of the saves in flight hold the micro-batches in flight too
    assert runs["in flight"]["stage_file_bytes"] > runs["drained"]["stage_file_bytes"] > 0
    assert runs["in flight"]["save_s"] > 0 and runs["drained"]["save_s"] > 0
