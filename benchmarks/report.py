"""Write the benchmarks' tables into the docs, from the JSON files the benchmarks write.

    python benchmarks/report.py                 # every docs/benchmarks*.md, from benchmarks/results/*.json
    python benchmarks/report.py --results DIR --docs docs/benchmarks-memory.md
    python benchmarks/report.py --check         # exit 1 if a table differs from what its JSON gives, or cannot be
                                                # rendered (its JSON missing or incomplete) and is not in MAY_BE_MISSING
    python benchmarks/report.py --list          # the tables each benchmark offers

Only the text between `<!-- table:NAME -->` and `<!-- /table:NAME -->` is rewritten; everything else in the docs
is written by hand. NAME is RESULT/TABLE or RESULT/TABLE/ARG: RESULT names the file RESULT.json in the results
folder, TABLE a table of the benchmark that wrote it (its "benchmark" field), ARG what that table needs (a model,
a downsampling). A region whose file is missing, or lacks what the table needs, is left as it is ("skipped"), and
`--check` fails on it: a docs table nobody can re-render is not checked. The exceptions are the results in
MAY_BE_MISSING (files that only a run on other hardware writes), which may be absent, but not incomplete. The tables
themselves live in `report_tables/`, one module per family of benchmarks.
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
DOCS = sorted((ROOT / "docs").glob("benchmarks*.md"))
MARKER = re.compile(r"<!-- table:(?P<name>\S+) -->\n.*?<!-- /table:(?P=name) -->", re.S)
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


def rewrite(text: str, results: Path) -> tuple[str, list[tuple[str, str]]]:
    """`text` with every marked region re-rendered; and (name, updated / unchanged / skipped: why / skipped,
    allowed: why) per region."""
    statuses = []

    def replace(match):
        name = match["name"]
        try:
            new = f"<!-- table:{name} -->\n{render(name, results)}\n<!-- /table:{name} -->"
        except Missing as missing:
            result = name.split("/", 1)[0]
            if result in MAY_BE_MISSING and not (results / f"{result}.json").exists():
                statuses.append((name, f"skipped, allowed: {missing}, {MAY_BE_MISSING[result]}"))
            else:
                statuses.append((name, f"skipped: {missing}"))
            return match[0]
        statuses.append((name, "unchanged" if new == match[0] else "updated"))
        return new

    return MARKER.sub(replace, text), statuses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON files (default %(default)s)")
    parser.add_argument("--docs", type=Path, nargs="+", default=DOCS, help="markdown files (default: benchmarks*.md)")
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a table would change or could not be rendered"
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
        stale |= new != text
        if new != text and not args.check:
            doc.write_text(new)
    return 1 if args.check and (stale or unrendered) else 0


if __name__ == "__main__":
    sys.exit(main())
