"""The delay remedies on the Trainer: weight prediction reaches every stage's worker, and the delay-aware
warm-up gives each stage lr * tau^-(1 - step / W) on top of the usual schedule."""

import pytest
import torch

from petra_hub.training import PetraTrainingArguments
from petra_hub.training.optimization import scheduler_factory
from tests.training.test_trainer import make_trainer


def learning_rates(args, num_stages, steps, max_steps=100):
    rates = {}
    make = scheduler_factory(args, max_steps, 10.0, num_stages)
    for index in range(num_stages):
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))]}, {"params": [torch.nn.Parameter(torch.zeros(1))]}]
        optimizer = torch.optim.SGD(groups, lr=args.learning_rate)  # two groups, as weight decay makes
        scheduler = make(index, optimizer)
        rates[index] = []
        for _ in range(steps):
            first, second = (group["lr"] for group in optimizer.param_groups)
            assert first == second
            rates[index].append(first)
            optimizer.step()
            scheduler.step()
    return rates


def test_delay_warmup_starts_each_stage_at_lr_over_its_delay(tmp_path):
    args = PetraTrainingArguments(output_dir=str(tmp_path), learning_rate=0.1, lr_scheduler_type="constant",
                                  petra_delay_lr_warmup=8, gradient_accumulation_steps=2, report_to=[])
    rates = learning_rates(args, num_stages=5, steps=12)
    for index, values in rates.items():
        tau = max(1.0, 2 * (5 - 1 - index) / 2)  # 4, 3, 2, 1, 1 updates in flight
        expected = [0.1 * tau ** -max(0.0, 1 - step / 8) for step in range(12)]
        assert values == pytest.approx(expected, rel=1e-12), index
    assert rates[0][0] == pytest.approx(0.025) and rates[4] == [pytest.approx(0.1)] * 12

    fraction = PetraTrainingArguments(output_dir=str(tmp_path), learning_rate=0.1, lr_scheduler_type="cosine",
                                      petra_delay_lr_warmup=0.25, report_to=[])
    plain = PetraTrainingArguments(output_dir=str(tmp_path), learning_rate=0.1, lr_scheduler_type="cosine",
                                   report_to=[])
    warmed, cosine = learning_rates(fraction, 3, 40), learning_rates(plain, 3, 40)
    for step in range(40):  # W = 25 steps of the 100; stage 0's delay is 4 updates
        assert warmed[0][step] == pytest.approx(cosine[0][step] * 4 ** -max(0.0, 1 - step / 25), rel=1e-12)


def test_delay_warmup_refuses_a_schedule_it_cannot_multiply(tmp_path, monkeypatch):
    """Every schedule transformers' get_scheduler offers PetraTrainer is a LambdaLR today; one that is not is
    refused rather than silently left without the warm-up."""
    from petra_hub.training import optimization

    monkeypatch.setattr(optimization, "get_scheduler",
                        lambda name, optimizer, **kwargs: torch.optim.lr_scheduler.StepLR(optimizer, 10))
    args = PetraTrainingArguments(output_dir=str(tmp_path), lr_scheduler_type="linear", petra_delay_lr_warmup=10,
                                  report_to=[])
    with pytest.raises(ValueError, match="petra_delay_lr_warmup needs a schedule given by a factor per step"):
        learning_rates(args, 2, 1)
    with pytest.raises(ValueError, match="petra_delay_lr_warmup must be >= 0"):
        PetraTrainingArguments(output_dir=str(tmp_path), petra_delay_lr_warmup=-1, report_to=[])


def test_weight_prediction_reaches_every_stage(tmp_path):
    trainer = make_trainer(tmp_path / "predicted", petra_weight_prediction=0.5, max_steps=4)
    trainer.train()
    workers = trainer.pipeline.workers
    stages = len(workers)
    assert [w.predictor.h for w in workers.values()] == [0.5] * (stages - 1) + [0.0]  # the last stage has no delay
    plain = make_trainer(tmp_path / "plain", max_steps=4)
    plain.train()
    changed = [name for name, value in plain.model.state_dict().items()
               if not torch.equal(value, trainer.model.state_dict()[name])]
    assert changed  # the forwards ran at other weights


