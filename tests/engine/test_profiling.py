"""Measured stage costs and the partition chosen from them: `Placement.auto` against a brute force over every
contiguous split, and `partition="auto"` agreeing across processes."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from petra_hub.analysis import profile_stages, split_backward_shares
from petra_hub.engine import Diagnostics, Layout, MemoryOptions, Mode, Pipeline, Placement, Remedies, StageCost
from petra_hub.engine import partitioning
from petra_hub.engine.graph_budget import kept_graphs
from petra_hub.engine.partitioning import auto_partition
from petra_hub.testing.models import random_images, small_model
from petra_hub.testing.ranks import run_ranks


def sample(model, batch=8, dtype=torch.float64):
    images = random_images(model.config, batch=batch, dtype=dtype)
    return images, torch.randint(0, model.config.num_labels, (batch,), generator=torch.Generator().manual_seed(0))


def test_profile_times_the_runs_own_optimizer_at_learning_rate_zero():
    model = small_model("revnet18", seed=1)
    made = []  # (optimizer, the copy's parameters as they were when it was made)

    def adamw(index, stage):
        optimizer = torch.optim.AdamW(stage.parameters(), lr=0.1, weight_decay=0.1)
        made.append((optimizer, [p.detach().clone() for p in stage.parameters()]))
        return optimizer

    costs = profile_stages(model.get_stages(), sample(model), repeats=2, warmup=0, optimizer_factory=adamw)
    assert len(made) == len(costs)
    for optimizer, before in made:
        assert all(group["lr"] == 0.0 for group in optimizer.param_groups)
        assert all(state["step"] > 0 for state in optimizer.state.values())  # Adam's moments were updated
        after = [p for group in optimizer.param_groups for p in group["params"]]
        assert all(torch.equal(a, b) for a, b in zip(after, before))  # and the weights never moved


@pytest.mark.parametrize("factory", ["default", "none_without_parameters"])
def test_a_stage_without_parameters_is_profiled_without_an_optimizer(factory):
    """A Flatten between a convolution and a linear head: the default SGD has no parameters to take (torch refuses an
    empty optimizer), and a factory may answer None for it as the Pipeline allows; both profile, and so does
    partition="auto"."""
    torch.manual_seed(0)
    stages = [torch.nn.Conv2d(1, 2, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(2 * 4 * 4, 3)]
    batch = (torch.randn(4, 1, 4, 4), torch.randint(0, 3, (4,)))
    made = []

    def sgd_where_parameters(index, stage):
        optimizer = torch.optim.SGD(stage.parameters(), lr=0.1) if list(stage.parameters()) else None
        made.append(optimizer)
        return optimizer

    options = {} if factory == "default" else {"optimizer_factory": sgd_where_parameters}
    costs = profile_stages(stages, batch, F.cross_entropy, repeats=1, warmup=0, **options)
    assert len(costs) == 3 and costs[1].parameter_bytes == 0 < costs[0].parameter_bytes
    if made:
        assert made[1] is None and all(group["lr"] == 0.0 for group in made[0].param_groups)
    pipeline = Pipeline(stages, F.cross_entropy, profile_batch=batch, layout=Layout(partition="auto"), **options)
    assert [len(group) for group in pipeline.placement.groups] == [3]


def test_profile_measures_every_stage_without_touching_it():
    model = small_model("revnet18", seed=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images, labels = sample(model)
    petra = profile_stages(model.get_stages(), (images, labels), repeats=3)
    delayed = profile_stages(model.get_stages(), (images, labels), mode="delayed", repeats=3)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    stages = model.get_stages()
    assert len(petra) == len(stages) and all(c.backward_s > 0 and c.update_s > 0 for c in petra)
    assert all(c.forward_s > 0 for c in petra[:-1]) and petra[-1].forward_s == 0  # the head's fused op: backward_s
    sizes = [images.numel() * images.element_size()]  # sizes[i]: the input of stage i
    with torch.no_grad():
        value = images
        for index, stage in enumerate(stages[:-1]):
            value = stage(value)
            size = sum(t.numel() * t.element_size() for t in (value if isinstance(value, tuple) else (value,)))
            sizes.append(size)
            assert petra[index].forward_bytes == size
            returned = size if getattr(stages[index], "reversible", False) else 0  # its input comes back to it
            assert petra[index + 1].backward_bytes == size + returned
    params = [sum(p.numel() * p.element_size() for p in stage.parameters()) for stage in stages]
    for index, stage in enumerate(stages[:-1]):
        if getattr(stage, "reversible", False):
            # PETRA holds weights, gradients and the messages waiting for it (at most an input, a gradient and the
            # output it rebuilds from); delayed also stores inputs and weight copies
            messages = petra[index].held_bytes - 2 * params[index]
            assert 0 < messages <= sizes[index] + 2 * sizes[index + 1], (index, messages)
            assert delayed[index].held_bytes > petra[index].held_bytes
    assert [c.parameter_bytes for c in petra] == params
    # one micro-batch's graph, the stage's output among it: at least the output, and not the parameters
    for index, cost in enumerate(petra[:-1]):
        assert sizes[index + 1] <= cost.graph_bytes == delayed[index].graph_bytes, index



def test_under_backprop_the_backward_is_split_into_input_and_weight_gradients():
    """torch's zero-bubble schedules split each backward; their simulation needs the time of each half."""
    model = small_model("revnet18", seed=1)
    plain = profile_stages(model.get_stages(), sample(model), mode="backprop", repeats=3)
    assert plain[0].input_backward_s == 0.0  # the images need no gradient: the weights' half is the whole backward
    assert plain[0].weight_backward_s == plain[0].backward_s
    # both halves take time (how they compare with the whole backward is a timing, which a loaded machine moves)
    assert all(c.input_backward_s > 0 and c.weight_backward_s > 0 for c in plain[1:])
    assert all(c.input_backward_s is None and c.weight_backward_s is None
               for c in profile_stages(model.get_stages(), sample(model), repeats=1))  # fmt: skip
    # a linear layer: both halves take time (their ratio is a timing, which a loaded machine moves: not asserted)
    layer, x = torch.nn.Linear(512, 512), torch.randn(256, 512)
    inputs, weights = split_backward_shares(layer, x, None, None, last=False, repeats=5)
    assert inputs > 0 and weights > 0
    assert layer.weight.grad is None  # measuring leaves no gradient behind
    frozen = torch.nn.Linear(4, 4).requires_grad_(False)
    assert split_backward_shares(frozen, torch.randn(2, 4), None, None, last=False, repeats=1) == (1.0, 0.0)


