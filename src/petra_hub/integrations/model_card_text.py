"""The words and code of a model card: values formatted for its tables, the architecture and input lines, the
results table, the framework versions and the how-to snippet. Used by :mod:`petra_hub.integrations.model_card`;
every function returns ready-made text (unknown values become :data:`NOT_RECORDED`).

Text that comes from a user's data or arguments (class names, data set names and ids, model names, metric names,
...) enters the Markdown body only through :func:`markdown_text` (or :func:`code_span`, which falls back to it),
so that it renders literally: a class named ``<script>``, ``[x](javascript:...)``, ``# Owned`` or a lone code fence
cannot add HTML, links, headings or code blocks to the card, nor swallow the rest of it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from numbers import Number
from typing import Any

from ..data import DatasetSpec
from ..data.sources.digits import SklearnDigits

NOT_RECORDED = "not recorded"
MISSING_CELL = "-"
FRAMEWORKS = ("petra_hub", "torch", "transformers", "datasets", "accelerate", "huggingface_hub")
# Suffixes of the timing figures the Trainer logs next to the metrics ("eval_runtime", ...): not model metrics.
SPEED_SUFFIXES = ("_runtime", "_per_second", "_preparation_time", "_compilation_time")
MAX_LISTED_LABELS = 20
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SPLIT_NAME = re.compile(r"^[\w.-]+(\[[^\]]*\])?$")
# Characters that start Markdown structure anywhere in a line: backslash first (it escapes the others), emphasis,
# code, links and images, headings, table cells, strikethrough and code fences (~~~), math ($).
_MARKDOWN_SPECIALS = re.compile(r"([\\`*_\[\]()#|!~$])")
_HTML = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
# What a code span cannot show literally in every renderer (a backtick ends it, "|" ends a table cell, HTML).
_NOT_IN_CODE_SPAN = re.compile(r"[`|<>&]")


# --------------------------------------------------------------------------------------------------------------
# user text in Markdown


def markdown_text(value: Any) -> str:
    """`value` as Markdown that renders literally, on one line: HTML's ``&``, ``<`` and ``>`` become entities, the
    characters that start Markdown structure (emphasis, code, links, images, headings, table cells, math) are
    backslash-escaped, as is a list or rule marker that begins the text, and every run of white space
    (line breaks included) becomes one space. "sweet_pepper" -> "sweet\\_pepper", "t-shirt/top" unchanged."""
    folded = " ".join(str(value).split())
    escaped = _MARKDOWN_SPECIALS.sub(r"\\\1", folded)
    escaped = "".join(_HTML.get(char, char) for char in escaped)
    # a marker that would begin a list ("- a", "1. a"), a rule ("---") or a setext underline ("===") where the text
    # begins a line of the card (the description begins with the model name); "-0.5" and "0.5" are no markers
    escaped = re.sub(r"^(\d{1,9})\.(?= |$)", r"\1\\.", escaped)
    return re.sub(r"^([-+=])(?=[-+= ]|$)", r"\\\1", escaped)


def code_span(value: Any) -> str:
    """`value` as inline code (`` `uoft-cs/cifar10` ``): where it holds a character a code span cannot show literally
    (a backtick, "|", "<", ">", "&"), or nothing, :func:`markdown_text` of it instead."""
    folded = " ".join(str(value).split())
    if not folded or _NOT_IN_CODE_SPAN.search(folded):
        return markdown_text(folded)
    return f"`{folded}`"


def python_string_text(value: Any) -> str:
    """What goes between the double quotes of a Python string literal in a snippet (``from_pretrained("{}")``): the
    JSON escapes of `value` (quotes, backslashes, line breaks), so that the literal holds `value` and the code block
    cannot end inside it."""
    return _literal(value)[1:-1]


# --------------------------------------------------------------------------------------------------------------
# values


def text(value: Any) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        return NOT_RECORDED
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(text(item) for item in value) if value else NOT_RECORDED
    return str(value)


def split_text(split: str | None) -> str:
    """How the body names the evaluated data: "test split" for a split name ("test", "validation[:10%]"), the words
    as given otherwise ("held-out 15% of train"), "evaluation set" when unknown."""
    if split is None or not str(split).strip():
        return "evaluation set"
    return f"{markdown_text(split)} split" if _SPLIT_NAME.match(str(split)) else markdown_text(split)


def parameters_text(count: int | None) -> str:
    if count is None:
        return NOT_RECORDED
    return f"{count:,} ({count / 1e6:.1f} M)" if count >= 100_000 else f"{count:,}"


def accuracy_text(accuracy: float | None) -> str:
    return NOT_RECORDED if accuracy is None else f"{100 * float(accuracy):.2f} %"


def loss_text(loss: float | None) -> str:
    return NOT_RECORDED if loss is None else f"{float(loss):.4f}"


def is_number(value: Any) -> bool:
    return isinstance(value, Number) and not isinstance(value, bool) and math.isfinite(float(value))


def is_speed_metric(key: str) -> bool:
    """Whether `key` is one of the Trainer's timing figures ("eval_runtime", "eval_samples_per_second", ...)."""
    return key.endswith(SPEED_SUFFIXES)


