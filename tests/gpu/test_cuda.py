"""The engine and the RevNet stages on a CUDA device (every test is skipped without one).

The float64 contract of the reversible stages (exact inverses, the fused backward equal to autograd), the float32
and low-precision streams under CUDA autocast, a one-device PETRA run (all stages in one process on one GPU: the
paper's simulator) with its frozen-weight gradients equal to backprop and its losses equal to the CPU's, bf16 and
fp16 training, and models in the channels_last layout.

    python -m pytest -q tests/gpu        # on a machine with a GPU; benchmarks/gpu.py measures speed and memory

Convolutions run in IEEE float32 (no TF32) with deterministic cuDNN algorithms during these tests: the comparisons
below are between two computations that must round alike.
"""

import pytest
import torch
import torch.nn.functional as F

from petra_hub.engine import Diagnostics, Layout, Pipeline
from petra_hub.engine.batchnorm import frozen_running_stats
from petra_hub.engine.precision import Precision
from petra_hub.engine.tensors import as_tuple
from petra_hub.testing.models import random_images, small_model
from petra_hub.testing.stage_contract import ReversibleStageContract, relative_error, reversible_stage_cases
from tests.engine.test_pipeline import assert_frozen_weights_give_the_backprop_gradient, micro_batches

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
VARIANTS = [
    (preset, downsampling) for preset in ("revnet18", "revnet50") for downsampling in ("buffered", "invertible")
]
AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.fixture(autouse=True)
def exact_cuda_arithmetic():
    """No TF32 for float32 convolutions and matmuls, deterministic cuDNN algorithms; restored afterwards."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    saved = (cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark, matmul.allow_tf32)
    cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark, matmul.allow_tf32 = False, True, False, False
    try:
        yield
    finally:
        cudnn.allow_tf32, cudnn.deterministic, cudnn.benchmark, matmul.allow_tf32 = saved


def cross_entropy(logits, labels):
    return F.cross_entropy(logits, labels)


def cuda_stage_cases(preset, downsampling, dtype=torch.float64):
    """(reversible stage on the GPU, the input it receives) for every reversible stage of a small model."""
    model = small_model(preset, downsampling=downsampling, dtype=dtype).to(CUDA).train()
    return reversible_stage_cases(model.get_stages(), random_images(model.config, dtype=dtype).to(CUDA))


# -- (a) the reversible-stage contract (petra_hub.testing.stage_contract) in float64 on the GPU -----------------------
class TestCudaStageContract(ReversibleStageContract):
    @pytest.fixture(params=VARIANTS, ids=lambda v: "-".join(v))
    def stage_cases(self, request):
        cases = cuda_stage_cases(*request.param)
        assert cases and all(t.device.type == CUDA.type for _, x in cases for t in as_tuple(x))
        return cases


# -- (b) float32 streams under CUDA autocast -------------------------------------------------------------------------
@pytest.mark.parametrize("compute", list(AUTOCAST))
@pytest.mark.parametrize("preset,downsampling", VARIANTS)
def test_streams_stay_float32_and_invert_under_cuda_autocast(preset, downsampling, compute):
    """F runs in bf16 / fp16 on the GPU; the streams, the coupling and the reconstruction stay float32, so at frozen
    weights the rebuilt input is exact up to float32 rounding (often exactly equal)."""
    dtype = AUTOCAST[compute]
    low_precision_outputs = set()
    for stage, x in cuda_stage_cases(preset, downsampling, dtype=torch.float32):
        convolutions = [m for m in stage.modules() if isinstance(m, torch.nn.Conv2d)]
        handles = [
            m.register_forward_hook(lambda m, a, out: low_precision_outputs.add(out.dtype)) for m in convolutions
        ]
        autocast = torch.autocast("cuda", dtype=dtype, enabled=dtype is not None)
        with torch.no_grad(), frozen_running_stats(stage), autocast:
            y = stage(x)
            rebuilt = stage.inverse(y)
            fused, grads = stage.reconstruct_and_backward(y, y)
        for handle in handles:
            handle.remove()
        for value in (y, rebuilt, fused, grads):
            assert {t.dtype for t in as_tuple(value)} == {torch.float32}, type(stage).__name__
        for got, fused_got, want in zip(as_tuple(rebuilt), as_tuple(fused), as_tuple(x)):
            assert relative_error(got, want) < 1e-5 and relative_error(fused_got, want) < 1e-5
    assert low_precision_outputs == {dtype or torch.float32}  # F did run in the autocast dtype


# -- (c) one-device PETRA: all stages in one process on one GPU -----------------------------------------------------
def fixed_batch(config, device, dtype=torch.float32, batch=8, channels_last=False):
    images = random_images(config, batch=batch, dtype=dtype).to(device)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    labels = torch.randint(0, config.num_labels, (batch,), generator=torch.Generator().manual_seed(0)).to(device)
    return images, labels


def train(precision=None, *, count=30, lr=0.01, device=CUDA, dtype=torch.float32, channels_last=False, model=None,
          **options):
    """PETRA on one device over `count` steps of one fixed batch (to memorise: the loss must fall)."""
    model = model or small_model("revnet18", dtype=dtype, seed=0).train()
    model.to(device)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    optimizer = (lambda index, stage: torch.optim.SGD(stage.parameters(), lr=lr)) if lr else None
    pipeline = Pipeline(model.get_stages(), cross_entropy, optimizer_factory=optimizer, precision=precision,
                        timeout=60, layout=Layout(device=device), **options)
    images, labels = fixed_batch(model.config, device, dtype, channels_last=channels_last)
    losses = []
    for _ in range(count):
        losses += pipeline.step(images, labels)
    losses += pipeline.drain()
    assert [b for b, _ in losses] == list(range(count))
    return pipeline, model, [float(loss) for _, loss in losses]


@pytest.mark.parametrize("downsampling", ["buffered", "invertible"])
def test_one_device_petra_gives_the_backprop_gradient_at_frozen_weights(downsampling):
    """tests/engine/test_pipeline.py's proof on the GPU: with a zero learning rate every micro-batch's averaged
    gradient, at every stage, is plain autograd's on the whole model, and running statistics count each once."""
    model = small_model("revnet18", downsampling=downsampling).to(CUDA).train()  # float64
    batches = [(images.to(CUDA), labels.to(CUDA)) for images, labels in micro_batches(model.config, 6)]
    assert_frozen_weights_give_the_backprop_gradient(model, batches, "petra", layout=Layout(device="cuda"))


