"""The stage API of the RevNets: exact inverses, the fused backward, batch-norm running statistics."""

import pytest
import torch
from torch import nn

from petra_hub.engine.batchnorm import batch_norms, frozen_running_stats
from petra_hub.testing.models import PAPER_LAYOUTS, random_images, relative_error, small_model

PRESETS = ["revnet18", "revnet34", "revnet50", "revnet101"]
VARIANTS = [(preset, downsampling) for preset in PRESETS for downsampling in ("buffered", "invertible")]
STEMS = ["cifar", "imagenet"]


def stage_inputs(model, images):
    """The input of every stage, computed by running the stages in order (frozen running stats)."""
    inputs, x = [], images
    with frozen_running_stats(model):
        for stage in model.get_stages():
            inputs.append(x)
            x = stage(x)
    return inputs, x


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("preset,downsampling", VARIANTS)
def test_stages_in_sequence_equal_the_model(preset, downsampling):
    for stem in STEMS:
        model = small_model(preset, stem=stem, downsampling=downsampling)
        model.eval()
        images = random_images(model.config)
        _, logits = stage_inputs(model, images)
        assert torch.equal(logits, model(images).logits)


@pytest.mark.parametrize("preset,downsampling", VARIANTS)
def test_every_reversible_stage_inverts_its_output(preset, downsampling):
    model = small_model(preset, downsampling=downsampling)
    model.train()
    inputs, _ = stage_inputs(model, random_images(model.config))
    reversible = [(stage, x) for stage, x in zip(model.get_stages(), inputs) if stage.reversible]
    layout = PAPER_LAYOUTS[preset]
    assert len(reversible) == (layout.count("R") if downsampling == "buffered" else len(layout) - 2)
    with torch.no_grad(), frozen_running_stats(model):
        for stage, x in reversible:
            rebuilt = stage.inverse(stage(x))
            for got, want in zip(rebuilt, x):
                assert relative_error(got, want) < 1e-12


def test_invertible_variant_makes_every_block_reversible():
    for preset in PRESETS:
        model = small_model(preset, downsampling="invertible")
        stages = model.get_stages()
        assert [s.reversible for s in stages[1:-1]] == [True] * (len(stages) - 2)
        assert not stages[0].reversible and not stages[-1].reversible


class CallCounter:
    """Counts the evaluations of every convolution under a module."""

    def __init__(self, module: nn.Module):
        self.calls = 0
        self.convs = [m for m in module.modules() if isinstance(m, nn.Conv2d)]
        self.handles = [m.register_forward_hook(self.hook) for m in self.convs]

    def hook(self, *args):
        self.calls += 1

    def remove(self):
        for handle in self.handles:
            handle.remove()


@pytest.mark.parametrize("preset,downsampling", VARIANTS)
def test_fused_backward_matches_autograd_and_runs_each_function_once(preset, downsampling):
    model = small_model(preset, downsampling=downsampling)
    model.train()
    inputs, _ = stage_inputs(model, random_images(model.config))
    generator = torch.Generator().manual_seed(3)
    for stage, x in zip(model.get_stages(), inputs):
        if not stage.reversible:
            continue
        params = list(stage.parameters())
        # Reference: plain autograd through the forward.
        leaves = tuple(t.detach().requires_grad_(True) for t in x)
        with frozen_running_stats(stage):
            y = stage(leaves)
        grads = tuple(torch.randn(t.shape, dtype=t.dtype, generator=generator) for t in y)
        expected = torch.autograd.grad(y, [*leaves, *params], grads)
        expected_inputs, expected_params = expected[: len(leaves)], expected[len(leaves) :]

        stage.zero_grad(set_to_none=True)
        counter = CallCounter(stage)
        with torch.no_grad():
            y_detached = tuple(t.detach() for t in y)
            rebuilt, input_grads = stage.reconstruct_and_backward(y_detached, grads)
        counter.remove()
        assert counter.calls == len(counter.convs), "each convolution must run exactly once"
        for got, want in zip(rebuilt, x):
            assert relative_error(got, want) < 1e-12
        for got, want in zip(input_grads, expected_inputs):
            assert relative_error(got, want) < 1e-10
        for param, want in zip(params, expected_params):
            assert relative_error(param.grad, want) < 1e-10


def running_stats(module):
    return [(bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked)) for bn in batch_norms(module)]


def test_frozen_forward_leaves_running_stats_untouched():
    model = small_model("revnet50")
    model.train()
    before = running_stats(model)
    with frozen_running_stats(model):
        model(random_images(model.config))
    after = running_stats(model)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and a[2] == b[2] for a, b in zip(before, after))
    assert all(bn.track_running_stats for bn in batch_norms(model))


def test_fused_backward_updates_running_stats_exactly_once():
    model = small_model("revnet18", downsampling="invertible")
    model.train()
    inputs, _ = stage_inputs(model, random_images(model.config))
    stage, x = next((s, x) for s, x in zip(model.get_stages(), inputs) if s.reversible)
    with torch.no_grad(), frozen_running_stats(stage):
        y = stage(x)
    momentum = model.config.batch_norm_momentum
    bn = batch_norms(stage)[0]
    # The first BN of F sees the first conv applied to x1 = y2: its batch mean is known.
    with torch.no_grad():
        conv_out = stage.residual[0][0](y[1])
    batch_mean = conv_out.mean(dim=(0, 2, 3))
    stage.reconstruct_and_backward(y, tuple(torch.ones_like(t) for t in y))
    assert int(bn.num_batches_tracked) == 1
    torch.testing.assert_close(bn.running_mean, momentum * batch_mean, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("batch", [1, 2])
def test_stem_streams_own_their_storage(batch):
    """Found by the memory benchmark: at batch 1, chunked streams were views of one buffer."""
    model = small_model("revnet18")
    first, second = model.get_stages()[0](random_images(model.config, batch=batch))
    assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
    assert first.untyped_storage().nbytes() == first.numel() * first.element_size()
