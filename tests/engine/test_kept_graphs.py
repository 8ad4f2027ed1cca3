"""Kept graphs: a stage that would recompute its forward in the backward (from its stored input, or from the input
it rebuilds by inversion) keeps the forward's graph instead, chosen by index or by a memory budget per rank.
References: the delayed mode's recomputation with stashed weights (the same gradient), the fidelity probes'
plain-autograd stashed-weight gradient, the handshake's message layouts, and the engine's own memory accounting."""

import copy

import pytest
import torch
import torch.nn.functional as F

from petra_hub.analysis import profile_stages
from petra_hub.engine import MemoryOptions, Mode, Pipeline, Schedule
from petra_hub.engine.accounting import nbytes
from petra_hub.engine.graph_budget import keepable_stages, kept_graph_bytes, recomputing_stages, stage_inputs
from petra_hub.engine.pending import ParameterSlots
from petra_hub.engine.tensors import as_tuple
from petra_hub.testing.models import small_model
from petra_hub.testing.ranks import run_ranks
from tests.engine.test_fidelity import batches_for, sgd, snapshots

STEM_AND_DOWNSAMPLING = [0, 3, 5, 7]  # small RevNet18: S R R D R D R D R H
ALL_BUT_HEAD = list(range(9))


def forward_calls(stages):
    """Count every evaluation of each stage (forwards, recomputations)."""
    calls = [0] * len(stages)
    for index, stage in enumerate(stages):
        stage.register_forward_hook(lambda *_, index=index: calls.__setitem__(index, calls[index] + 1))
    return calls


def train(mode, keep_graphs=None, steps=24, **options):
    model = small_model("revnet18", seed=3)
    stages = model.get_stages()
    calls = forward_calls(stages)
    options.setdefault("memory", MemoryOptions(keep_graphs=keep_graphs))
    pipeline = Pipeline(stages, F.cross_entropy, mode=mode, optimizer_factory=sgd, **options)
    for images, labels in batches_for(model.config, steps):
        pipeline.step(images, labels)
    pipeline.drain()
    return model, pipeline, calls


def test_the_stages_that_recompute_are_the_non_reversible_ones_but_the_last():
    stages = small_model("revnet18").get_stages()
    assert recomputing_stages(stages, Mode.PETRA) == STEM_AND_DOWNSAMPLING
    assert recomputing_stages(stages, Mode.DELAYED) == list(range(9))  # no reconstruction: every stage but the head
    assert recomputing_stages(stages, Mode.BACKPROP) == []
    assert keepable_stages(stages, Mode.PETRA) == keepable_stages(stages, Mode.DELAYED) == ALL_BUT_HEAD
    assert keepable_stages(stages, Mode.BACKPROP) == []


def test_in_the_delayed_mode_a_kept_graph_trains_exactly_what_recomputing_trains():
    """The delayed mode recomputes each stage's forward at its stashed weights: the kept graph is that same
    computation done once. Weights and running statistics agree to rounding, with one evaluation per micro-batch
    at the kept stages instead of two."""
    recomputed, _, calls = train(Mode.DELAYED)
    kept, pipeline, kept_calls = train(Mode.DELAYED, keep_graphs=list(range(9)))
    assert pipeline.kept_graphs == set(range(9))
    for (name, a), b in zip(recomputed.state_dict().items(), kept.state_dict().values()):
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)
        else:
            assert torch.equal(a, b), name  # e.g. num_batches_tracked: each micro-batch counted once
    # one evaluation each in the start-up dry run, then two per micro-batch recomputing, one keeping the graph
    assert calls[:9] == [1 + 2 * 24] * 9 and kept_calls[:9] == [1 + 24] * 9
    assert calls[9] == kept_calls[9] == 1 + 24  # the head: forward and backward in one operation either way


