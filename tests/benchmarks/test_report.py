"""benchmarks/report.py rewrites only the marked regions (tables and figures) of the README and the docs, from the
benchmarks' JSON files."""

import json
import re
from pathlib import Path

import pytest


ACCURACY = {
    "benchmark": "accuracy_digits",
    "settings": {"seeds": [0, 1]},
    "summary": [
        {"config": "backprop", "mode": "backprop", "k": 1, "learning_rate": 0.05, "optimizer_steps": 90,
         "accuracies": [99.0, 98.0], "mean": 98.5, "std": 0.71, "min": 98.0, "max": 99.0, "mean_wall_s": 3.2},
        {"config": "petra-k2", "mode": "petra", "k": 2, "learning_rate": 0.1, "optimizer_steps": 45,
         "accuracies": [97.0, 98.0], "mean": 97.5, "std": 0.71, "min": 97.0, "max": 98.0, "mean_wall_s": 4.0,
         "gap_mean": -1.0, "gap_std": 1.41},
    ],
}  # fmt: skip

DOC = """# Title

Hand-written text, with `<!-- table:NAME -->` quoted inline.

<!-- table:acc/main -->
| old | table |
|---|---|
| 1 | 2 |
<!-- /table:acc/main -->

More text | with a pipe.

<!-- table:acc/summary -->
<!-- /table:acc/summary -->

<!-- table:missing/main -->
kept as it is
<!-- /table:missing/main -->
The end.
"""


