"""Gradient fidelity probes against references written here: plain autograd on copies of the model at the weights
each stage had at the forward and at the backward of a micro-batch, snapshot by the update hook."""

import copy

import pytest
import torch
import torch.nn.functional as F

from petra_hub.engine import Mode, Pipeline, Precision
from petra_hub.testing.models import random_images, small_model
from petra_hub.testing.ranks import run_ranks
from tests.reliability.test_engine_randomness import micro_batches as random_batches
from tests.reliability.test_engine_randomness import random_stages

PROBED = (3, 7)


def batches_for(config, count, dtype=torch.float64):
    out = []
    for index in range(count):
        images = random_images(config, batch=4, dtype=dtype, seed=50 + index)
        labels = torch.randint(0, config.num_labels, (4,), generator=torch.Generator().manual_seed(index))
        out.append((images, labels))
    return out


def sgd(index, stage):
    return torch.optim.SGD(stage.parameters(), lr=0.2, momentum=0.9)


def probed_run(mode, stages, batches, probed=PROBED, on_update=None, **options):
    """Train on `batches`, probing `probed`; returns the fidelity results and, per result, the number of micro-batches
    fed when it came out."""
    pipeline = Pipeline(stages, F.cross_entropy, mode=mode, optimizer_factory=sgd, on_update=on_update, **options)
    results, when = [], []
    for images, labels in batches:
        if pipeline.fed in probed:
            pipeline.probe()
        pipeline.step(images, labels)
        found = pipeline.gradient_fidelity()
        results += found
        when += [pipeline.fed] * len(found)
    pipeline.drain()
    found = pipeline.gradient_fidelity()
    return pipeline, results + found, when + [None] * len(found)


def expected_fidelity(model, batches, weights_after, gradients, micro_batch):
    """cos / norm ratios from plain autograd on copies of `model`, stage j at the weights it had after
    `n` updates: n = m at the backward of m (k = 1), n = max(0, m + 2j - 2(J-1)) at its forward (the backwards of
    earlier micro-batches that ran at ticks before it)."""
    num_stages = len(model.get_stages())

    def gradient_at(counts):
        reference = copy.deepcopy(model)
        stages = reference.get_stages()
        with torch.no_grad():
            for j, stage in enumerate(stages):
                for param, value in zip(stage.parameters(), weights_after[j][counts[j]]):
                    param.copy_(value)
        images, labels = batches[micro_batch]
        loss = F.cross_entropy(reference(images).logits, labels)
        grads = torch.autograd.grad(loss, [p for s in stages for p in s.parameters()])
        sizes = [len(list(s.parameters())) for s in stages]
        split, start = [], 0
        for size in sizes:
            split.append(torch.cat([g.reshape(-1) for g in grads[start:start + size]]))
            start += size
        return split

    true = gradient_at([micro_batch] * num_stages)
    stashed = gradient_at([max(0, micro_batch + 2 * j - 2 * (num_stages - 1)) for j in range(num_stages)])
    expected = {}
    for j in range(num_stages):
        mine = torch.cat([g.reshape(-1) for g in gradients[j][micro_batch]])
        expected[j] = {
            "cosine_true": float(F.cosine_similarity(mine, true[j], dim=0)),
            "norm_ratio_true": float(mine.norm() / true[j].norm()),
            "cosine_stashed": float(F.cosine_similarity(mine, stashed[j], dim=0)),
            "norm_ratio_stashed": float(mine.norm() / stashed[j].norm()),
            "cosine_stashed_true": float(F.cosine_similarity(stashed[j], true[j], dim=0)),
            "norm_ratio_stashed_true": float(stashed[j].norm() / true[j].norm()),
        }
    return expected


def snapshots():
    """An update hook keeping, per stage, the weights before each update (= after that many updates) and the
    gradient it applies (k = 1: that of one micro-batch)."""
    weights, gradients = {}, {}

    def hook(index, group, stage):
        weights.setdefault(index, []).append([p.detach().clone() for p in stage.parameters()])
        gradients.setdefault(index, []).append([p.grad.clone() for p in stage.parameters()])

    return hook, weights, gradients


