"""Corners of the Pipeline's API: `infer` restoring every sub-module's own mode, `partition="auto"` leaving the global
generators alone, `last_lr` past a stage without parameters, and the weight-prediction state loaded onto the
parameters' dtype and checked against their shapes."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from petra_hub.engine import Layout, Pipeline, Remedies
from petra_hub.analysis import profile_stages
from petra_hub.testing.ranks import run_ranks


def sgd(index, stage):
    return torch.optim.SGD(stage.parameters(), lr=0.1) if list(stage.parameters()) else None


def batches(count, dtype=torch.float64, width=4, batch=6):
    generator = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, width, generator=generator, dtype=dtype),
             torch.randint(0, 3, (batch,), generator=generator)) for _ in range(count)]


def dropout_stages():
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU()).double(), nn.Linear(8, 3).double()]


def test_infer_restores_every_sub_module_to_its_own_mode():
    """A batch norm the user froze (`.eval()` inside a stage in training mode) stays frozen after `infer`: training
    afterwards leaves its running statistics alone, as it does without the `infer`."""
    torch.manual_seed(0)
    first = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.2), nn.ReLU()).double()
    first[1].eval()
    stages = [first, nn.Linear(8, 3).double()]
    modes = [module.training for stage in stages for module in stage.modules()]
    data = batches(4)
    pipeline = Pipeline(stages, F.cross_entropy, mode="backprop", optimizer_factory=sgd)
    pipeline.step(*data[0])
    frozen_mean, frozen_var = first[1].running_mean.clone(), first[1].running_var.clone()
    pipeline.infer(data[0][0])
    assert [module.training for stage in stages for module in stage.modules()] == modes
    assert not first[1].training and first.training and first[2].training
    for inputs, targets in data[1:]:
        pipeline.step(inputs, targets)
    pipeline.drain()
    assert torch.equal(first[1].running_mean, frozen_mean) and torch.equal(first[1].running_var, frozen_var)
    assert first[1].num_batches_tracked.item() == 0


def test_auto_partition_leaves_the_global_generator_alone():
    """Profiling runs copies of a dropout stage forwards: the constructor with partition="auto" (and
    `profile_stages` itself) leaves the global generator where it was, and the run trains exactly as the same
    partition given explicitly."""
    data = batches(4)
    finals = {}
    for partition in [None, "auto"]:
        stages = dropout_stages()
        torch.manual_seed(123)
        before = torch.random.get_rng_state()
        pipeline = Pipeline(stages, F.cross_entropy, profile_batch=data[0],
                            optimizer_factory=sgd, layout=Layout(partition=partition))
        assert torch.equal(torch.random.get_rng_state(), before), partition
        assert pipeline.placement.groups == (range(0, 2),)
        for inputs, targets in data:
            pipeline.step(inputs, targets)
        pipeline.drain()
        finals[partition] = [p.detach().clone() for stage in stages for p in stage.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(finals[None], finals["auto"]))
    stages = dropout_stages()
    before = torch.random.get_rng_state()
    profile_stages(stages, data[0], repeats=1, warmup=0)
    assert torch.equal(torch.random.get_rng_state(), before)


def _seeded_rank_draws(rank, world_size):
    torch.manual_seed(0)
    torch.set_num_threads(1)
    stages = [nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.ReLU()), nn.Linear(8, 8), nn.Linear(8, 3)]
    data = batches(1, dtype=torch.float32)
    Pipeline(stages, F.cross_entropy, profile_batch=data[0], optimizer_factory=sgd, layout=Layout(partition="auto"))
    return torch.rand(4).tolist()  # what a DataLoader(shuffle=True) or a dropout would draw next


def test_auto_partition_keeps_ranks_seeded_alike_in_step(tmp_path):
    """Pipeline rank 0 alone profiles: afterwards its global generator agrees with rank 1's (same seed)."""
    results, codes, _ = run_ranks(_seeded_rank_draws, 2, out_dir=tmp_path, deadline=120)
    for rank, result in enumerate(results):
        assert result is not None and "error" not in result, (rank, result and result.get("traceback"))
    assert codes == [0, 0]
    assert results[0]["value"] == results[1]["value"]


