"""Which `TrainingArguments` fields PetraTrainer honours, refuses, or has no use for: no silent no-ops.

Every dataclass field of `PetraTrainingArguments` (transformers' fields and the `petra_*` ones) has one entry in
`TRAINING_ARGUMENT_SUPPORT`:

- "honoured": PetraTrainer, or the transformers machinery it keeps (callbacks, logging, `TrainerState`,
  checkpoint folders, `push_to_hub`), really uses it; the note says how.
- "refused": PetraTrainer would ignore it or get it wrong, so `check_supported` (run when the arguments are
  built, and again when PetraTrainer is built, trains, evaluates and predicts, for a field set afterwards) raises a
  `ValueError` when it is set to anything but its default; the note says why and what to do.
- "not_applicable": it means nothing for PETRA and is harmless at any value; the note says why.

A few honoured fields also have values PetraTrainer cannot honour (e.g. `optim="lomo"`); `check_supported`
refuses those values too, and the field's note names them.

`python -m petra_hub.training.support` prints the table of docs/training-arguments.md;
`python -m petra_hub.training.support --write [PAGE]` rewrites it in place (between its markers).

This module must not import `arguments.py` at import time (that module imports `check_supported` from here).
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .support_table import HONOURED, NOT_APPLICABLE, REFUSED, STATUSES, TRAINING_ARGUMENT_SUPPORT

TABLE_NAME = "training-arguments"
TABLE_START, TABLE_END = f"<!-- table:{TABLE_NAME} -->", f"<!-- /table:{TABLE_NAME} -->"
DOCS_PAGE = "docs/training-arguments.md"

# Values a refused field may hold besides its dataclass default, because they mean the same (a disabled
# feature), or because `TrainingArguments.__post_init__` writes them when the arguments are rebuilt
# (`dataclasses.replace`).
_ALSO_DEFAULT: dict[str, tuple] = {
    "activation_checkpointing": (False,),
    "gradient_checkpointing": (False,),
    "activation_checkpointing_kwargs": ({},),
    "gradient_checkpointing_kwargs": ({},),
    "liger_kernel_config": ({},),
    "include_num_input_tokens_seen": (False,),
    "include_for_metrics": (None,),
    "label_names": (["labels"],),
    "debug": (None, []),
    "fsdp": (False, "", []),
    "fsdp_config": ({},),
    "deepspeed": ({},),
}


def _plain(value: Any) -> Any:
    """An enum member as its value (`SchedulerType.LINEAR` -> "linear"); anything else unchanged."""
    return getattr(value, "value", value)


def _field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _is_default_accelerator_config(value: Any) -> bool:
    if value is None or value == {}:
        return True
    try:
        from transformers.trainer_pt_utils import AcceleratorConfig
    except ImportError:  # pragma: no cover - accelerate missing: TrainingArguments fails on its own
        return False
    if isinstance(value, AcceleratorConfig):
        return value == AcceleratorConfig()
    if isinstance(value, str) and value.lstrip().startswith("{"):
        value = json.loads(value)
    if isinstance(value, dict):
        try:
            return AcceleratorConfig(**value) == AcceleratorConfig()
        except TypeError:
            return False
    return False


def _is_default(name: str, value: Any, default: Any) -> bool:
    """Whether `value` leaves the feature behind field `name` as its default leaves it."""
    if name == "accelerator_config":
        return _is_default_accelerator_config(value)
    value = _plain(value)
    if isinstance(value, (list, tuple)):
        value = [_plain(item) for item in value]
    return value == default or value in _ALSO_DEFAULT.get(name, ())


# -- values of honoured fields that PetraTrainer cannot honour ---------------------------------------------------

_DELAYED_SCHEDULERS = {"reduce_lr_on_plateau", "greedy"}
# linear is the default of lr_scheduler_type: a user who sets petra_lr_milestones cannot be told apart from one who
# asked for linear
_MILESTONE_COMPATIBLE_SCHEDULERS = {"linear", "constant", "constant_with_warmup"}
_WHOLE_MODEL_OPTIMIZERS = ("galore_", "apollo_", "lomo", "adalomo")


def _empty(value: Any) -> bool:
    if isinstance(value, str):
        value = value.strip()
        return value in ("", "{}")
    return not value


def _lr_scheduler_type_problem(args) -> str | None:
    scheduler = str(_plain(args.lr_scheduler_type))
    if scheduler in _DELAYED_SCHEDULERS:
        return (
            "it is stepped with evaluation metrics, while every stage steps its scheduler after its own update; "
            "use another schedule or petra_lr_milestones (step decay)"
        )
    if getattr(args, "petra_lr_milestones", None) and scheduler not in _MILESTONE_COMPATIBLE_SCHEDULERS:
        return (
            "petra_lr_milestones replaces the schedule by the paper's warm-up + step decay, so this one would be "
            "ignored; set lr_scheduler_type='constant' with petra_lr_milestones, or drop petra_lr_milestones"
        )
    return None


def _lr_scheduler_kwargs_problem(args) -> str | None:
    if getattr(args, "petra_lr_milestones", None) and not _empty(args.lr_scheduler_kwargs):
        return (
            "petra_lr_milestones replaces the schedule by the paper's warm-up + step decay, so these would be "
            "ignored; drop them, or drop petra_lr_milestones"
        )
    return None


def _optim_problem(args) -> str | None:
    optim = str(_plain(args.optim))
    if optim.startswith(_WHOLE_MODEL_OPTIMIZERS):
        return (
            "GaLore, APOLLO and LOMO optimizers are built over the whole model (or drive its backward pass), while "
            "each stage has its own optimizer; use a per-stage optimizer such as sgd or adamw_torch"
        )
    if optim.startswith("schedule_free"):
        return (
            "schedule-free optimizers must be switched with optimizer.train()/eval() around evaluation, which the "
            "stages' optimizers are not; use a per-stage optimizer with an lr_scheduler_type"
        )
    return None


def _save_strategy_problem(args) -> str | None:
    if str(_plain(args.save_strategy)) == "best":
        return (
            "PetraTrainer saves at steps or epochs only, so no checkpoint would ever be written; use "
            "save_strategy='steps' or 'epoch' with load_best_model_at_end=True and save_total_limit"
        )
    return None


_VALUE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "lr_scheduler_type": _lr_scheduler_type_problem,
    "lr_scheduler_kwargs": _lr_scheduler_kwargs_problem,
    "optim": _optim_problem,
    "save_strategy": _save_strategy_problem,
}


def _transformers_defaults() -> dict[str, Any]:
    """The default of every `TrainingArguments` field (a subclass may change its own defaults: what counts is
    transformers', so that no subclass can turn a refused feature on by default)."""
    from transformers import TrainingArguments

    return {field.name: _field_default(field) for field in dataclasses.fields(TrainingArguments)}


def check_supported(args) -> None:
    """Raise a ValueError naming the first refused field set to a value other than its `TrainingArguments` default
    (in field order), or the first honoured field set to a value PetraTrainer cannot honour.

    Runs in `PetraTrainingArguments.__post_init__`, before transformers normalises the values, and again on every
    rebuild (`dataclasses.replace`) and in `PetraTrainer.__init__`, `train`, `evaluate` and `predict` (a field set
    after the arguments were built), after it did: both forms of a default value are accepted. A transformers
    field missing from `TRAINING_ARGUMENT_SUPPORT` (a newer release) is refused when set, until it is classified.
    """
    defaults = _transformers_defaults()
    for field in dataclasses.fields(args):
        name, value = field.name, getattr(args, field.name)
        support = TRAINING_ARGUMENT_SUPPORT.get(name)
        if name in defaults and support is None:
            if not _is_default(name, value, defaults[name]):
                raise ValueError(
                    f"{name}={value!r}: PetraTrainer has not been checked against this TrainingArguments field (new "
                    f"in this transformers release), so it may be silently ignored; leave it at its default "
                    f"({defaults[name]!r}) until petra_hub lists it in {DOCS_PAGE}"
                )
            continue
        if support is None:  # a field of a subclass of PetraTrainingArguments: its own business
            continue
        if support.status == REFUSED and name in defaults and not _is_default(name, value, defaults[name]):
            raise ValueError(
                f"{name}={value!r} is not supported by PetraTrainer: {support.note}. Leave {name} at its default "
                f"({defaults[name]!r}); {DOCS_PAGE} lists how PetraTrainer treats every TrainingArguments field"
            )
        check = _VALUE_CHECKS.get(name)
        problem = check(args) if check is not None else None
        if problem:
            raise ValueError(f"{name}={_plain(value)!r} is not supported by PetraTrainer: {problem}")


# -- the docs page -----------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The table of docs/training-arguments.md: every field of `PetraTrainingArguments`, in field order."""
    from .arguments import PetraTrainingArguments

    fields = dataclasses.fields(PetraTrainingArguments)
    counts = {status: 0 for status in STATUSES}
    rows = ["| Field | Default | Status | How PetraTrainer treats it |", "| --- | --- | --- | --- |"]
    for field in fields:
        support = TRAINING_ARGUMENT_SUPPORT[field.name]
        counts[support.status] += 1
        default = _field_default(field)
        rows.append(
            f"| `{field.name}` | `{_cell(repr(default))}` | {support.status.replace('_', ' ')} "
            f"| {_cell(support.note)} |"
        )
    summary = (
        f"{len(fields)} fields: {counts[HONOURED]} honoured, {counts[REFUSED]} refused, "
        f"{counts[NOT_APPLICABLE]} not applicable."
    )
    return "\n".join([summary, "", *rows])


def replace_table(text: str, table: str | None = None) -> str:
    """`text` (the docs page) with the table between its markers replaced by `table` (default: the current one)."""
    table = markdown_table() if table is None else table
    pattern = re.compile(re.escape(TABLE_START) + r"\n.*?" + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        raise ValueError(f"the page has no {TABLE_START} ... {TABLE_END} markers")
    return pattern.sub(lambda _: f"{TABLE_START}\n{table}\n{TABLE_END}", text, count=1)


def table_in(text: str) -> str:
    """The table between the markers of `text`."""
    match = re.search(re.escape(TABLE_START) + r"\n(.*?)\n?" + re.escape(TABLE_END), text, re.S)
    if match is None:
        raise ValueError(f"the page has no {TABLE_START} ... {TABLE_END} markers")
    return match.group(1)


def default_page() -> Path:
    """docs/training-arguments.md of the source checkout this module runs from."""
    return Path(__file__).resolve().parents[3] / DOCS_PAGE


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print(markdown_table())
        return
    if argv[0] != "--write" or len(argv) > 2:
        raise SystemExit("usage: python -m petra_hub.training.support [--write [PAGE]]")
    page = Path(argv[1]) if len(argv) == 2 else default_page()
    page.write_text(replace_table(page.read_text(encoding="utf-8")), encoding="utf-8")
    print(f"wrote the table of {page}")


if __name__ == "__main__":
    main()
