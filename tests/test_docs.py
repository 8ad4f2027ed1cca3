"""The docs agree with their one home: the tables of modes and data sets with the code (Mode, the data registry),
and every measured number with the benchmarks' JSON files (through benchmarks/report.py's tables and figures)."""

import re
from pathlib import Path

import pytest

from petra_hub.data import DATASET_SPECS
from petra_hub.engine import Mode

ROOT = Path(__file__).resolve().parent.parent


def mode_rows(path: Path) -> dict[str, list[str]]:
    rows = {}
    for line in path.read_text().splitlines():
        match = re.match(r"\| `(\w+)` \|(.*)\|\s*$", line)
        if match and match.group(1) in Mode.names():
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split("|")]
    return rows


@pytest.mark.parametrize("doc", ["docs/usage.md", "docs/engine.md"])
def test_mode_tables_list_every_mode_with_its_policy(doc):
    rows = mode_rows(ROOT / doc)
    assert sorted(rows) == sorted(Mode.names())
    for name, cells in rows.items():
        policy = Mode(name).policy
        backward_input, backward_weights, delayed = cells
        assert delayed == ("yes" if policy.pipelined else "no"), name
        assert ("inversion" in backward_input) == policy.reconstructs, name
        assert ("stashed" in backward_weights) == policy.stashes_weights, name
        assert ("graph" in backward_input) == policy.keeps_graph, name


@pytest.mark.parametrize("doc", ["README.md", "docs/data.md"])
def test_readme_names_every_data_set(doc):
    text = (ROOT / doc).read_text()
    for name in DATASET_SPECS:
        assert f"`{name}`" in text, name


# What is not prose: fenced code, inline code, HTML comments with what they enclose when they are report regions
# (generated tables and figures), other comments, link targets.
NOT_PROSE = re.compile(
    r"```.*?```|<!-- table:(\S+) -->.*?<!-- /table:\1 -->|<!-- figure:.*?<!-- /figure -->|<!--.*?-->|`[^`\n]*`"
    r"|\]\([^)]*\)",
    re.S,
)
# A measurement as prose quotes it: a decimal, or a number with a unit of size, time, ratio or share.
MEASURED = re.compile(
    r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+(?![.\d])|(?:\.\d+)?\s?(?:%|x\b|GB\b|GiB\b|MB\b|MiB\b|KiB\b|ms\b|s\b|min\b"
    r"|points?\b))"
)
# Pages written before figures were marked, with the count of measured numbers their prose still quotes outside a
# table or figure. The counts may only fall: a number added to any page must be a table or a figure.
UNMARKED = {
    "docs/benchmarks-accuracy.md": 255,
    "docs/benchmarks-memory.md": 146,
    "docs/benchmarks-precision.md": 40,
    "docs/benchmarks-throughput.md": 445,
    "docs/benchmarks.md": 94,
    "docs/design.md": 50,
    "docs/engine.md": 16,
}


def unmarked_figures(path: Path) -> list[str]:
    prose = NOT_PROSE.sub(" ", path.read_text())
    return [m[0] for m in MEASURED.finditer(prose)]


def pages():
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", pages())
def test_measured_numbers_are_tables_or_figures(page):
    """A number measured by a benchmark has one home, its JSON file: the page quotes it through a generated table
    or a figure (`python benchmarks/report.py --check`, run by tests/benchmarks/test_report.py, compares them)."""
    found = unmarked_figures(ROOT / page)
    assert len(found) <= UNMARKED.get(page, 0), f"{page}: numbers outside a table or figure: {found}"