def test_under_petra_reversible_stages_that_keep_their_graph_skip_their_reconstruction():
    """Every stage keeping its graph under PETRA takes the gradient of its forward's weights at each stage: what the
    delayed mode computes by recomputing at its stashed weights. One evaluation per micro-batch, no inverse run."""
    delayed, _, _ = train(Mode.DELAYED)
    kept, pipeline, calls = train(Mode.PETRA, keep_graphs=ALL_BUT_HEAD)
    assert pipeline.kept_graphs == set(ALL_BUT_HEAD)
    assert not any(worker.reconstructs for worker in pipeline.workers.values())
    for (name, a), b in zip(delayed.state_dict().items(), kept.state_dict().values()):
        if a.is_floating_point():
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12, msg=name)
        else:
            assert torch.equal(a, b), name
    assert calls == [1 + 24] * 10
    petra, _, _ = train(Mode.PETRA)  # reconstructing at the current weights trains something else
    assert max((a - b).abs().max() for a, b in zip(petra.parameters(), kept.parameters())) > 1e-6


def test_a_stage_sends_back_no_input_to_a_reversible_stage_that_kept_its_graph():
    """The backward message to a reconstructing stage carries its output (for the inversion) beside the gradient;
    to a stage that kept its graph, the gradient alone: half the bytes."""
    model = small_model("revnet18", seed=3)
    sample = batches_for(model.config, 1)[0]
    reconstructing = profile_stages(model.get_stages(), sample, repeats=1, warmup=0)
    kept = profile_stages(model.get_stages(), sample, repeats=1, warmup=0, memory=MemoryOptions(keep_graphs=[1]))
    assert reconstructing[2].backward_bytes == 2 * kept[2].backward_bytes > 0
    assert [c.backward_bytes for i, c in enumerate(reconstructing) if i != 2] == \
        [c.backward_bytes for i, c in enumerate(kept) if i != 2]
    assert kept[1].held_bytes > reconstructing[1].held_bytes  # its graphs, for the micro-batches in flight
    # its backward builds no graph: what it holds is all a simulation adds up for it (not one graph more)
    assert kept[1].graph_bytes == 0 < reconstructing[1].graph_bytes


def test_under_petra_a_kept_stage_takes_the_gradient_of_its_forward_weights():
    """Plain autograd on a copy of the stem at the weights of its forward (snapshot by the update hook), given the
    gradient the stem received: the gradient it applied. The reversible and recomputing stages are PETRA's."""
    model = small_model("revnet18", seed=3)
    batches = batches_for(model.config, 30)
    reference = copy.deepcopy(model.get_stages()[0])
    hook, weights, gradients = snapshots()
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, optimizer_factory=sgd, on_update=hook,
                        memory=MemoryOptions(keep_graphs=[0]))
    stem, received = pipeline.workers[0], {}
    backward = stem.backward

    def recording_backward(micro_batch, grad_outputs, outputs=None):
        received[micro_batch] = tuple(g.clone() for g in as_tuple(grad_outputs))
        return backward(micro_batch, grad_outputs, outputs)

    stem.backward = recording_backward
    for images, labels in batches:
        pipeline.step(images, labels)
    pipeline.drain()

    delay = 2 * (pipeline.num_stages - 1)  # the stem's forward of m comes after the updates of m - delay micro-batches
    for m in (delay + 2, 29):
        with torch.no_grad():
            for param, value in zip(reference.parameters(), weights[0][m - delay]):
                param.copy_(value)
        outputs = reference(batches[m][0])
        expected = torch.autograd.grad(as_tuple(outputs), list(reference.parameters()), received[m])
        for applied, value in zip(gradients[0][m], expected):
            torch.testing.assert_close(applied, value, rtol=0, atol=1e-12)
        assert not all(torch.equal(a, b) for a, b in zip(weights[0][m - delay], weights[0][m]))  # it moved since