def test_one_device_run_on_the_gpu_equals_the_cpu_run_in_float64():
    _, gpu_model, gpu = train(count=12, lr=0.05, dtype=torch.float64)
    _, cpu_model, cpu = train(count=12, lr=0.05, dtype=torch.float64, device=torch.device("cpu"))
    assert max(abs(a - b) for a, b in zip(gpu, cpu)) < 1e-9
    for (name, got), want in zip(gpu_model.state_dict().items(), cpu_model.state_dict().values()):
        if got.is_floating_point():
            assert relative_error(got.cpu(), want) < 1e-8, name


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_one_device_petra_trains(precision):
    received, convolutions = set(), set()
    model = small_model("revnet18", dtype=torch.float32, seed=0).train()
    for stage in model.get_stages()[1:]:
        stage.register_forward_pre_hook(lambda module, args: received.add(as_tuple(args[0])[0].dtype))
    for conv in (m for m in model.modules() if isinstance(m, torch.nn.Conv2d)):
        conv.register_forward_hook(lambda module, args, out: convolutions.add(out.dtype))
    pipeline, model, losses = train(None if precision == "fp32" else precision, model=model)
    assert losses[-1] < losses[0] - 0.3, losses
    assert received == {torch.float32}  # float32 streams between stages, also under bf16
    assert convolutions == {torch.float32 if precision == "fp32" else torch.bfloat16}
    assert all(p.is_cuda and p.dtype == torch.float32 and torch.isfinite(p).all() for p in model.parameters())
    assert all(c.forwards == c.backwards == c.updates == 30 for c in pipeline.counters().values())


def test_bf16_tracks_float32_on_the_gpu():
    _, _, fp32 = train(None)
    _, _, bf16 = train("bf16")
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < 0.02


def test_reconstruction_check_on_the_gpu():
    """The sampled check of rebuilt inputs: exact up to rounding at frozen weights, float32 and bf16 compute."""
    for precision in (None, "bf16"):
        pipeline, _, _ = train(precision, count=6, lr=0, diagnostics=Diagnostics(check_reconstruction_every=2))
        checked = [c for c in pipeline.counters().values() if c.reconstruction_checks]
        assert len(checked) == 5 and all(c.reconstruction_checks == 3 for c in checked)
        assert max(c.reconstruction_error for c in checked) < 1e-5, precision


