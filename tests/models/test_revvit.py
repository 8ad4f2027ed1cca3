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
from tests.models import remote_checks


def images(batch=4, dtype=torch.float64, seed=1):
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(seed), dtype=dtype)


class TestRevViTStages(ReversibleStageContract):
    @pytest.fixture(params=sorted(PRESETS))
    def stage_cases(self, request):
        model = small_revvit(request.param).train()
        return reversible_stage_cases(model.get_stages(), images())


class TestRevViTStagesWithLayerScale(ReversibleStageContract):
    """The gains are parameters of the block itself: the fused backward must give them autograd's gradient too."""

    @pytest.fixture
    def stage_cases(self):
        model = small_revvit(layer_scale_init_value=0.5).train()
        return reversible_stage_cases(model.get_stages(), images())


class TestRevViTStagesWithQKNorm(ReversibleStageContract):
    """The query and key norms sit inside F: the fused backward must give their weights autograd's gradient."""

    @pytest.fixture
    def stage_cases(self):
        model = small_revvit(qk_norm=True).train()
        for name, parameter in model.named_parameters():  # off their initial ones and zeros, so that they count
            if "query_norm" in name or "key_norm" in name:
                parameter.data.add_(0.1 * torch.randn_like(parameter))
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


@pytest.mark.parametrize("mode,conv_stem", [(Mode.PETRA, False), (Mode.REVERSIBLE_BACKPROP, False),
                                            (Mode.PETRA, True)])
def test_petra_gradients_at_frozen_weights_are_autograds(mode, conv_stem):
    model = small_revvit("revvit-tiny", num_hidden_layers=4, conv_stem=conv_stem)
    labels = [torch.randint(0, 10, (4,), generator=torch.Generator().manual_seed(i)) for i in range(5)]
    batches = [(images(seed=10 + i), labels[i]) for i in range(5)]
    assert_frozen_weights_give_the_backprop_gradient(model, batches, mode)


def _two_processes(rank, world_size, conv_stem=False):
    # no dropout: each process draws masks from its own generator, so random stages train reproducibly for one
    # placement but differently across placements (docs/engine.md, randomness)
    model = small_revvit("revvit-tiny", dtype=torch.float32, seed=4, conv_stem=conv_stem)
    model.train()
    pipeline = Pipeline(model.get_stages(), F.cross_entropy, timeout=60,
                        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.05))
    torch.manual_seed(9)
    for index in range(6):
        pipeline.step(images(8, torch.float32, seed=index), torch.arange(8) % 10)
    pipeline.drain()
    pipeline.gather_stages(dst=0)
    return {k: v.clone() for k, v in model.state_dict().items()} if rank == 0 else None


@pytest.mark.parametrize("conv_stem", [False, True])
def test_two_processes_train_what_one_process_trains(tmp_path, conv_stem):
    """With the convolutional stem too: its BatchNorm's running statistics are state a process must train alike."""
    torch.set_num_threads(1)
    expected = _two_processes(0, 1, conv_stem)
    outcome, codes, _ = run_ranks(_two_processes, 2, conv_stem, out_dir=tmp_path, deadline=150)
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


def remote_folder(folder):
    """What the interpreter without petra_hub loads (tests/models/remote_checks.py): a saved model, with an input and
    its logits."""
    model = small_revvit("revvit-tiny").eval()
    model.save_pretrained(folder)
    x = images()
    with torch.no_grad():
        logits = model(x).logits
    return remote_checks.RemoteLoad("AutoModelForImageClassification", inputs=x, expected=logits)


remote_checks.register("revvit_classifier", remote_folder)


def test_trust_remote_code_loads_without_petra_hub(tmp_path_factory):
    outcome = remote_checks.outcome("revvit_classifier", tmp_path_factory)
    logits = outcome.expected
    assert outcome.error is None, outcome.error
    assert outcome.petra_hub_importable is False
    module, name, config_module = outcome.model_module, outcome.model_class, outcome.config_module
    assert name == "RevViTForImageClassification" and module.startswith("transformers_modules")
    assert module.endswith("modeling_revvit") and config_module.endswith("configuration_revvit")
    assert outcome.petra_hub_modules == []
    assert torch.allclose(outcome.output, logits, rtol=0, atol=1e-12)


def test_image_classification_pipeline(tmp_path):
    import numpy as np
    import transformers
    from PIL import Image

    model = small_revvit("revvit-tiny", dtype=torch.float32).eval()
    processor = transformers.ViTImageProcessor(do_resize=True, size={"height": 16, "width": 16})
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    classifier = transformers.pipeline("image-classification", model=str(tmp_path))
    assert type(classifier.model) is RevViTForImageClassification
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8), mode="RGB")
    predictions = classifier(image, top_k=10)
    with torch.no_grad():
        probabilities = model(processor(image, return_tensors="pt")["pixel_values"]).logits.softmax(-1)[0]
    scores = {p["label"]: p["score"] for p in predictions}
    assert len(scores) == 10
    for index, probability in enumerate(probabilities.tolist()):
        assert scores[model.config.id2label[index]] == pytest.approx(probability, abs=1e-5)