@pytest.mark.parametrize("mode", [Mode.PETRA, Mode.DELAYED, Mode.INPUT_BUFFER, Mode.WEIGHT_STASH])
def test_fidelity_equals_plain_autograd_at_the_forward_and_backward_weights(mode):
    model = small_model("revnet18", seed=3)
    reference = copy.deepcopy(model)
    num_stages = len(model.get_stages())
    batches = batches_for(model.config, 2 * num_stages + max(PROBED))
    hook, weights, gradients = snapshots()
    _, results, when = probed_run(mode, model.get_stages(), batches, on_update=hook)

    assert [(r.micro_batch, r.stage) for r in results] == [(m, j) for m in PROBED for j in range(num_stages)]
    # ready right after the tick of the probed micro-batch's backward at stage 0: start(m) + 2(J-1)
    assert when == [m + 2 * (num_stages - 1) + 1 for m in PROBED for _ in range(num_stages)]
    for m in PROBED:
        expected = expected_fidelity(reference, batches, weights, gradients, m)
        for result in (r for r in results if r.micro_batch == m):
            for name, value in expected[result.stage].items():
                assert getattr(result, name) == pytest.approx(value, abs=1e-10), (m, result.stage, name)
    last = [r for r in results if r.stage == num_stages - 1]
    # forward and backward in one tick, on the input of the real forward: the stashed-weight gradient
    assert all(r.cosine_stashed == pytest.approx(1, abs=1e-12) for r in last)
    early = [r for r in results if r.stage == 1 and r.micro_batch == PROBED[-1]][0]
    assert early.cosine_true < 1 - 1e-6  # the delay shows
    if mode == Mode.DELAYED:  # the delayed mode computes exactly the stashed-weight gradient
        assert all(r.cosine_stashed == pytest.approx(1, abs=1e-12) for r in results)
        assert all(r.norm_ratio_stashed == pytest.approx(1, abs=1e-12) for r in results)


@pytest.mark.parametrize("mode", [Mode.BACKPROP, Mode.REVERSIBLE_BACKPROP])
def test_synchronous_modes_compute_the_true_gradient(mode):
    model = small_model("revnet18", seed=3)
    _, results, _ = probed_run(mode, model.get_stages(), batches_for(model.config, 4), probed=(1, 2))
    assert len(results) == 2 * len(model.get_stages())
    for result in results:
        for name in ("cosine_true", "norm_ratio_true", "cosine_stashed", "norm_ratio_stashed"):
            assert getattr(result, name) == pytest.approx(1, abs=1e-10), (result, name)


def test_probing_changes_nothing_even_with_dropout():
    """Probes and their reference passes leave weights, optimizer states and the RNG as a run without them."""
    finals = []
    for probed in ((), (1, 2, 4)):
        stages = random_stages()
        torch.manual_seed(11)
        pipeline, results, _ = probed_run(Mode.PETRA, stages, random_batches(), probed=probed)
        assert len(results) == len(probed) * len(stages)
        finals.append(([p.detach().clone() for s in stages for p in s.parameters()], torch.random.get_rng_state(),
                       pipeline.state_dict()))
    (weights, rng, state), (probed_weights, probed_rng, probed_state) = finals
    assert all(torch.equal(a, b) for a, b in zip(weights, probed_weights))
    assert torch.equal(rng, probed_rng)
    assert str(state) == str(probed_state)


def _two_process_fidelity(rank, world_size):
    model = small_model("revnet18", dtype=torch.float32, seed=3)
    _, results, _ = probed_run(Mode.PETRA, model.get_stages(), batches_for(model.config, 24, torch.float32),
                               precision=Precision.of("bf16", messages="bf16"), timeout=60)
    return [r.as_dict() for r in results], [p.detach().clone() for p in model.parameters()] if rank == 0 else None


def test_two_processes_measure_what_one_process_measures(tmp_path):
    """Bit-identical numbers under bf16 with bf16 messages on both sides (each rank measures its own stages and
    the reference passes cross the boundary as training messages do)."""
    torch.set_num_threads(1)
    expected, _ = _two_process_fidelity(0, 1)
    outcome, codes, _ = run_ranks(_two_process_fidelity, 2, out_dir=tmp_path, deadline=150)
    assert codes == [0, 0], [r.get("traceback") for r in outcome if r]
    for result in outcome:
        assert result["value"][0] == expected
    assert {r["stage"] for r in expected} == set(range(10))
