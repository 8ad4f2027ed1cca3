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

The table and `check_supported` live in `support_table.py` (which `arguments.py` imports: it checks the arguments
when they are built); this module writes the docs page from them and `PetraTrainingArguments`, and re-exports them.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from .arguments import PetraTrainingArguments
from .support_table import (DOCS_PAGE, HONOURED, NOT_APPLICABLE, REFUSED, STATUSES, TRAINING_ARGUMENT_SUPPORT,
                            check_supported, field_default)

__all__ = ["DOCS_PAGE", "HONOURED", "NOT_APPLICABLE", "REFUSED", "STATUSES", "TRAINING_ARGUMENT_SUPPORT",
           "check_supported", "default_page", "main", "markdown_table", "replace_table", "table_in"]

TABLE_NAME = "training-arguments"
TABLE_START, TABLE_END = f"<!-- table:{TABLE_NAME} -->", f"<!-- /table:{TABLE_NAME} -->"

# -- the docs page -----------------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table() -> str:
    """The table of docs/training-arguments.md: every field of `PetraTrainingArguments`, in field order."""
    fields = dataclasses.fields(PetraTrainingArguments)
    counts = {status: 0 for status in STATUSES}
    rows = ["| Field | Default | Status | How PetraTrainer treats it |", "| --- | --- | --- | --- |"]
    for field in fields:
        support = TRAINING_ARGUMENT_SUPPORT[field.name]
        counts[support.status] += 1
        default = field_default(field)
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
