"""Write the benchmarks' tables and figures into the README and the docs, from the JSON files the benchmarks write.

    python benchmarks/report.py                 # README.md and every docs/*.md, from benchmarks/results/*.json
    python benchmarks/report.py --results DIR --docs docs/benchmarks-memory.md
    python benchmarks/report.py --check         # exit 1 if a table or figure differs from what its JSON gives, or
                                                # cannot be rendered (its JSON missing or incomplete) and is not in
                                                # MAY_BE_MISSING
    python benchmarks/report.py --list          # the tables each benchmark offers

Two kinds of region are rewritten; everything else is written by hand.

Tables: the lines between `<!-- table:NAME -->` and `<!-- /table:NAME -->`. NAME is RESULT/TABLE or
RESULT/TABLE/ARG: RESULT names the file RESULT.json in the results folder, TABLE a table of the benchmark that wrote
it (its "benchmark" field), ARG what that table needs (a model, a downsampling).

Figures: one number in a sentence or a table cell, between `<!-- figure:SOURCE -->` and `<!-- /figure -->` on one
line. SOURCE is either a table's cell or a value of the JSON:
- `RESULT/TABLE[/ARG] row="CELL; CELL" col="HEADER"`: in the row whose first cells are those given (semicolons,
  since a pipe would split a markdown table; no row for a one-row table), the cell under HEADER, bold marks dropped;
- `RESULT:PATH format="{:.1f}"`: PATH is keys joined by dots, `key[field=value]` the list item whose field is value,
  `key[2]` the item at an index. A quoted number thus has one home, its JSON file, and `--check` fails when
the text differs from it.

A region whose file is missing, or lacks what it needs, is left as it is ("skipped"), and `--check` fails on it: a
docs table nobody can re-render is not checked. The exceptions are the results in MAY_BE_MISSING (files that only
a run on other hardware writes), which may be absent, but not incomplete. The tables themselves live in
`report_tables/`, one module per family of benchmarks.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from report_tables import RENDERERS, Missing  # noqa: E402

ROOT = HERE.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A table marker's NAME holds a slash (RESULT/TABLE): other generators' markers (training-arguments) are not ours.
MARKER = re.compile(r"<!-- table:(?P<name>[^\s/]+/\S+) -->\n.*?<!-- /table:(?P=name) -->", re.S)
FIGURE = re.compile(r"<!-- figure:(?P<spec>[^>\n]+?) -->(?P<text>[^<`\n]*)<!-- /figure -->")
ATTRIBUTE = re.compile(r'(\w+)="([^"]*)"')
# RESULT -> why its file may be absent: `--check` lets its regions be skipped when RESULT.json does not exist.
MAY_BE_MISSING = {
    "gpu": "written only by `python benchmarks/gpu.py` on a machine with a CUDA GPU (docs/benchmarks-precision.md)",
}


class UnknownTable(ValueError):
    """A marker names a table that its results file's benchmark does not offer."""


def render(name: str, results: Path) -> str:
    """The table NAME (RESULT/TABLE[/ARG]); raises Missing when its results are not there."""
    result, table_name, arg = (name.split("/", 2) + [None])[:3]
    path = results / f"{result}.json"
    if not path.exists():
        raise Missing(f"no {path}")
    data = json.loads(path.read_text())
    renderer = RENDERERS.get(data.get("benchmark"), {}).get(table_name)
    if renderer is None:
        raise UnknownTable(f"{name}: {path} comes from {data.get('benchmark')!r}, which has no table {table_name!r}")
    return renderer(data, arg)


def table_cells(markdown: str) -> tuple[list[str], list[list[str]]]:
    """A rendered table's header cells and its rows' cells."""
    lines = [line.strip().strip("|").split(" | ") for line in markdown.splitlines() if line.startswith("|")]
    header, *rows = [[cell.strip() for cell in cells] for cells in lines]
    return header, rows[1:]  # rows[0] is the alignment rule


def json_value(data, path: str):
    """The value at PATH (`a.b[field=value].c`, `a[2]`) in `data`; raises Missing when it is not there."""
    value = data
    for part in path.split("."):
        key, *selectors = re.split(r"\[|\]\[", part.rstrip("]"))
        if key:
            value = need_key(value, key)
        for selector in selectors:
            if "=" in selector:
                field, wanted = selector.split("=", 1)
                matches = [item for item in value if isinstance(item, dict) and str(item.get(field)) == wanted]
                if len(matches) != 1:
                    raise Missing(f"{len(matches)} items with {field}={wanted} in {path}")
                value = matches[0]
            elif not isinstance(value, list) or not -len(value) <= int(selector) < len(value):
                raise Missing(f"no item {selector} in {path}")
            else:
                value = value[int(selector)]
    return value


