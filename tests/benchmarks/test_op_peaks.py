"""benchmarks/op_peaks.py: what a stage holds at its busiest inside an operation, against allocations of known size."""

import torch

from .conftest import load

MIB = 2**20


class Worker:
    """A stage's operations with known allocations: the forward keeps 1 MiB and frees a 4 MiB temporary; the
    backward frees what the forward kept after a 2 MiB temporary."""

    def __init__(self):
        self.kept: list[torch.Tensor] = []

    def memory(self):
        return type("Stats", (), {"total_bytes": sum(t.nbytes for t in self.kept)})()

    def forward(self, *args):
        temporary = torch.ones(4 * MIB, dtype=torch.uint8)
        self.kept.append(torch.ones(MIB, dtype=torch.uint8))
        return int(temporary[0])

    def backward(self, *args):
        temporary = torch.ones(2 * MIB, dtype=torch.uint8)
        self.kept.pop()
        return int(temporary[0])

    def forward_backward_last(self, *args):
        return None

    def maybe_update(self, *args):
        return False


class Pipeline:
    def __init__(self):
        self.workers = {0: Worker(), 1: Worker()}
        self.tick = 0


def test_each_operation_peaks_at_what_it_held_plus_its_largest_allocation():
    op_peaks = load("op_peaks")
    earlier = Pipeline()  # an earlier profile leaves a tensor alive: the allocator's total starts above zero
    with op_peaks.OperationPeaks(earlier):
        earlier.workers[0].forward()
    pipeline = Pipeline()
    with op_peaks.OperationPeaks(pipeline) as peaks:
        first, second = pipeline.workers.values()
        first.forward()
        first.forward()  # begins holding 1 MiB
        pipeline.tick = 1
        second.forward()
        first.backward()  # begins holding 2 MiB, peaks with the 2 MiB temporary
    assert [(op.stage, op.name, op.tick) for op in peaks.operations] == [
        (0, "forward", 0), (0, "forward", 0), (1, "forward", 1), (0, "backward", 1)]
    assert [op.held_bytes for op in peaks.operations] == [0, MIB, 0, 2 * MIB]
    assert [op.rise_bytes for op in peaks.operations] == [5 * MIB, 5 * MIB, 5 * MIB, 2 * MIB]
    assert peaks.stage_peaks() == {0: 6 * MIB, 1: 5 * MIB}
    assert peaks.stage_peaks(from_tick=1) == {0: 4 * MIB, 1: 5 * MIB}
    assert "forward" not in vars(first)  # the workers' own methods again