def brute_force(costs, ranks, memory_limit=None, bandwidth=None):
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), ranks - 1):
        bounds = [0, *cuts, len(costs)]
        times, fits = [], True
        for start, stop in zip(bounds, bounds[1:]):
            time = sum(c.compute_s for c in costs[start:stop])
            if bandwidth:
                time += (costs[stop - 1].forward_bytes if stop < len(costs) else 0) / bandwidth
                time += (costs[start].backward_bytes if start else 0) / bandwidth
            times.append(time)
            fits &= memory_limit is None or sum(c.held_bytes for c in costs[start:stop]) <= memory_limit
        if fits and (best is None or max(times) < best):
            best = max(times)
    return best


def bottleneck(placement, costs, bandwidth=None):
    """The slowest rank's time per micro-batch under `placement` (the same model as brute_force)."""
    times = []
    for group in placement.groups:
        time = sum(costs[i].compute_s for i in group)
        if bandwidth:
            time += (costs[group.stop - 1].forward_bytes if group.stop < len(costs) else 0) / bandwidth
            time += (costs[group.start].backward_bytes if group.start else 0) / bandwidth
        times.append(time)
    return max(times)


@pytest.mark.parametrize("seed", range(6))
def test_auto_partition_is_the_best_contiguous_split(seed):
    generator = torch.Generator().manual_seed(seed)
    count = 9
    costs = [StageCost(*torch.rand(3, generator=generator).tolist(),
                       *torch.randint(1, 10**6, (3,), generator=generator).tolist()) for _ in range(count)]
    for ranks in (2, 3, 4):
        assert bottleneck(Placement.auto(costs, ranks), costs) == pytest.approx(brute_force(costs, ranks))
        slow_link = Placement.auto(costs, ranks, link_bandwidth=1e6)
        assert bottleneck(slow_link, costs, 1e6) == pytest.approx(brute_force(costs, ranks, bandwidth=1e6))
        limit = int(1.3 * sum(c.held_bytes for c in costs) / ranks)
        if brute_force(costs, ranks, memory_limit=limit) is None:
            with pytest.raises(ValueError, match="memory_limit"):
                Placement.auto(costs, ranks, memory_limit=limit)
            continue
        with_limit = Placement.auto(costs, ranks, memory_limit=limit)
        assert all(sum(costs[i].held_bytes for i in g) <= limit for g in with_limit.groups)
        assert bottleneck(with_limit, costs) == pytest.approx(brute_force(costs, ranks, memory_limit=limit))
    with pytest.raises(ValueError, match="memory_limit=10 bytes"):
        Placement.auto(costs, 3, memory_limit=10)


def _tanh_stages(count):
    torch.manual_seed(0)
    return [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()) for _ in range(count - 1)] + \
        [torch.nn.Linear(8, 3)]


def spying_on_profile_stages(monkeypatch):
    """The keyword options `auto_partition` passes to `measure_stages`, recorded (the profile still runs)."""
    seen = {}
    original = partitioning.measure_stages

    def spy(*args, **options):
        seen.update(options)
        return original(*args, **options)

    monkeypatch.setattr(partitioning, "measure_stages", spy)
    return seen