def test_renders_tables_into_marked_regions_only(report, tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    (results / "acc.json").write_text(json.dumps(ACCURACY))
    doc = tmp_path / "doc.md"
    doc.write_text(DOC)

    assert report.main(["--results", str(results), "--docs", str(doc), "--check"]) == 1
    assert doc.read_text() == DOC  # --check writes nothing
    assert report.main(["--results", str(results), "--docs", str(doc)]) == 0
    text = doc.read_text()
    assert "| old | table |" not in text
    main = text.split("<!-- table:acc/main -->\n")[1].split("<!-- /table:acc/main -->")[0]
    assert main.splitlines()[0].startswith("| configuration | mode | k |")
    assert "| per seed (0, 1) |" in main.splitlines()[0]
    assert "| petra-k2 | petra | 2 | 0.1 | 45 | 97.50 ± 0.71 |" in main
    assert "| -1.00 ± 1.41 | 4 |" in main and "| (reference) | 3 |" in main
    assert "| backprop | PETRA k=2 |" in text and "| 98.50 ± 0.71 | 97.50 ± 0.71 |" in text
    # Outside the regions, and in the region whose results are missing, nothing changed.
    outside = re.sub(r"<!-- table:(acc/\w+) -->\n.*?<!-- /table:\1 -->", "", text, flags=re.S)
    assert outside == re.sub(r"<!-- table:(acc/\w+) -->\n.*?<!-- /table:\1 -->", "", DOC, flags=re.S)
    assert "kept as it is" in text
    assert "missing/main: skipped: no " in capsys.readouterr().out
    # Rendering again changes nothing, but the check still fails on the region it cannot render...
    assert report.main(["--results", str(results), "--docs", str(doc), "--check"]) == 1
    assert doc.read_text() == text
    assert "missing/main cannot be rendered (no " in capsys.readouterr().err
    # ...and passes once it can.
    (results / "missing.json").write_text(json.dumps(ACCURACY))
    assert report.main(["--results", str(results), "--docs", str(doc)]) == 0
    assert report.main(["--results", str(results), "--docs", str(doc), "--check"]) == 0


INCOMPLETE_MEMORY = {"benchmark": "memory", "models": {"revnet18 buffered": {"summary": {}}}}


def test_check_fails_on_a_region_it_cannot_render_unless_its_file_may_be_missing(report, tmp_path, capsys):
    """A table whose results file is missing, or lacks what the table needs, is not checked: --check says so and
    fails, except for the results of MAY_BE_MISSING (the GPU run's), which may be absent but not incomplete."""
    assert set(report.MAY_BE_MISSING) == {"gpu"}
    results = tmp_path / "results"
    results.mkdir()
    (results / "acc.json").write_text(json.dumps(ACCURACY))
    doc = tmp_path / "doc.md"
    regions = ["acc/main", "gpu/main"]

    def check(*names):
        doc.write_text("".join(f"<!-- table:{n} -->\n<!-- /table:{n} -->\n" for n in names))
        report.main(["--results", str(results), "--docs", str(doc)])  # renders what it can
        return report.main(["--results", str(results), "--docs", str(doc), "--check"])

    assert check(*regions) == 0  # gpu.json absent: allowed
    assert "gpu/main: skipped, allowed: no " in capsys.readouterr().out
    # Present but without what its table needs (a memory table here, whose renderer says so): not allowed.
    (results / "gpu.json").write_text(json.dumps(INCOMPLETE_MEMORY))
    assert check("acc/main", "gpu/summary") == 1
    assert "gpu/summary cannot be rendered (no 'delayed')" in capsys.readouterr().err
    (results / "gpu.json").unlink()
    assert check(*regions, "memory/summary") == 1  # any other missing file fails
    assert "memory/summary cannot be rendered (no " in capsys.readouterr().err
    (results / "memory.json").write_text(json.dumps(INCOMPLETE_MEMORY))
    assert check(*regions, "memory/summary") == 1
    assert "memory/summary cannot be rendered (no 'delayed')" in capsys.readouterr().err


def test_the_docs_tables_are_those_of_the_recorded_results(report, capsys):
    """`python benchmarks/report.py --check` on the real README, docs and benchmarks/results: every table and figure
    renders from its JSON file (none skipped but the GPU run's) and is what the text holds."""
    assert report.main(["--check"]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    skipped = [line for line in lines if ": skipped" in line]
    texts = [doc.read_text() for doc in report.DOCS]
    assert len(lines) == sum(len(report.MARKER.findall(t)) + len(report.FIGURE.findall(t)) for t in texts)
    assert sum(len(report.MARKER.findall(t)) for t in texts) > 80
    assert sum(len(report.FIGURE.findall(t)) for t in texts) >= 10
    assert all(line.split(": ")[1] == "gpu/main" for line in skipped), skipped


FIGURES = """Backprop reaches <!-- figure:acc/summary col="backprop" -->0<!-- /figure --> and PETRA
<!-- figure:acc:summary[config=petra-k2].mean format="{:.1f}" -->0<!-- /figure --> %, k =
<!-- figure:acc/main row="petra-k2; petra" col="k" -->2<!-- /figure -->, in
<!-- figure:acc:summary[1].optimizer_steps -->45<!-- /figure --> steps.
Quoted, not a figure: `<!-- figure:SOURCE -->` before the number, `<!-- /figure -->` after it.
"""


def test_figures_are_table_cells_or_json_values(report, tmp_path, capsys):
    """A figure is one number in a sentence: a cell of a rendered table (row by its first cells, column by its
    header) or a JSON value with a format; --check fails when the text differs, and the rewrite puts it right."""
    results = tmp_path / "results"
    results.mkdir()
    (results / "acc.json").write_text(json.dumps(ACCURACY))
    doc = tmp_path / "doc.md"
    doc.write_text(FIGURES)
    assert report.main(["--results", str(results), "--docs", str(doc), "--check"]) == 1
    assert capsys.readouterr().err.count("differs from its JSON") == 2
    assert report.main(["--results", str(results), "--docs", str(doc)]) == 0
    text = doc.read_text()
    assert '"backprop" -->98.50 ± 0.71<!--' in text and 'format="{:.1f}" -->97.5<!--' in text
    assert text.split("\n", 3)[3] == FIGURES.split("\n", 3)[3]  # untouched: the quoted markers, the rest
    assert report.main(["--results", str(results), "--docs", str(doc), "--check"]) == 0
    # A changed result makes the text stale; a path or row that is not there cannot be rendered.
    (results / "acc.json").write_text(json.dumps({**ACCURACY, "summary": ACCURACY["summary"][:1]}))
    assert report.main(["--results", str(results), "--docs", str(doc), "--check"]) == 1
    err = capsys.readouterr().err
    assert "0 items with config=petra-k2" in err and "0 rows start with ['petra-k2', 'petra']" in err
    assert report.figure("acc:settings.seeds[1]", results) == "1"
    with pytest.raises(report.UnknownTable, match="col must be one of"):
        report.figure('acc/summary col="nope"', results)


def test_every_marker_in_the_docs_names_a_known_table(report):
    for doc in report.DOCS:
        text = doc.read_text()
        names = [m["name"] for m in report.MARKER.finditer(text)]
        assert len(names) == len(re.findall(r"^<!-- table:\S*/", text, flags=re.M)), f"unclosed marker in {doc.name}"
        for name in names:
            result, table = name.split("/")[:2]
            assert any(result.startswith(b) and table in report.RENDERERS[b] for b in report.RENDERERS), name


def test_throughput_tables_render_from_a_quick_run(report):
    """data/throughput-quick.json: the results of `python benchmarks/throughput.py --quick` (2 processes)."""
    data = Path(__file__).resolve().parent / "data"
    result = json.loads((data / "throughput-quick.json").read_text())
    J, methods = len(result["one"]["layout"]), 4 + len(result["settings"]["pp_microbatches"])
    tables = {name: report.render(f"throughput-quick/{name}", data) for name in report.RENDERERS["throughput"]}
    assert len(tables["stages"].splitlines()[0].split(" | ")) == J + 1
    two = tables["two-processes"].splitlines()
    assert len(two) == 2 + methods and two[2].startswith("| PETRA, steady state") and "| - |" in two[2]
    assert len(tables["ratios"].splitlines()) == 2 + methods - 1
    assert tables["partition"].count("\n") == 3  # header, rule, one row per rank
    assert "`python benchmarks/throughput.py --quick" in tables["run"]
    versus = tables["versus-torch"].splitlines()  # no rivals in this run: PETRA and checkpointed 1F1B only
    assert len(versus) == 4 and versus[3].startswith("| `Schedule1F1B` with checkpointing (the same work)")


def test_table4_ranks_against_the_papers_row_with_ties(report):
    from report_tables import accuracy  # importable once `report` is loaded

    def row(mode, mean, gap=None):
        entry = {"mode": mode, "k": 1, "mean": mean, "std": 0.5}
        return entry if gap is None else {**entry, "gap_mean": gap, "gap_std": 0.1}

    result = {"settings": {"seeds": [0, 1, 2]}, "summary": [
        row("backprop", 99.0), row("reversible_backprop", 99.5, 0.5), row("delayed", 98.0, -1.0),
        row("input_buffer", 97.0, -2.0), row("weight_stash", 98.0, -1.0), row("petra", 96.5, -2.5)]}
    lines = accuracy.accuracy_table4(result).splitlines()
    cells = {line.split(" | ")[0].strip("| "): [c.strip(" |") for c in line.split(" | ")] for line in lines[2:]}
    assert cells["backprop"][3:] == ["1", "77.5", "+0.0", "1"]
    assert cells["reversible_backprop"][3:] == ["—", "—", "—", "—"]  # not in the paper's table: not ranked
    assert cells["delayed"][3] == cells["weight_stash"][3] == "2="
    assert cells["input_buffer"][3] == "4" and cells["petra"][3:] == ["5", "75.9", "-1.6", "4"]


def test_fidelity_tables_average_seeds_by_epoch(report):
    from report_tables import fidelity  # importable once `report` is loaded

    def record(seed, epoch, stage, true, stashed_true):
        return {"epoch": epoch, "stage": stage, "cosine_true": true, "cosine_stashed_true": stashed_true,
                "cosine_stashed": 0.9, "norm_ratio_true": 1.0, "norm_ratio_stashed_true": 1.0,
                "norm_ratio_stashed": 1.0}

    runs = []
    for s in (0, 1):
        records = [record(s, e, j, 0.5 + 0.1 * s, 0.4 + 0.3 * s) for e in (0.5, 1.5, 2.0) for j in (0, 1)]
        runs.append({"columns": list(records[0]), "rows": [list(r.values()) for r in records]})
    result = {"settings": {"epochs": 2}, "runs": runs}
    main = fidelity.fidelity_main(result).splitlines()
    assert main[0].count("epoch") == 2  # epochs 1 and 2
    assert main[2].startswith("| 0 | 0.550 / 0.550 / 0.900 | 0.550 / 0.550 / 0.900")
    summary = fidelity.fidelity_summary(result).splitlines()
    assert summary[2].endswith("| 50.0% |")  # seed 0: PETRA closer (0.5 > 0.4); seed 1: not (0.6 < 0.7)


def test_equal_memory_takes_the_worst_level_where_both_have_a_setting(report):
    from report_tables import throughput_rivals  # importable once `report` is loaded

    # (seconds, bytes). At 90 B only a rival runs; at 100 B the rival is 1.2x slower than PETRA (1.2 / 1.0); at
    # 300 B PETRA's second setting makes it 2.4x; at 400 B a rival at 0.4 s beats PETRA's 0.5 s: 0.8x, the worst
    petra, rivals = [(1.0, 100), (0.5, 300)], [(1.2, 90), (0.4, 400)]
    assert throughput_rivals.worst_ratio_at_equal_memory(petra, rivals) == "**0.80x**"
    assert throughput_rivals.worst_ratio_at_equal_memory(petra, rivals[:1]) == "**1.20x**"
    # a rival holding more than PETRA is still compared at its own level, where PETRA's lighter setting runs too
    assert throughput_rivals.worst_ratio_at_equal_memory([(1.0, 100)], [(0.4, 400)]) == "**0.40x**"