def test_a_memory_budget_keeps_the_graphs_that_fit(tmp_path):
    """petra_memory_budget reaches the pipeline: a generous one keeps every stage's graph but the head's (their
    forwards run once per micro-batch, the reversible ones rebuild nothing), none keeps nothing; bad values are
    refused up front."""
    roomy = make_trainer(tmp_path / "roomy", petra_memory_budget="1GiB", max_steps=4)
    roomy.train()
    assert roomy.pipeline.kept_graphs == set(range(9))  # S R R D R D R D R H: all but the head
    assert all(roomy.pipeline.workers[i].keeps_graph and not roomy.pipeline.workers[i].reconstructs for i in range(9))
    tight = make_trainer(tmp_path / "tight", petra_memory_budget="0", max_steps=4)
    tight.train()
    assert tight.pipeline.kept_graphs == set()
    with pytest.raises(ValueError, match="petra_memory_budget='lots': expected bytes"):
        PetraTrainingArguments(output_dir=str(tmp_path), petra_memory_budget="lots", report_to=[])


def _weights(model) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def test_a_synchronous_start_resumes_exactly_inside_and_after_it(tmp_path):
    """petra_synchronous_steps=3: steps 1-3 in reversible_backprop, then petra. A run resumed from step 2 (inside
    the start) or step 4 (after it) ends with the uninterrupted run's weights; the start changes the run."""
    full = make_trainer(tmp_path / "full", max_steps=6, save_strategy="steps", save_steps=2,
                        petra_synchronous_steps=3)
    full.train()
    expected = _weights(full.model)
    assert full.pipeline.running_mode.value == "petra"
    for step in (2, 4):
        resumed = make_trainer(tmp_path / f"resumed-{step}", init_seed=123, max_steps=6, save_strategy="steps",
                               save_steps=2, petra_synchronous_steps=3)  # the same drains as the full run
        resumed.train(resume_from_checkpoint=str(tmp_path / "full" / f"checkpoint-{step}"))
        got = _weights(resumed.model)
        assert all(torch.equal(got[name], expected[name]) for name in expected), step
    plain = make_trainer(tmp_path / "plain", max_steps=6)
    plain.train()
    assert any(not torch.equal(value, expected[name]) for name, value in _weights(plain.model).items())


def test_a_synchronous_start_is_petras_and_is_refused_for_other_modes(tmp_path):
    with pytest.raises(ValueError, match="petra_synchronous_steps=3 applies to petra_mode='petra'"):
        PetraTrainingArguments(output_dir=str(tmp_path), petra_mode="delayed", petra_synchronous_steps=3,
                               report_to=[])
    with pytest.raises(ValueError, match="petra_synchronous_steps must be a whole number >= 0"):
        PetraTrainingArguments(output_dir=str(tmp_path), petra_synchronous_steps=-1, report_to=[])


def test_an_endless_delay_warmup_divides_each_stages_learning_rate_by_its_delay_for_the_whole_run(tmp_path):
    """petra_delay_lr_warmup = inf: W never ends, so lr_j(t) = lr(t) / tau_j throughout (a permanent per-stage
    scaling by the delay)."""
    args = PetraTrainingArguments(output_dir=str(tmp_path), learning_rate=0.1, lr_scheduler_type="constant",
                                  petra_delay_lr_warmup=float("inf"), report_to=[])
    rates = learning_rates(args, num_stages=5, steps=30)
    for index, values in rates.items():
        tau = max(1.0, 2 * (5 - 1 - index))  # k = 1: 8, 6, 4, 2, 1 updates in flight
        assert values == [pytest.approx(0.1 / tau, rel=1e-12)] * 30, index


def test_delay_matched_momentum_reaches_every_stage_and_resumes_exactly(tmp_path):
    """petra_delay_momentum: each stage's optimizer trains with the momentum matched to its delay (the optimizer's
    own at the last stage), a run resumed from its checkpoint ends with the uninterrupted run's weights, and the card
    says so."""
    from petra_hub.engine.momentum import matched_momentum

    options = dict(max_steps=4, save_strategy="steps", save_steps=2, petra_delay_momentum=True)
    full = make_trainer(tmp_path / "full", **options)
    full.train()
    workers = full.pipeline.workers
    J, k = len(workers), full.args.gradient_accumulation_steps
    assert full.args.optim_args == "momentum=0.9,nesterov=True"
    for j, worker in workers.items():
        matched = matched_momentum(0.9, 2 * (J - 1 - j) / k)
        assert {group["momentum"] for group in worker.optimizer.param_groups} == {matched}
    assert workers[0].optimizer.param_groups[0]["momentum"] == 0 and workers[J - 1].optimizer.param_groups[0][
        "momentum"] == 0.9
    expected = _weights(full.model)
    resumed = make_trainer(tmp_path / "resumed", init_seed=123, **options)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    got = _weights(resumed.model)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    full.save_model(str(tmp_path / "saved"))
    from tests.training.test_card import load_card

    assert r"Delay-matched momentum \(petra\_delay\_momentum\)" in load_card(tmp_path / "saved").text
