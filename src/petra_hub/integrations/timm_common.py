"""What petra_hub's timm models share: the wrapper of a transformers classifier and the loading of local weights.

The families live in :mod:`petra_hub.integrations.timm` (RevNets) and :mod:`petra_hub.integrations.timm_revvit`
(RevViTs); importing the first registers both. A timm model here wraps a transformers ``...ForImageClassification``
as its ``model`` attribute (state-dict keys ``model.<base_model_prefix>...``, ``model.classifier...``) and takes
weights written by the transformers model, its base model or the timm model itself.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import torch
import torch.nn.functional as functional
from safetensors import safe_open
from timm.models import build_model_with_cfg, resolve_pretrained_cfg
from torch import nn

from ..data import dataset_spec

IMAGENET = dataset_spec("imagenet").info

# The arguments every wrapper takes from timm, in the order error messages list them.
TIMM_ARGUMENTS = ("num_classes", "in_chans", "drop_rate", "global_pool")


def imagenet_cfg(**fields: Any) -> dict[str, Any]:
    """A timm pretrained cfg for ImageNet-1k inputs (3x224x224, ImageNet mean/std, resize 256 + centre crop 224 as
    petra_hub's ImageNet test transform), no url (no weights are published); `fields` complete or replace it."""
    return {
        "url": "",
        "num_classes": IMAGENET.num_labels,
        "input_size": (IMAGENET.num_channels, IMAGENET.image_size, IMAGENET.image_size),
        "crop_pct": 0.875,
        "interpolation": "bilinear",
        "mean": IMAGENET.mean,
        "std": IMAGENET.std,
        "classifier": "model.classifier",
        "license": "apache-2.0",
        **fields,
    }


class TimmHead(nn.Module):
    """The last stage of a timm model: pool the streams, `drop_rate` dropout, classifier (shared with the model)."""

    reversible = False

    def __init__(self, pooler: nn.Module, classifier: nn.Module, drop_rate: float):
        super().__init__()
        self.pooler, self.classifier, self.drop_rate = pooler, classifier, drop_rate

    def forward(self, streams) -> torch.Tensor:
        pooled = self.pooler(streams)[1].flatten(1)
        # The pooler is shared with the model, so its mode follows both model.train() and this stage's train().
        return self.classifier(functional.dropout(pooled, p=self.drop_rate, training=self.pooler.training))


class TimmWrapper(nn.Module):
    """timm's classifier interface around a transformers image classifier kept as `self.model`.

    A family sets `family` (its name in messages, e.g. "RevNet"), `stem` (the base model's attribute that embeds
    the images), `renamed` (config arguments that timm arguments replace) and `config_arguments` (the config
    arguments taken), and defines `forward_features` and `forward_head` (which ends with :meth:`_classify`).
    """

    family = "model"
    stem = "embeddings"
    renamed: dict[str, str] = {}
    config_arguments: frozenset[str] = frozenset()
    timm_arguments = TIMM_ARGUMENTS

    def _check_arguments(self, config_kwargs: dict[str, Any], num_classes: int, global_pool: str) -> None:
        for name in config_kwargs:
            if name in self.renamed:
                raise TypeError(f"{type(self).__name__}: pass {self.renamed[name]} instead of {name!r}")
            if name not in self.config_arguments:
                raise TypeError(
                    f"{type(self).__name__} got an unexpected keyword argument {name!r}; {self.family} arguments "
                    f"are {', '.join(self.timm_arguments)} and {', '.join(sorted(self.config_arguments))}"
                )
        self._check_global_pool(global_pool)
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")

    def _wrap(self, model: nn.Module, num_classes: int, in_chans: int, drop_rate: float, cfg: dict) -> None:
        self.model = model
        self.num_classes = num_classes
        self.in_chans = in_chans
        self.drop_rate = float(drop_rate)
        self.global_pool = "avg"
        self.num_features = self.head_hidden_size = model.base_model.num_features
        if num_classes == 0:
            self.model.classifier = nn.Identity()
        # create_model (build_model_with_cfg) replaces these with the resolved cfg.
        self.pretrained_cfg = self.default_cfg = cfg

    @property
    def config(self):
        return self.model.config

    def get_stages(self) -> list[nn.Module]:
        """The PETRA stages of the wrapped model (stem, one per block), then a head that applies `drop_rate`
        dropout before the classifier as `forward_head` does: running them in order equals `forward`."""
        base = self.model.base_model
        return [*base.get_stages(), TimmHead(base.pooler, self.model.classifier, self.drop_rate)]

    def _classify(self, pooled: torch.Tensor, pre_logits: bool) -> torch.Tensor:
        if self.drop_rate > 0.0:
            pooled = functional.dropout(pooled, p=self.drop_rate, training=self.training)
        return pooled if pre_logits else self.model.classifier(pooled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.model.classifier

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """A new, freshly initialised linear head with `num_classes` outputs (0: no head, features out)."""
        if global_pool is not None:
            self._check_global_pool(global_pool)
        if num_classes < 0:
            raise ValueError(f"num_classes must be >= 0, got {num_classes}")
        reference = next(self.model.base_model.parameters())
        if num_classes > 0:
            head = nn.Linear(self.num_features, num_classes, device=reference.device, dtype=reference.dtype)
            with torch.no_grad():
                nn.init.normal_(head.weight, mean=0.0, std=self.model.config.initializer_range)
                nn.init.zeros_(head.bias)
            self.model.config.num_labels = num_classes
            self.model.num_labels = num_classes
        else:
            head = nn.Identity()
        self.model.classifier = head
        self.num_classes = num_classes

    def group_matcher(self, coarse: bool = False) -> dict[str, str]:
        """Parameter groups for timm's layer-wise learning-rate decay: the stem, then one group per block."""
        base = rf"^model\.{self.model.base_model_prefix}"
        return {"stem": rf"{base}\.{self.stem}", "blocks": rf"{base}\.encoder\.(\d+)"}

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        if enable:
            raise NotImplementedError(
                f"gradient checkpointing is not implemented for {self.family}s (reversible blocks can rebuild their "
                "inputs instead: see petra_hub's reversible_backprop and petra modes)"
            )

    def _check_global_pool(self, global_pool: str) -> None:
        if global_pool != "avg":
            raise ValueError(f"{self.family}s only support global_pool='avg', got {global_pool!r}")


# --------------------------------------------------------------------------------------------------------------
# loading weights


def convert_keys(state_dict: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The keys of a timm model from those of a timm model, a transformers classifier (base model `prefix`, e.g.
    "revnet"), or a bare base model."""
    if any(key.startswith("model.") for key in state_dict):  # timm model
        return state_dict
    if any(key.startswith((f"{prefix}.", "classifier.")) for key in state_dict):  # transformers classifier
        return {f"model.{key}": value for key, value in state_dict.items()}
    return {f"model.{prefix}.{key}": value for key, value in state_dict.items()}  # bare base model


def classifier_width(path: str) -> int | None:
    """Output width of the classifier stored in a safetensors file (read from its header); 0 for a file without
    one (a bare base model, or a timm model with num_classes=0); None when the file is not safetensors."""
    if not str(path).endswith(".safetensors"):
        return None
    with safe_open(path, framework="pt") as handle:
        keys = set(handle.keys())
        for key in ("model.classifier.weight", "revnet.classifier.weight", "classifier.weight"):
            if key in keys:
                return int(handle.get_slice(key).get_shape()[0])
    return 0


def first_conv_channels(path: str) -> int | None:
    """Input channels of the first convolution (RevNet stem, RevViT patch embedding or convolutional stem) stored in
    a safetensors file, if it is one and holds that convolution."""
    if not str(path).endswith(".safetensors"):
        return None
    with safe_open(path, framework="pt") as handle:
        for key in handle.keys():
            if key.endswith(("embedder.layers.0.weight", "embeddings.patches.weight", "embeddings.patches.0.weight")):
                return int(handle.get_slice(key).get_shape()[1])
    return None


WEIGHTS_FILE = "model.safetensors"  # what save_pretrained writes in a model's folder (unsharded)


def weights_file(path: str | os.PathLike) -> str:
    """The weights file `pretrained_cfg_overlay=dict(file=...)` names: the file itself, or the ``model.safetensors``
    in a model's folder (as ``save_pretrained`` writes it); FileNotFoundError saying what is missing."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"pretrained weights file {path!r} does not exist")
    file = os.path.join(path, WEIGHTS_FILE)
    if os.path.isfile(file):
        return file
    sharded = os.path.isfile(os.path.join(path, f"{WEIGHTS_FILE}.index.json"))
    hint = (f"it holds sharded weights ({WEIGHTS_FILE}.index.json): save the model with a larger max_shard_size "
            "to get one file" if sharded else "give the path of the weights file itself")
    raise FileNotFoundError(
        f"pretrained weights file {path!r} is a folder without {WEIGHTS_FILE} (expected {file!r}, the file "
        f"save_pretrained writes); {hint}"
    )


def prepare_pretrained(variant: str, pretrained_cfg, overlay: dict | None, architecture: str) -> dict | None:
    """Fail clearly when there is nothing to load; return the overlay, completed with the file's head width and,
    as the channels of `input_size`, those of the file's first convolution: timm adapts that convolution from them
    to `in_chans`. `architecture` names the family's architecture arguments for the message (e.g. "stem, ...")."""
    resolved = resolve_pretrained_cfg(variant, pretrained_cfg=pretrained_cfg, pretrained_cfg_overlay=overlay)
    if not (resolved.file or resolved.url or resolved.hf_hub_id or resolved.state_dict):
        raise RuntimeError(
            f"no pretrained weights are published for {variant!r}. Use pretrained=False, or point at a local file: "
            f"timm.create_model({variant!r}, pretrained=True, pretrained_cfg_overlay=dict(file='.../model.safetensors'"
            f"), ...) with the architecture arguments ({architecture}) of the saved model"
        )
    if resolved.file:
        file = weights_file(resolved.file)
        if file != resolved.file:  # a model's folder: timm loads the weights file it holds
            overlay = {**(overlay or {}), "file": file}
        if overlay is not None and "num_classes" not in overlay:
            width = classifier_width(file)
            if width is not None:
                overlay = {**overlay, "num_classes": width}
        channels = first_conv_channels(file)
        if channels is not None:
            size = (overlay or {}).get("input_size") or resolved.input_size
            overlay = {**(overlay or {}), "input_size": (channels, *size[1:])}
    return overlay


def build(
    model_cls: type[TimmWrapper],
    variant: str,
    pretrained: bool,
    kwargs: dict[str, Any],
    *,
    architecture: str,
    filter_fn: Callable,
    cfg_defaults: dict[str, Any] | None = None,
) -> TimmWrapper:
    """Build `model_cls(preset=variant, **kwargs)` the timm way, loading local weights when `pretrained`.
    `cfg_defaults` describe this instance (e.g. its input size) unless the caller's pretrained_cfg_overlay says."""
    if kwargs.pop("features_only", False):
        raise NotImplementedError(f"{variant} does not support features_only; use forward_features instead")
    if "preset" in kwargs:  # the model name is the preset: a second one collided in build_model_with_cfg's call
        raise TypeError(f"{model_cls.__name__} got an unexpected keyword argument 'preset' ({kwargs['preset']!r}): "
                        f"the model name ({variant!r}) is the preset; expected no preset argument (create the "
                        f"model of that name instead)")
    overlay = kwargs.pop("pretrained_cfg_overlay", None)
    if cfg_defaults:
        overlay = {**cfg_defaults, **(overlay or {})}
    if pretrained:
        overlay = prepare_pretrained(variant, kwargs.get("pretrained_cfg"), overlay, architecture)
    try:
        return build_model_with_cfg(
            model_cls,
            variant,
            pretrained,
            pretrained_cfg_overlay=overlay,
            pretrained_filter_fn=filter_fn,
            preset=variant,
            **kwargs,
        )
    except RuntimeError as error:  # load_state_dict's list of every tensor that does not fit, a hundred lines
        file = (overlay or {}).get("file")
        if not (pretrained and file and "size mismatch" in str(error)):
            raise
        given = {name: value for name, value in kwargs.items() if name in model_cls.config_arguments}
        taken = model_cls.config_arguments | set(model_cls.timm_arguments)
        try:  # the configuration of the model the weights did not fit (built again: this is the error's path)
            built = model_cls(preset=variant, **{name: value for name, value in kwargs.items() if name in taken})
        except Exception:  # noqa: BLE001 - only the hint is lost
            built = None
        saved = saved_architecture(file, built.model.config.to_dict() if built is not None else None,
                                   model_cls.config_arguments)
        hint = (f"; its config.json says {', '.join(f'{name}={value!r}' for name, value in saved.items())}: "
                f"timm.create_model({variant!r}, pretrained=True, pretrained_cfg_overlay=dict(file=...), "
                f"{', '.join(f'{name}={value!r}' for name, value in saved.items())})") if saved else ""
        raise RuntimeError(f"the weights in {file} are of another architecture than {variant} with "
                           f"{given or 'its preset'}: pass the saved model's architecture arguments ({architecture})"
                           f"{hint}") from None


def saved_architecture(file: str, built: dict | None, config_arguments) -> dict:
    """The architecture arguments of the config.json saved beside `file` (or in it, a folder) that differ from the
    `built` configuration ({} without a readable config.json or a built configuration)."""
    folder = file if os.path.isdir(file) else os.path.dirname(file)
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
            saved = json.load(handle)
    except (OSError, ValueError):
        return {}
    if not isinstance(saved, dict) or built is None:
        return {}
    return {name: saved[name] for name in sorted(config_arguments)
            if name in saved and saved[name] != built.get(name)}
