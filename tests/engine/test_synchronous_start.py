"""A synchronous start (`Remedies(synchronous_updates=N)`): the first N updates of every stage run in
reversible_backprop, then the pipeline drains and runs PETRA with the same weights and optimizer states. In float64
the run equals, bit for bit, a reversible_backprop pipeline for N updates followed by a PETRA pipeline on the same
stages and optimizers; on 2 processes it equals the 1-process run; a resumed pipeline skips a start already made."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from petra_hub.engine import Layout, Mode, OptionError, Pipeline, Remedies
from petra_hub.testing.models import random_images, small_model
from petra_hub.testing.ranks import run_ranks

MICRO_BATCHES = 12
K = 2


def batches(config):
    generator = torch.Generator().manual_seed(5)
    return [(random_images(config, batch=4, seed=10 + i), torch.randint(0, 10, (4,), generator=generator))
            for i in range(MICRO_BATCHES)]


def loss(logits, labels):
    return F.cross_entropy(logits, labels)


def sgd_factory(optimizers: dict):
    def make(index, stage):
        if index not in optimizers:
            optimizers[index] = torch.optim.SGD(stage.parameters(), lr=0.05, momentum=0.9)
        return optimizers[index]
    return make


def weights(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def with_synchronous_start(model, updates: int, **options) -> list:
    pipeline = Pipeline(model.get_stages(), loss, mode="petra", accumulation_steps=K,
                        optimizer_factory=sgd_factory({}), remedies=Remedies(synchronous_updates=updates), **options)
    losses = []
    for images, labels in batches(model.config):
        losses += pipeline.step(images, labels)
    losses += pipeline.drain()
    return losses


def test_the_start_is_reversible_backprop_then_petra_with_the_same_optimizers():
    model = small_model(seed=0)
    reference = copy.deepcopy(model)
    updates = 3
    losses = with_synchronous_start(model, updates)

    optimizers: dict = {}
    data = batches(reference.config)
    first = Pipeline(reference.get_stages(), loss, mode="reversible_backprop", accumulation_steps=K,
                     optimizer_factory=sgd_factory(optimizers))
    expected = []
    for images, labels in data[: updates * K]:
        expected += first.step(images, labels)
    expected += first.drain()
    second = Pipeline(reference.get_stages(), loss, mode="petra", accumulation_steps=K,
                      optimizer_factory=sgd_factory(optimizers))  # the same optimizer objects: their states go on
    for images, labels in data[updates * K:]:
        expected += second.step(images, labels)
    expected += second.drain()

    assert [m for m, _ in losses] == list(range(MICRO_BATCHES)) and len(expected) == MICRO_BATCHES
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(losses, expected))  # the second pipeline counts from 0
    trained, wanted = weights(model), weights(reference)
    assert all(torch.equal(trained[name], wanted[name]) for name in wanted)
    assert any(not torch.equal(trained[name], weights(small_model(seed=0))[name]) for name in trained)


def test_off_is_petra_bit_for_bit_and_a_start_changes_the_run():
    plain, started, petra = small_model(seed=0), small_model(seed=0), small_model(seed=0)
    pipeline = Pipeline(petra.get_stages(), loss, mode="petra", accumulation_steps=K,
                        optimizer_factory=sgd_factory({}))
    for images, labels in batches(petra.config):
        pipeline.step(images, labels)
    pipeline.drain()
    with_synchronous_start(plain, 0)
    with_synchronous_start(started, 2)
    assert all(torch.equal(a, b) for a, b in zip(weights(plain).values(), weights(petra).values()))
    assert any(not torch.equal(a, b) for a, b in zip(weights(started).values(), weights(petra).values()))


def test_a_resumed_pipeline_skips_the_start_already_made():
    model = small_model(seed=0)
    pipeline = Pipeline(model.get_stages(), loss, mode="petra", optimizer_factory=sgd_factory({}),
                        remedies=Remedies(synchronous_updates=4))
    assert pipeline.running_mode is Mode.REVERSIBLE_BACKPROP and not pipeline.schedule.pipelined
    pipeline.resume_after(3)
    assert pipeline.running_mode is Mode.REVERSIBLE_BACKPROP
    pipeline.resume_after(4)
    assert pipeline.running_mode is Mode.PETRA and pipeline.schedule.pipelined
    assert all(worker.mode is Mode.PETRA for worker in pipeline.workers.values())


def test_only_petra_has_a_synchronous_start():
    with pytest.raises(OptionError, match="synchronous_updates must be 0 in mode delayed"):
        Pipeline(small_model().get_stages(), loss, mode="delayed", remedies=Remedies(synchronous_updates=2))
    with pytest.raises(OptionError, match="synchronous_updates must be a whole number >= 0"):
        Remedies(synchronous_updates=-1)


def _two_ranks(rank, world_size):
    model = small_model(seed=0)
    pipeline = Pipeline(model.get_stages(), loss, mode="petra", accumulation_steps=K,
                        optimizer_factory=sgd_factory({}), remedies=Remedies(synchronous_updates=3),
                        layout=Layout(partition=[5, 5]), timeout=30)
    losses = []
    for images, labels in batches(model.config):
        losses += pipeline.step(images, labels)
    losses += pipeline.drain()
    pipeline.gather_stages(dst=0)
    return {"state": weights(model) if rank == 0 else None, "losses": [(m, float(value)) for m, value in losses]}


def test_two_processes_train_what_one_process_trains(tmp_path):
    single = small_model(seed=0)
    expected_losses = with_synchronous_start(single, 3)
    results, codes, _ = run_ranks(_two_ranks, 2, out_dir=tmp_path, deadline=150)
    for rank, result in enumerate(results):
        assert result is not None and "error" not in result, (rank, result and result.get("traceback"))
    assert codes == [0, 0]
    state, expected = results[0]["value"]["state"], weights(single)
    assert state.keys() == expected.keys() and all(torch.equal(state[name], expected[name]) for name in expected)
    losses = [loss for result in results for loss in result["value"]["losses"]]
    assert losses == [(m, float(value)) for m, value in expected_losses]
