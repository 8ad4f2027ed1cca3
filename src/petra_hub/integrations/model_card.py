"""Model cards of PETRA-trained RevNets: what a training run reports, rendered into ``README.md``.

    summary = TrainingSummary(model_name="revnet18-cifar10-petra", preset="revnet18", dataset="cifar10",
                              dataset_id="uoft-cs/cifar10", num_stages=10, accumulation_steps=2,
                              eval_accuracy=0.93)
    write_model_card("out/revnet18-cifar10-petra", summary, repo_id="me/revnet18-cifar10-petra")

The card text comes from the jinja2 template of the model's family (``model_cards/revnet.md``,
``model_cards/revvit.md``, each extending the shared ``model_cards/card.md``); its YAML header (license, tags,
data sets, ``model-index`` with the evaluated metrics) is built with ``huggingface_hub.ModelCardData``. The words about
a mode come from :class:`petra_hub.engine.Mode`, those about a data set from :func:`petra_hub.data.dataset_spec`, the
formatted values and the how-to snippet from :mod:`petra_hub.integrations.model_card_text`.
:func:`petra_hub.training.card.write_run_card` fills a summary from a ``PetraTrainer``.
"""

from __future__ import annotations

import importlib.resources
import os
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..data import DatasetSpec, dataset_spec
from ..engine.modes import Mode
from ..models.families import ModelFamily, family_named, family_of_config, family_of_preset
from . import model_card_text as words
from .model_card_text import NOT_RECORDED

__all__ = [
    "NOT_RECORDED",
    "card_family",
    "TAGS",
    "TrainingSummary",
    "card_data_for",
    "default_template_path",
    "render_model_card",
    "write_model_card",
]

TAGS = ["petra", "reversible-network", "image-classification", "pipeline-parallel", "petra_hub"]
DEFAULT_TASK = "image-classification"


