"""Memory counted the way a device pays for it: the messages waiting between ticks belong to the stage they are
for, and what one process holds (`process_memory`, each storage once) agrees with glibc's own count of the bytes
it has handed out (`malloc_in_use`), in one process and in each of two."""

import types
import weakref

import pytest
import torch
import torch.nn.functional as F

from petra_hub.engine import MemoryOptions, Mode, Pipeline, Remedies
from petra_hub.engine.accounting import graph_bytes, memory_of
from petra_hub.engine.batchnorm import frozen_running_stats
from petra_hub.engine.tensors import as_tuple
from petra_hub.testing.malloc import malloc_available, steady_state_growth
from petra_hub.testing.models import RECIPE_WIDTH, doubling_widths, small_model
from petra_hub.testing.ranks import run_ranks
from tests.engine.test_fidelity import sgd

needs_glibc = pytest.mark.skipif(not malloc_available(), reason="needs glibc's mallinfo2")


def recipe_model():
    """The recipe's RevNet18 (widths 16..128), float32: buffers of megabytes, far above Python's own objects."""
    widths = doubling_widths(RECIPE_WIDTH)
    return small_model("revnet18", dtype=torch.float32, hidden_sizes=widths, embedding_size=RECIPE_WIDTH)


def batch(config, size, seed, image_size=32):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, config.num_channels, image_size, image_size, generator=generator)
    return images, torch.randint(0, config.num_labels, (size,), generator=generator)


def output_bytes(stages, images):
    """Bytes of every stage's output for `images`."""
    sizes, x = [], images
    with torch.no_grad():
        for stage in stages:
            with frozen_running_stats(stage):
                x = stage(x)
            sizes.append(sum(t.numel() * t.element_size() for t in as_tuple(x)))
    return sizes


@pytest.mark.parametrize("mode", ["petra", "delayed"])
def test_the_messages_waiting_for_a_stage_are_counted_exactly(mode):
    model = small_model("revnet18", dtype=torch.float32)
    stages = model.get_stages()
    J = len(stages)
    pipeline = Pipeline(stages, F.cross_entropy, mode=mode)
    for step in range(2 * J):  # past the 2(J-1) ticks of warm-up: every stage has work in both directions
        pipeline.step(*batch(model.config, 4, step, image_size=8))
    out = output_bytes(stages, batch(model.config, 4, 0, image_size=8)[0])
    memory = pipeline.memory()
    assert memory[0].message_bytes == out[0] * (1 + stages[0].reversible)  # the gradient of its output, no input
    for i in range(1, J - 1):
        returned = 1 if Mode(mode).reconstructs and stages[i].reversible else 0  # its output, to rebuild from
        assert memory[i].message_bytes == out[i - 1] + (1 + returned) * out[i], i
    assert memory[J - 1].message_bytes == out[J - 2]  # the head runs its backward in the tick of its forward
    assert all(m.total_bytes == m.activation_bytes + m.stash_bytes + m.gradient_bytes + m.message_bytes
               for m in memory.values())
    pipeline.drain()
    assert all(m.message_bytes == 0 for m in pipeline.memory().values())


def test_a_process_counts_a_storage_its_stages_share_once():
    model = small_model("revnet18", dtype=torch.float32)
    stages = model.get_stages()
    for mode in ["delayed", "petra"]:
        pipeline = Pipeline(stages, F.cross_entropy, mode=mode)
        for step in range(2 * len(stages)):
            pipeline.step(*batch(model.config, 4, step, image_size=8))
        per_stage = sum(m.total_bytes for m in pipeline.memory().values())
        held = pipeline.process_memory().total_bytes
        if mode == "delayed":  # a reversible block's second output stream is its stored second input stream
            assert held < 0.9 * per_stage
        else:  # PETRA stores no stream a neighbour also holds
            assert held == per_stage
        pipeline.drain()


def held_against_malloc(mode):
    """(bytes `process_memory` gained, bytes malloc handed out) between an empty pipeline and its steady state, on
    this process (one rank of a process group if one is initialised)."""
    torch.manual_seed(0)
    model = recipe_model()
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, mode=mode)
    growth = steady_state_growth(pipeline, lambda step: batch(model.config, 16, step))
    return growth["process_bytes"], growth["malloc_bytes"]


@needs_glibc
@pytest.mark.parametrize("mode", ["delayed", "petra"])
def test_one_process_holds_what_malloc_says_within_10_percent(mode):
    held, allocated = held_against_malloc(mode)
    assert held > 10 * 2**20
    assert abs(allocated / held - 1) < 0.10, (held, allocated)


def _two_ranks(rank, world_size, mode):
    return held_against_malloc(mode)


@needs_glibc
def test_each_of_two_processes_holds_what_malloc_says_within_10_percent(tmp_path):
    results, codes, _ = run_ranks(_two_ranks, 2, "petra", out_dir=tmp_path, deadline=200)
    assert codes == [0, 0], results
    for rank, result in enumerate(results):
        held, allocated = result["value"]
        assert held > 2**20, rank
        assert abs(allocated / held - 1) < 0.10, (rank, held, allocated)