def metric_key(key: str, prefix: str = "eval_") -> str:
    """"eval_accuracy" -> "accuracy"."""
    return key[len(prefix):] if key.startswith(prefix) else key


def percentage_problem(name: str, value: Any) -> str | None:
    """Why an accuracy-like metric (its name ends with "accuracy") cannot go into a card: it is not a fraction in
    [0, 1] (97.5 is a percentage: the card would publish it as 9750 %). None where it can."""
    if not metric_key(name).endswith("accuracy") or not is_number(value) or 0 <= float(value) <= 1:
        return None
    hint = f"give {float(value) / 100:g}, not {float(value):g}" if 1 < float(value) <= 100 else "not a percentage"
    return f"a card reports accuracies as fractions in [0, 1] ({hint})"


def metric_label(key: str) -> str:
    """A metric's name for a table: "accuracy" -> "Accuracy", "top_5_accuracy" -> "Top 5 accuracy", "f1" -> "F1"."""
    words = metric_key(key).replace("_", " ").strip()
    return words[:1].upper() + words[1:] if words else key


def metric_text(key: str, value: Any) -> str:
    """Accuracies as percentages, losses to 4 decimals, other numbers to 4 significant digits."""
    if value is None:
        return NOT_RECORDED
    name = metric_key(key)
    if is_number(value) and name.endswith("accuracy") and 0 <= float(value) <= 1:
        return accuracy_text(value)
    if is_number(value) and name.endswith("loss"):
        return loss_text(value)
    if is_number(value) and isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# --------------------------------------------------------------------------------------------------------------
# model and data


def is_sklearn_digits(spec: DatasetSpec | None) -> bool:
    return spec is not None and isinstance(spec.reader, SklearnDigits)


def _numbers(values: Sequence[float]) -> str:
    return ", ".join(f"{float(v):.4g}" for v in values)


def input_text(
    spec: DatasetSpec | None,
    image_size: int | None = None,
    image_mean: Sequence[float] | None = None,
    image_std: Sequence[float] | None = None,
    num_channels: int | None = None,
    image_resize: int | None = None,
    image_center_crop: bool = False,
    image_processor: bool = True,
) -> str:
    """What the model expects: the given values (those of the saved image processor) when there are some, else the
    registry's for a petra_hub data set (whose processor, ``data.image_processor_for``, prepares images as its
    evaluation does). `image_resize`: the side the processor resizes an image to, the whole image (S x S) or, with
    `image_center_crop`, its shorter side before the centred `image_size` square is cropped. `image_processor`:
    whether the model's folder holds its image processor (else the line does not point at one)."""
    if spec is not None and image_size is None:
        info = spec.info
        image_size, image_mean, image_std, num_channels = info.image_size, info.mean, info.std, info.num_channels
        image_resize, image_center_crop = spec.eval_shorter_side or info.image_size, bool(spec.eval_shorter_side)
    if image_size is None or image_mean is None or image_std is None:
        if not image_processor:
            return ("images prepared as the training data was; not recorded: no image processor was saved with this "
                    "model")
        return "RGB images (see `preprocessor_config.json`)"
    shape = f"{num_channels or 3}x{image_size}x{image_size}"
    if image_resize and image_center_crop:
        shape += (f" images (an image's shorter side resized to {image_resize}, then its centred "
                  f"{image_size}x{image_size} cropped)")
    elif image_resize:
        shape += f" images (any image resized to {image_resize}x{image_resize})"
    else:
        shape += " images"
    line = (f"{shape}, rescaled to [0, 1] and normalised with mean ({_numbers(image_mean)}) and std "
            f"({_numbers(image_std)})")
    if is_sklearn_digits(spec):
        line += (f"; the images are white digits on a black background (scikit-learn's 8x8 `load_digits()` images, "
                 f"ink 0-16 scaled to [0, 1], upscaled to {image_size}x{image_size} and repeated to RGB)")
    return line


