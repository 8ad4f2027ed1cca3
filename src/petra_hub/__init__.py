"""petra_hub: PETRA (parallel end-to-end training of reversible architectures) across processes and devices.

Importing the package registers the "revnet" and "revvit" model types with transformers' Auto classes when
transformers is installed (at once if transformers is loaded, else when it is first imported), so that
`import petra_hub` is enough for `AutoModelForImageClassification.from_pretrained` of a saved folder (no
`trust_remote_code`). `import petra_hub.engine` needs torch only and does not load transformers. The other public
names below are imported on first use. Importing `petra_hub.integrations.timm` registers `revnet18` .. `revnet101`
and `revvit_tiny` .. `revvit_base` with timm.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "RevNetConfig": "petra_hub.models.revnet",
    "RevNetModel": "petra_hub.models.revnet",
    "RevNetForImageClassification": "petra_hub.models.revnet",
    "RevNetPreTrainedModel": "petra_hub.models.revnet",
    "RevViTConfig": "petra_hub.models.revvit",
    "RevViTModel": "petra_hub.models.revvit",
    "RevViTForImageClassification": "petra_hub.models.revvit",
    "RevViTPreTrainedModel": "petra_hub.models.revvit",
    "ModelFamily": "petra_hub.models.families",
    "DataShape": "petra_hub.models.families",
    "register_family": "petra_hub.models.families",
    "Pipeline": "petra_hub.engine",
    "Mode": "petra_hub.engine",
    "PetraTrainer": "petra_hub.training",
    "PetraTrainingArguments": "petra_hub.training",
    "GradientFidelityCallback": "petra_hub.training",
    "load_image_dataset": "petra_hub.data",
    "collate_image_batch": "petra_hub.data",
    "image_processor_for": "petra_hub.data",
}

__all__ = [*_LAZY, "__version__"]

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .data import collate_image_batch, image_processor_for, load_image_dataset
    from .engine import Mode, Pipeline
    from .models.families import DataShape, ModelFamily, register_family
    from .models.revnet import RevNetConfig, RevNetForImageClassification, RevNetModel, RevNetPreTrainedModel
    from .models.revvit import RevViTConfig, RevViTForImageClassification, RevViTModel, RevViTPreTrainedModel
    from .training import GradientFidelityCallback, PetraTrainer, PetraTrainingArguments


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'petra_hub' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


class _RegisterOnTransformersImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when transformers is first imported, it hands on transformers' own spec with a loader
    that, once transformers is loaded, imports `petra_hub.models` (which registers the model types); then it leaves
    `sys.meta_path`. So `import petra_hub` registers the Auto classes for any later use of transformers, while a
    process that imports only `petra_hub.engine` never pays for transformers' modeling code."""

    def find_spec(self, name, path=None, target=None):
        if name != "transformers":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenRegister(spec.loader)
        return spec


class _ThenRegister(importlib.abc.Loader):
    """transformers' loader, then `import petra_hub.models`; anything else is the wrapped loader's."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        importlib.import_module("petra_hub.models")

    def __getattr__(self, name):
        return getattr(self.loader, name)


# Register the model families with transformers' Auto classes where transformers is installed: now if it is loaded
# already, else as soon as it is. The engine alone (torch only) stays importable without it.
if sys.modules.get("transformers") is not None:
    importlib.import_module("petra_hub.models")
elif importlib.util.find_spec("transformers") is not None:
    sys.meta_path.insert(0, _RegisterOnTransformersImport())