def test_last_lr_reads_the_first_stage_with_an_optimizer():
    """A first stage without parameters has no optimizer: `last_lr` reads the next stage's schedule instead of
    giving None (the trainer would drop `learning_rate` from its logs)."""
    stages = [nn.Flatten(), nn.Linear(4, 8), nn.Linear(8, 3)]

    def halving(index, optimizer):
        return torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)

    pipeline = Pipeline(stages, F.cross_entropy, optimizer_factory=sgd, scheduler_factory=halving, mode="backprop")
    assert pipeline.workers[0].optimizer is None
    assert pipeline.last_lr() == pytest.approx(0.1)  # before any update: the rate the first will use
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        pipeline.step(torch.randn(5, 2, 2, generator=generator), torch.randint(0, 3, (5,), generator=generator))
    assert pipeline.counters()[1].learning_rate == pytest.approx(0.025)
    assert pipeline.last_lr() == pytest.approx(0.025)


def linear_stages(dtype):
    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(4, 8), nn.Tanh()).to(dtype), nn.Sequential(nn.Linear(8, 8), nn.Tanh()).to(dtype),
            nn.Linear(8, 3).to(dtype)]


def momentum(index, stage):
    return torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9)


def saved_float32_state():
    pipeline = Pipeline(linear_stages(torch.float32), F.cross_entropy,
                        optimizer_factory=momentum, remedies=Remedies(weight_prediction=1.0))
    for inputs, targets in batches(8, dtype=torch.float32):
        pipeline.step(inputs, targets)
    pipeline.drain()
    return copy.deepcopy(pipeline.state_dict())


def test_weight_prediction_state_is_cast_to_the_parameters():
    """A delta saved from float32 stages, loaded into float64 ones, becomes float64 (as the optimizer's momentum
    does), with the saved values."""
    state = saved_float32_state()
    pipeline = Pipeline(linear_stages(torch.float64), F.cross_entropy,
                        optimizer_factory=momentum, remedies=Remedies(weight_prediction=1.0))
    pipeline.load_state_dict(state)
    for index in (0, 1):
        worker, saved = pipeline.workers[index], state[index]["weight_prediction"]["delta"]
        assert saved is not None and saved[0].dtype == torch.float32
        assert [d.dtype for d in worker.predictor.delta] == [torch.float64] * len(worker.params)
        assert [d.device for d in worker.predictor.delta] == [p.device for p in worker.params]
        assert all(torch.equal(d, s.double()) for d, s in zip(worker.predictor.delta, saved))


def test_weight_prediction_state_of_another_shape_raises_naming_the_stage():
    """A delta of another shape, or another count, than the stage's parameters is refused on loading, naming the
    stage."""
    state = saved_float32_state()
    pipeline = Pipeline(linear_stages(torch.float32), F.cross_entropy,
                        optimizer_factory=momentum, remedies=Remedies(weight_prediction=1.0))
    wrong_shape = copy.deepcopy(state)
    wrong_shape[1]["weight_prediction"]["delta"][0] = torch.zeros(8, 7)
    with pytest.raises(ValueError, match=r"stage 1: weight-prediction delta 0 has shape \[8, 7\], its parameter "
                                         r"\[8, 8\]"):
        pipeline.load_state_dict(wrong_shape)
    wrong_count = copy.deepcopy(state)
    wrong_count[0]["weight_prediction"]["delta"].pop()
    with pytest.raises(ValueError, match="stage 0: the weight-prediction state holds 1 delta"):
        pipeline.load_state_dict(wrong_count)


def test_what_the_first_stage_shares_reaches_a_pipeline_of_one_process_unchanged():
    pipeline = Pipeline([nn.Linear(2, 2), nn.Linear(2, 2)], F.cross_entropy)
    told = {"size": torch.tensor([3]), "labels": torch.tensor([0, 1, 1])}
    assert pipeline.share_from_first_stage(told) is told
    assert pipeline.share_from_first_stage(None) is None and pipeline.share_from_first_stage({}) is None