def need_key(mapping, key: str):
    if not isinstance(mapping, dict) or key not in mapping:
        raise Missing(f"no {key!r}")
    return mapping[key]


def figure(spec: str, results: Path) -> str:
    """The text of the figure SPEC (see the module's docstring); raises Missing when its results are not there."""
    source = spec.split(" ", 1)[0]
    attributes = dict(ATTRIBUTE.findall(spec))
    unknown = set(attributes) - {"row", "col", "format"}
    if unknown:
        raise UnknownTable(f"figure {spec!r}: unknown attributes {sorted(unknown)}")
    if ":" in source:
        result, path = source.split(":", 1)
        file = results / f"{result}.json"
        if not file.exists():
            raise Missing(f"no {file}")
        return attributes.get("format", "{}").format(json_value(json.loads(file.read_text()), path))
    header, rows = table_cells(render(source, results))
    if "col" not in attributes or attributes["col"] not in header:
        raise UnknownTable(f"figure {spec!r}: col must be one of {header}")
    wanted = [cell.strip() for cell in attributes["row"].split(";")] if "row" in attributes else []
    matches = [row for row in rows if row[: len(wanted)] == wanted]
    if len(matches) != 1:
        raise Missing(f"{len(matches)} rows start with {wanted}")
    return matches[0][header.index(attributes["col"])].replace("**", "")


def skipped(name: str, missing: Missing, results: Path) -> str:
    result = re.split(r"[/:]", name, maxsplit=1)[0]
    if result in MAY_BE_MISSING and not (results / f"{result}.json").exists():
        return f"skipped, allowed: {missing}, {MAY_BE_MISSING[result]}"
    return f"skipped: {missing}"


def rewrite(text: str, results: Path) -> tuple[str, list[tuple[str, str]]]:
    """`text` with every marked table and figure re-rendered; and (name, updated / unchanged / skipped: why /
    skipped, allowed: why) per region (a figure's name is `figure:SPEC`)."""
    statuses = []

    def replace_table(match):
        name = match["name"]
        try:
            new = f"<!-- table:{name} -->\n{render(name, results)}\n<!-- /table:{name} -->"
        except Missing as missing:
            statuses.append((name, skipped(name, missing, results)))
            return match[0]
        statuses.append((name, "unchanged" if new == match[0] else "updated"))
        return new

    def replace_figure(match):
        spec = match["spec"]
        try:
            value = figure(spec, results)
        except Missing as missing:
            statuses.append((f"figure:{spec}", skipped(spec, missing, results)))
            return match[0]
        statuses.append((f"figure:{spec}", "unchanged" if value == match["text"] else "updated"))
        return f"<!-- figure:{spec} -->{value}<!-- /figure -->"

    return FIGURE.sub(replace_figure, MARKER.sub(replace_table, text)), statuses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON files (default %(default)s)")
    parser.add_argument(
        "--docs", type=Path, nargs="+", default=DOCS, help="markdown files (default: README.md, docs/*.md)"
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a table or figure is stale or unrenderable"
    )
    parser.add_argument("--list", action="store_true", help="list the tables of every benchmark and exit")
    args = parser.parse_args(argv)
    if args.list:
        for benchmark, tables in RENDERERS.items():
            print(f"{benchmark}: {', '.join(tables)}")
        return 0
    stale = unrendered = False
    for doc in args.docs:
        text = doc.read_text()
        try:
            new, statuses = rewrite(text, args.results)
        except UnknownTable as error:
            print(f"{doc}: {error}", file=sys.stderr)
            return 2
        for name, status in statuses:
            print(f"{doc}: {name}: {status}")
            if status.startswith("skipped:"):
                unrendered = True
                print(f"{doc}: {name} cannot be rendered ({status[len('skipped: '):]})", file=sys.stderr)
            elif status == "updated" and args.check:
                print(f"{doc}: {name} differs from its JSON", file=sys.stderr)
        stale |= new != text
        if new != text and not args.check:
            doc.write_text(new)
    return 1 if args.check and (stale or unrendered) else 0


if __name__ == "__main__":
    sys.exit(main())
