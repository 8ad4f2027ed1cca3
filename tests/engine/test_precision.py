"""Mixed precision in the engine: the policy, the wire format, fp16 loss scaling per stage, the handshake's dtype
rules, the sampled reconstruction check, and multi-process runs bit-identical to one process under the policy."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from petra_hub.engine import Diagnostics, Layout, Pipeline, StageMismatchError
from petra_hub.engine.messages import Part, decode, encode, message_bytes, round_trip
from petra_hub.engine.precision import Precision
from petra_hub.engine.transport import ActivationSpec
from petra_hub.testing.models import random_images, small_model
from petra_hub.testing.ranks import run_ranks


def cross_entropy(logits, labels):
    return F.cross_entropy(logits, labels)


def data(config, count, batch=8):
    generator = torch.Generator().manual_seed(0)
    images = random_images(config, batch=batch, dtype=torch.float32)
    labels = torch.randint(0, config.num_labels, (batch,), generator=generator)
    return [(images, labels)] * count  # one batch to memorise: the loss must fall


def run(precision, count=12, lr=0.01, check_every=None, model=None, **kwargs):
    model = model or small_model("revnet18", dtype=torch.float32, seed=0).train()
    optimizer = (lambda i, stage: torch.optim.SGD(stage.parameters(), lr=lr)) if lr else None
    pipeline = Pipeline(model.get_stages(), cross_entropy, optimizer_factory=optimizer, precision=precision,
                        timeout=30, diagnostics=Diagnostics(check_reconstruction_every=check_every), **kwargs)
    losses = []
    for images, labels in data(model.config, count):
        losses += pipeline.step(images, labels)
    losses += pipeline.drain()
    return pipeline, model, [float(loss) for _, loss in losses]


# -- the policy ---------------------------------------------------------------------------------------------------
def test_policy_names_and_defaults():
    assert Precision.of("bf16") == Precision(torch.bfloat16, torch.float32, None)
    assert Precision.of("fp32") == Precision()  # float32 compute: autocast off, nothing cast
    assert Precision.of("fp16", streams="bf16", messages="fp16").scales_loss
    for bad, named in ((dict(compute="int8"), "compute"), (dict(compute="bf16", streams="fp16"), "streams"),
                       (dict(messages="fp8"), "messages")):
        with pytest.raises(ValueError, match=named):
            Precision.of(**bad)


def test_bf16_computes_in_bf16_but_stages_exchange_float32_streams():
    received, convolutions = set(), set()
    model = small_model("revnet18", dtype=torch.float32, seed=0).train()
    for stage in model.get_stages()[1:]:  # stage 3 is a non-reversible downsampling block: its bf16 output is cast
        stage.register_forward_pre_hook(lambda module, args: received.add(args[0][0].dtype))
    for conv in (m for m in model.modules() if isinstance(m, torch.nn.Conv2d)):
        conv.register_forward_hook(lambda module, args, out: convolutions.add(out.dtype))
    _, _, losses = run("bf16", model=model)
    assert received == {torch.float32}
    assert convolutions == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(math.isfinite(loss) for loss in losses)


def test_bf16_training_tracks_float32_training():
    _, _, fp32 = run(None, count=30)
    _, _, bf16 = run("bf16", count=30)
    assert fp32[-1] < fp32[0] - 0.3
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < 0.02


# -- the wire -----------------------------------------------------------------------------------------------------
def test_wire_round_trip_exact_in_own_dtype_rounded_in_bf16_rescaled_in_fp16():
    generator = torch.Generator().manual_seed(0)
    streams = (torch.randn(3, 4, 5, generator=generator), torch.randn(3, 2, generator=generator) * 1e-9)
    spec = ActivationSpec.of(streams)
    for wire, tolerance in ((None, 0.0), (torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)):
        parts = [Part(spec), Part(spec, wire)]  # a returned input (always exact) and a gradient
        buffer = encode([streams, streams], parts)
        assert buffer.dtype == torch.uint8 and buffer.numel() == message_bytes(parts, 3)
        returned, gradient = decode(buffer, parts, 3)
        for exact, got, want in zip(returned, returned, streams):
            assert torch.equal(exact, want)
        for got, want in zip(gradient, streams):
            assert got.dtype == torch.float32
            # relative to each element: 1e-9 gradients survive fp16 thanks to the power-of-two factor
            assert float(((got - want).abs() / want.abs()).max()) <= tolerance
    assert message_bytes([Part(spec, torch.bfloat16)], 3) == (60 + 6) * 2


def test_a_local_delivery_lays_values_out_as_a_remote_one():
    """A strided view (one half of a concatenation's gradient) reaches a stage of the same rank laid out as one of
    another rank gets it: reductions over it (a per-channel gain's gradient) then sum in the same order, and one
    process trains the weights N processes train (RevViT with LayerScale differed from its second step)."""
    both = torch.randn(3, 4, 10, generator=torch.Generator().manual_seed(0))
    streams = (both[..., :5], both[..., 5:])
    assert not streams[1].is_contiguous()
    parts = [Part(ActivationSpec.of(streams), wire) for wire in (None, torch.bfloat16)]
    for part in parts:
        (local,), (remote,) = round_trip([streams], [part]), decode(encode([streams], [part]), [part], 3)
        for got, want in zip(local, remote):
            assert got.is_contiguous() and got.stride() == want.stride() and torch.equal(got, want)


def test_fp16_wire_keeps_an_overflow_visible():
    gradient = torch.tensor([[1.0, float("inf")]])
    parts = [Part(ActivationSpec.of(gradient), torch.float16)]
    (got,) = decode(encode([gradient], parts), parts, 1)
    assert not torch.isfinite(got).all()


# -- fp16 loss scaling ----------------------------------------------------------------------------------------------
def test_fp16_overflow_is_survived_without_a_nan_reaching_any_weight():
    """A loss scale of 2**24 overflows fp16 in every stage's backward: updates are skipped and scales halve until
    they fit, then training proceeds; no weight ever holds a NaN or an infinity. (A stage can only test its own
    scale once the stages above have found theirs: until then it receives NaN, and skips.)"""
    steps, scales = [], []

    def watch(index, micro_batches, stage):
        assert all(torch.isfinite(p.grad).all() for p in stage.parameters() if p.grad is not None)
        steps.append(index)

    precision = Precision.of("fp16", initial_scale=2.0**24)
    pipeline, model, losses = run(precision, count=60, lr=0.02, on_update=watch)
    counters = pipeline.counters()
    skipped = [c.skipped_updates for c in counters.values()]
    assert min(skipped) >= 5  # 2**24 -> about 2**17 takes 7-odd halvings at the last stage, more below
    assert all(c.updates + c.skipped_updates == 60 for c in counters.values())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    state = pipeline.state_dict()
    scales = [state[i]["loss_scale"]["scale"] for i in state]
    assert all(scale < 2.0**24 and math.log2(scale).is_integer() for scale in scales)
    assert losses[-1] < losses[0] - 0.5
    assert len(steps) == sum(c.updates for c in counters.values())


class _OverflowOnce(torch.autograd.Function):
    """The identity, whose backward multiplies its 4th gradient by 1e36: an fp16 overflow born in one stage."""

    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        _OverflowOnce.calls += 1
        return grad * 1e36 if _OverflowOnce.calls == 4 else grad


class _Overflowing(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x):
        return _OverflowOnce.apply(self.linear(x))


def test_fp16_only_the_stage_where_an_overflow_is_born_halves_its_scale():
    """Stage 1 overflows once: it and stage 0 below it (which receives the non-finite gradient) skip that group;
    only stage 1 halves its scale and counts the overflow (stage 0 once did too, and over a long run the lowest
    stages drifted to the smallest scale)."""
    torch.manual_seed(0)
    _OverflowOnce.calls = 0
    stages = [nn.Linear(8, 8), _Overflowing(), nn.Sequential(nn.Tanh(), nn.Linear(8, 8)), nn.Linear(8, 3)]
    pipeline = Pipeline(stages, nn.functional.cross_entropy, precision="fp16",
                        optimizer_factory=lambda i, s: torch.optim.SGD(s.parameters(), lr=0.01))
    batch = (torch.randn(4, 8), torch.randint(0, 3, (4,)))
    for _ in range(10):
        pipeline.step(*batch)
    pipeline.drain()
    skipped = [pipeline.workers[i].counters.skipped_updates for i in range(4)]
    scales = [pipeline.workers[i].loss_scale.scale for i in range(4)]
    overflows = [pipeline.workers[i].loss_scale.overflows for i in range(4)]
    assert skipped == [1, 1, 0, 0]
    assert overflows == [0, 1, 0, 0]
    assert scales[1] == scales[0] / 2 == scales[2] / 2
    assert all(torch.isfinite(p).all() for stage in stages for p in stage.parameters())


def test_fp16_scale_state_resumes():
    pipeline, _, _ = run(Precision.of("fp16", initial_scale=2.0**40), count=8)
    state = pipeline.state_dict()
    fresh, _, _ = run(Precision.of("fp16", initial_scale=2.0**40), count=0)
    fresh.load_state_dict(state)
    assert fresh.state_dict()[3]["loss_scale"] == state[3]["loss_scale"]


# -- the handshake ----------------------------------------------------------------------------------------------------
def test_handshake_accepts_the_policy_and_rejects_real_dtype_mismatches():
    images, labels = data(small_model("revnet18", dtype=torch.float32).config, 1)[0]
    float64 = small_model("revnet18", dtype=torch.float64)
    with pytest.raises(StageMismatchError, match="float32 master weights"):
        Pipeline(float64.get_stages(), cross_entropy, precision="bf16").step(images.double(), labels)
    mixed = small_model("revnet18", dtype=torch.float32)
    mixed.get_stages()[4].double()
    with pytest.raises(StageMismatchError, match="stage 4"):
        Pipeline(mixed.get_stages(), cross_entropy, precision="bf16").step(images, labels)
    streams = Pipeline(small_model("revnet18", dtype=torch.float32).get_stages(), cross_entropy,
                       precision=Precision.of("bf16", streams="bf16"))
    streams.step(images, labels)  # bf16 streams into float32 master weights: accepted
    streams.drain()


# -- the sampled reconstruction check ---------------------------------------------------------------------------------
def test_reconstruction_check_measures_rebuilt_inputs():
    frozen, _, _ = run(None, count=6, lr=0, check_every=2)
    bf16_streams, _, _ = run(Precision.of("bf16", streams="bf16"), count=6, lr=0, check_every=2)
    training, _, _ = run(None, count=6, lr=0.1, check_every=2)
    for pipeline in (frozen, bf16_streams, training):
        checked = [c for c in pipeline.counters().values() if c.reconstruction_checks]
        assert len(checked) == 5 and all(c.reconstruction_checks == 3 for c in checked)  # micro-batches 0, 2, 4
    error = {name: max(c.reconstruction_error for c in p.counters().values() if c.reconstruction_checks)
             for name, p in (("frozen", frozen), ("bf16", bf16_streams), ("training", training))}
    assert error["frozen"] < 1e-6 < 1e-4 < error["bf16"] < 1e-2 < error["training"]
    off, _, _ = run(None, count=3)
    assert all(c.reconstruction_checks == 0 and c.reconstruction_error is None for c in off.counters().values())


# -- multi-process ---------------------------------------------------------------------------------------------------
POLICIES = {
    "bf16-messages": Precision.of("bf16", messages="bf16"),
    "fp16-messages": Precision.of("fp16", messages="fp16", initial_scale=2.0**30),
}


def _train_on_ranks(rank, world_size, policy):
    pipeline, model, losses = run(POLICIES[policy], count=7)
    pipeline.gather_stages(dst=0)
    skipped = {i: c.skipped_updates for i, c in pipeline.counters().items()}
    return {"state": model.state_dict() if rank == 0 else None, "losses": losses, "skipped": skipped}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_multiprocess_is_bit_identical_to_one_process_under_the_policy(tmp_path, policy):
    torch.set_num_threads(1)
    reference, model, losses = run(POLICIES[policy], count=7)
    results, codes, _ = run_ranks(_train_on_ranks, 2, policy, out_dir=tmp_path, deadline=150)
    assert codes == [0, 0], [r and r.get("traceback") for r in results]
    state = results[0]["value"]["state"]
    for name, value in model.state_dict().items():
        assert torch.equal(state[name], value), name
    assert results[1]["value"]["losses"] == losses
    skipped = {**results[0]["value"]["skipped"], **results[1]["value"]["skipped"]}
    assert skipped == {i: c.skipped_updates for i, c in reference.counters().items()}
    if policy.startswith("fp16"):
        assert sum(skipped.values()) > 0


def _fp16_replicas(rank, world_size):
    """Two replicas of the whole pipeline (one rank each), fed different data, fp16 from a scale of 2**40."""
    model = small_model("revnet18", dtype=torch.float32, seed=0).train()
    pipeline = Pipeline(model.get_stages(), cross_entropy, precision=Precision.of("fp16", initial_scale=2.0**40),
                        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.02),
                        timeout=30, layout=Layout(data_parallel_size=2))
    generator = torch.Generator().manual_seed(rank)  # each replica its own data: their overflows differ
    images = random_images(model.config, batch=4, dtype=torch.float32, seed=10 + rank) * (1 + rank)
    labels = torch.randint(0, model.config.num_labels, (4,), generator=generator)
    for _ in range(30):
        pipeline.step(images, labels)
    pipeline.drain()
    counters = pipeline.counters()
    return {"state": model.state_dict(), "skipped": [c.skipped_updates for c in counters.values()],
            "updates": [c.updates for c in counters.values()]}


def test_fp16_replicas_skip_together_and_stay_identical(tmp_path):
    torch.set_num_threads(1)
    results, codes, _ = run_ranks(_fp16_replicas, 2, out_dir=tmp_path, deadline=150)
    assert codes == [0, 0], [r and r.get("traceback") for r in results]
    first, second = (r["value"] for r in results)
    assert first["skipped"] == second["skipped"] and min(first["skipped"]) > 0
    assert first["updates"] == second["updates"]
    for name, value in first["state"].items():
        assert torch.equal(value, second["state"][name]), name  # one model, whichever replica skipped
        assert not value.is_floating_point() or torch.isfinite(value).all()