def budget_counts(stages, sample_inputs, keep):
    """Per stage but the head, the activation and stash bytes the budget counts it holds between ticks under PETRA:
    its graphs (`keep`) or its stored inputs (recomputing stages; nothing for reversible ones)."""
    schedule, inputs = Schedule(len(stages), True), stage_inputs(stages, sample_inputs, len(stages) - 2)
    recomputing = recomputing_stages(stages, Mode.PETRA)
    counted = {}
    for index in range(len(stages) - 1):
        count = schedule.in_flight(index)
        if keep:
            counted[index] = kept_graph_bytes(stages[index], inputs[index], count, pipelined=True)
        else:
            counted[index] = count * nbytes(as_tuple(inputs[index])) if index in recomputing else 0
    return counted


def test_kept_graphs_hold_what_the_budget_counted():
    """The budget's count of each stage's bytes agrees with the engine's accounting between ticks (within 2%: a
    graph also saves the batch norms' running statistics, the module's own), keeping every graph or none; and a
    budget keeps the graphs that fit, smallest first. It once left out the input a kept stage holds for its
    gradient where the graph does not save it (a RevNet coupling saves one stream of two): 3-16% under."""
    model = small_model("revnet18", seed=3)
    batches = batches_for(model.config, 20)
    images, labels = batches[0]
    held = {}
    for name, options in [("none", {}), ("all", {"memory": MemoryOptions(keep_graphs=ALL_BUT_HEAD)})]:
        pipeline = Pipeline(copy.deepcopy(model).get_stages(), F.cross_entropy, optimizer_factory=sgd, **options)
        held[name] = {}
        for step_images, step_labels in batches:
            pipeline.step(step_images, step_labels)
            for index, stats in pipeline.memory().items():
                held[name][index] = max(held[name].get(index, 0), stats.activation_bytes + stats.stash_bytes)
        pipeline.drain()
        counted = budget_counts(copy.deepcopy(model).get_stages(), images, keep=name == "all")
        for index, bytes_counted in counted.items():
            assert held[name][index] == pytest.approx(bytes_counted, rel=0.02, abs=0), (name, index)
    totals = {name: sum(held[name].values()) for name in held}
    assert totals["all"] > totals["none"]
    everything = Pipeline(copy.deepcopy(model).get_stages(), F.cross_entropy,
                          profile_batch=(images, labels), memory=MemoryOptions(memory_budget=totals["all"]))
    assert everything.kept_graphs == set(ALL_BUT_HEAD)
    assert Pipeline(copy.deepcopy(model).get_stages(), F.cross_entropy, profile_batch=(images, labels),
                    memory=MemoryOptions(memory_budget=totals["none"])).kept_graphs == set()
    between = (totals["none"] + totals["all"]) // 2
    some = Pipeline(copy.deepcopy(model).get_stages(), F.cross_entropy,
                    profile_batch=(images, labels), memory=MemoryOptions(memory_budget=between)).kept_graphs
    assert set() < some < set(ALL_BUT_HEAD)


def test_bad_choices_are_refused_with_the_reason():
    stages = small_model("revnet18").get_stages()
    with pytest.raises(ValueError, match="stage 9 cannot keep its graph in mode 'petra'"):
        Pipeline(stages, F.cross_entropy, memory=MemoryOptions(keep_graphs=[0, 9]))
    with pytest.raises(ValueError, match="stage 1 cannot keep its graph in mode 'backprop'"):
        Pipeline(stages, F.cross_entropy, mode="backprop", memory=MemoryOptions(keep_graphs=[1]))
    with pytest.raises(ValueError, match="not both"):
        Pipeline(stages, F.cross_entropy, memory=MemoryOptions(keep_graphs=[0], memory_budget=10))
    with pytest.raises(ValueError, match="needs a sample micro-batch"):
        Pipeline(stages, F.cross_entropy, memory=MemoryOptions(memory_budget=10))
    with pytest.raises(ValueError, match=">= 0 bytes"):
        Pipeline(stages, F.cross_entropy, profile_batch=(None, None), memory=MemoryOptions(memory_budget=-1))


