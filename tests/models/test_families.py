"""Model families: one registration gives every per-family fact, refused by name where missing; PetraTrainer also
trains models of no registered family, and says what it cannot do for them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from petra_hub import ModelFamily, PetraTrainer, PetraTrainingArguments, register_family
from petra_hub.data import collate_image_batch, load_image_dataset
from petra_hub.models import families
from petra_hub.models.families import DataShape, MissingFamilyFact, family_of_preset, registered_families
from petra_hub.testing.stage_contract import ReversibleStageContract, reversible_stage_cases



def _classes(revmlp, model_type: str):
    """RevMLP classes under another model_type."""

    class LooseConfig(revmlp.RevMLPConfig):
        def __init__(self, **kwargs):  # transformers generates the __init__ of a configuration subclass without one
            super().__init__(**kwargs)

    class LooseModel(revmlp.RevMLPModel):
        config_class = LooseConfig

    class LooseClassifier(revmlp.RevMLPForImageClassification):
        config_class = LooseConfig

    LooseConfig.model_type = model_type
    return LooseConfig, LooseModel, LooseClassifier


@pytest.fixture(scope="module")
def loose(revmlp):
    """Classes of a family the tests register (and forget again)."""
    return _classes(revmlp, "loose_mlp")


@pytest.fixture(scope="module")
def unregistered(revmlp):
    """Classes of a model_type no family registers, ever."""
    return _classes(revmlp, "free_mlp")


@pytest.fixture
def forget_families():
    before = dict(families._FAMILIES)
    yield
    families._FAMILIES.clear()
    families._FAMILIES.update(before)


def test_the_built_in_families_are_registered_the_same_way():
    known = registered_families()
    assert {"revnet", "revvit"} <= set(known)
    for family in (known["revnet"], known["revvit"]):
        assert family.package == "petra_hub" and family.shape_config and family.recipe_flags and family.architecture
        assert family.code_files() == tuple(sorted({f"configuration_{family.model_type}.py",
                                                    f"modeling_{family.model_type}.py", "loading_checks.py"}))
    assert family_of_preset("RevNet-18") == (known["revnet"], "revnet18")
    assert family_of_preset("revvit_small") == (known["revvit"], "revvit-small")


def test_each_family_registers_the_timm_entry_points_it_names():
    import importlib

    import timm

    for family in registered_families().values():
        if family.timm_module is None:
            assert not family.timm_models
            continue
        importlib.import_module(family.timm_module)
        assert family.timm_models and set(family.timm_models) <= set(timm.list_models())


def test_registration_checks_the_family_before_registering(revmlp, loose, forget_families):
    config, base, classifier = loose
    family = ModelFamily(title="Loose", config_class=config, base_model_class=base, classifier_class=classifier,
                         description="a test family")
    with pytest.raises(ValueError, match="base_model_class RevMLPModel has config_class .*expected LooseConfig"):
        register_family(dataclasses.replace(family, base_model_class=revmlp.RevMLPModel))
    with pytest.raises(ValueError, match=r"classifier_class Module has no get_stages\(\)"):
        register_family(dataclasses.replace(family, classifier_class=type("Module", (nn.Module,),
                                                                           {"config_class": config})))
    with pytest.raises(ValueError, match="preset 'revnet18' is a preset of 'RevNet' already"):
        register_family(dataclasses.replace(family, presets={"revnet18": {}}))
    assert "loose_mlp" not in registered_families()  # nothing registered by a refused family
    register_family(family)
    register_family(family)  # again: harmless
    with pytest.raises(ValueError, match="model_type 'loose_mlp' is registered already, by the family 'Loose'"):
        register_family(dataclasses.replace(family, title="Other"))


def test_a_missing_fact_is_an_error_naming_the_family_and_the_fact(loose, forget_families):
    config, base, classifier = loose
    family = register_family(ModelFamily(title="Loose", config_class=config, base_model_class=base,
                                         classifier_class=classifier, description="a test family",
                                         presets={"loose-small": {"hidden_size": 8}}))
    with pytest.raises(MissingFamilyFact, match=r"model family 'Loose' \(model_type 'loose_mlp'\) gives no "
                                                "shape_config, which the recipe's --model loose-small needs"):
        family.config_for_data("loose-small", {}, DataShape(image_size=16))
    assert family.config_from_preset("loose-small").hidden_size == 8
    assert family.describe(None, "loose-small") == ("Loose (loose-small)", "Loose (loose-small): see `config.json`")
    assert family.stored_stages_text(None) == "The stages that are not reversible"  # words of no other family


def _train(model, tmp_path, **overrides) -> PetraTrainer:
    train = torch.utils.data.Subset(load_image_dataset("digits", "train"), range(64))
    args = PetraTrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=16, max_steps=4,
                                  learning_rate=0.05, report_to=[], disable_tqdm=True, save_strategy="no",
                                  **overrides)
    trainer = PetraTrainer(model=model, args=args, train_dataset=train, data_collator=collate_image_batch)
    trainer.train()
    return trainer


def test_a_model_of_no_registered_family_trains_and_saves_without_a_card(unregistered, tmp_path):
    config, _, classifier = unregistered
    torch.manual_seed(0)
    model = classifier(config(image_size=16, hidden_size=8, num_blocks=2, num_labels=10))
    trainer = _train(model, tmp_path)
    with pytest.warns(UserWarning, match=r"no model card .*LooseClassifier \(model_type 'free_mlp'\) belongs to no "
                                         r"registered model family; register it with petra_hub.register_family"):
        trainer.save_model(str(tmp_path / "saved"))
    saved = {path.name for path in (tmp_path / "saved").iterdir()}
    assert {"config.json", "model.safetensors"} <= saved and "README.md" not in saved
    reloaded = classifier.from_pretrained(tmp_path / "saved")
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    with pytest.raises(ValueError, match="a model card needs the model family of model_type 'free_mlp', and none "
                                         "is registered"):
        trainer.create_model_card()


def test_a_model_that_is_not_a_pretrained_model_or_has_no_stages_is_refused_before_training(revmlp, tmp_path):
    config = revmlp.RevMLPConfig(image_size=16, hidden_size=8, num_blocks=2, num_labels=10)

    class Plain(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = revmlp.RevMLPForImageClassification(config)

        def get_stages(self):
            return self.inner.get_stages()

    args = PetraTrainingArguments(output_dir=str(tmp_path), report_to=[])
    with pytest.raises(TypeError, match="PetraTrainer needs a transformers PreTrainedModel with get_stages\\(\\), "
                                        "got Plain"):
        PetraTrainer(model=Plain(), args=args)
    with pytest.raises(ValueError, match="PetraTrainer needs a model with get_stages\\(\\).*RevMLPPreTrainedModel has"):
        PetraTrainer(model=revmlp.modeling_revmlp.RevMLPPreTrainedModel(config), args=args)


class TestExampleFamilyStages(ReversibleStageContract):
    """The example family's reversible blocks honour the stage contract PETRA relies on."""

    @pytest.fixture
    def stage_cases(self, revmlp):
        torch.manual_seed(0)
        model = revmlp.RevMLPForImageClassification(revmlp.RevMLPConfig(num_labels=10)).double().train()
        return reversible_stage_cases(model.get_stages(), torch.randn(4, 3, 8, 8, dtype=torch.float64))
