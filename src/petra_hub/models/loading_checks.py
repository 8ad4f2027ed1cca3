"""Checks every petra_hub model family runs when it loads a saved model (a clear error for a missing or malformed
config.json, a warning naming the weights or statistics that hold NaN or infinity), on the labels of its loss, on the
values of its configuration (plain integers for sizes, the class cap, the problem types) and on the size of the model
it describes (counted on the meta device); and the image classifier both families build on their base model.

One file for all families: `revnet/loading_checks.py` and `revvit/loading_checks.py` are links to this file, and
each modeling and configuration file imports it relatively (`from .loading_checks import ...`). `save_pretrained`
copies their relative imports next to the checkpoint, so `trust_remote_code=True` users run the same checks without
petra_hub: this file may import only the standard library, torch and transformers.
"""

from __future__ import annotations

import json
import math
import os
import threading
import warnings
from itertools import chain

import torch
from torch import nn
from transformers import PretrainedConfig


class CheckedLoadingMixin:
    """Put before `PreTrainedModel` in a model's bases: transformers' `from_pretrained` plus the checks above."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        """transformers' `from_pretrained`, plus a warning naming any weight or statistic that holds NaN or
        infinity (a checkpoint saved from a diverged run loads without error but predicts nothing useful)."""
        config_file = local_config_file(args[0] if args else kwargs.get("pretrained_model_name_or_path"), kwargs)
        if config_file is not None:
            check_config_file(config_file, cls.__name__)
        loaded = super().from_pretrained(*args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded
        bad = non_finite_tensors(model)
        if bad:
            shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            warnings.warn(f"{cls.__name__}.from_pretrained: non-finite values (NaN or inf) in {shown}", stacklevel=2)
        return loaded

    def save_pretrained(self, *args, **kwargs):
        """transformers' `save_pretrained`; a classifier saved with its code (`trust_remote_code` folders) also maps
        "AutoModel" to its base model's class in config.json's `auto_map`, so that `AutoModel.from_pretrained(folder,
        trust_remote_code=True)` loads the backbone from the saved code alone."""
        base = getattr(self, "base_model", self)
        if self._auto_class is not None and base is not self and self._auto_class != "AutoModel":
            module = type(base).__module__.split(".")[-1]
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}),
                                    "AutoModel": f"{module}.{type(base).__name__}"}
        return super().save_pretrained(*args, **kwargs)


def non_finite_tensors(module: torch.nn.Module) -> list[str]:
    """The names of the floating-point parameters and buffers of `module` holding NaN or infinity (meta tensors have
    no values)."""
    named = [
        (name, tensor) for name, tensor in chain(module.named_parameters(), module.named_buffers())
        if tensor.is_floating_point() and tensor.device.type != "meta"
    ]
    by_device: dict[torch.device, list[torch.Tensor]] = {}
    for _, tensor in named:  # one reduction and one sync per device (a model may be spread over several)
        by_device.setdefault(tensor.device, []).append(torch.isfinite(tensor).all())
    if all(bool(torch.stack(flags).all()) for flags in by_device.values()):
        return []
    return [name for name, tensor in named if not bool(torch.isfinite(tensor).all())]


def local_config_file(source, kwargs: dict) -> str | None:
    """The config.json `from_pretrained(source, **kwargs)` reads when it reads one from a local folder: `source` is
    a folder when os.path.isdir says so (transformers' own test), and the file lies in its `subfolder`. None when
    `config` is given, for a GGUF file (its metadata is the configuration), and for a Hub id, which transformers
    resolves (local cache, download, offline mode) and reports on itself."""
    if kwargs.get("config") is not None or kwargs.get("gguf_file") or not isinstance(source, (str, os.PathLike)):
        return None
    if not os.path.isdir(source):
        return None
    return os.path.join(source, kwargs.get("subfolder") or "", "config.json")


def check_config_file(path: str, model_name: str = "model") -> None:
    """A saved folder's config.json must exist and hold a JSON object (clear errors instead of transformers' own)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist: a saved {model_name} folder needs its config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            content = json.load(handle)
    except ValueError as error:
        raise ValueError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(content, dict):
        raise ValueError(f"{path} must hold a JSON object of configuration fields, got a {type(content).__name__}")


IGNORE_INDEX = -100  # transformers' cross-entropy skips the items labelled so


def check_labels(labels: torch.Tensor, logits: torch.Tensor, config) -> None:
    """Raise a ValueError unless `labels` fit `logits`: one entry per image, and for single-label classification
    class indices or IGNORE_INDEX (see `class_indices`)."""
    if labels.shape[0] != logits.shape[0]:
        raise ValueError(f"labels has {labels.shape[0]} entries for a batch of {logits.shape[0]} images")
    counted = class_indices(labels, config.num_labels, config.problem_type)
    if counted is None:
        return
    low, high = int(counted.min()), int(counted.max())
    if low < 0 or high >= config.num_labels:
        raise ValueError(
            f"labels must lie in [0, {config.num_labels - 1}] (config.num_labels={config.num_labels}), got values "
            f"in [{low}, {high}] ({IGNORE_INDEX} marks an image the loss ignores)"
        )


