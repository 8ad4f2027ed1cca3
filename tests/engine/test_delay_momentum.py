"""Delay-matched momentum (`Remedies(delay_momentum=True)`): each stage's optimizer momentum is lowered so that its
lag plus the stage's delay is the lag of the optimizer's own (`engine.momentum`). A run with it equals, bit for
bit, a run whose stages were given those momenta by hand; synchronous modes and a synchronous start keep the
optimizer's own; it resumes exactly, and 2 processes train what 1 does."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from petra_hub.engine import Mode, OptionError, Pipeline, Remedies
from petra_hub.engine.momentum import matched_momentum, momentum_lag
from petra_hub.testing.models import small_model
from petra_hub.testing.ranks import run_ranks
from tests.engine.test_fidelity import batches_for


def sgd(momentum=0.9):
    return lambda index, stage: torch.optim.SGD(stage.parameters(), lr=0.05, momentum=momentum, nesterov=True)


def trained(model, remedies, optimizer_factory, mode=Mode.PETRA, k=1, count=16):
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, mode=mode, accumulation_steps=k,
                        optimizer_factory=optimizer_factory, remedies=remedies)
    losses = []
    for images, labels in batches_for(model.config, count):
        losses += pipeline.step(images, labels)
    losses += pipeline.drain()
    return pipeline, losses


def test_the_lag_of_momentum_plus_the_delay_is_the_optimizers_own():
    assert momentum_lag(0.9) == pytest.approx(9)
    assert [matched_momentum(0.9, d) for d in (0, 2, 4, 8)] == pytest.approx([0.9, 0.875, 5 / 6, 0.5])
    assert matched_momentum(0.9, 10) == matched_momentum(0.9, 18) == 0.0
    for beta, delay in ((0.9, 3.5), (0.99, 40), (0.5, 0.5)):
        assert momentum_lag(matched_momentum(beta, delay)) + delay == pytest.approx(momentum_lag(beta))


@pytest.mark.parametrize("k", [1, 2])
def test_each_stage_trains_as_with_its_matched_momentum_given_by_hand(k):
    model = small_model("revnet18", seed=3)
    by_hand = copy.deepcopy(model)
    J = len(model.get_stages())
    pipeline, losses = trained(model, Remedies(delay_momentum=True), sgd(), k=k)
    expected = [matched_momentum(0.9, 2 * (J - 1 - j) / k) for j in range(J)]
    assert [w.optimizer.param_groups[0]["momentum"] for w in pipeline.workers.values()] == expected
    assert expected[0] == 0.0 and 0 < expected[-2] < expected[-1] == 0.9

    def matched(index, stage):
        return torch.optim.SGD(stage.parameters(), lr=0.05, momentum=expected[index], nesterov=expected[index] > 0)

    _, reference = trained(by_hand, Remedies(), matched, k=k)
    assert losses == reference
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), by_hand.parameters()))
    plain = copy.deepcopy(by_hand)
    trained(plain, Remedies(), sgd(), k=k)
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), plain.parameters()))


def test_adam_lowers_its_first_factor_and_keeps_its_second():
    model = small_model("revnet18", seed=3)
    J = len(model.get_stages())

    def adamw(index, stage):
        return torch.optim.AdamW(stage.parameters(), lr=1e-3, betas=(0.8, 0.95))

    pipeline, _ = trained(model, Remedies(delay_momentum=True), adamw, count=4)
    betas = [w.optimizer.param_groups[0]["betas"] for w in pipeline.workers.values()]
    assert betas == [(matched_momentum(0.8, 2 * (J - 1 - j)), 0.95) for j in range(J)]


def test_synchronous_modes_and_a_synchronous_start_keep_the_optimizers_own():
    model = small_model("revnet18", seed=3)
    pipeline, _ = trained(model, Remedies(delay_momentum=True), sgd(), mode=Mode.BACKPROP, count=4)
    assert {w.optimizer.param_groups[0]["momentum"] for w in pipeline.workers.values()} == {0.9}

    pipeline = Pipeline(model.get_stages(), F.cross_entropy, optimizer_factory=sgd(),
                        remedies=Remedies(delay_momentum=True, synchronous_updates=3))
    J = len(model.get_stages())
    momenta = []
    for images, labels in batches_for(model.config, 24):
        pipeline.step(images, labels)
        momenta.append((pipeline.running_mode, pipeline.workers[0].optimizer.param_groups[0]["momentum"]))
    assert momenta[0] == (Mode.REVERSIBLE_BACKPROP, 0.9)
    assert momenta[-1] == (Mode.PETRA, matched_momentum(0.9, 2 * (J - 1)))


def test_resuming_continues_exactly_whatever_momentum_the_state_was_saved_with():
    model = small_model("revnet18", seed=3)
    batches = batches_for(model.config, 24)
    remedies = Remedies(delay_momentum=True)
    first = Pipeline(model.get_stages(), F.cross_entropy, optimizer_factory=sgd(), remedies=remedies)
    for images, labels in batches[:12]:
        first.step(images, labels)
    first.drain()
    state = copy.deepcopy(first.state_dict())
    saved = copy.deepcopy(model)
    for images, labels in batches[12:]:
        first.step(images, labels)
    first.drain()

    def resumed(stage_states):
        twin = copy.deepcopy(saved)
        pipeline = Pipeline(twin.get_stages(), F.cross_entropy, optimizer_factory=sgd(), remedies=remedies)
        pipeline.load_state_dict(copy.deepcopy(stage_states))  # an optimizer loads its state's tensors as they are
        for images, labels in batches[12:]:
            pipeline.step(images, labels)
        pipeline.drain()
        return list(twin.parameters())

    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed(state)))
    # a state whose optimizers hold the optimizer's own momentum (saved without the remedy) resumes with the matched
    own = copy.deepcopy(state)
    for stage_state in own.values():
        stage_state["optimizer"]["param_groups"][0]["momentum"] = 0.9
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), resumed(own)))


def test_an_optimizer_without_momentum_or_a_cycling_schedule_is_refused_by_name():
    stages = small_model("revnet18", seed=3).get_stages()
    with pytest.raises(OptionError, match="delay_momentum must be used with an optimizer that has a momentum.*Adagrad"):
        Pipeline(stages, F.cross_entropy, optimizer_factory=lambda i, s: torch.optim.Adagrad(s.parameters()),
                 remedies=Remedies(delay_momentum=True))

    def one_cycle(index, optimizer):
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=100)

    with pytest.raises(OptionError, match="delay_momentum .*cycles the momentum"):
        Pipeline(stages, F.cross_entropy, optimizer_factory=sgd(), scheduler_factory=one_cycle,
                 remedies=Remedies(delay_momentum=True))
    with pytest.raises(OptionError, match="delay_momentum must be True or False"):
        Remedies(delay_momentum=1)


def _two_process_run(rank, world_size):
    model = small_model("revnet18", dtype=torch.float32, seed=3)
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, optimizer_factory=sgd(), timeout=60,
                        remedies=Remedies(delay_momentum=True))
    for images, labels in batches_for(model.config, 12, torch.float32):
        pipeline.step(images, labels)
    pipeline.drain()
    pipeline.gather_stages(dst=0)
    return [p.detach().clone() for p in model.parameters()] if rank == 0 else None


def test_two_processes_train_as_one(tmp_path):
    torch.set_num_threads(1)
    expected = _two_process_run(0, 1)
    outcome, codes, _ = run_ranks(_two_process_run, 2, out_dir=tmp_path, deadline=150)
    assert codes == [0, 0], [r and r.get("traceback") for r in outcome]
    assert all(torch.equal(a, b) for a, b in zip(outcome[0]["value"], expected))
