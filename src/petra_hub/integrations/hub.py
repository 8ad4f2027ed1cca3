"""Publishing PETRA-trained RevNets on the Hugging Face Hub: Hub-ready folders and uploads.

    summary = TrainingSummary(model_name="revnet18-cifar10-petra", preset="revnet18", dataset="cifar10",
                              dataset_id="uoft-cs/cifar10", num_stages=10, accumulation_steps=2,
                              eval_accuracy=0.93)
    folder = save_for_hub(model, "out/revnet18-cifar10-petra", summary, repo_id="me/revnet18-cifar10-petra")
    push_folder_to_hub(folder, "me/revnet18-cifar10-petra")

:class:`TrainingSummary` and the card itself live in :mod:`petra_hub.integrations.model_card`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path

from huggingface_hub import HfApi
from transformers import PreTrainedModel

from .. import __version__
from ..data import dataset_spec, image_processor_for
from .model_card import TrainingSummary, write_model_card

__all__ = ["name_generic_labels", "push_folder_to_hub", "save_for_hub"]


def _unwrap(model) -> PreTrainedModel:
    """The transformers model inside a timm wrapper (``petra_hub.integrations.timm.TimmRevNet``), or `model`."""
    if isinstance(model, PreTrainedModel):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, PreTrainedModel):
        return inner
    raise TypeError(f"save_for_hub needs a transformers PreTrainedModel, got {type(model).__name__}")


def name_generic_labels(config, label_names) -> bool:
    """Give the data set's class names to a model config that still has transformers' placeholder names LABEL_0,
    LABEL_1, ... (so that a pipeline prints "cat", not "LABEL_3"); True where it did. A config with names of its own,
    or names of another count, is left alone. Shared by :func:`save_for_hub` and ``PetraTrainer.save_model``."""
    if not label_names or len(label_names) != config.num_labels:
        return False
    generic = {i: f"LABEL_{i}" for i in range(config.num_labels)}
    if {int(i): name for i, name in config.id2label.items()} != generic:
        return False
    config.id2label = {i: str(name) for i, name in enumerate(label_names)}
    config.label2id = {str(name): i for i, name in enumerate(label_names)}
    return True


def save_for_hub(
    model,
    folder: str | os.PathLike,
    summary: TrainingSummary,
    image_processor=None,
    *,
    repo_id: str | None = None,
    template_path: str | os.PathLike | None = None,
) -> Path:
    """Write a folder ready for the Hub: config.json + model.safetensors (+ the model code for
    ``trust_remote_code``), preprocessor_config.json and README.md (the card).

    `image_processor` defaults to the data set's (``data.image_processor_for``: images prepared as its evaluation
    prepares them); a data set petra_hub does not know needs one (else ValueError). When `summary.num_parameters` is
    None it is counted from the model. A config whose labels are still the placeholders LABEL_i gets the data set's
    class names (so pipelines print "cat", not "LABEL_3").
    """
    summary.validate()
    model = _unwrap(model)
    try:
        spec = dataset_spec(summary.dataset)
    except ValueError:
        if image_processor is None:
            raise
        spec = None
    info = spec.info if spec is not None else None
    if image_processor is None:
        image_processor = image_processor_for(info, spec.eval_shorter_side)
    if info is not None and info.num_labels != model.config.num_labels:
        warnings.warn(
            f"the model has {model.config.num_labels} labels but data set {summary.dataset!r} has "
            f"{info.num_labels} classes",
            stacklevel=2,
        )
    if summary.num_parameters is None:
        summary = dataclasses.replace(summary, num_parameters=sum(p.numel() for p in model.parameters()))
    name_generic_labels(model.config, info.label_names if info is not None else None)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    image_processor.save_pretrained(folder)
    write_model_card(folder, summary, template_path=template_path, repo_id=repo_id, config=model.config)
    return folder


def push_folder_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    *,
    token: str | bool | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    ignore_patterns: list[str] | str | None = None,
) -> str:
    """Create the model repository `repo_id` if needed and upload every file of `folder` in one commit.

    Returns the URL of the commit. `token=None` uses the token of ``hf auth login`` / ``HF_TOKEN``.
    """
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{str(folder)!r} holds no config.json: write it with save_for_hub(...) first")
    if not (folder / "README.md").is_file():
        warnings.warn(f"{str(folder)!r} holds no README.md: the repository will have no model card", stacklevel=2)
    api = HfApi(library_name="petra_hub", library_version=__version__)
    repo = api.create_repo(repo_id, token=token, private=private, repo_type="model", exist_ok=True)
    repo_id = getattr(repo, "repo_id", None) or repo_id
    commit = api.upload_folder(
        repo_id=repo_id,
        folder_path=folder,
        repo_type="model",
        token=token,
        commit_message=commit_message or "Upload RevNet trained with petra_hub",
        ignore_patterns=ignore_patterns,
    )
    return str(getattr(commit, "commit_url", commit))
