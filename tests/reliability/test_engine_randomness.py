"""Random stages (dropout): every recomputation and reconstruction draws the mask of its forward, so recomputing
modes give autograd's gradient for the masks of the forward, and the pipeline moves the global RNG exactly as the
forwards of a plain run do (the handshake's dry run and the recomputations draw nothing)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from petra_hub.engine import Mode, Pipeline, Schedule, merge_stages

WIDTH, CLASSES, COUNT = 4, 3, 6


class RandomStem(nn.Module):
    """Not reversible: linear, tanh, dropout, split into two streams."""

    reversible = False

    def __init__(self):
        super().__init__()
        self.linear, self.dropout = nn.Linear(5, 2 * WIDTH), nn.Dropout(0.3)

    def forward(self, x):
        first, second = self.dropout(torch.tanh(self.linear(x))).chunk(2, dim=1)
        return first.contiguous(), second.contiguous()


class RandomCoupling(nn.Module):
    """Reversible: y1 = x2 + F(x1), y2 = x1, with dropout inside F (F is evaluated once by each method)."""

    reversible = True

    def __init__(self):
        super().__init__()
        self.residual = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Dropout(0.3))

    def forward(self, streams):
        x1, x2 = streams
        return x2 + self.residual(x1), x1

    def inverse(self, streams):
        y1, y2 = streams
        return y2, y1 - self.residual(y2)

    def reconstruct_and_backward(self, outputs, output_grads):
        y1, y2 = outputs
        g1, g2 = output_grads
        x1 = y2.detach().requires_grad_(True)
        with torch.enable_grad():
            f = self.residual(x1)
            f.backward(g1)
        return (x1.detach(), y1.detach() - f.detach()), (x1.grad + g2, g1)


class RandomHead(nn.Module):
    reversible = False

    def __init__(self):
        super().__init__()
        self.dropout, self.linear = nn.Dropout(0.3), nn.Linear(2 * WIDTH, CLASSES)

    def forward(self, streams):
        return self.linear(self.dropout(torch.cat(streams, dim=1)))


def random_stages():
    torch.manual_seed(0)
    stages = [RandomStem(), RandomCoupling(), RandomCoupling(), RandomCoupling(), RandomHead()]
    return [stage.double() for stage in stages]


def micro_batches():
    generator = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(8, 5, generator=generator, dtype=torch.float64),
            torch.randint(0, CLASSES, (8,), generator=generator),
        )
        for _ in range(COUNT)
    ]


def autograd_reference(stages, batches, seed, mode):
    """Plain autograd, each stage evaluated once per micro-batch in the order of the pipeline's forwards (by tick,
    then by stage), so each draws the mask the pipeline's forward draws. Returns the gradient of every
    micro-batch's loss and the RNG state after all forwards."""
    schedule = Schedule(len(stages), mode.pipelined)
    torch.manual_seed(seed)
    values = [inputs for inputs, _ in batches]
    order = sorted((schedule.forward_tick(b, i), i, b) for b in range(len(batches)) for i in range(len(stages)))
    for _, index, micro_batch in order:
        values[micro_batch] = stages[index](values[micro_batch])
    state = torch.random.get_rng_state()
    params = [p for stage in stages for p in stage.parameters()]
    gradients = []
    for outputs, (_, labels) in zip(values, batches):
        grads = torch.autograd.grad(F.cross_entropy(outputs, labels), params)
        gradients.append({id(p): g for p, g in zip(params, grads)})
    return gradients, state


@pytest.mark.parametrize("grouped", [False, True], ids=["stages", "grouped"])
@pytest.mark.parametrize("mode", [m for m in Mode if not m.keeps_graph], ids=lambda m: m.value)
def test_recomputed_gradients_of_random_stages_equal_autograds(mode, grouped):
    stages = random_stages()
    if grouped:  # [stem + coupling] (stores its input), [coupling + coupling] (reversible group), [head]
        stages = merge_stages(stages, 3)
        assert [getattr(s, "reversible", False) for s in stages] == [False, True, False]
    batches = micro_batches()
    expected, expected_state = autograd_reference(stages, batches, seed=7, mode=mode)
    stem_weight = id(next(stages[0].parameters()))
    other_masks, _ = autograd_reference(stages, batches, seed=8, mode=mode)
    assert not torch.equal(other_masks[0][stem_weight], expected[0][stem_weight])  # the masks matter

    seen = {}

    def record(index, group, stage):
        for param in stage.parameters():
            seen[(group[0], id(param))] = param.grad.clone()

    pipeline = Pipeline(stages, F.cross_entropy, mode=mode, on_update=record)  # no optimizer: frozen weights
    torch.manual_seed(7)
    for inputs, labels in batches:
        pipeline.step(inputs, labels)
    pipeline.drain()
    assert len(seen) == COUNT * sum(1 for stage in stages for _ in stage.parameters())
    for (micro_batch, param), grad in seen.items():
        assert (grad - expected[micro_batch][param]).abs().max() < 1e-12, (micro_batch, param)
    # Only the forwards drew random numbers: not the dry run, not the recomputations or reconstructions.
    assert torch.equal(torch.random.get_rng_state(), expected_state)


def test_the_start_up_dry_run_leaves_the_random_generator_alone():
    stages = random_stages()
    inputs, labels = micro_batches()[0]
    torch.manual_seed(3)
    with torch.no_grad():
        stages[0](inputs)  # the only forward of the first tick
    after_first_tick = torch.random.get_rng_state()
    pipeline = Pipeline(stages, F.cross_entropy, mode="petra")
    torch.manual_seed(3)
    pipeline.step(inputs, labels)  # the handshake's dry run through all five stages, then tick 0
    assert torch.equal(torch.random.get_rng_state(), after_first_tick)
