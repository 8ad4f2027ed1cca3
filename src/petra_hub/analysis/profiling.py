"""What each stage costs, measured for analysis: `measure_stages` (the engine's own profile, which
`Pipeline(partition="auto")` runs) in a `Pipeline`, plus, under `backprop`, how a backward splits into the input's
gradient and the weights' (what torch's zero-bubble schedules run, and what `simulate_schedule` replays)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch
from torch import nn

from ..engine.batchnorm import frozen_running_stats
from ..engine.modes import Mode
from ..engine.partitioning import StageCost, generators_kept, measure_stages
from ..engine.pipeline import Pipeline
from ..engine.randomness import preserved
from ..engine.tensors import Activation, as_tuple, detached, to_device


def profile_stages(
    stages: list[nn.Module],
    sample_batch: tuple[Activation, object],
    loss_fn: Callable = torch.nn.functional.cross_entropy,
    *,
    mode: Mode | str = Mode.PETRA,
    repeats: int = 5,
    warmup: int = 2,
    optimizer_factory: Callable | None = None,
    **options,
) -> list[StageCost]:
    """Measure every stage on `sample_batch` = (inputs, targets) in one process (the stages themselves are not
    touched: copies run; see `petra_hub.engine.partitioning`). `optimizer_factory` is the run's
    `(index, stage) -> optimizer`, whose step the update timings measure (default: plain SGD); it runs at learning
    rate 0. `options` go to the `Pipeline` (e.g. `precision`, `device`). Under `backprop`, each cost also holds the
    halves of its split backward (`split_backward_shares`)."""
    mode = Mode.parse(mode)
    measured = measure_stages(Pipeline, stages, sample_batch, loss_fn, mode=mode, repeats=repeats, warmup=warmup,
                              optimizer_factory=optimizer_factory, **options)
    costs = measured.costs
    if mode is Mode.BACKPROP:  # what a split backward (torch's zero-bubble schedules) needs
        with generators_kept(stages, measured.device):
            costs[0] = replace(costs[0], input_backward_s=0.0, weight_backward_s=costs[0].backward_s)  # no gradient
            targets = to_device(sample_batch[1], measured.device)
            for index, stage in enumerate(measured.copies[1:], start=1):
                shares = split_backward_shares(stage, measured.stage_inputs[index], targets, loss_fn,
                                               index == len(measured.copies) - 1, repeats)
                costs[index] = replace(costs[index], input_backward_s=shares[0] * costs[index].backward_s,
                                       weight_backward_s=shares[1] * costs[index].backward_s)
    return costs


def split_backward_shares(stage: nn.Module, inputs: Activation, targets, loss_fn: Callable, last: bool,
                          repeats: int) -> tuple[float, float]:
    """The two halves of a split backward through `stage(inputs)`, each as a fraction of one plain backward (medians
    of `repeats` timings of each, graphs built untimed): the input's gradient, then the weights'. The split is
    torch's own (`stage_backward_input`, `stage_backward_weight` of torch.distributed.pipelining, which its
    zero-bubble schedules run); where this torch lacks them, the input half is a gradient to the inputs alone and
    the weight half the rest of a plain backward."""
    try:
        from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    except ImportError:
        stage_backward_input = stage_backward_weight = None
    params = [p for p in stage.parameters() if p.requires_grad]
    if not params:
        return 1.0, 0.0
    timings = {"plain": [], "input": [], "weight": []}
    with torch.enable_grad(), frozen_running_stats(stage), preserved(params[0].device):
        for _ in range(repeats + 1):  # the first of each untimed
            for split in (False, True):
                leaves = detached(inputs, requires_grad=True)
                wrt_inputs = [t for t in as_tuple(leaves) if t.requires_grad]
                outputs = as_tuple(stage(leaves))
                # the loss, or copies as a pipeline stage sends them: torch's split detaches them in place
                outputs = (loss_fn(outputs[0], targets),) if last else tuple(t.clone() for t in outputs)
                seeds = [torch.ones_like(t) for t in outputs]
                start = time.perf_counter()
                if not split:
                    torch.autograd.grad(outputs, wrt_inputs + params, seeds, allow_unused=True)
                    timings["plain"].append(time.perf_counter() - start)
                elif stage_backward_input is None:
                    torch.autograd.grad(outputs, wrt_inputs, seeds, allow_unused=True)
                    timings["input"].append(time.perf_counter() - start)
                else:
                    _, groups = stage_backward_input(list(outputs), seeds, wrt_inputs, iter(params))
                    middle = time.perf_counter()
                    stage_backward_weight(iter(params), groups)
                    timings["input"].append(middle - start)
                    timings["weight"].append(time.perf_counter() - middle)
                    for tensor in (*params, *wrt_inputs):
                        tensor.grad = None
    plain, first = (statistics.median(timings[key][1:]) for key in ("plain", "input"))
    if stage_backward_input is None:
        return min(1.0, first / plain), max(0.0, 1.0 - first / plain)
    return first / plain, statistics.median(timings["weight"][1:]) / plain