# the stem, a downsampling stage, and reversible stages on both sides of the 5 | 5 split (stage 5 must not send
# stage 4 its input back); or a budget every graph fits, which each rank works out for the other's stages
KEPT_ACROSS_THE_SPLIT = [0, 1, 4, 7, 8]
ROOMY = {"memory": MemoryOptions(memory_budget=2**30)}


def _kept_graph_run(rank, world_size, options):
    model, pipeline, _ = train(Mode.PETRA, timeout=60, **options)
    stages = model.get_stages()
    return sorted(pipeline.kept_graphs), {index: [p.detach().clone() for p in stages[index].parameters()]
                                          for index in pipeline.local}


@pytest.mark.parametrize("options", [{"keep_graphs": KEPT_ACROSS_THE_SPLIT}, ROOMY], ids=["given", "budget"])
def test_two_processes_train_what_one_process_trains(tmp_path, options):
    torch.set_num_threads(1)
    if options is ROOMY:
        options = ROOMY | {"profile_batch": batches_for(small_model("revnet18").config, 1)[0]}
    kept, expected = _kept_graph_run(0, 1, options)
    outcome, codes, _ = run_ranks(_kept_graph_run, 2, options, out_dir=tmp_path, deadline=150)
    assert codes == [0, 0], [r.get("traceback") for r in outcome if r]
    assert kept == outcome[0]["value"][0] == outcome[1]["value"][0] == options.get("keep_graphs", ALL_BUT_HEAD)
    trained = {index: weights for result in outcome for index, weights in result["value"][1].items()}
    assert sorted(trained) == list(range(10))
    assert all(torch.equal(a, b) for index in expected for a, b in zip(trained[index], expected[index]))


class _Tied(torch.nn.Module):
    """One weight in two modules (tied, as language models tie embeddings) and a module used twice."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.frozen = torch.nn.Linear(6, 6), torch.nn.Linear(6, 6), torch.nn.Linear(6, 6)
        self.second.weight = self.first.weight
        self.frozen.requires_grad_(False)

    def forward(self, x):
        return self.frozen(torch.tanh(self.second(torch.tanh(self.first(self.first(x))))))


def test_a_kept_graph_on_weight_copies_is_torch_s_functional_call_tied_weights_included():
    """A pipelined stage keeps its graph on copies of its weights (`ParameterSlots`): the outputs and the copies'
    gradients are those of `torch.func.functional_call` with the same copies, a tied weight replaced everywhere it is
    held; afterwards the module holds its own parameters again, also after an exception."""
    torch.manual_seed(0)
    stage = _Tied()
    params = [p for p in stage.parameters() if p.requires_grad]
    names = [name for name, p in stage.named_parameters() if p.requires_grad]
    assert len(params) == 3  # first.weight (tied), first.bias, second.bias
    x = torch.randn(4, 6, dtype=torch.float64)
    stage.double()
    ours = [(p.detach() * 1.5).requires_grad_() for p in params]
    theirs = [t.detach().clone().requires_grad_() for t in ours]
    slots = ParameterSlots(stage, params)
    assert len(slots.slots) == 4  # the tied weight is held in two places
    with slots.holding(ours):
        output = stage(x)
    reference = torch.func.functional_call(stage, dict(zip(names, theirs)), (x,), tie_weights=True)
    assert torch.equal(output, reference)
    output.sum().backward()
    reference.sum().backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(ours, theirs))
    assert all(p.grad is None for p in stage.parameters())  # nothing reached the module's own
    assert stage.first.weight is params[0] and stage.second.weight is params[0]
    with pytest.raises(RuntimeError, match="inside"), slots.holding(ours):
        raise RuntimeError("inside")
    assert all(a is b for a, b in zip([stage.first.weight, stage.first.bias, stage.second.bias], params))
