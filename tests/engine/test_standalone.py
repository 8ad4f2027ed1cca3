"""The engine is pure torch: importable and usable where transformers and timm are not installed."""

import copy
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from petra_hub.engine import Pipeline

TOY_RUN = textwrap.dedent(
    """
    import sys
    for name in ("transformers", "timm", "datasets", "accelerate", "huggingface_hub"):
        sys.modules[name] = None  # any import of these now raises ImportError

    import torch
    from torch import nn
    import petra_hub.engine as engine

    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 2)]
    pipeline = engine.Pipeline(stages, nn.functional.cross_entropy, mode="petra",
                               optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.5))
    inputs = torch.randn(64, 4)
    labels = (inputs[:, 0] > 0).long()
    first = last = None
    for epoch in range(30):
        for start in range(0, 64, 16):
            for _, loss in pipeline.step(inputs[start:start + 16], labels[start:start + 16]):
                first = float(loss) if first is None else first
                last = float(loss)
    pipeline.drain()
    heavy = sorted(name for name in ("transformers", "timm", "datasets") if sys.modules.get(name) is not None)
    print(first, last, heavy)
    """
)


def test_engine_trains_a_toy_pipeline_without_transformers_or_timm():
    result = subprocess.run([sys.executable, "-c", TOY_RUN], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    first, last, heavy = result.stdout.split(maxsplit=2)
    assert float(last) < 0.5 * float(first)  # it learned
    assert heavy.strip() == "[]"


def test_end_group_closes_an_accumulation_group_early():
    torch.manual_seed(0)
    stages = [nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 2)]
    groups = []
    pipeline = Pipeline(stages, nn.functional.cross_entropy, mode="petra", accumulation_steps=3,
                        on_update=lambda index, micro_batches, stage: groups.append((index, micro_batches)))
    batches = [(torch.randn(4, 3), torch.randint(0, 2, (4,))) for _ in range(7)]
    fill = []
    for index, batch in enumerate(batches):
        pipeline.step(*batch)
        fill.append(pipeline.fed_in_group)
        if index == 1:
            pipeline.end_group()
            assert pipeline.fed_in_group == 0
    pipeline.drain()
    assert fill == [1, 2, 1, 2, 0, 1, 2]  # the group closed after micro-batch 1 restarts the count of k
    for stage in range(3):
        assert [mbs for index, mbs in groups if index == stage] == [[0, 1], [2, 3, 4], [5, 6]]


def _float64_stages():
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(3, 4), nn.Tanh()).double(), nn.Sequential(nn.Linear(4, 4), nn.Tanh()).double(),
            nn.Linear(4, 2).double()]


@pytest.mark.parametrize("mode", ["backprop", "reversible_backprop"])
def test_end_group_in_a_synchronous_mode_matches_autograd(mode):
    """k = 2, the group closed after micro-batch 0: updates after [0], then after [1, 2], as plain autograd does
    them. The closed group must be applied before the next micro-batch's forward (it once waited for the next tick,
    so stage 0 ran micro-batch 1 with its old weights)."""
    stages = _float64_stages()
    model = nn.Sequential(*copy.deepcopy(stages))
    batches = [(torch.randn(5, 3, dtype=torch.float64), torch.randint(0, 2, (5,))) for _ in range(3)]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for group in ([0], [1, 2]):
        optimizer.zero_grad()
        for index in group:
            (nn.functional.cross_entropy(model(batches[index][0]), batches[index][1]) / len(group)).backward()
        optimizer.step()
    pipeline = Pipeline(stages, nn.functional.cross_entropy, mode=mode, accumulation_steps=2,
                        optimizer_factory=lambda index, stage: torch.optim.SGD(stage.parameters(), lr=0.5))
    pipeline.step(*batches[0])
    pipeline.end_group()
    assert [counters.updates for counters in pipeline.counters().values()] == [1, 1, 1]
    pipeline.step(*batches[1])
    pipeline.step(*batches[2])
    pipeline.drain()
    engine = [p.detach() for stage in stages for p in stage.parameters()]
    reference = [p.detach() for p in model.parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(engine, reference)) < 1e-14


def test_end_group_in_a_one_stage_pipeline_closes_the_group():
    groups = []
    pipeline = Pipeline([nn.Linear(3, 2)], nn.functional.cross_entropy, accumulation_steps=3,
                        on_update=lambda index, micro_batches, stage: groups.append(micro_batches))
    batch = (torch.randn(4, 3), torch.randint(0, 2, (4,)))
    pipeline.step(*batch)
    pipeline.end_group()
    for _ in range(3):
        pipeline.step(*batch)
    pipeline.drain()
    assert groups == [[0], [1, 2, 3]]
