"""The docs' tables of modes and data sets agree with their one home in the code (Mode, the data registry)."""

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


@pytest.mark.parametrize("doc", ["README.md", "docs/engine.md"])
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


def test_readme_names_every_data_set():
    readme = (ROOT / "README.md").read_text()
    for name in DATASET_SPECS:
        assert f"`{name}`" in readme, name
