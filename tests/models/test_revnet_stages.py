"""The stage API of the RevNets: exact inverses, the fused backward, batch-norm running statistics."""

import pytest
import torch

from petra_hub.engine.batchnorm import batch_norms, frozen_running_stats
from petra_hub.engine import stage_layout
from petra_hub.testing.models import PAPER_LAYOUTS, random_images, small_model
from petra_hub.testing.stage_contract import ReversibleStageContract, reversible_stage_cases

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
def test_reversible_stages_are_the_paper_layout(preset, downsampling):
    model = small_model(preset, downsampling=downsampling)
    layout = PAPER_LAYOUTS[preset]
    assert stage_layout(model.get_stages()) == (
        layout if downsampling == "buffered" else "S" + "R" * (len(layout) - 2) + "H"
    )


class TestRevNetStageContract(ReversibleStageContract):
    """Exact inverses and the fused backward of every reversible stage, for every preset and downsampling."""

    @pytest.fixture(params=VARIANTS, ids=[f"{p}-{d}" for p, d in VARIANTS])
    def stage_cases(self, request):
        preset, downsampling = request.param
        model = small_model(preset, downsampling=downsampling)
        model.train()
        return reversible_stage_cases(model.get_stages(), random_images(model.config))


def test_invertible_variant_makes_every_block_reversible():
    for preset in PRESETS:
        model = small_model(preset, downsampling="invertible")
        stages = model.get_stages()
        assert [s.reversible for s in stages[1:-1]] == [True] * (len(stages) - 2)
        assert not stages[0].reversible and not stages[-1].reversible


def running_stats(module):
    return [
        (bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked)) for bn in batch_norms(module)
    ]


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
