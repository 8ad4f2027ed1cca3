"""benchmarks/throughput.py's torch schedules (benchmarks/rivals.py): every rival timed and its activation memory
measured, the chunk layouts, the report's tables; and why the zero-bubble schedules checkpoint with
`recompute_once`. The numbers of a real run are a benchmark result (docs/benchmarks-throughput.md), not a test."""

import json
import sys
from pathlib import Path

import pytest
import torch

from .conftest import load, run_quick

STAGES = "SRRDRDRDRH"  # RevNet18: stem, 8 blocks (3 downsampling), head


@pytest.fixture(scope="module")
def rivals():
    yield load("rivals")
    sys.modules.pop("benchmark_rivals", None)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The quick mode, cut down: 2 processes, widths 4, micro-batches of 2 images of 8x8, m = 4 (DualPipeV's least
    with 2 ranks), 1 window of 4 micro-batches per method. A subprocess: the benchmark spawns its ranks, which
    import it by its module name."""
    out = tmp_path_factory.mktemp("throughput") / "throughput-quick.json"
    return run_quick("throughput", out, "--repeats", "1", "--micro-batches", "4", "--batch", "2", "--image-size", "8",
                     "--pp-microbatches", "4", "--petra-groups", "1,2/7", "4/6", "5k/5")


@pytest.mark.benchmark_run
def test_every_rival_is_timed_and_measured_with_and_without_checkpointing(quick_run, rivals):
    records, multi = quick_run["multi"]["rivals"], quick_run["multi"]
    settings = {(r["schedule"], r["checkpointed"], r["m"]): r for r in records}
    assert set(settings) == {(name, checkpointed, 4) for name in rivals.SCHEDULES for checkpointed in (True, False)
                             if checkpointed or name != "1f1b_but_last"}  # fmt: skip
    for (name, checkpointed, _), record in settings.items():
        assert record["status"] == "measured", record
        assert record["torch_class"] == rivals.SCHEDULES[name][0]
        times = multi["times"][record["key"]]
        assert len(times) == 1 and times[0] > 0
        assert len(record["peak_bytes"]) == 2 and min(record["peak_bytes"]) > 0
        # one forward per micro-batch and local chunk, plus exactly one recomputation when checkpointed
        chunks_per_rank = rivals.SCHEDULES[name][1]
        forwards = [[2.0 if checkpointed else 1.0] * chunks_per_rank] * 2
        if name == "1f1b_but_last":
            forwards = [[2.0], [1.0]]  # rank 1 holds the last chunk, which keeps its graph
        assert record["forwards_per_micro_batch"] == forwards
    assert "1f1b_m4" in multi["times"]  # checkpointed 1F1B keeps the key the older tables read
    for name in ("1f1b", "interleaved_1f1b"):  # full backward: checkpointing keeps only each chunk's input
        assert max(settings[name, True, 4]["peak_bytes"]) < max(settings[name, False, 4]["peak_bytes"])
    # checkpointing the last chunk saves nothing there: it holds one micro-batch, as without checkpointing
    selective, everywhere = settings["1f1b_but_last", True, 4]["peak_bytes"], settings["1f1b", True, 4]["peak_bytes"]
    assert abs(selective[0] - everywhere[0]) <= 0.05 * everywhere[0]
    assert selective[1] <= 1.1 * settings["1f1b", False, 4]["peak_bytes"][1]


@pytest.mark.benchmark_run
def test_engine_modes_measured_with_the_same_method(quick_run):
    peaks, info = quick_run["multi"]["info"]["activation_peak_bytes"], quick_run["multi"]["info"]
    grouped = {"petra_groups_1,2/7": ("SRH", [1, 2, 7], [2, 1], []), "petra_groups_4/6": ("SH", [4, 6], [1, 1], []),
               "petra_groups_5k/5": ("SH", [5, 5], [1, 1], [0])}
    assert set(peaks) == {"petra", "reversible_backprop", "backprop", *grouped}
    for name, (layout, groups, partition, kept) in grouped.items():  # PETRA on coarser engine stages (--petra-groups)
        assert info["petra_groups"][name] == {"groups": groups, "partition": partition, "layout": layout, "kept": kept}
        assert len(quick_run["multi"]["times"][name]) == 1
    # rank 0 keeping its group's graphs holds more than storing its input (4/6: 3 images) and recomputing
    assert peaks["petra_groups_5k/5"][0] > peaks["petra_groups_4/6"][0]
    assert all(len(p) == 2 and min(p) > 0 for p in peaks.values())
    # the measurement sees PETRA's input FIFOs (engine accounting) and more: the messages in flight, the
    # recomputation; only the images (allocated before) are not in it
    images = 4 * quick_run["one"]["image_bytes"]
    assert all(peak >= held - images for peak, held in zip(peaks["petra"], info["petra_held_bytes"]))
    assert max(peaks["reversible_backprop"]) < max(peaks["petra"])  # nothing kept between micro-batches


@pytest.mark.benchmark_run
def test_chunk_layouts_cover_every_stage_once(quick_run):
    chunks, W = quick_run["chunks"], 2
    assert chunks["1f1b"] == {"sizes": quick_run["partition"], "ranks": [0, 1]}
    assert chunks["loop"]["ranks"] == [0, 1, 0, 1] and chunks["v"]["ranks"] == [0, 1, 1, 0]
    assert chunks["loop"]["sizes"] == chunks["v"]["sizes"]
    for layout in chunks.values():
        assert sum(layout["sizes"]) == len(STAGES) and min(layout["sizes"]) >= 1
        assert sorted(layout["ranks"]) == sorted(list(range(W)) * (len(layout["ranks"]) // W))
    assert quick_run["one"]["layout"] == STAGES


@pytest.mark.benchmark_run
def test_report_renders_the_rivals_and_equal_memory(quick_run, report, tmp_path):
    (tmp_path / "throughput-quick.json").write_text(json.dumps(quick_run))
    rows = {name: report.render(f"throughput-quick/{name}", tmp_path).splitlines()
            for name in ("chunks", "rivals", "equal-memory", "petra-settings", "goals")}  # fmt: skip
    assert len(rows["chunks"]) == 2 + 4
    assert len(rows["rivals"]) == 2 + 6 + 11 and rows["rivals"][2].startswith("| PETRA")
    assert len(rows["equal-memory"]) == 2 + 2 + 5
    assert len(rows["petra-settings"]) == 2 + 4 and "S R H (groups 1,2/7)" in rows["petra-settings"][3]
    assert "S H (groups 5k/5, engine stage 0 keeping its graph)" in rows["petra-settings"][5]
    assert len(rows["goals"]) == 3 and rows["goals"][2].count("x** |") == 2
    for table in ("equal-memory", "petra-settings"):
        assert all(row.count("|") == rows[table][0].count("|") for row in rows[table])
    # results written before the rivals still render, with a note instead of the new tables
    from report_tables.throughput import NOT_MEASURED  # importable once `report` is loaded

    data = Path(__file__).resolve().parent / "data"
    for name in ("chunks", "rivals", "equal-memory", "petra-settings"):
        assert report.render(f"throughput-quick/{name}", data) == NOT_MEASURED


def test_zero_bubble_checkpointing_recomputes_once(rivals):
    """The split backward of the zero-bubble schedules (torch's stage_backward_input, then stage_backward_weight)
    over a checkpointed chunk: `torch.utils.checkpoint` recomputes the forward in every `torch.autograd.grad` call
    (the input gradient, then each group of weights), `recompute_once` once; the gradients are the same."""
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

    common = load("common")
    torch.manual_seed(0)
    stages = common.build_model(common.revnet_config("revnet18", width=4, num_labels=10)).get_stages()
    x = torch.cat(stages[1](stages[0](torch.randn(2, 3, 8, 8))), dim=1).detach()
    found = {}
    for checkpointing in (None, "torch", "once"):
        part = rivals.Part(stages[2:4], first=False, last=False, checkpointing=checkpointing)
        part.zero_grad(set_to_none=True)
        leaf = x.clone().requires_grad_()
        output = part(leaf)
        (grad_input,), groups = stage_backward_input([output], [torch.ones_like(output)], [leaf], part.parameters())
        stage_backward_weight(part.parameters(), groups)
        found[checkpointing] = (part.runs, len(groups), grad_input, [p.grad for p in part.parameters()])
    runs, groups = found["torch"][:2]
    assert groups > 1 and runs == 2 + groups  # forward, input pass, one recomputation per weight group
    assert found["once"][0] == 2 and found[None][0] == 1
    for checkpointing in ("torch", "once"):
        assert torch.equal(found[checkpointing][2], found[None][2])
        assert all(torch.equal(a, b) for a, b in zip(found[checkpointing][3], found[None][3]))