@dataclass
class TrainingSummary:
    """What a model card reports about a training run. Leave unknown fields as None: they render "not recorded"."""

    model_name: str  # e.g. "revnet18-digits-petra"
    preset: str | None  # "revnet18" .. "revnet101", "revvit-tiny" .. "revvit-base"; None for a custom configuration
    dataset: str  # petra_hub.data name ("digits", "cifar10", ...) or the name of any other data set
    dataset_id: str | None = None  # Hub data set id for the metadata, e.g. "uoft-cs/cifar10"
    mode: str = "petra"
    num_stages: int | None = None  # J
    accumulation_steps: int = 1  # k
    num_processes: int = 1
    epochs: float | None = None
    micro_batch_size: int | None = None
    learning_rate: float | None = None  # 0 is a valid (if useless) choice
    hardware: str | None = None  # e.g. "2 CPU cores (gloo)", "8x H100 (NCCL)"
    eval_accuracy: float | None = None  # a fraction in [0, 1]
    eval_loss: float | None = None
    num_parameters: int | None = None
    license: str = "apache-2.0"
    extra: dict = field(default_factory=dict)  # more rows for the training table (name -> value)
    # -- the data set
    dataset_title: str | None = None  # how the card names it; default: the registry's description, else `dataset`
    dataset_config: str | None = None  # the Hub configuration (`Trainer.create_model_card(dataset_args=...)`)
    dataset_tags: list = field(default_factory=list)  # more Hub data set ids for the `datasets` metadata
    eval_split: str | None = "test"  # a split name, or what the evaluated data is ("held-out 15% of train"); None:
    # unknown (model-index then names no split, the body says "evaluation set")
    label_names: list | None = None  # class names; default: the model config's id2label, else the registry's
    image_size: int | None = None  # input convention of a data set petra_hub does not know (its image processor)
    image_mean: tuple | None = None
    image_std: tuple | None = None
    image_resize: int | None = None  # the processor resizes an image to image_resize x image_resize, or with
    image_center_crop: bool = False  # image_center_crop its shorter side to image_resize, then crops image_size
    image_processor: bool = True  # the model's folder holds its image processor (preprocessor_config.json); False:
    # none was saved, so the card does not point at one
    image_column: str | None = None  # where the how-to finds an image and its label in a Hub data set
    label_column: str | None = None
    example_split: str | None = None
    # -- hyper-parameters
    # optimizer, lr_schedule and eval_notes are Markdown, put into the card as given (escape what they quote from
    # the user: model_card_text.markdown_text, code_span); every other text field is plain text the card escapes
    optimizer: str | None = None  # e.g. "`sgd`: `SGD(momentum=0.9, nesterov=True)`"
    lr_schedule: str | None = None  # e.g. "cosine", "x0.1 at epochs 150, 225 (after the warm-up)"
    warmup_steps: int | None = None
    weight_decay: float | None = None
    max_grad_norm: float | None = None
    label_smoothing: float | None = None
    seed: int | None = None
    global_steps: int | None = None
    buffered_stages: int | None = None  # pipeline stages that store their input (not reversible)
    # -- results
    eval_metrics: dict = field(default_factory=dict)  # every other evaluated metric, e.g. {"f1": 0.91}
    results: list = field(default_factory=list)  # rows {"epoch", "step", "training_loss", metric: value}
    eval_notes: list = field(default_factory=list)  # sentences under the Evaluation table
    framework_versions: dict | None = None  # None: the versions installed when the card is rendered
    # -- metadata (the arguments of `Trainer.create_model_card`)
    language: str | list | None = None
    tags: list = field(default_factory=list)  # added to TAGS
    base_model: str | None = None  # `finetuned_from`
    tasks: list = field(default_factory=list)  # the first one is the pipeline tag; default "image-classification"

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
        for name in ("num_stages", "accumulation_steps", "num_processes", "micro_batch_size", "num_parameters",
                     "image_size", "image_resize"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ValueError(f"TrainingSummary.{name} must be a positive integer or None, got {value!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"TrainingSummary.seed must be an integer or None, got {self.seed!r}")
        for name in ("warmup_steps", "global_steps", "buffered_stages"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"TrainingSummary.{name} must be a non-negative integer or None, got {value!r}")
        if self.epochs is not None and not float(self.epochs) > 0:
            raise ValueError(f"TrainingSummary.epochs must be positive or None, got {self.epochs!r}")
        for name in ("learning_rate", "max_grad_norm"):
            value = getattr(self, name)
            if value is not None and not float(value) >= 0:
                raise ValueError(f"TrainingSummary.{name} must be zero, positive or None, got {value!r}")
        if self.label_smoothing is not None and not 0.0 <= float(self.label_smoothing) <= 1.0:
            raise ValueError(f"TrainingSummary.label_smoothing is a fraction in [0, 1], got {self.label_smoothing!r}")
        for name, kind in (("extra", dict), ("eval_metrics", dict), ("results", list), ("dataset_tags", list),
                           ("tags", list), ("tasks", list), ("eval_notes", list)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"TrainingSummary.{name} must be a {kind.__name__}, "
                                 f"got {type(getattr(self, name)).__name__}")
        if not all(isinstance(row, dict) for row in self.results):
            raise ValueError("TrainingSummary.results must be a list of dicts (one per evaluation)")
        metrics = [(f"eval_metrics[{key!r}]", key, value) for key, value in self.eval_metrics.items()]
        metrics += [(f"results[{i}][{key!r}]", key, value) for i, row in enumerate(self.results)
                    for key, value in row.items()]
        for where, key, value in metrics:
            problem = words.percentage_problem(key, value)
            if problem is not None:
                raise ValueError(f"TrainingSummary.{where} = {value!r}: {problem}")
        if self.framework_versions is not None and not isinstance(self.framework_versions, dict):
            raise ValueError("TrainingSummary.framework_versions must be a dict or None")
        Mode.parse(self.mode)

    # -- what the card derives from the summary -----------------------------------------------------------------
    def spec(self) -> DatasetSpec | None:
        """The :class:`petra_hub.data.DatasetSpec` of the data set, or None for one petra_hub does not know."""
        try:
            return dataset_spec(self.dataset)
        except ValueError:
            return None

    def title(self) -> str:
        """The data set's name in the body and in ``model-index``."""
        spec = self.spec()
        return self.dataset_title or (spec.title if spec is not None else self.dataset)

    def metrics(self) -> dict:
        """Every evaluated metric (accuracy and loss first), names without the "eval_" prefix."""
        metrics = {"accuracy": self.eval_accuracy, "loss": self.eval_loss}
        metrics.update({words.metric_key(key): value for key, value in self.eval_metrics.items()
                        if not words.is_speed_metric(key)})
        return {key: value for key, value in metrics.items() if value is not None}


# --------------------------------------------------------------------------------------------------------------
# metadata


def _unique(values) -> list:
    seen = []
    for value in values:
        if value and value not in seen:
            seen.append(value)
    return seen


def card_family(summary: TrainingSummary, config=None) -> ModelFamily:
    """The registered family whose card this is: the configuration's, else the preset's; a ValueError when neither
    names a registered family (a card says what the architecture is, and never guesses it)."""
    if config is not None:
        return family_of_config(config, "a model card")
    if summary.preset:
        return family_of_preset(summary.preset)[0]
    raise ValueError("a model card needs the model's family: pass config= (the model's configuration), or give "
                     "TrainingSummary.preset a preset of a registered family")


def card_data_for(summary: TrainingSummary, config=None) -> ModelCardData:
    """The YAML metadata of the card: ``model-index`` lists accuracy (first) and the other numeric metrics except
    losses, and exists only when one of them is known."""
    family = card_family(summary, config)
    task = summary.tasks[0] if summary.tasks else DEFAULT_TASK
    dataset_ids = _unique([summary.dataset_id, *summary.dataset_tags])
    eval_results = [
        EvalResult(
            task_type=task,
            task_name=task.replace("-", " ").title(),
            dataset_type=dataset_ids[0] if dataset_ids else summary.dataset,
            dataset_name=summary.title(),
            dataset_config=summary.dataset_config,
            dataset_split=summary.eval_split,
            metric_type=name,
            metric_name=words.metric_label(name),
            metric_value=float(value),
        )
        for name, value in summary.metrics().items()
        if not name.endswith("loss") and words.is_number(value)
    ]
    return ModelCardData(
        language=summary.language,
        license=summary.license,
        library_name="transformers",
        tags=_unique([*TAGS, *family.card_tags, *summary.tags]),
        datasets=dataset_ids or None,
        metrics=[result.metric_type for result in eval_results] or None,
        base_model=summary.base_model,
        pipeline_tag=task,
        model_name=summary.model_name,
        eval_results=eval_results or None,
    )


# --------------------------------------------------------------------------------------------------------------
# body


def _stored_stages_text(summary: TrainingSummary, family: ModelFamily, config) -> str:
    """Which stages keep their input whatever the mode (they are not reversible)."""
    which = family.stored_stages_text(config)
    if summary.buffered_stages is not None and summary.num_stages is not None:
        which += f" ({summary.buffered_stages} of this run's {summary.num_stages} pipeline stages)"
    return which


def _template_variables(summary: TrainingSummary, repo_id: str | None, config=None) -> dict:
    spec = summary.spec()
    mode = Mode.parse(summary.mode)
    family = card_family(summary, config)
    architecture_name, architecture = family.describe(config, summary.preset)
    label_names = summary.label_names
    if label_names is None and config is not None and getattr(config, "id2label", None):
        label_names = [config.id2label[i] for i in sorted(config.id2label)]
    if label_names is None and spec is not None:
        label_names = list(spec.info.label_names)
    num_labels = config.num_labels if config is not None else (spec.info.num_labels if spec is not None else None)
    # the registry's description is petra_hub's own Markdown; a title or a name the user gave is escaped
    dataset_description = words.markdown_text(summary.dataset_title) if summary.dataset_title else (
        spec.description if spec is not None else words.markdown_text(summary.dataset))
    dataset_ids = _unique([summary.dataset_id, *summary.dataset_tags])
    dataset_label = dataset_description
    if dataset_ids or summary.dataset_config:
        details = ", ".join(words.code_span(d) for d in dataset_ids)
        if summary.dataset_config:
            details += f"{', ' if details else ''}config {words.code_span(summary.dataset_config)}"
        dataset_label = f"{dataset_description} ({details})"
    image_code, image_sentence = words.example_image(
        spec, summary.dataset_id, summary.dataset_config, summary.image_column, summary.label_column,
        summary.example_split,
    )
    header, rows = words.results_table(summary.results)
    metrics = summary.metrics()
    versions = summary.framework_versions if summary.framework_versions is not None else words.framework_versions()
    base_model = summary.base_model
    if base_model:
        base_model = f"[{words.markdown_text(base_model)}](https://huggingface.co/{base_model})" \
            if words.is_hub_id(base_model) else words.code_span(base_model)
    # Every value is Markdown ready for the body: what comes from the user's data or arguments is escaped
    # (words.markdown_text, words.code_span), and repo_id goes between the quotes of a Python string in the snippets.
    task = summary.tasks[0] if summary.tasks else DEFAULT_TASK
    return {
        "model_name": words.markdown_text(summary.model_name),
        "repo_id": words.python_string_text(repo_id or f"your-namespace/{summary.model_name}"),
        "base_model_link": base_model or "",
        "model_type": family.model_type,
        "classifier_class": family.classifier_class.__name__,
        "family_package": family.import_name,
        "architecture_name": architecture_name,
        "architecture": architecture,
        "num_parameters": words.parameters_text(summary.num_parameters),
        "input_description": words.input_text(spec, summary.image_size, summary.image_mean, summary.image_std,
                                              image_resize=summary.image_resize,
                                              image_center_crop=summary.image_center_crop,
                                              image_processor=summary.image_processor),
        "has_image_processor": summary.image_processor,
        "num_labels": words.labels_text(label_names, num_labels),
        # the template writes the task's backticks: a task no code span can hold comes escaped into them
        "task": task if words.code_span(task) == f"`{task}`" else words.markdown_text(task),
        "mode": mode.value,
        "mode_description": mode.description,
        "mode_pipelined": mode.pipelined,
        "mode_reconstructs": mode.reconstructs,
        "mode_keeps_graph": mode.keeps_graph,
        "stored_stages": _stored_stages_text(summary, family, config),
        "family_description": family.description,
        "family_citation": family.citation or "",
        "invertible_downsampling": getattr(config, "downsampling", None) == "invertible",
        "num_stages": words.text(summary.num_stages),
        "accumulation_steps": words.text(summary.accumulation_steps),
        "num_processes": words.text(summary.num_processes),
        "epochs": words.text(summary.epochs),
        "global_steps": words.text(summary.global_steps),
        "micro_batch_size": words.text(summary.micro_batch_size),
        "learning_rate": words.text(summary.learning_rate),
        "optimizer": words.text(summary.optimizer),
        "lr_schedule": words.text(summary.lr_schedule),
        "warmup_steps": words.text(summary.warmup_steps),
        "weight_decay": words.text(summary.weight_decay),
        "max_grad_norm": words.text(summary.max_grad_norm),
        "label_smoothing": words.text(summary.label_smoothing),
        "seed": words.text(summary.seed),
        "hardware": words.markdown_text(words.text(summary.hardware)),
        "dataset_label": dataset_label,
        "dataset_description": dataset_description,
        "dataset_is_digits": words.is_sklearn_digits(spec),
        "eval_split": words.split_text(summary.eval_split),
        "eval_accuracy": words.accuracy_text(summary.eval_accuracy),
        "eval_loss": words.loss_text(summary.eval_loss),
        "metric_rows": [(words.markdown_text(words.metric_label(key)),
                         words.markdown_text(words.metric_text(key, value)))
                        for key, value in metrics.items() if key not in ("accuracy", "loss")],
        "has_metrics": bool(metrics),
        "eval_notes": [str(note) for note in summary.eval_notes],
        "extra_rows": [(words.markdown_text(key), words.markdown_text(words.text(value)))
                       for key, value in summary.extra.items()],
        "results_header": header,
        "results_rows": rows,
        "example_image_code": image_code,
        "example_image_sentence": image_sentence,
        "framework_versions": [(words.markdown_text(name), words.markdown_text(version))
                               for name, version in versions.items()],
    }


# --------------------------------------------------------------------------------------------------------------
# cards


def packaged_template(name: str = "card.md") -> Path:
    """``model_cards/<name>``: packaged with petra_hub if it was installed so, else in the source checkout."""
    candidates = []
    try:
        candidates.append(Path(str(importlib.resources.files("petra_hub") / "model_cards" / name)))
    except (ModuleNotFoundError, TypeError):  # pragma: no cover - petra_hub is always importable here
        pass
    candidates.append(Path(__file__).resolve().parents[3] / "model_cards" / name)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"model card template {name!r} not found (looked in {', '.join(str(c) for c in candidates)}); "
        "pass template_path="
    )


def default_template_path(family: ModelFamily | str = "revnet") -> Path:
    """The card template of a family (or of the family of a model_type): its `card_template`, a name packaged with
    petra_hub or the path of the family's own file, else petra_hub's shared ``card.md``."""
    if isinstance(family, str):
        model_type, family = family, family_named(family)
        if family is None:
            raise ValueError(f"no model family of model_type {model_type!r} is registered, so it has no card template")
    if family.card_template is None:
        return packaged_template()
    own = Path(family.card_template)
    if own.is_absolute() or own.parent != Path("."):
        if not own.is_file():
            raise FileNotFoundError(f"model family {family.title!r}: card_template {str(own)!r} does not exist")
        return own
    return packaged_template(own.name)


def render_model_card(
    summary: TrainingSummary,
    template_path: str | os.PathLike | None = None,
    *,
    repo_id: str | None = None,
    config=None,
) -> ModelCard:
    """Fill the card template with `summary`.

    `repo_id` (a Hub id or a local folder) goes into the loading snippets (default "your-namespace/<model_name>");
    `config` (the model's RevNetConfig or RevViTConfig) makes the architecture line, the class names and count
    exact instead of read from the preset and the registry. The default template is that of the model's family;
    a template may `{% extends %}` or `{% include %}` the files beside it (as the packaged ones extend card.md).
    """
    summary.validate()
    family = card_family(summary, config)
    path = Path(template_path) if template_path is not None else default_template_path(family)
    if not path.is_file():
        raise FileNotFoundError(f"model card template {str(path)!r} does not exist")
    # ModelCard.from_template, with a loader for the templates' {% extends %}: the files beside the template, then
    # petra_hub's own (so that a family's template outside petra_hub extends card.md)
    loader = jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(path.parent)),
                                  jinja2.FileSystemLoader(str(packaged_template().parent))])
    template = jinja2.Environment(loader=loader).get_template(path.name)
    card_data = card_data_for(summary, config)
    variables = {**card_data.to_dict(), **_template_variables(summary, repo_id, config)}
    return ModelCard(template.render(**variables, card_data=card_data.to_yaml()))


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