@pytest.mark.parametrize("mode,drop", [("reversible_backprop", 0.5), ("petra", 0.05)])
def test_the_petra_trainer_trains_a_revvit(tmp_path, mode, drop):
    """The Trainer needs only `get_stages()`: a 4-block RevViT (J = 6) on digits, its loss falling, and the model's
    own input check on prediction. At this tiny budget (200 steps, AdamW) the delay slows PETRA's start a lot: the
    classic delayed baseline starts as slowly (2.26 -> 2.17 for both), while synchronous reversible backprop, which
    rebuilds inputs the same way, reaches 1.63."""
    from petra_hub.data import collate_image_batch, load_image_dataset, take
    from petra_hub.training import PetraTrainer, PetraTrainingArguments

    torch.manual_seed(0)
    model = small_revvit("revvit-tiny", dtype=torch.float32, num_hidden_layers=4, hidden_size=48)
    args = PetraTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=32, max_steps=200,
                                  petra_mode=mode, learning_rate=1e-3, optim="adamw_torch", max_grad_norm=0.0,
                                  logging_steps=50, eval_strategy="no", save_strategy="no", report_to=[],
                                  disable_tqdm=True)
    trainer = PetraTrainer(model=model, args=args, train_dataset=take(load_image_dataset("digits", "train"), 320),
                           data_collator=collate_image_batch)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4 and losses[-1] < losses[0] - drop
    assert {c.backwards for c in trainer.pipeline.counters().values()} == {200}
    gray = [{"pixel_values": torch.zeros(1, 16, 16), "labels": 0}] * 4  # checked before any step
    bad = PetraTrainer(model=model, args=args, train_dataset=gray, data_collator=collate_image_batch)
    with pytest.raises(ValueError, match="1 channels but the model expects config.num_channels=3"):
        bad.train()


def test_layer_scale_is_off_by_default_and_when_on_starts_each_branch_at_its_gain():
    """LayerScale adds two gains per block and changes nothing else: the other weights are drawn as without it."""
    import torch

    from petra_hub.models import RevViTConfig, RevViTForImageClassification

    base = dict(image_size=16, patch_size=4, hidden_size=24, num_hidden_layers=2, num_attention_heads=2, num_labels=3)
    torch.manual_seed(0)
    plain = RevViTForImageClassification(RevViTConfig(**base))
    torch.manual_seed(0)
    scaled = RevViTForImageClassification(RevViTConfig(**base, layer_scale_init_value=1e-3))
    extra = set(scaled.state_dict()) - set(plain.state_dict())
    assert extra == {f"revvit.encoder.{i}.{name}" for i in range(2) for name in ("attention_scale", "mlp_scale")}
    assert all(torch.equal(plain.state_dict()[name], scaled.state_dict()[name]) for name in plain.state_dict())
    block = scaled.revvit.encoder[0].eval()
    x1, x2 = torch.randn(2, 16, 24), torch.randn(2, 16, 24)
    with torch.no_grad():
        y1, y2 = block((x1, x2))
        assert torch.allclose(y1, x1 + 1e-3 * block.attention(x2), atol=1e-7)
        assert torch.allclose(y2, x2 + 1e-3 * block.mlp(y1), atol=1e-7)
    with pytest.raises(ValueError, match="layer_scale_init_value must be a positive number or None"):
        RevViTConfig(**base, layer_scale_init_value=0.0)


def test_qk_norm_normalises_each_head_s_queries_and_keys_and_changes_nothing_else():
    """With qk_norm each head's queries and keys go through their own LayerNorm before the scaled dot products
    (written out here in float64 against torch's attention kernel); the other weights are drawn as without it."""
    base = dict(image_size=16, patch_size=4, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, num_labels=3)
    torch.manual_seed(0)
    plain = RevViTForImageClassification(RevViTConfig(**base))
    torch.manual_seed(0)
    normed = RevViTForImageClassification(RevViTConfig(**base, qk_norm=True)).double()
    extra = set(normed.state_dict()) - set(plain.state_dict())
    assert extra == {f"revvit.encoder.{i}.attention.{name}" for i in range(2)
                     for name in ("query_norm.weight", "query_norm.bias", "key_norm.weight")}
    assert all(torch.equal(plain.state_dict()[name].double(), normed.state_dict()[name]) for name in plain.state_dict())
    attention = normed.revvit.encoder[0].attention
    with torch.no_grad():
        for norm in (attention.query_norm, attention.key_norm):
            norm.weight.add_(torch.randn_like(norm.weight))
        attention.query_norm.bias.add_(torch.randn_like(attention.query_norm.bias))
    x = torch.randn(2, 16, 24, dtype=torch.float64)
    q, k, v = (attention.qkv(attention.norm(x)).view(2, 16, 3, 3, 8).permute(2, 0, 3, 1, 4)).unbind(0)
    q = F.layer_norm(q, (8,), attention.query_norm.weight, attention.query_norm.bias, 1e-6)
    k = F.layer_norm(k, (8,), attention.key_norm.weight, None, 1e-6)
    mixed = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1) @ v
    expected = attention.projection(mixed.transpose(1, 2).reshape(2, 16, 24))
    assert torch.allclose(attention(x), expected, atol=1e-12)
    with pytest.raises(ValueError, match="qk_norm must be True or False"):
        RevViTConfig(**base, qk_norm="yes")


