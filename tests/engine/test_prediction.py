"""Weight prediction: each forward runs at the weights extrapolated along the stage's last update over its delay;
checked against the weights the update hook saw, and for exact resumption from `state_dict`."""

import copy

import pytest
import torch
import torch.nn.functional as F

from petra_hub.engine import Mode, Pipeline, Remedies
from petra_hub.testing.models import small_model
from tests.engine.test_fidelity import batches_for, sgd, snapshots

H = 0.5


@pytest.mark.parametrize("mode,k", [(Mode.PETRA, 1), (Mode.DELAYED, 1), (Mode.PETRA, 2)])
def test_forwards_run_at_the_extrapolated_weights(mode, k):
    """The probe keeps the weights a forward really used: theta + h * 2(J-1-j)/k * (theta - theta before the last
    update), from the update hook's snapshots (theta after n updates is the snapshot of update n)."""
    model = small_model("revnet18", seed=3)
    num_stages = len(model.get_stages())
    batches = batches_for(model.config, 40)
    hook, weights, _ = snapshots()
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, mode=mode, accumulation_steps=k, optimizer_factory=sgd,
                        on_update=hook, remedies=Remedies(weight_prediction=H))
    probed = 20
    for index, (images, labels) in enumerate(batches):
        if index == probed:
            pipeline.probe()
        pipeline.step(images, labels)
    probes = {j: worker.probes[probed] for j, worker in pipeline.workers.items()}
    for j in range(num_stages):
        # updates applied at stage j before the forward of `probed` (its backwards at earlier ticks, in groups of k)
        done = max(0, probed + 2 * j - 2 * (num_stages - 1)) // k
        current, previous = weights[j][done], weights[j][done - 1]
        horizon = H * 2 * (num_stages - 1 - j) / k
        expected = [c + horizon * (c - p) for c, p in zip(current, previous)]
        for used, wanted in zip(probes[j].weights_forward, expected):
            assert torch.allclose(used, wanted, rtol=0, atol=1e-12), j
        if j == num_stages - 1:  # no delay, no prediction
            assert all(torch.equal(u, c) for u, c in zip(probes[j].weights_forward, current))


def test_resuming_from_state_dict_continues_exactly():
    model = small_model("revnet18", seed=3)
    batches = batches_for(model.config, 24)
    first = Pipeline(model.get_stages(), F.cross_entropy, optimizer_factory=sgd,
                     remedies=Remedies(weight_prediction=1.0))
    for images, labels in batches[:12]:
        first.step(images, labels)
    first.drain()
    state = copy.deepcopy(first.state_dict())
    last = len(model.get_stages()) - 1
    assert state[last]["weight_prediction"] is None  # no delay at the last stage: nothing predicted
    assert all(state[j]["weight_prediction"]["delta"] is not None for j in range(last))
    saved = copy.deepcopy(model)

    def resumed(stage_states):
        twin = copy.deepcopy(saved)
        pipeline = Pipeline(twin.get_stages(), F.cross_entropy, optimizer_factory=sgd,
                            remedies=Remedies(weight_prediction=1.0))
        pipeline.load_state_dict(stage_states)
        for images, labels in batches[12:]:
            pipeline.step(images, labels)
        pipeline.drain()
        return list(twin.parameters())

    for images, labels in batches[12:]:
        first.step(images, labels)
    first.drain()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed(state)))
    without = resumed({j: {**s, "weight_prediction": None} for j, s in state.items()})
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), without))  # the saved delta matters


def test_bad_setting():
    with pytest.raises(ValueError, match="weight_prediction must be >= 0"):
        Pipeline(small_model().get_stages(), F.cross_entropy, remedies=Remedies(weight_prediction=-1))


def _two_process_prediction(rank, world_size):
    model = small_model("revnet18", dtype=torch.float32, seed=3)
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, optimizer_factory=sgd, timeout=60,
                        remedies=Remedies(weight_prediction=0.5))
    for images, labels in batches_for(model.config, 16, torch.float32):
        pipeline.step(images, labels)
    pipeline.drain()
    pipeline.gather_stages(dst=0)
    return [p.detach().clone() for p in model.parameters()] if rank == 0 else None


def test_two_processes_predict_as_one(tmp_path):
    from petra_hub.testing.ranks import run_ranks

    torch.set_num_threads(1)
    expected = _two_process_prediction(0, 1)
    outcome, codes, _ = run_ranks(_two_process_prediction, 2, out_dir=tmp_path, deadline=150)
    assert codes == [0, 0], [r and r.get("traceback") for r in outcome]
    assert all(torch.equal(a, b) for a, b in zip(outcome[0]["value"], expected))


def test_nothing_is_extrapolated_where_no_update_comes_before_the_backward():
    """After a drain the pipeline fills again: the first micro-batch's forwards have no backward ahead of them, so
    they run at the weights as they are; in steady state the forwards run at extrapolated weights."""
    model = small_model("revnet18", seed=3)
    batches = batches_for(model.config, 24)
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, optimizer_factory=sgd,
                        remedies=Remedies(weight_prediction=1.0))
    for images, labels in batches[:20]:
        pipeline.step(images, labels)
    steady = pipeline.probe()
    pipeline.step(*batches[20])
    pipeline.drain()
    after_drain = {j: [p.detach().clone() for p in w.params] for j, w in pipeline.workers.items()}
    first = pipeline.probe()
    for images, labels in batches[21:]:
        pipeline.step(images, labels)
    for j in (0, 1, 2):  # their forwards of `first` ran before any backward of the new fill
        assert all(torch.equal(a, b) for a, b in zip(pipeline.workers[j].probes[first].weights_forward, after_drain[j]))
    assert pipeline.workers[0].predictor.delta is not None
    moved = pipeline.workers[0].probes[steady].weights_forward
    assert not all(torch.equal(a, b) for a, b in zip(moved, after_drain[0]))
