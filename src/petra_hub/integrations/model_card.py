"""Model cards of PETRA-trained RevNets: what a training run reports, rendered into ``README.md``.

    summary = TrainingSummary(model_name="revnet18-cifar10-petra", preset="revnet18", dataset="cifar10",
                              dataset_id="uoft-cs/cifar10", num_stages=10, accumulation_steps=2,
                              eval_accuracy=0.93)
    write_model_card("out/revnet18-cifar10-petra", summary, repo_id="me/revnet18-cifar10-petra")

The card text comes from a jinja2 template (``model_cards/revnet.md``); its YAML header (license, tags, data sets,
``model-index`` with the evaluated accuracy) is built with ``huggingface_hub.ModelCardData``. The words about a mode
come from :class:`petra_hub.engine.Mode`, those about a data set from :func:`petra_hub.data.dataset_spec`.
"""

from __future__ import annotations

import importlib.resources
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..data import DatasetSpec, dataset_spec
from ..engine.modes import Mode
from ..models.revnet.configuration_revnet import PRESETS, canonical_preset

__all__ = [
    "NOT_RECORDED",
    "TAGS",
    "TrainingSummary",
    "card_data_for",
    "default_template_path",
    "render_model_card",
    "write_model_card",
]

NOT_RECORDED = "not recorded"
TAGS = ["petra", "reversible-network", "revnet", "image-classification", "pipeline-parallel", "petra_hub"]
TEMPLATE_NAME = "revnet.md"


@dataclass
class TrainingSummary:
    """What a model card reports about a training run. Leave unknown fields as None: they render "not recorded"."""

    model_name: str  # e.g. "revnet18-digits-petra"
    preset: str | None  # "revnet18", "revnet34", "revnet50", "revnet101"; None for a custom configuration
    dataset: str  # petra_hub.data name: "digits", "cifar10", ...
    dataset_id: str | None = None  # Hub data set id for the metadata, e.g. "uoft-cs/cifar10"
    mode: str = "petra"
    num_stages: int | None = None  # J
    accumulation_steps: int = 1  # k
    num_processes: int = 1
    epochs: float | None = None
    micro_batch_size: int | None = None
    learning_rate: float | None = None
    hardware: str | None = None  # e.g. "2 CPU cores (gloo)", "8x H100 (NCCL)"
    eval_accuracy: float | None = None  # a fraction in [0, 1]
    eval_loss: float | None = None
    num_parameters: int | None = None
    license: str = "apache-2.0"
    extra: dict = field(default_factory=dict)  # more rows for the training table (name -> value)

    def validate(self) -> None:
        """Raise a ValueError naming the first field that cannot be right."""
        if not isinstance(self.model_name, str) or not self.model_name.strip():
            raise ValueError(f"TrainingSummary.model_name must be a non-empty string, got {self.model_name!r}")
        if not isinstance(self.dataset, str) or not self.dataset.strip():
            raise ValueError(f"TrainingSummary.dataset must be a non-empty string, got {self.dataset!r}")
        if self.eval_accuracy is not None and not 0.0 <= float(self.eval_accuracy) <= 1.0:
            raise ValueError(
                f"TrainingSummary.eval_accuracy is a fraction in [0, 1], got {self.eval_accuracy!r} "
                "(give 0.93, not 93)"
            )
        for name in ("num_stages", "accumulation_steps", "num_processes", "micro_batch_size", "num_parameters"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"TrainingSummary.{name} must be a positive integer or None, got {value!r}")
        for name in ("epochs", "learning_rate"):
            value = getattr(self, name)
            if value is not None and not float(value) > 0:
                raise ValueError(f"TrainingSummary.{name} must be positive or None, got {value!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"TrainingSummary.extra must be a dict, got {type(self.extra).__name__}")
        Mode.parse(self.mode)


# --------------------------------------------------------------------------------------------------------------
# formatting


def _text(value: Any) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        return NOT_RECORDED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(item) for item in value) if value else NOT_RECORDED
    return str(value)


def _parameters_text(count: int | None) -> str:
    if count is None:
        return NOT_RECORDED
    return f"{count:,} ({count / 1e6:.1f} M)" if count >= 100_000 else f"{count:,}"


def _accuracy_text(accuracy: float | None) -> str:
    return NOT_RECORDED if accuracy is None else f"{100 * float(accuracy):.2f} %"


def _loss_text(loss: float | None) -> str:
    return NOT_RECORDED if loss is None else f"{float(loss):.4f}"


def _known_spec(dataset: str) -> DatasetSpec | None:
    """The :class:`petra_hub.data.DatasetSpec` of `dataset`, or None for a data set petra_hub does not know."""
    try:
        return dataset_spec(dataset)
    except ValueError:
        return None


def _architecture(preset: str | None, config=None) -> tuple[str, str]:
    """(short name, one-line description) of the architecture: from `config` when given, else from the preset."""
    key = canonical_preset(preset) if preset else None
    paper = PRESETS[key] if key else None
    if config is not None:
        layout = {"block_type": config.block_type, "depths": list(config.depths),
                  "hidden_sizes": list(config.hidden_sizes)}
    elif paper is not None:
        layout = paper
    else:
        return (preset or "a custom RevNet"), "custom RevNet configuration (see `config.json`)"
    if paper is not None and all(layout[name] == paper[name] for name in paper):
        name = f"RevNet-{key.removeprefix('revnet')}"
    else:
        name = f"a custom RevNet (derived from {preset})" if preset else "a custom RevNet"
    description = (
        f"{layout['block_type']} blocks in layers of {'/'.join(str(d) for d in layout['depths'])} "
        f"({sum(layout['depths'])} blocks), widths {'/'.join(str(w) for w in layout['hidden_sizes'])} per stream"
    )
    if config is not None:
        description += f", {config.stem} stem, {config.downsampling} downsampling"
    return name, (f"{name} ({key}): {description}" if name.startswith("RevNet-") else description)