def labels_text(names: Sequence[str] | None, count: int | None) -> str:
    """"10: 0, 1, ..., 9"; long lists are cut (all names are in `config.json`). Each name is escaped
    (:func:`markdown_text`): class names come from the user's data."""
    if not names:
        return text(count)
    count = count or len(names)
    shown = ", ".join(markdown_text(name) for name in names[:MAX_LISTED_LABELS])
    if len(names) > MAX_LISTED_LABELS:
        shown += f", ... (all {len(names)} names in `config.json`)"
    if list(names) == [f"LABEL_{i}" for i in range(len(names))]:
        shown += " (transformers' placeholder names: the model's config gives no class names)"
    return f"{count}: {shown}"


def is_hub_id(name: str | None) -> bool:
    return bool(name) and bool(_HUB_ID.match(name))


# --------------------------------------------------------------------------------------------------------------
# tables


def results_table(rows: Iterable[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the results table: epoch, step, training loss, then every metric column in the order the
    metrics first appear. A row is a dict with "epoch", "step", "training_loss" and metric names (compute_metrics
    names them: escaped, as their values)."""
    rows = list(rows)
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in ("epoch", "step", "training_loss") and key not in columns:
                columns.append(key)
    header = ["Epoch", "Step", "Training loss",
              *(f"Eval {markdown_text(metric_key(key).replace('_', ' '))}" for key in columns)]
    body = []
    for row in rows:
        epoch, step, loss = row.get("epoch"), row.get("step"), row.get("training_loss")
        cells = [
            MISSING_CELL if epoch is None else f"{float(epoch):.2f}".rstrip("0").rstrip("."),
            MISSING_CELL if step is None else str(step),
            MISSING_CELL if loss is None else loss_text(loss),
        ]
        cells += [MISSING_CELL if row.get(key) is None else markdown_text(metric_text(key, row[key]))
                  for key in columns]
        body.append(cells)
    return header, body


def framework_versions() -> dict[str, str]:
    """The installed versions of the libraries a petra_hub model is trained and loaded with."""
    versions = {}
    for name in FRAMEWORKS:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            try:
                versions[name] = str(importlib.import_module(name).__version__)
            except (ImportError, AttributeError):
                versions[name] = "not installed"
    return versions


# --------------------------------------------------------------------------------------------------------------
# how to use


def _literal(value: str) -> str:
    """A Python string literal in double quotes."""
    return json.dumps(str(value))


def example_image(
    spec: DatasetSpec | None,
    dataset_id: str | None,
    dataset_config: str | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    split: str | None = None,
) -> tuple[str, str]:
    """(Python lines that define `image`, a PIL image, and one sentence saying where it comes from).

    scikit-learn digits: built from ``load_digits()``; a Hub data set with a known image column: its first example;
    anything else: a placeholder path the reader replaces."""
    if is_sklearn_digits(spec):
        code = (
            "from PIL import Image\n"
            "from sklearn.datasets import load_digits\n"
            "\n"
            "digits = load_digits()  # 1,797 8x8 images, ink 0-16: white digits on a black background\n"
            "image = Image.fromarray((digits.images[-1] * 255 / 16).astype(\"uint8\"))  # the processor upscales it\n"
            "print(\"true label:\", digits.target[-1])"
        )
        return code, "The example classifies the last image of scikit-learn's digits (`pip install scikit-learn`)."
    if spec is not None and dataset_id == spec.hub_id:
        image_column = image_column or spec.hub_image_columns[0]
        label_column = label_column or spec.hub_label_columns[0]
        split = spec.hub_test_splits[0]
    if dataset_id and image_column:
        config = f", {_literal(dataset_config)}" if dataset_config and dataset_config != "default" else ""
        split = split or "train"
        code = (
            "from datasets import load_dataset\n"
            "\n"
            f"example = load_dataset({_literal(dataset_id)}{config}, split={_literal(split)})[0]\n"
            f"image = example[{_literal(image_column)}]"
        )
        if label_column:
            code += f"\nprint(\"true label:\", example[{_literal(label_column)}])"
        where = (f"[`{dataset_id}`](https://huggingface.co/datasets/{dataset_id})" if is_hub_id(dataset_id)
                 else code_span(dataset_id))
        sentence = (f"The example classifies the first image of the {code_span(split)} split of the Hub data set "
                    f"{where} (`pip install datasets`).")
        return code, sentence
    code = (
        "from PIL import Image\n"
        "\n"
        "image = Image.open(\"path/to/image.png\")  # placeholder: the path of one of your own images"
    )
    return code, ("`path/to/image.png` is a placeholder: give the path of an image like those the model was trained "
                  "on (the processor resizes and normalises it).")