def test_partition_auto_profiles_with_the_options_that_change_what_a_stage_costs(monkeypatch):
    """A kept graph spares a recomputation, k > 1 spreads an update over k micro-batches, clipping, prediction,
    sampled checks, gradient norms and compilation add work: the profile measures the run it partitions. What is
    about processes, the user's callbacks or the profile's own tracing stays out."""
    seen = spying_on_profile_stages(monkeypatch)
    factory = lambda i, s: torch.optim.SGD(s.parameters(), lr=0.1)  # noqa: E731
    compiling = {"backend": "eager"}
    batch = (torch.randn(4, 8), torch.randint(0, 3, (4,)))
    Pipeline(_tanh_stages(4), F.cross_entropy, profile_batch=batch, accumulation_steps=4, max_grad_norm=1.0,
             compile_options=compiling, optimizer_factory=factory, precision="bf16", timeout=50,
             on_update=lambda *_: None, scheduler_factory=lambda i, o: None,
             layout=Layout(partition="auto", device="cpu"), memory=MemoryOptions(keep_graphs=[0, 2]),
             remedies=Remedies(weight_prediction=1.0),
             diagnostics=Diagnostics(trace=True, check_reconstruction_every=3, grad_norms=True))
    assert seen["memory"] == MemoryOptions(keep_graphs=(0, 2))
    assert seen["accumulation_steps"] == 4 and seen["remedies"] == Remedies(1.0) and seen["max_grad_norm"] == 1.0
    assert seen["diagnostics"] == Diagnostics(check_reconstruction_every=3, grad_norms=True)
    assert seen["compile_options"] is compiling
    assert seen["optimizer_factory"] is factory and seen["precision"].compute == torch.bfloat16
    assert seen["layout"] == Layout(device="cpu")  # where it runs; not the partition being chosen, nor replicas
    left_out = {"distributed", "group", "profile_batch", "timeout", "on_update", "scheduler_factory"}
    assert not left_out & seen.keys()


def test_a_memory_budget_is_profiled_as_the_graphs_it_keeps_on_an_even_split(monkeypatch):
    """Which graphs fit a rank's budget depends on the split being chosen: the profile keeps those of the even
    split (here the split 3 | 2 keeps two graphs, where one rank holding all five stages has room for one)."""
    seen = spying_on_profile_stages(monkeypatch)
    stages, batch = _tanh_stages(5), (torch.randn(4, 8), torch.randint(0, 3, (4,)))
    budget = MemoryOptions(memory_budget=4000)
    expected = kept_graphs(stages, Mode.PETRA, Placement.balanced(5, 2).groups, budget, sample_inputs=batch[0])
    assert expected and expected != kept_graphs(stages, Mode.PETRA, [range(5)], budget, sample_inputs=batch[0])
    sizes = auto_partition(Pipeline, stages, F.cross_entropy, batch, 2, Mode.PETRA, memory=budget)
    assert sum(sizes) == 5 and len(sizes) == 2
    assert seen["memory"] == MemoryOptions(keep_graphs=tuple(sorted(expected)))


def test_the_partition_counts_an_update_once_every_k_micro_batches():
    """Stage 0's update costs twice its forward and backward: with k = 1 it needs a rank of its own; with k = 4 its
    update is a quarter of that per micro-batch and it shares a rank with stage 1."""
    costs = [StageCost(0.5, 0.5, 2.0, 0, 0, 0), StageCost(0.5, 0.5, 0.0, 0, 0, 0), StageCost(1.0, 1.0, 0.0, 0, 0, 0)]
    assert [len(g) for g in Placement.auto(costs, 2).groups] == [1, 2]
    assert [len(g) for g in Placement.auto(costs, 2, accumulation_steps=4).groups] == [2, 1]


def _auto_on_ranks(rank, world_size):
    model = small_model("revnet18", dtype=torch.float32, seed=2)
    images, labels = sample(model, dtype=torch.float32)
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, profile_batch=(images, labels),
                        optimizer_factory=lambda i, s: torch.optim.SGD(s.parameters(), lr=0.1), timeout=60,
                        layout=Layout(partition="auto"))
    for _ in range(6):
        pipeline.step(images, labels)
    pipeline.drain()
    return [len(g) for g in pipeline.placement.groups]


def test_partition_auto_agrees_across_processes_and_needs_a_batch(tmp_path):
    outcome, codes, _ = run_ranks(_auto_on_ranks, 2, out_dir=tmp_path, deadline=150)
    assert codes == [0, 0], [r and r.get("traceback") for r in outcome]
    sizes = [r["value"] for r in outcome]
    assert sizes[0] == sizes[1] and sum(sizes[0]) == 10 and len(sizes[0]) == 2
    with pytest.raises(ValueError, match="partition='auto' needs profile_batch"):
        Pipeline(small_model().get_stages(), F.cross_entropy, layout=Layout(partition="auto"))
