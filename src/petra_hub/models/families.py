"""Model families: every fact petra_hub needs about a reversible architecture, in one registration.

A family is a configuration class and the models built from it, plus what the rest of the package asks of them: the
named presets, how a preset is shaped to a data set (the recipe), the words and tags of its model card, the code files
a `trust_remote_code` folder carries, and its timm entry points where it has some. `register_family` makes a family
known everywhere at once: transformers' Auto classes, `PetraTrainer.save_model`'s card, the recipe's `--model`,
the Hub folders. RevNet and RevViT are registered the same way, by their packages (`models/revnet/family.py`,
`models/revvit/family.py`); a user registers their own from any module, before using it:

    from petra_hub import ModelFamily, register_family

    register_family(ModelFamily(
        title="RevMLP", config_class=RevMLPConfig, base_model_class=RevMLPModel,
        classifier_class=RevMLPForImageClassification, presets={"revmlp-small": {"hidden_size": 64}},
        description="a reversible multilayer perceptron: each block maps (x1, x2) to (x2 + F(x1), x1)",
    ))

A fact a family does not give is an error naming the family and the fact where it is needed (`MissingFamilyFact`),
never another family's behaviour.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DataShape",
    "MissingFamilyFact",
    "ModelFamily",
    "family_named",
    "family_of_config",
    "family_of_model",
    "family_of_preset",
    "preset_names",
    "register_family",
    "registered_families",
]


@dataclass(frozen=True)
class DataShape:
    """What the recipe tells a family about the data a new model is shaped to."""

    image_size: int  # the side of the (square) images the model receives
    num_channels: int = 3


class MissingFamilyFact(LookupError):
    """A family was asked for a fact its registration does not give."""

    def __init__(self, family: ModelFamily, fact: str, needed_for: str):
        super().__init__(f"model family {family.title!r} (model_type {family.model_type!r}) gives no {fact}, which "
                         f"{needed_for} needs: add {fact}= to its ModelFamily registration")


@dataclass(frozen=True)
class ModelFamily:
    """A reversible architecture as petra_hub knows it.

    Required: `title` (how text names it, e.g. "RevNet"), `config_class` (a `PretrainedConfig` with a unique
    `model_type`), `base_model_class` (for `AutoModel`) and `classifier_class` (for `AutoModelForImageClassification`;
    its `get_stages()` returns the pipeline stages), `description` (the model card's words for the architecture,
    completing "built on <name>, ...").

    Optional (a default describes no other family; where there is none, what needs the fact refuses by name):
    - `presets`: named configurations (keyword arguments of `config_class`), for the recipe's `--model` and cards;
      `canonical_preset` maps a spelling to a preset name (default: the exact name).
    - `shape_config(preset, flags, data) -> config`: a new configuration of `preset` for the recipe's data
      (`DataShape`); `flags` holds the values of the recipe flags in `recipe_flags` (ModelArguments fields).
      `recipe_defaults`: the recipe's training arguments for this family where the user gives none (its optimizer,
      learning rate, ...; default: the recipe's own, tuned for RevNet); `delayed_recipe_defaults`: more, over those,
      where the recipe's mode has delayed gradients (petra, delayed, ...): the family's delay remedies.
    - `architecture(config, preset) -> (short name, one-line description)` for the card (default: the title and
      the preset name).
    - `stored_stages(config) -> str`: which stages keep their inputs because they are not reversible (card).
    - `package`: the module a user imports for the classes (the card's snippets; default: the classifier's).
    - `card_tags`: Hub tags; `card_template`: a jinja2 template extending petra_hub's `card.md` (default: `card.md`
      itself, with `description`); `citation`: BibTeX the card adds.
    - `timm_module` and `timm_models`: the module whose import registers the family's timm entry points, and
      their names.
    """

    title: str
    config_class: type
    base_model_class: type
    classifier_class: type
    description: str
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    canonical_preset: Callable[[str], str | None] | None = None
    shape_config: Callable[[str, Mapping[str, Any], DataShape], Any] | None = None
    recipe_flags: tuple[str, ...] = ()
    recipe_defaults: Mapping[str, Any] = field(default_factory=dict)
    delayed_recipe_defaults: Mapping[str, Any] = field(default_factory=dict)
    architecture: Callable[[Any, str | None], tuple[str, str]] | None = None
    stored_stages: Callable[[Any], str] | None = None
    package: str | None = None
    card_tags: tuple[str, ...] = ()
    card_template: str | os.PathLike | None = None
    citation: str | None = None
    timm_module: str | None = None
    timm_models: tuple[str, ...] = ()

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def import_name(self) -> str:
        """The module the card's snippets import the classifier from."""
        return self.package or self.classifier_class.__module__

    # -- presets ----------------------------------------------------------------------------------------------------
    def preset_key(self, name: str) -> str | None:
        """The preset `name` spells, or None."""
        if self.canonical_preset is not None:
            return self.canonical_preset(str(name))
        return str(name) if str(name) in self.presets else None

    def config_from_preset(self, name: str, **overrides):
        """A configuration of preset `name` with `overrides`; it records the preset's name as `config.preset`."""
        key = self.preset_key(name)
        if key is None:
            raise ValueError(f"unknown {self.title} preset {name!r}; expected one of {', '.join(self.presets)}")
        return self.config_class(**{**self.presets[key], "preset": key, **overrides})

    def config_for_data(self, preset: str, flags: Mapping[str, Any], data: DataShape):
        """The recipe's new configuration of `preset`, shaped to `data` with the family's recipe `flags`."""
        if self.shape_config is None:
            raise MissingFamilyFact(self, "shape_config", f"the recipe's --model {preset}")
        return self.shape_config(preset, flags, data)

    # -- model card -------------------------------------------------------------------------------------------------
    def describe(self, config, preset: str | None) -> tuple[str, str]:
        """(short name, one-line description) of the architecture, for the card."""
        if self.architecture is not None:
            return self.architecture(config, preset)
        key = self.preset_key(preset) if preset else None
        name = f"{self.title} ({key})" if key else f"a custom {self.title}"
        return name, f"{name}: see `config.json`"

    def stored_stages_text(self, config) -> str:
        if self.stored_stages is not None:
            return self.stored_stages(config)
        return "The stages that are not reversible"

    # -- saved folders ----------------------------------------------------------------------------------------------
    def code_files(self) -> tuple[str, ...]:
        """The names of the code files `save_pretrained` copies into a folder for `trust_remote_code`: the modules
        of the configuration and model classes and what they import relatively."""
        from transformers.dynamic_module_utils import get_relative_import_files

        names = set()
        for cls in (self.config_class, self.base_model_class, self.classifier_class):
            module_file = importlib.import_module(cls.__module__).__file__
            names.add(Path(module_file).name)
            names.update(Path(path).name for path in get_relative_import_files(module_file))
        return tuple(sorted(names))


_FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> ModelFamily:
    """Make `family` known to petra_hub and to transformers' Auto classes (`AutoConfig`, `AutoModel`,
    `AutoModelForImageClassification`); its saved folders carry its code for `trust_remote_code` users. Registering
    the same family again is harmless; another family of the same `model_type`, or a preset name another family
    has, is a ValueError."""
    from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

    _check(family)
    AutoConfig.register(family.model_type, family.config_class, exist_ok=True)
    AutoModel.register(family.config_class, family.base_model_class, exist_ok=True)
    AutoModelForImageClassification.register(family.config_class, family.classifier_class, exist_ok=True)
    family.config_class.register_for_auto_class()
    family.base_model_class.register_for_auto_class("AutoModel")
    family.classifier_class.register_for_auto_class("AutoModelForImageClassification")
    _FAMILIES[family.model_type] = family
    return family


def _check(family: ModelFamily) -> None:
    model_type = getattr(family.config_class, "model_type", None)
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"ModelFamily {family.title!r}: config_class {family.config_class.__name__} needs a "
                         "model_type (a class attribute naming the architecture, as transformers' configurations have)")
    for role in ("base_model_class", "classifier_class"):
        cls = getattr(family, role)
        if getattr(cls, "config_class", None) is not family.config_class:
            raise ValueError(f"ModelFamily {family.title!r}: {role} {cls.__name__} has config_class "
                             f"{getattr(cls, 'config_class', None)!r}, expected {family.config_class.__name__}")
    if not callable(getattr(family.classifier_class, "get_stages", None)):
        raise ValueError(f"ModelFamily {family.title!r}: classifier_class {family.classifier_class.__name__} has no "
                         "get_stages(), which returns the pipeline stages PETRA trains")
    known = _FAMILIES.get(model_type)
    if known is not None and known != family:
        raise ValueError(f"model_type {model_type!r} is registered already, by the family {known.title!r}")
    for other in _FAMILIES.values():
        if other.model_type == model_type:
            continue
        clash = [name for name in family.presets if other.preset_key(name) is not None]
        if clash:
            raise ValueError(f"ModelFamily {family.title!r}: preset {clash[0]!r} is a preset of {other.title!r} "
                             "already; preset names must say which family they build")


def registered_families() -> dict[str, ModelFamily]:
    """Every registered family by model_type, the built-in ones included."""
    importlib.import_module("petra_hub.models")  # registers RevNet and RevViT
    return dict(_FAMILIES)


def preset_names() -> list[str]:
    return [name for family in registered_families().values() for name in family.presets]


def family_named(model_type: str | None) -> ModelFamily | None:
    """The family of `model_type`, or None."""
    return registered_families().get(model_type)


def family_of_preset(name: str) -> tuple[ModelFamily, str]:
    """(family, preset name) of a preset such as "revnet18" or "revvit-tiny"; a ValueError otherwise."""
    for family in registered_families().values():
        key = family.preset_key(str(name))
        if key is not None:
            return family, key
    raise ValueError(f"unknown model {name!r}; expected one of {', '.join(preset_names())} (a family's presets are "
                     "known once the module that registers it is imported)")


def family_of_config(config, needed_for: str) -> ModelFamily:
    """The registered family of `config`; a ValueError naming `needed_for` and how to register one otherwise."""
    model_type = getattr(config, "model_type", None)
    family = family_named(model_type)
    if family is None:
        raise ValueError(
            f"{needed_for} needs the model family of model_type {model_type!r}, and none is registered (known: "
            f"{', '.join(registered_families())}): register it with petra_hub.register_family(ModelFamily(...)) "
            "in the module that defines the model"
        )
    return family


def family_of_model(model, needed_for: str) -> ModelFamily:
    return family_of_config(getattr(model, "config", None), needed_for)