# -- (d) channels_last --------------------------------------------------------------------------------------------
def test_channels_last_model_trains_like_the_contiguous_one():
    """A model in channels_last and channels_last images train under the pipeline with the losses (and weights) of
    the contiguous run, in float32. (The stem hands its streams on contiguous; later convolutions with channels_last
    weights produce channels_last outputs again: the layout does not change what is computed.)"""
    arrived = []
    model = small_model("revnet18", dtype=torch.float32, seed=0).train()
    model.get_stages()[0].register_forward_pre_hook(lambda module, args: arrived.append(args[0]))
    _, last_model, last = train(None, count=20, lr=0.05, channels_last=True, model=model)
    _, plain_model, plain = train(None, count=20, lr=0.05)
    conv = next(m for m in last_model.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last) and not conv.weight.is_contiguous()
    fed = arrived[-1]  # the first call is the handshake's dry run on a zero batch
    assert fed.is_contiguous(memory_format=torch.channels_last) and not fed.is_contiguous()
    assert last[-1] < last[0] - 0.3
    assert max(abs(a - b) for a, b in zip(last, plain)) < 1e-4
    for (name, got), want in zip(last_model.state_dict().items(), plain_model.state_dict().values()):
        if got.is_floating_point():
            assert relative_error(got, want) < 1e-3, name


def test_channels_last_under_bf16():
    _, _, last = train("bf16", count=20, lr=0.05, channels_last=True)
    _, _, plain = train("bf16", count=20, lr=0.05)
    assert all(torch.isfinite(torch.tensor(last)))
    assert max(abs(a - b) for a, b in zip(last, plain)) < 0.05  # bf16 rounds differently in each layout


# -- (e) fp16 -----------------------------------------------------------------------------------------------------
def test_fp16_one_device_run_keeps_every_weight_finite():
    """fp16 with a loss scale of 2**40: every stage's backward overflows at first, skips its update and halves its
    scale until the gradients fit; no NaN or infinity reaches a weight, and the loss falls."""

    def watch(index, micro_batches, stage):
        assert all(torch.isfinite(p.grad).all() for p in stage.parameters() if p.grad is not None)

    count = 60
    pipeline, model, losses = train(Precision.of("fp16", initial_scale=2.0**40), count=count, lr=0.02, on_update=watch)
    counters = pipeline.counters()
    assert all(c.updates + c.skipped_updates == count for c in counters.values())
    assert min(c.skipped_updates for c in counters.values()) >= 1
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(torch.isfinite(b).all() for b in model.buffers() if b.is_floating_point())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0] - 0.3


def test_images_reach_the_device_one_micro_batch_ahead_from_pinned_memory():
    from petra_hub.training.feeding import MicroBatch, ahead_on_device

    pinned = [MicroBatch(2, None, torch.randn(2, 3, 4, 4).pin_memory(), torch.tensor([0, k]).pin_memory())
              for k in range(3)]
    moved = list(ahead_on_device(iter(pinned), CUDA))
    assert len(moved) == 3
    for before, after in zip(pinned, moved):
        assert after.pixel_values.is_cuda and torch.equal(after.pixel_values.cpu(), before.pixel_values)
        assert after.labels is before.labels  # left to the engine, and told to other ranks from the CPU


def test_the_trainer_on_the_gpu_trains_alike_with_and_without_pinned_memory(tmp_path):
    from tests.training.test_trainer import make_trainer

    runs = []
    for pinned in (True, False):
        trainer = make_trainer(tmp_path / str(pinned), dataloader_pin_memory=pinned)
        assert trainer.get_train_dataloader().pin_memory is pinned
        trainer.train()
        assert trainer.pipeline.device.type == "cuda"
        runs.append(([log["loss"] for log in trainer.state.log_history if "loss" in log],
                     {name: value.cpu() for name, value in trainer.model.state_dict().items()}))
    (losses, weights), (losses_unpinned, weights_unpinned) = runs
    assert losses == losses_unpinned
    assert all(torch.equal(weights[name], weights_unpinned[name]) for name in weights)


@pytest.mark.parametrize("mode", ["petra", "backprop"])
def test_a_steady_state_step_never_waits_for_the_device(mode):
    """No host synchronisation inside a tick: CUDA's sync debug mode turns any (an `.item()`, a host copy of a
    device value, a shape that depends on data) into an error. The inputs arrive on the device already; the
    losses the steps return stay there."""
    model = small_model("revnet18", dtype=torch.float32, seed=0).to(CUDA).train()
    pipeline = Pipeline(model.get_stages(), cross_entropy, mode=mode, layout=Layout(device=CUDA),
                        optimizer_factory=lambda index, stage: torch.optim.SGD(stage.parameters(), lr=0.01,
                                                                               momentum=0.9))
    batches = [(x.to(CUDA), y.to(CUDA)) for x, y in micro_batches(model.config, 4, dtype=torch.float32)]
    for images, labels in batches * 6:  # past the fill: every stage has work in both directions
        pipeline.step(images, labels)
    torch.cuda.synchronize()
    losses = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for images, labels in batches * 2:
            losses.extend(pipeline.step(images, labels))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert losses and all(loss.is_cuda for _, loss in losses)