def test_the_card_s_description_names_qk_norm_layer_scale_and_the_stem_where_the_model_has_them():
    from petra_hub.models.revvit.family import architecture

    plain = RevViTConfig.from_preset("revvit-tiny", image_size=16, patch_size=4)
    name, description = architecture(plain, "revvit-tiny")
    assert name == "RevViT-Ti" and "normalised" not in description and "LayerScale" not in description
    both = RevViTConfig.from_preset("revvit-tiny", image_size=16, patch_size=4, qk_norm=True,
                                    layer_scale_init_value=1e-4)
    _, description = architecture(both, "revvit-tiny")
    assert description.endswith("LayerScale from 0.0001, queries and keys normalised per head")
    assert "stem" not in description
    _, description = architecture(RevViTConfig.from_preset("revvit-tiny", image_size=16, patch_size=4,
                                                           conv_stem=True), "revvit-tiny")
    assert description.endswith("(16 tokens), a convolutional stem")


def test_the_convolutional_stem_is_a_stack_of_strided_convolutions_giving_the_patchify_grid():
    """Two 3x3 convolutions of stride 2 (patch 4) with BatchNorm and ReLU, widths doubling to hidden_size, then a 1x1
    convolution, written out here in float64 with torch's functional ops; He-initialised; the same tokens' shape
    as the patchify convolution; bad shapes refused by name."""
    base = dict(image_size=16, patch_size=4, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, num_labels=3)
    model = RevViTForImageClassification(RevViTConfig(**base, conv_stem=True)).double().train()
    embeddings = model.revvit.embeddings
    convolutions = [m for m in embeddings.patches if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in embeddings.patches if isinstance(m, torch.nn.BatchNorm2d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size, c.stride) for c in convolutions] == [
        (3, 12, (3, 3), (2, 2)), (12, 24, (3, 3), (2, 2)), (24, 24, (1, 1), (1, 1))]
    for convolution in convolutions:  # He: std sqrt(2 / fan_out), against the transformer's 0.02
        fan_out = convolution.out_channels * convolution.kernel_size[0] * convolution.kernel_size[1]
        assert float(convolution.weight.detach().std()) == pytest.approx((2 / fan_out) ** 0.5, rel=0.2)
    with torch.no_grad():
        for norm in norms:  # off their initial ones and zeros, so that they count
            norm.weight.add_(0.3 * torch.randn_like(norm.weight))
            norm.bias.add_(0.3 * torch.randn_like(norm.bias))
    x = images()
    value = x
    for convolution, norm in zip(convolutions, norms):
        value = F.conv2d(value, convolution.weight, stride=2, padding=1)
        value = F.relu(F.batch_norm(value, None, None, norm.weight, norm.bias, training=True, eps=norm.eps))
    value = F.conv2d(value, convolutions[2].weight, convolutions[2].bias)
    expected = value.flatten(2).transpose(1, 2) + embeddings.position_embeddings
    with torch.no_grad():
        tokens, other = embeddings(x)
    assert tokens.shape == (4, 16, 24) and torch.equal(tokens, other)
    assert torch.allclose(tokens, expected, atol=1e-12)
    plain = RevViTForImageClassification(RevViTConfig(**base)).double()
    assert plain.revvit.embeddings(x)[0].shape == tokens.shape
    with pytest.raises(ValueError, match="conv_stem=True needs a patch_size that is a power of two"):
        RevViTConfig(**{**base, "image_size": 18, "patch_size": 6}, conv_stem=True)
    with pytest.raises(ValueError, match=r"conv_stem=True needs hidden_size divisible by patch_size // 2 = 4"):
        RevViTConfig(**{**base, "patch_size": 8, "hidden_size": 18}, conv_stem=True)
    with pytest.raises(ValueError, match="conv_stem must be True or False"):
        RevViTConfig(**base, conv_stem="yes")