def loss_labels(labels: torch.Tensor, logits: torch.Tensor, config) -> torch.Tensor:
    """`labels` as the loss takes them: integer class indices of single-label classification (`class_indices`' rule)
    as int64, which the cross-entropy requires (int32 labels pass the checks and transformers' inference), and integer
    multi-label targets in the logits' dtype, which the binary cross-entropy requires."""
    if labels.is_floating_point() or labels.dtype == torch.long:
        return labels
    problem_type = config.problem_type
    if problem_type is None and config.num_labels and config.num_labels > 1 and labels.dtype == torch.int:
        problem_type = "single_label_classification"
    if problem_type == "single_label_classification":
        return labels.long()
    return labels.to(logits.dtype) if problem_type == "multi_label_classification" else labels


def class_indices(labels: torch.Tensor, num_labels: int | None, problem_type: str | None) -> torch.Tensor | None:
    """The labels that must lie in [0, num_labels): those of single-label classification (`problem_type`, else
    inferred as transformers' loss infers it: several classes and int64 or int32 labels) other than IGNORE_INDEX.
    None when there is nothing to check (regression, multi-label, float labels, only ignored items). The one rule
    for the models' loss and the trainer's checks before the first step."""
    if not num_labels or labels.is_floating_point():
        return None
    if problem_type is None and num_labels > 1 and labels.dtype in (torch.long, torch.int):
        problem_type = "single_label_classification"
    if problem_type != "single_label_classification":
        return None
    counted = labels[labels != IGNORE_INDEX]
    return counted if counted.numel() else None


# -- the values of a configuration (both families' configuration files import these) ---------------------------------
MAX_LABELS = 100_000  # classes a configuration may ask for
PROBLEM_TYPES = (None, "regression", "single_label_classification", "multi_label_classification")


def plain_count(value) -> int | None:
    """A size given as a plain integer (bools and floats excluded), else None: other values are the configuration's
    `validate_architecture`'s to name."""
    return value if type(value) is int else None


def is_integer(value) -> bool:
    return type(value) is int  # bools (True == 1) and floats (8.0) are not sizes: they would pass `isinstance`


def is_real(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def check_num_labels(value, name: str) -> None:
    """num_labels as given (PretrainedConfig keeps only id2label, whose length a negative count makes 0)."""
    if not is_integer(value) or value < 1:
        raise ValueError(f"Invalid {name}: num_labels must be a positive integer (the number of classes), got "
                         f"{value!r}")
    if value > MAX_LABELS:
        raise ValueError(f"Invalid {name}: num_labels makes {value:,} classes, more than the cap of {MAX_LABELS:,}")


def check_label_count(kwargs: dict, name: str) -> int:
    """The number of classes `kwargs` (PretrainedConfig's) asks for, id2label's entries else num_labels (2, its
    default, when neither says), refused beyond MAX_LABELS before anything is built from it."""
    id2label = kwargs.get("id2label")
    labels = len(id2label) if isinstance(id2label, dict) else plain_count(kwargs.get("num_labels"))
    if labels is not None and labels > MAX_LABELS:
        key = "id2label" if isinstance(id2label, dict) else "num_labels"
        raise ValueError(f"Invalid {name}: {key} makes {labels:,} classes, more than the cap of {MAX_LABELS:,}")
    return 2 if labels is None else labels


class CheckedNumLabelsMixin:
    """Put before `PretrainedConfig` in a configuration's bases: `num_labels` is checked as given (`check_num_labels`),
    where PretrainedConfig builds id2label from range(value), which a negative count leaves empty (reported as 0) and
    a bool or a float would reach unchecked."""

    @property
    def num_labels(self) -> int | None:
        """The number of classes: id2label's entries (PretrainedConfig's rule)."""
        return PretrainedConfig.num_labels.fget(self)

    @num_labels.setter
    def num_labels(self, value) -> None:
        check_num_labels(value, type(self).__name__)
        PretrainedConfig.num_labels.fset(self, value)


# -- the size of a model (both families' models check it before building anything) ----------------------------------
MAX_PARAMETERS = 2_000_000_000  # 8 GB of float32 weights; the paper's largest RevNet has 55 million
_counting = threading.local()


def check_parameter_count(model_class: type, config) -> None:
    """Refuse a configuration whose model would hold more than MAX_PARAMETERS parameters, before anything is
    allocated: `model_class(config)` is built on the meta device (shapes only) and its parameters counted, so the
    count is the model's own. Call it first in the model's `__init__` (the meta build skips the check it runs)."""
    if getattr(_counting, "active", False):
        return
    _counting.active = True
    try:
        with torch.device("meta"):
            count = sum(parameter.numel() for parameter in model_class(config).parameters())
    finally:
        _counting.active = False
    if count > MAX_PARAMETERS:
        raise ValueError(f"Invalid {type(config).__name__}: {config.describe_sizes()} make {count:,} parameters, more "
                         f"than the cap of {MAX_PARAMETERS:,}")


class ImageClassifierMixin:
    """Put before a family's `PreTrainedModel` in its classifier's bases, and set `base_model_class`: the base model
    (kept under `base_model_prefix`), a linear classifier on its pooled features (`num_features` wide), and the loss
    of `config.problem_type` after checking that the labels fit the model."""

    accepts_loss_kwargs = False  # the loss is a micro-batch mean: the Trainer must not rescale it for accumulation
    base_model_class: type

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        setattr(self, self.base_model_prefix, self.base_model_class(config))
        self.classifier = nn.Linear(self.base_model.num_features, config.num_labels)
        self.post_init()

    def compute_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The loss of `config.problem_type`, after checking that the labels fit the model."""
        check_labels(labels, logits, self.config)
        return self.loss_function(loss_labels(labels, logits, self.config), logits, self.config)