def _input_text(spec: DatasetSpec | None) -> str:
    if spec is None:
        return "RGB images (see `preprocessor_config.json`)"
    info = spec.info
    mean = ", ".join(f"{m:.4g}" for m in info.mean)
    std = ", ".join(f"{s:.4g}" for s in info.std)
    return (
        f"{info.num_channels}x{info.image_size}x{info.image_size} images, rescaled to [0, 1] and normalised with "
        f"mean ({mean}) and std ({std})"
    )


def card_data_for(summary: TrainingSummary) -> ModelCardData:
    """The YAML metadata of the card (``model-index`` only when the accuracy is known)."""
    eval_results = None
    if summary.eval_accuracy is not None:
        spec = _known_spec(summary.dataset)
        eval_results = [
            EvalResult(
                task_type="image-classification",
                task_name="Image Classification",
                dataset_type=summary.dataset_id or summary.dataset,
                dataset_name=spec.title if spec is not None else summary.dataset,
                dataset_split="test",
                metric_type="accuracy",
                metric_name="Accuracy",
                metric_value=float(summary.eval_accuracy),
            )
        ]
    return ModelCardData(
        license=summary.license,
        library_name="transformers",
        tags=list(TAGS),
        datasets=[summary.dataset_id] if summary.dataset_id else None,
        metrics=["accuracy"] if eval_results else None,
        pipeline_tag="image-classification",
        model_name=summary.model_name,
        eval_results=eval_results,
    )


def _template_variables(summary: TrainingSummary, repo_id: str | None, config=None) -> dict[str, str | list]:
    spec = _known_spec(summary.dataset)
    mode = Mode.parse(summary.mode)
    architecture_name, architecture = _architecture(summary.preset, config)
    num_labels = config.num_labels if config is not None else (spec.info.num_labels if spec is not None else None)
    dataset_description = spec.description if spec is not None else summary.dataset
    dataset_label = dataset_description
    if summary.dataset_id:
        dataset_label = f"{dataset_description} (`{summary.dataset_id}`)"
    return {
        "model_name": summary.model_name,
        "repo_id": repo_id or f"your-namespace/{summary.model_name}",
        "architecture_name": architecture_name,
        "architecture": architecture,
        "num_parameters": _parameters_text(summary.num_parameters),
        "input_description": _input_text(spec),
        "num_labels": _text(num_labels),
        "mode": mode.value,
        "mode_description": mode.description,
        "num_stages": _text(summary.num_stages),
        "accumulation_steps": _text(summary.accumulation_steps),
        "num_processes": _text(summary.num_processes),
        "epochs": _text(summary.epochs),
        "micro_batch_size": _text(summary.micro_batch_size),
        "learning_rate": _text(summary.learning_rate),
        "hardware": _text(summary.hardware),
        "dataset_label": dataset_label,
        "dataset_description": dataset_description,
        "eval_split": "test split",
        "eval_accuracy": _accuracy_text(summary.eval_accuracy),
        "eval_loss": _loss_text(summary.eval_loss),
        "extra_rows": [(str(key), _text(value)) for key, value in summary.extra.items()],
    }


# --------------------------------------------------------------------------------------------------------------
# cards


def default_template_path() -> Path:
    """``model_cards/revnet.md``: packaged with petra_hub if it was installed so, else in the source checkout."""
    candidates = []
    try:
        candidates.append(Path(str(importlib.resources.files("petra_hub") / "model_cards" / TEMPLATE_NAME)))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - petra_hub is always importable here
        pass
    candidates.append(Path(__file__).resolve().parents[3] / "model_cards" / TEMPLATE_NAME)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"model card template {TEMPLATE_NAME!r} not found (looked in {', '.join(str(c) for c in candidates)}); "
        "pass template_path="
    )


def render_model_card(
    summary: TrainingSummary,
    template_path: str | os.PathLike | None = None,
    *,
    repo_id: str | None = None,
    config=None,
) -> ModelCard:
    """Fill the card template with `summary`.

    `repo_id` goes into the loading snippets (default "your-namespace/<model_name>"); `config` (the model's
    RevNetConfig) makes the architecture line and the class count exact instead of read from the preset.
    """
    summary.validate()
    path = Path(template_path) if template_path is not None else default_template_path()
    if not path.is_file():
        raise FileNotFoundError(f"model card template {str(path)!r} does not exist")
    return ModelCard.from_template(
        card_data_for(summary), template_path=str(path), **_template_variables(summary, repo_id, config)
    )


def write_model_card(
    folder: str | os.PathLike,
    summary: TrainingSummary,
    *,
    template_path: str | os.PathLike | None = None,
    repo_id: str | None = None,
    config=None,
) -> Path:
    """Render the card and write it to ``folder/README.md`` (the folder is created); returns that path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "README.md"
    render_model_card(summary, template_path, repo_id=repo_id, config=config).save(path)
    return path
