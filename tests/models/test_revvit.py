"""RevViT: the reversible-stage contract for every preset, randomness replayed in any order, PETRA's gradients at
frozen weights equal autograd's, 2 processes equal 1, Auto classes and bad input."""

import copy

import pytest
import torch
import torch.nn.functional as F

from petra_hub import RevViTConfig, RevViTForImageClassification
from petra_hub.engine import Mode, Pipeline, stage_layout
from petra_hub.models.revvit import PRESETS
from petra_hub.testing.models import small_revvit
from petra_hub.testing.ranks import run_ranks
from petra_hub.testing.stage_contract import ReversibleStageContract, relative_error, reversible_stage_cases
from tests.engine.test_pipeline import assert_frozen_weights_give_the_backprop_gradient


def images(batch=4, dtype=torch.float64, seed=1):
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed), dtype=dtype)


class TestRevViTStages(ReversibleStageContract):
    @pytest.fixture(params=sorted(PRESETS))
    def stage_cases(self, request):
        model = small_revvit(request.param).train()
        return reversible_stage_cases(model.get_stages(), images())


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_stages_in_order_are_the_model_and_the_layout(preset):
    model = small_revvit(preset).eval()
    stages = model.get_stages()
    assert stage_layout(stages) == "S" + "R" * RevViTConfig.from_preset(preset).num_hidden_layers + "H"
    value = images()
    for stage in stages:
        value = stage(value)
    assert torch.equal(value, model(images()).logits)


def test_dropout_and_stochastic_depth_replay_in_any_order():
    """With dropout and stochastic depth on, the inverse (G before F) and the fused backward draw the forward's
    masks when the global generator is replayed: inversion to 1e-12, gradients equal autograd's."""
    model = small_revvit(hidden_dropout_prob=0.3, drop_path_rate=0.5).train()
    stage, x = reversible_stage_cases(model.get_stages(), images())[-1]
    state = torch.random.get_rng_state()
    leaves = tuple(t.detach().requires_grad_(True) for t in x)
    y = stage(leaves)
    grads = tuple(torch.randn_like(t) for t in y)
    expected = torch.autograd.grad(y, [*leaves, *stage.parameters()], grads)
    other = torch.random.get_rng_state()
    assert not torch.equal(stage(x)[0], y[0])  # the masks matter: another draw, another output

    torch.random.set_rng_state(state)
    with torch.no_grad():
        rebuilt = stage.inverse(tuple(t.detach() for t in y))
    assert all(relative_error(a, b) < 1e-12 for a, b in zip(rebuilt, x))
    torch.random.set_rng_state(state)
    stage.zero_grad(set_to_none=True)
    with torch.no_grad():
        fused, input_grads = stage.reconstruct_and_backward(tuple(t.detach() for t in y), grads)
    assert all(relative_error(a, b) < 1e-12 for a, b in zip(fused, x))
    for got, want in zip([*input_grads, *(p.grad for p in stage.parameters())], expected):
        assert relative_error(got, want) < 1e-10
    torch.random.set_rng_state(other)


@pytest.mark.parametrize("mode", [Mode.PETRA, Mode.REVERSIBLE_BACKPROP])
def test_petra_gradients_at_frozen_weights_are_autograds(mode):
    model = small_revvit("revvit-tiny", num_hidden_layers=4)
    labels = [torch.randint(0, 10, (4,), generator=torch.Generator().manual_seed(i)) for i in range(5)]
    batches = [(images(seed=10 + i), labels[i]) for i in range(5)]
    assert_frozen_weights_give_the_backprop_gradient(model, batches, mode)


def _two_processes(rank, world_size):
    # no dropout: each process draws masks from its own generator, so random stages train reproducibly for one
    # placement but differently across placements (docs/engine.md, randomness)
    model = small_revvit("revvit-tiny", dtype=torch.float32, seed=4)
    model.train()
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, timeout=60,
                        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.05))
    torch.manual_seed(9)
    for index in range(6):
        pipeline.step(images(8, torch.float32, seed=index), torch.arange(8) % 10)
    pipeline.drain()
    pipeline.gather_stages(dst=0)
    return {k: v.clone() for k, v in model.state_dict().items()} if rank == 0 else None


def test_two_processes_train_what_one_process_trains(tmp_path):
    torch.set_num_threads(1)
    expected = _two_processes(0, 1)
    outcome, codes, _ = run_ranks(_two_processes, 2, out_dir=tmp_path, deadline=150)
    assert codes == [0, 0], [r and r.get("traceback") for r in outcome]
    state = outcome[0]["value"]
    assert all(torch.equal(state[name], value) for name, value in expected.items())


def test_auto_classes_and_saving(tmp_path):
    from transformers import AutoConfig, AutoModelForImageClassification

    model = small_revvit("revvit-small").float().eval()
    model.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).model_type == "revvit"
    loaded = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, RevViTForImageClassification)
    x = images(dtype=torch.float32)
    assert torch.equal(loaded(x).logits, model(x).logits)
    assert {"configuration_revvit.py", "modeling_revvit.py"} <= {p.name for p in tmp_path.iterdir()}


def test_bad_configs_and_inputs_are_clear_errors():
    with pytest.raises(ValueError, match="image_size 30 must be a multiple of patch_size 4"):
        RevViTConfig(image_size=30, patch_size=4)
    with pytest.raises(ValueError, match="hidden_size 10 must be divisible by num_attention_heads 3"):
        RevViTConfig(hidden_size=10, num_attention_heads=3)
    with pytest.raises(ValueError, match="drop_path_rate must lie in"):
        RevViTConfig(drop_path_rate=1.5)
    with pytest.raises(ValueError, match="Unknown RevViT preset"):
        RevViTConfig.from_preset("revvit-huge")
    model = small_revvit()
    with pytest.raises(ValueError, match="channels but the model expects config.num_channels=3"):
        model(torch.randn(2, 1, 16, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="built for 16x16 images in patches of 4"):
        model(torch.randn(2, 3, 20, 20, dtype=torch.float64))
    assert copy.deepcopy(model.config).num_patches == 16
