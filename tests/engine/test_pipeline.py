"""The one-process engine against references written here: autograd per micro-batch, delayed SGD, backprop."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from petra_hub.engine.batchnorm import batch_norms, frozen_running_stats
from petra_hub.engine import (Layout, MemoryOptions, Mode, Pipeline, Placement, Schedule, StageMismatchError,
                              paper_sgd)
from petra_hub.testing.models import random_images, small_model
from petra_hub.testing.stage_contract import relative_error

DELAYED_MODES = [Mode.PETRA, Mode.DELAYED, Mode.INPUT_BUFFER, Mode.WEIGHT_STASH]


def micro_batches(config, count, batch=4, dtype=torch.float64):
    out = []
    for index in range(count):
        images = random_images(config, batch=batch, dtype=dtype, seed=10 + index)
        labels = torch.randint(0, config.num_labels, (batch,), generator=torch.Generator().manual_seed(index))
        out.append((images, labels))
    return out


def cross_entropy(logits, labels):
    return F.cross_entropy(logits, labels)


def per_micro_batch_gradients(model, batches):
    """Reference: plain autograd on the whole model, one micro-batch at a time (frozen weights)."""
    reference = copy.deepcopy(model)
    grads = []
    for images, labels in batches:
        reference.zero_grad()
        cross_entropy(reference(images).logits, labels).backward()
        grads.append({name: p.grad.clone() for name, p in reference.named_parameters()})
    return reference, grads


def assert_frozen_weights_give_the_backprop_gradient(model, batches, mode, stages=None, **options):
    """With a zero learning rate, every micro-batch's averaged gradient at every stage is plain autograd's on the
    whole model, on the model's device, and running statistics count each micro-batch once. `stages`: the model's
    stages as the pipeline runs them (default `model.get_stages()`); `options` go to the Pipeline (e.g. device).
    Also run on a GPU by tests/gpu."""
    reference, expected = per_micro_batch_gradients(model, batches)
    device = next(model.parameters()).device
    names = {id(p): name for name, p in model.named_parameters()}
    seen = {}

    def record(stage_index, group, stage):
        for param in stage.parameters():
            assert param.grad.device == device
            seen[(group[0], names[id(param)])] = param.grad.clone()

    stages = stages or model.get_stages()
    pipeline = Pipeline(
        stages,
        cross_entropy,
        mode=mode,
        on_update=record,
        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.0),
        **options,
    )
    assert len(pipeline.stages) == len(stages)
    for images, labels in batches:
        pipeline.step(images, labels)
    pipeline.drain()
    assert len(seen) == len(batches) * len(expected[0])
    for (micro_batch, name), grad in seen.items():
        want = expected[micro_batch][name]
        if want.norm() > 0:
            assert relative_error(grad, want) < 1e-9, (micro_batch, name)
    # Running statistics: each micro-batch counted once, exactly as the plain model run once per micro-batch.
    for got, want in zip(batch_norms(model), batch_norms(reference)):
        assert int(got.num_batches_tracked) == int(want.num_batches_tracked) == len(batches)
        assert relative_error(got.running_mean, want.running_mean) < 1e-12
        assert relative_error(got.running_var, want.running_var) < 1e-12


@pytest.mark.parametrize("downsampling", ["buffered", "invertible"])
@pytest.mark.parametrize("mode", DELAYED_MODES, ids=lambda m: m.value)
def test_frozen_weights_give_the_backprop_gradient_of_every_micro_batch(mode, downsampling):
    model = small_model("revnet18", downsampling=downsampling)
    model.train()
    assert_frozen_weights_give_the_backprop_gradient(model, micro_batches(model.config, 6), mode)


def test_delayed_mode_matches_a_straightforward_delayed_sgd():
    """Stage i runs micro-batch b's forward with the weights after max(0, b - 2(J-1-i)) updates, and its backward
    with those same (stashed) weights and the stored input: the gradient of the composed function at mixed
    weight versions. Written here with functional_call, independently of the engine."""
    lr, count = 0.05, 8
    model = small_model("revnet18")
    model.train()
    stages = model.get_stages()
    J = len(stages)
    batches = micro_batches(model.config, count)
    history = [[{n: p.detach().clone() for n, p in stage.named_parameters()}] for stage in stages]
    for b, (images, labels) in enumerate(batches):
        versions = [max(0, b - 2 * (J - 1 - i)) for i in range(J)]
        params = [{n: t.clone().requires_grad_(True) for n, t in history[i][versions[i]].items()} for i in range(J)]
        x = images
        with frozen_running_stats(model):
            for stage, p in zip(stages, params):
                x = functional_call(stage, p, (x,))
        loss = cross_entropy(x, labels)
        flat = [t for p in params for t in p.values()]
        grads = dict(zip(map(id, flat), torch.autograd.grad(loss, flat)))
        for i in range(J):
            latest = history[i][-1]
            history[i].append({n: latest[n] - lr * grads[id(params[i][n])] for n in latest})

    engine_model = small_model("revnet18")
    pipeline = Pipeline(
        engine_model.get_stages(),
        cross_entropy,
        mode="delayed",
        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=lr),
    )
    for images, labels in batches:
        pipeline.step(images, labels)
    pipeline.drain()
    for i, stage in enumerate(engine_model.get_stages()):
        for name, param in stage.named_parameters():
            assert relative_error(param, history[i][-1][name]) < 1e-9, (i, name)


@pytest.mark.parametrize("preset,downsampling,lr", [("revnet18", "buffered", 0.01), ("revnet50", "invertible", 1e-3)])
def test_reversible_backprop_matches_plain_backprop_step_for_step(preset, downsampling, lr):
    count = 5
    plain = small_model(preset, downsampling=downsampling)
    plain.train()
    engine_model = copy.deepcopy(plain)
    optimizer = torch.optim.SGD(plain.parameters(), lr=lr, momentum=0.9)
    pipeline = Pipeline(
        engine_model.get_stages(),
        cross_entropy,
        mode="reversible_backprop",
        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=lr, momentum=0.9),
    )
    for images, labels in micro_batches(plain.config, count):
        optimizer.zero_grad()
        loss = cross_entropy(plain(images).logits, labels)
        loss.backward()
        optimizer.step()
        (engine_loss,) = pipeline.step(images, labels)
        assert loss.item() < 5  # a sane regime: divergence would amplify rounding
        assert abs(float(engine_loss[1]) - loss.item()) < 1e-10
        for (name, want), got in zip(plain.named_parameters(), engine_model.parameters()):
            assert relative_error(got, want) < 1e-10, name
    for got, want in zip(batch_norms(engine_model), batch_norms(plain)):
        assert relative_error(got.running_mean, want.running_mean) < 1e-10


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_fifo_lengths_memory_and_drain_accounting(mode):
    model = small_model("revnet18", dtype=torch.float32)
    model.train()
    stages = model.get_stages()
    J, count, k = len(stages), 23, 4
    pipeline = Pipeline(
        stages,
        cross_entropy,
        mode=mode,
        accumulation_steps=k,
        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.01),
    )
    batches = micro_batches(model.config, count, dtype=torch.float32)
    losses = []
    for images, labels in batches:
        losses += pipeline.step(images, labels)
    in_flight = pipeline.in_flight()
    memory = pipeline.memory()
    expected = [2 * (J - 1 - i) if mode.pipelined else 0 for i in range(J)]
    assert [len(in_flight[i]) for i in range(J)] == expected
    if mode.pipelined:
        assert in_flight[0] == list(range(count - 2 * (J - 1), count))
    for i, stage in enumerate(stages):
        holds_nothing = stage.reversible and mode.reconstructs
        if holds_nothing or expected[i] == 0:
            assert memory[i].activation_bytes == 0, i
        else:
            assert memory[i].activation_bytes > 0, i
        assert (memory[i].stash_bytes > 0) == (mode.stashes_weights and expected[i] > 0), i
    losses += pipeline.drain()
    assert sorted(b for b, _ in losses) == list(range(count))
    for i, counters in pipeline.counters().items():
        assert (counters.forwards, counters.backwards, counters.last_backward) == (count, count, count - 1)
        assert counters.updates == -(-count // k)  # 5 full groups of 4 and the last 3 micro-batches
    assert all(not fifo for fifo in pipeline.in_flight().values())
    assert all(m.activation_bytes == m.stash_bytes == m.gradient_bytes == 0 for m in pipeline.memory().values())


def test_stored_input_bytes_are_measured_exactly():
    model = small_model("revnet18", dtype=torch.float32)
    stages = model.get_stages()
    pipeline = Pipeline(stages, cross_entropy, mode="petra")
    batches = micro_batches(model.config, 25, dtype=torch.float32)  # past the 2(J-1) = 18 warm-up
    for images, labels in batches:
        pipeline.step(images, labels)
    memory = pipeline.memory()
    J = len(stages)
    # The stem keeps 2(J-1) image batches; a downsampling stage keeps 2(J-1-i) two-stream inputs.
    assert memory[0].activation_bytes == 2 * (J - 1) * batches[0][0].numel() * 4
    x = batches[0][0]
    with torch.no_grad(), frozen_running_stats(model):
        for stage in stages[:3]:
            x = stage(x)
    assert not stages[3].reversible
    assert memory[3].activation_bytes == 2 * (J - 1 - 3) * sum(t.numel() for t in x) * 4


def test_any_list_of_non_reversible_stages_trains():
    """An ordinary CNN cut into pieces (the ResNet baselines) gets the exact gradient with frozen weights."""
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU()),
        nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, stride=2), nn.ReLU()),
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 3)),
    ).double()
    images = [torch.randn(5, 3, 8, 8, dtype=torch.float64) for _ in range(4)]
    labels = [torch.randint(0, 3, (5,)) for _ in range(4)]
    expected = []
    reference = copy.deepcopy(net)
    for x, y in zip(images, labels):
        reference.zero_grad()
        cross_entropy(reference(x), y).backward()
        expected.append([p.grad.clone() for p in reference.parameters()])
    got = {}
    index_of = {id(p): n for n, p in enumerate(net.parameters())}

    def record(stage_index, group, stage):
        for p in stage.parameters():
            got[(group[0], index_of[id(p)])] = p.grad.clone()

    pipeline = Pipeline(list(net), cross_entropy, mode="petra", on_update=record)
    for x, y in zip(images, labels):
        pipeline.step(x, y)
    pipeline.drain()
    assert len(got) == 4 * len(expected[0])
    for (b, n), grad in got.items():
        assert relative_error(grad, expected[b][n]) < 1e-12


class _Embed(nn.Module):
    """(token ids, integer mask) -> (embeddings, the mask passed on unchanged)."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4).double()

    def forward(self, x):
        ids, mask = x
        return self.embedding(ids), mask


