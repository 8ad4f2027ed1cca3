"""profile_stages against stages of known cost: forwards, backwards and optimizer steps that sleep set times (a sleep
costs what it says however loaded the cores are, give or take the scheduler's wake-up), slow first calls that the
warm-up must leave out, one slow call among the timed ones that a median must ignore, and a set time per tick spent
outside the stages' operations."""

import time

import torch
import torch.nn.functional as F
from torch import nn

from petra_hub.analysis import profile_stages
from petra_hub.engine import pipeline as pipeline_module

MS = 1e-3
FIRST_CALL = 50 * MS  # the first forward, backward and step of every stage (lazy initialisation), not a cost
SPIKE = 30 * MS  # one optimizer step among the timed ones (a hiccup), not a cost either
# (forward, backward, optimizer step) of each stage; the last runs forward, loss and backward as one operation.
COSTS = [(4 * MS, 9 * MS, 3 * MS), (7 * MS, 2 * MS, 5 * MS), (3 * MS, 6 * MS, 2 * MS)]
OUTSIDE = 12 * MS  # per step of the pipeline (one tick when pipelined), outside every stage's operations
SLACK = 8 * MS  # what a loaded machine may add to a sleep or to the engine's own work, in a median (seen: 3.5)


class Sleep(torch.autograd.Function):
    """y = x * w, whose forward sleeps costs["forward"] and backward costs["backward"], the first of each
    FIRST_CALL."""

    @staticmethod
    def forward(ctx, x, weight, costs):
        ctx.save_for_backward(x, weight)
        ctx.costs = costs
        time.sleep(costs.pop("first forward", costs["forward"]))
        return x * weight

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        time.sleep(ctx.costs.pop("first backward", ctx.costs["backward"]))
        return grad * weight, (grad * x).sum(), None


class SleepingStage(nn.Module):
    def __init__(self, forward_s, backward_s):
        super().__init__()
        self.weight = nn.Parameter(torch.ones((), dtype=torch.float64))
        self.costs = {"forward": forward_s, "backward": backward_s, "first forward": FIRST_CALL,
                      "first backward": FIRST_CALL}

    def forward(self, x):
        return Sleep.apply(x, self.weight, self.costs)


class SleepingSGD(torch.optim.SGD):
    """SGD whose steps sleep `sleeps[i]` (call i), then `step_s`."""

    def __init__(self, params, sleeps, step_s):
        super().__init__(params, lr=0.1)
        self.sleeps, self.step_s, self.calls = sleeps, step_s, 0

    def step(self, closure=None):
        time.sleep(self.sleeps.get(self.calls, self.step_s))
        self.calls += 1
        return super().step(closure)


def test_profile_measures_known_costs_leaving_out_warm_up_and_outliers(monkeypatch):
    """The stages are not reversible: under PETRA each backward recomputes its forward, so it costs forward +
    backward; the last stage's fused operation counts as its backward. The first call of everything sleeps
    FIRST_CALL, and the second to last timed step SPIKE: the median of the timed repeats leaves both out, a maximum or
    a warm-up counted in does not. The engine's time per tick outside the operations is OUTSIDE (a sleep added to
    every step) plus its own work, shared equally by the stages."""
    step = pipeline_module.Pipeline.step

    def slow_step(self, *args, **kwargs):
        time.sleep(OUTSIDE)
        return step(self, *args, **kwargs)

    monkeypatch.setattr(pipeline_module.Pipeline, "step", slow_step)
    J, repeats, warmup = len(COSTS), 5, 1
    micro_batches = (2 * J - 1) + warmup + repeats  # what fills the pipeline, the warm-up, the timed ones
    stages = [SleepingStage(forward_s, backward_s) for forward_s, backward_s, _ in COSTS]
    optimizers = {}

    def sleeping_sgd(index, stage):
        sleeps = {0: FIRST_CALL, micro_batches - 2: SPIKE}
        optimizers[index] = SleepingSGD(stage.parameters(), sleeps, COSTS[index][2])
        return optimizers[index]

    inputs = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    costs = profile_stages(stages, (inputs, torch.tensor([0, 2, 1, 0])), F.cross_entropy, mode="petra",
                           repeats=repeats, warmup=warmup, optimizer_factory=sleeping_sgd)
    assert [optimizers[i].calls for i in range(J)] == [micro_batches] * J  # one step per micro-batch: k = 1
    want = [(forward_s, forward_s + backward_s, step_s) for forward_s, backward_s, step_s in COSTS]
    want[-1] = (0.0, *want[-1][1:])
    for index, (cost, expected) in enumerate(zip(costs, want)):
        for kind, wanted in zip(("forward_s", "backward_s", "update_s"), expected):
            value = getattr(cost, kind)
            assert wanted <= value < wanted + SLACK or value == wanted == 0.0, (index, kind, value, wanted)
    share = OUTSIDE / J  # pipelined: one tick per micro-batch
    assert all(c.overhead_s == costs[0].overhead_s for c in costs)
    assert share <= costs[0].overhead_s < share + SLACK / J, (costs[0].overhead_s, share)
