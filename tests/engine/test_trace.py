"""Pipeline(trace=True): every operation recorded with timestamps, exported as a Chrome trace, drawn as a timeline."""

import json

import pytest
import torch
import torch.nn.functional as F

from petra_hub.engine import Diagnostics, Pipeline, PipelineError
from petra_hub.engine.trace import EXCHANGE, write_chrome_trace
from petra_hub.testing.models import random_images, small_model
from petra_hub.testing.ranks import run_ranks

MICRO_BATCHES = 6


def traced_run(trace=True):
    model = small_model("revnet18", dtype=torch.float32).train()
    pipeline = Pipeline(model.get_stages(), lambda out, labels: F.cross_entropy(out, labels),
                        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.01), timeout=30,
                        diagnostics=Diagnostics(trace=trace))
    images, labels = random_images(model.config, batch=4, dtype=torch.float32), torch.tensor([0, 1, 2, 3])
    for _ in range(MICRO_BATCHES):
        pipeline.step(images, labels)
    pipeline.drain()
    return pipeline


def test_every_operation_is_one_event_in_schedule_order():
    pipeline = traced_run()
    events = pipeline.trace_events()
    J = pipeline.num_stages
    counts = {
        kind: sum(e.kind == kind for e in events) for kind in ("forward", "backward", "forward+backward", "update")
    }
    assert counts == {"forward": (J - 1) * MICRO_BATCHES, "backward": (J - 1) * MICRO_BATCHES,
                      "forward+backward": MICRO_BATCHES, "update": J * MICRO_BATCHES}
    assert all(e.end >= e.start for e in events)
    for stage in range(J - 1):  # a stage's forward of micro-batch m precedes its backward of m
        forwards = {e.micro_batch: e.start for e in events if e.stage == stage and e.kind == "forward"}
        backwards = {e.micro_batch: e.start for e in events if e.stage == stage and e.kind == "backward"}
        assert forwards.keys() == backwards.keys() == set(range(MICRO_BATCHES))
        assert all(forwards[m] < backwards[m] for m in forwards)
    # PETRA's delay: stage 0 runs micro-batch 1's forward before micro-batch 0's backward
    first = [(e.kind, e.micro_batch) for e in sorted(events, key=lambda e: e.start) if e.stage == 0]
    assert first.index(("forward", 1)) < first.index(("backward", 0))


def test_chrome_trace_and_timeline_png(tmp_path):
    events = traced_run().trace_events()
    trace = json.loads(write_chrome_trace(events, tmp_path / "trace.json").read_text())
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(events) and all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    assert {e["tid"] for e in complete} == {f"stage {i}" for i in range(10)}
    from petra_hub.plots import plot_timeline

    png = plot_timeline(events, tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_the_flag_nothing_is_recorded():
    pipeline = traced_run(trace=False)
    assert pipeline.trace is None
    with pytest.raises(PipelineError, match="trace=True"):
        pipeline.trace_events()


def _traced_ranks(rank, world_size):
    events = traced_run().trace_events()
    return [(e.kind, e.rank, e.stage, e.micro_batch) for e in events]


def test_two_processes_gather_every_rank_with_its_exchanges(tmp_path):
    torch.set_num_threads(1)
    results, codes, _ = run_ranks(_traced_ranks, 2, out_dir=tmp_path, deadline=120)
    assert codes == [0, 0], [r and r.get("traceback") for r in results]
    events = results[0]["value"]
    assert events == results[1]["value"]  # gathered on every rank
    assert {stage for _, rank, stage, _ in events if rank == 0 and stage != EXCHANGE} == set(range(5))
    assert {stage for _, rank, stage, _ in events if rank == 1 and stage != EXCHANGE} == set(range(5, 10))
    assert all(
        sum(1 for kind, r, _, _ in events if kind == "exchange" and r == rank) > MICRO_BATCHES for rank in (0, 1)
    )


def _traced_subgroup(rank, world_size, members):
    import torch.distributed as dist

    group = dist.new_group(members)  # a collective: every rank creates it
    if rank not in members:
        return None  # not part of the pipeline: gone before the others gather
    torch.manual_seed(0)
    pipeline = Pipeline([torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)], F.cross_entropy, group=group,
                        timeout=10, diagnostics=Diagnostics(trace=True))
    batch = (torch.randn(3, 4), torch.randint(0, 2, (3,)))
    for _ in range(3):
        pipeline.step(*batch)
    pipeline.drain()
    return [(e.kind, e.rank, e.stage) for e in pipeline.trace_events()]


@pytest.mark.parametrize("members", [[0, 1], [1, 2]])
def test_a_pipeline_on_a_subgroup_gathers_over_its_group(tmp_path, members):
    """Three processes, a pipeline on two of them: the gather runs over the pipeline's group (over the default one
    it waited for the third process until the process group's timeout), and each event names its global rank."""
    results, codes, _ = run_ranks(_traced_subgroup, 3, members, out_dir=tmp_path, deadline=60, pg_timeout=10)
    assert codes == [0, 0, 0] and not any("error" in r for r in results), [r.get("traceback") for r in results]
    first, second = (results[rank]["value"] for rank in members)
    assert first == second  # gathered on both
    assert {(rank, stage) for kind, rank, stage in first if stage != EXCHANGE} == set(zip(members, (0, 1)))