class _MaskedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4).double()

    def forward(self, x):
        hidden, mask = x
        return torch.tanh(self.linear(hidden)) * mask.unsqueeze(-1), mask


class _MaskedHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 3).double()

    def forward(self, x):
        hidden, mask = x
        return self.linear((hidden * mask.unsqueeze(-1)).sum(1))


@pytest.mark.parametrize("mode,keep_graphs", [("petra", None), ("petra", [1]), ("backprop", None)],
                         ids=["petra-recomputing", "petra-kept-graph", "backprop"])
def test_an_integer_mask_carried_along_the_stages_gets_the_backprop_gradient(mode, keep_graphs):
    """Activations (hidden, mask) with an int64 mask, as transformer stages pass them: only the outputs that are
    part of the graph are backpropagated (autograd refused the whole backward at the first stage that tried the
    mask), and frozen weights give plain autograd's gradient of every micro-batch, in the stages' backwards and in
    the fidelity probe's."""
    torch.manual_seed(0)
    net = nn.Sequential(_Embed(), _MaskedBlock(), _MaskedBlock(), _MaskedHead())
    batches = []
    for _ in range(5):
        ids, mask = torch.randint(0, 10, (3, 6)), (torch.rand(3, 6) > 0.3).long()
        batches.append(((ids, mask), torch.randint(0, 3, (3,))))
    expected = []
    reference = copy.deepcopy(net)
    for inputs, labels in batches:
        reference.zero_grad()
        cross_entropy(reference(inputs), labels).backward()
        expected.append([p.grad.clone() for p in reference.parameters()])
    got = {}
    index_of = {id(p): n for n, p in enumerate(net.parameters())}

    def record(stage_index, group, stage):
        for p in stage.parameters():
            got[(group[0], index_of[id(p)])] = p.grad.clone()

    pipeline = Pipeline(list(net), cross_entropy, mode=mode, on_update=record,
                        memory=MemoryOptions(keep_graphs=keep_graphs))
    pipeline.probe()  # the fidelity probe's own backward through the stages, too
    for inputs, labels in batches:
        pipeline.step(inputs, labels)
    pipeline.drain()
    assert len(got) == len(batches) * len(expected[0])
    for (b, n), grad in got.items():
        assert relative_error(grad, expected[b][n]) < 1e-12, (b, n)
    fidelity = pipeline.gradient_fidelity()
    assert [record.stage for record in fidelity] == [0, 1, 2, 3]
    assert all(record.cosine_true == pytest.approx(1.0, abs=1e-12) for record in fidelity)


