"""The model families petra_hub trains, by name: what a recipe, a card or a loader needs to tell them apart."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .revnet import configuration_revnet as revnet
from .revnet import RevNetConfig, RevNetForImageClassification
from .revvit import configuration_revvit as revvit
from .revvit import RevViTConfig, RevViTForImageClassification

__all__ = ["FAMILIES", "ModelFamily", "family_of_model_type", "family_of_preset", "preset_names"]


@dataclass(frozen=True)
class ModelFamily:
    """A reversible architecture: its `model_type`, classes and named presets."""

    model_type: str
    title: str
    config_class: type
    classifier_class: type
    presets: Mapping[str, dict]
    canonical_preset: Callable[[str], str | None]


FAMILIES = {
    family.model_type: family
    for family in (
        ModelFamily("revnet", "RevNet", RevNetConfig, RevNetForImageClassification, revnet.PRESETS,
                    revnet.canonical_preset),
        ModelFamily("revvit", "RevViT", RevViTConfig, RevViTForImageClassification, revvit.PRESETS,
                    revvit.canonical_preset),
    )
}


def preset_names() -> list[str]:
    return [name for family in FAMILIES.values() for name in family.presets]


def family_of_preset(name: str) -> tuple[ModelFamily, str]:
    """(family, canonical preset name) of a preset such as "revnet18" or "revvit-tiny"; a ValueError otherwise."""
    for family in FAMILIES.values():
        key = family.canonical_preset(str(name))
        if key is not None:
            return family, key
    raise ValueError(f"unknown model {name!r}; expected one of {', '.join(preset_names())}")


def family_of_model_type(model_type: str | None) -> ModelFamily | None:
    return FAMILIES.get(model_type)
