"""Inference through the pipeline's stages: every rank reads the same batches, the last stage's rank computes the
outputs, and the results reach every rank (so `evaluate` and `predict` agree everywhere)."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from transformers.trainer_utils import EvalPrediction, denumpify_detensorize, speed_metrics

from ..engine import Pipeline, PipelineError, broadcast_json, broadcast_tensors
from .distributed import together, world_size


def eval_set_named(eval_dataset, name: str):
    """`evaluate("name")`: one of a dict of eval data sets, as in Trainer, with an error that lists the names."""
    if not isinstance(eval_dataset, dict) or name not in eval_dataset:
        sets = ", ".join(map(repr, eval_dataset)) if isinstance(eval_dataset, dict) else "none"
        raise KeyError(f"evaluate({name!r}): eval_dataset has no set of that name (named sets: {sets})")
    return eval_dataset[name]


@dataclass
class InferenceResult:
    logits: np.ndarray | None
    label_ids: np.ndarray | None
    metrics: dict


def run_inference(
    pipeline: Pipeline,
    batches,
    loss_fn: Callable,
    compute_metrics: Callable | None,
    prefix: str,
    preprocess_logits: Callable | None = None,
    keep_outputs: bool = False,
) -> InferenceResult:
    """Forward every batch of `batches` (`feeding.MicroBatch`es: the images where this rank runs stage 0, the
    labels where it runs the last stage) in eval mode; metrics (and, with `keep_outputs`, logits and labels) are
    known on every rank afterwards. `preprocess_logits(logits, labels)` (Trainer's `preprocess_logits_for_metrics`)
    turns each batch's logits into what is kept for `compute_metrics` and returned (a tensor, or a tuple of tensors,
    each concatenated over the batches, as Trainer does); the loss sees the logits."""
    start = time.time()
    logits, labels, loss_sum, seen, count = [], [], 0.0, 0, 0
    for batch in batches:
        batch_labels = batch.labels
        outputs = pipeline.infer(batch.pixel_values if pipeline.has_first_stage else None, batch_size=batch.size)
        seen += batch.size
        count += 1
        if outputs is not None:
            outputs = outputs.detach().float().cpu()
            if batch_labels is not None:
                loss_sum += float(loss_fn(outputs, batch_labels)) * len(batch_labels)
                labels.append(batch_labels.cpu())
            logits.append(outputs if preprocess_logits is None else preprocess_logits(outputs, batch_labels))
    result = None
    if pipeline.has_last_stage:
        all_logits = concatenated(logits)
        all_labels = torch.cat(labels).numpy() if labels else None
        metrics = {f"{prefix}_loss": loss_sum / max(1, seen)} if all_labels is not None else {}
        if compute_metrics is not None and all_labels is not None:
            for key, value in compute_metrics(EvalPrediction(predictions=all_logits, label_ids=all_labels)).items():
                metrics[key if key.startswith(f"{prefix}_") else f"{prefix}_{key}"] = value
        result = InferenceResult(all_logits if keep_outputs else None, all_labels if keep_outputs else None, metrics)
    if world_size() > 1:
        with together(f"receive the {prefix} results from the last stage's process"):
            result = shared_result(result, pipeline.last_stage_rank, seen)
    result.metrics.update(speed_metrics(prefix, start, num_samples=seen, num_steps=count))
    result.metrics = denumpify_detensorize(result.metrics)  # as Trainer: numpy and torch numbers become Python's
    return result


def shared_result(result: InferenceResult | None, src: int, samples: int) -> InferenceResult:
    """The last stage's `result` (None elsewhere) on every rank, never pickled: the metrics as JSON, the logits and
    labels as tensors, whose first dimension must be the `samples` every rank read."""

    def accept(rank: int, manifest: dict) -> None:
        for name, (shape, _) in manifest.items():
            known = name in ("logits", "labels") or re.fullmatch(r"logits\.\d{1,3}", name)
            if not known or not shape or shape[0] != samples or math.prod(shape) > samples << 20:
                raise PipelineError(f"rank {src} sent {name} of shape {list(shape)} for {samples} evaluated samples")

    arrays = None if result is None else {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in (
        *_named("logits", result.logits), ("labels", result.label_ids)) if value is not None}
    metrics = broadcast_json(None if result is None else result.metrics, src)  # numpy, torch values: numbers
    tensors = broadcast_tensors(arrays, src, accept=accept)
    if not isinstance(metrics, dict):
        raise PipelineError(f"rank {src} sent metrics that are not a JSON object")
    numpy = {name: tensor.numpy() for name, tensor in tensors.items()}
    parts = sorted((int(name.split(".")[1]), array) for name, array in numpy.items() if name.startswith("logits."))
    logits = tuple(array for _, array in parts) if parts else numpy.get("logits")
    return InferenceResult(logits, numpy.get("labels"), metrics)


def _named(name: str, value) -> list[tuple[str, np.ndarray | None]]:
    """An array as (name, array), a tuple of them as (name.0, first), (name.1, second), ..."""
    if isinstance(value, tuple):
        return [(f"{name}.{index}", part) for index, part in enumerate(value)]
    return [(name, value)]


def concatenated(parts: list):
    """The batches' kept outputs end to end: an array, or a tuple of arrays where each batch gave a tuple (or list)
    of tensors; None without any."""
    if not parts:
        return None
    if isinstance(parts[0], (tuple, list)):
        if any(not isinstance(part, (tuple, list)) or len(part) != len(parts[0]) for part in parts):
            raise ValueError("preprocess_logits_for_metrics must return tuples of the same length for every batch")
        return tuple(concatenated([part[index] for part in parts]) for index in range(len(parts[0])))
    if not all(torch.is_tensor(part) for part in parts):
        kinds = sorted({type(part).__name__ for part in parts})
        raise TypeError(f"preprocess_logits_for_metrics must return tensors or tuples of tensors, got {kinds}")
    return torch.cat([part.detach().cpu() for part in parts]).numpy()