def test_schedule_timing_matches_the_paper():
    schedule = Schedule(num_stages=4, pipelined=True)
    for b in range(5):
        for i in range(4):
            assert schedule.forward_tick(b, i) == b + i
            assert schedule.backward_tick(b, i) == b + 2 * 3 - i
    assert schedule.table(2)[3][3] == "F0 B0"  # the head does forward and backward in one tick
    assert schedule.table(2)[0] == ["F0", "F1", ".", ".", ".", ".", "B0", "B1"]
    lines = schedule.grid(2).splitlines()
    assert lines[0].split() == ["tick", *map(str, range(8))] and len(lines) == 1 + 4
    assert lines[1].split()[2:] == ["F0", "F1", ".", ".", ".", ".", "B0", "B1"]
    assert lines[1].index("B0") == lines[0].index("6") and lines[2].index("B0") == lines[0].index("5")  # aligned
    synchronous = Schedule(num_stages=3, pipelined=False)
    assert [synchronous.forward_tick(1, i) for i in range(3)] == [5, 6, 7]
    assert synchronous.backward_tick(0, 0) < synchronous.forward_tick(1, 0)


@pytest.mark.parametrize("pipelined", [True, False])
@pytest.mark.parametrize("num_stages", [1, 2, 5])
def test_the_work_at_a_tick_is_every_stage_the_grid_shows_busy(pipelined, num_stages):
    """`work_at` (what the tick loop runs) lists exactly the stages and micro-batches of `forward_at` and
    `backward_at`, for any local range of stages, while micro-batches are fed and after."""
    schedule = Schedule(num_stages, pipelined)
    for local in (range(num_stages), range(num_stages // 2, num_stages), range(0, 1)):
        for fed in (1, 3):
            for tick in range(schedule.backward_tick(fed - 1, 0) + 3):
                expected = [(stage, schedule.forward_at(stage, tick, fed), schedule.backward_at(stage, tick, fed))
                            for stage in local]
                expected = [work for work in expected if work[1:] != (None, None)]
                assert schedule.work_at(local, tick, fed) == expected, (local, fed, tick)
    ticks = range(schedule.latency + 2 * schedule.ticks_per_micro_batch)
    operations = [b for tick in ticks for _, f, b_ in schedule.work_at(range(num_stages), tick, 3) for b in (f, b_)]
    assert sorted(b for b in operations if b is not None) == [b for b in range(3) for _ in range(2 * num_stages)]


def test_placement_and_bad_settings():
    assert [list(g) for g in Placement.balanced(10, 3).groups] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    with pytest.raises(ValueError, match="at most 10 processes"):
        Placement.balanced(10, 11)
    with pytest.raises(ValueError, match="at least one stage"):
        Placement.from_sizes([3, 0])
    stages = small_model("revnet18").get_stages()
    with pytest.raises(ValueError, match="accumulation_steps"):
        Pipeline(stages, cross_entropy, accumulation_steps=0)
    with pytest.raises(ValueError, match="Unknown PETRA mode"):
        Pipeline(stages, cross_entropy, mode="pipedream")
    with pytest.raises(ValueError, match="covering all 10 stages"):
        Pipeline(stages, cross_entropy, layout=Layout(partition=[4, 4]))


def test_six_processes_as_two_replicas_are_two_pipelines_of_three_in_rank_order():
    from petra_hub.engine import pipeline_rank_of, replica_of

    assert [(replica_of(rank, 6, 2), pipeline_rank_of(rank, 6, 2)) for rank in range(6)] == \
        [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    assert [pipeline_rank_of(rank, 3, 1) for rank in range(3)] == [0, 1, 2]


def test_shape_mismatch_between_stages_names_both():
    stages = [nn.Conv2d(3, 4, 3), nn.Conv2d(5, 2, 3), nn.Sequential(nn.Flatten(), nn.LazyLinear(2))]
    pipeline = Pipeline(stages, cross_entropy)
    with pytest.raises(StageMismatchError, match=r"stage 1 \(Conv2d\) cannot take the output of stage 0 \(Conv2d\)"):
        pipeline.step(torch.randn(2, 3, 9, 9), torch.tensor([0, 1]))


def test_dtype_mismatch_and_changing_micro_batch_shape_are_errors():
    model = small_model("revnet18", dtype=torch.float64)
    pipeline = Pipeline(model.get_stages(), cross_entropy)
    images = random_images(model.config, dtype=torch.float32)
    with pytest.raises(StageMismatchError, match=r"stage 0 \(RevNetStem\) has \['torch.float64'\] parameters"):
        pipeline.step(images, torch.zeros(4, dtype=torch.long))
    pipeline = Pipeline(model.get_stages(), cross_entropy)
    pipeline.step(random_images(model.config), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="same per-sample shape"):
        pipeline.step(torch.zeros(4, 3, 16, 16, dtype=torch.float64), torch.zeros(4, dtype=torch.long))


def test_infer_equals_the_model_in_eval_mode():
    model = small_model("revnet34")
    pipeline = Pipeline(model.get_stages(), cross_entropy, mode="petra")
    for images, labels in micro_batches(model.config, 3):
        pipeline.step(images, labels)
    pipeline.drain()
    images = random_images(model.config, batch=3)
    model.eval()
    expected = model(images).logits
    model.train()
    assert torch.equal(pipeline.infer(images), expected)
    assert all(stage.training for stage in model.get_stages())


def test_paper_sgd_spares_norms_and_biases_from_weight_decay():
    stage = small_model("revnet50").get_stages()[1]
    optimizer = paper_sgd(stage, lr=0.1, weight_decay=1e-4)
    decayed, spared = optimizer.param_groups
    assert decayed["weight_decay"] == 1e-4 and spared["weight_decay"] == 0.0
    assert all(p.dim() == 4 for p in decayed["params"]) and all(p.dim() == 1 for p in spared["params"])
    assert len(decayed["params"]) + len(spared["params"]) == len(list(stage.parameters()))
    assert optimizer.defaults["nesterov"] and optimizer.defaults["momentum"] == 0.9