@pytest.mark.parametrize("mode, options", [("petra", {}), ("delayed", {"accumulation_steps": 2}),
                                           ("petra", {"memory": MemoryOptions(keep_graphs=[0, 2])}),
                                           ("backprop", {}),
                                           ("petra", {"remedies": Remedies(weight_prediction=0.5),
                                                      "optimizer_factory": sgd})])
def test_the_peak_from_running_totals_is_the_largest_exact_count_after_any_operation(mode, options):
    model = small_model("revnet18", dtype=torch.float32)
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, mode=mode, **options)
    exact = {index: 0 for index in pipeline.workers}
    for worker in pipeline.workers.values():  # recount every tensor held after each operation, as memory() does
        for name in ("forward", "backward", "forward_backward_last"):
            def recounting(*args, _op=getattr(worker, name), _worker=worker, **kwargs):
                result = _op(*args, **kwargs)
                total = memory_of(_worker.held()).total_bytes + _worker.kept_graph_bytes()
                exact[_worker.index] = max(exact[_worker.index], total)
                return result
            setattr(worker, name, recounting)
    for step in range(3 * len(model.get_stages())):
        pipeline.step(*batch(model.config, 4, step, image_size=8))
    pipeline.drain()
    peaks = {index: stats.peak_bytes for index, stats in pipeline.memory().items()}
    assert peaks == exact and min(peaks.values()) > 0


class _Released(torch.autograd.Function):
    """The identity, whose backward records in `released` whether `probe.saved` (a weak reference) is dead."""

    @staticmethod
    def forward(ctx, x, probe):
        ctx.probe = probe
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.probe.released.append(ctx.probe.saved() is None)
        return grad, None


class _SavesLate(torch.nn.Module):
    """x -> sin(x * w'), w' = _Released(w): `h = x * w'` is saved by sin's node, which runs first in the backward;
    `_Released`'s node runs last and looks whether `h` is gone by then."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.full((8,), 0.5))
        self.released = []

    def forward(self, x):
        probe = types.SimpleNamespace(released=self.released)  # one per forward: several may be in flight
        h = x * _Released.apply(self.weight, probe)
        probe.saved = weakref.ref(h)
        return torch.sin(h)


@pytest.mark.parametrize("mode, options", [("backprop", {}), ("petra", {"memory": MemoryOptions(keep_graphs=[0])})])
def test_a_kept_graph_frees_what_it_saved_as_its_backward_goes(mode, options):
    """What a kept graph saved is freed node by node, as autograd frees it in a plain loop, not held to the end of
    the stage's backward: the accounting's record of it must not keep it alive."""
    stage = _SavesLate()
    pipeline = Pipeline([stage, torch.nn.Linear(8, 2)], F.cross_entropy, mode=mode, **options)
    for _ in range(3):
        pipeline.step(torch.randn(4, 8), torch.randint(0, 2, (4,)))
    pipeline.drain()
    assert stage.released == [True, True, True]


def test_kept_graphs_are_counted_by_their_own_shape_when_micro_batch_sizes_change():
    """A kept graph's bytes are measured once per input shape and reused: with micro-batches of 4 and of 2 samples in
    flight, the stage holds what `graph_bytes` (a fresh count of each graph, with its inputs) gives for each."""
    model = small_model("revnet18", dtype=torch.float32)
    stages = model.get_stages()
    pipeline = Pipeline(stages, F.cross_entropy, mode="petra", memory=MemoryOptions(keep_graphs=[0]))
    fed = [batch(model.config, size, step, image_size=8) for step, size in enumerate([4, 4, 2, 4, 2])]
    for images, labels in fed:
        pipeline.step(images, labels)
    in_flight = pipeline.in_flight()[0]
    assert in_flight == list(range(len(fed)))
    with frozen_running_stats(stages[0]):
        expected = sum(graph_bytes(stages[0], fed[m][0], with_inputs=True) for m in in_flight)
    sizes = {graph_bytes(stages[0], fed[m][0], with_inputs=True) for m in in_flight}
    assert len(sizes) == 2  # two shapes in flight, each counted as its own
    assert pipeline.memory()[0].activation_bytes == expected
    pipeline.drain()
    assert pipeline.memory()[0].activation_bytes == 0


def test_weight_prediction_holds_one_copy_of_each_stage_s_weights_counted_as_remedy_bytes():
    model = small_model("revnet18", dtype=torch.float32)
    stages = model.get_stages()
    pipeline = Pipeline(stages, F.cross_entropy, mode="petra", optimizer_factory=sgd,
                        remedies=Remedies(weight_prediction=0.5))
    pipeline.step(*batch(model.config, 4, 0, image_size=8))
    assert all(stats.remedy_bytes == 0 for stats in pipeline.memory().values())  # no update yet: nothing to extrapolate
    for step in range(1, 3 * len(stages)):
        pipeline.step(*batch(model.config, 4, step, image_size=8))
    weights = [sum(p.numel() * p.element_size() for p in stage.parameters() if p.requires_grad) for stage in stages]
    remedy = [stats.remedy_bytes for stats in pipeline.memory().values()]
    assert remedy == weights[:-1] + [0]  # the last stage has no delay to extrapolate over
    assert pipeline.process_memory().remedy_bytes == sum(weights[:-1])
