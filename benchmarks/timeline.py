"""The schedule as it really ran on 2 processes: PETRA against naive model parallelism (the engine's synchronous
`backprop` and `reversible_backprop`) and every torch.distributed.pipelining schedule of the throughput benchmark,
checkpointed, traced and drawn as per-rank timelines.

    python benchmarks/timeline.py            # docs/images/timeline-*.png + benchmarks/results/timeline.json (2 min)
                                             # (timeline-comparison.png: PETRA, naive MP, 1F1B on one time scale;
                                             # timeline-torch.png: torch's schedules on one time scale;
                                             # timeline-simulated.png: PETRA and 1F1B beside their simulation)
    python benchmarks/timeline.py --quick    # tiny model: timeline-quick.json and PNGs in a temporary folder

Each method trains its own copy of the same RevNet18 (recipe width, micro-batch 32) for a few micro-batches after
a warm-up; every forward, backward, update and exchange is recorded (`Diagnostics(trace=True)`) and the window is
drawn, one row per stage (`petra_hub.plots.plot_timeline`). Every method runs on the partition the throughput
benchmark uses: `Placement.auto`'s split of the stages' costs, profiled on rank 0 and broadcast (2W chunks for the
interleaved and V-shaped schedules, as `rivals.chunk_layout` places them). torch's schedules run through
`rivals.Rival`, checkpointed as the throughput benchmark checkpoints them, with one step of the traced micro-batches
after a warm-up step; their chunks' forwards and backwards (and the weight halves of the zero-bubble schedules' split
backwards) are recorded by wrapping the `PipelineStage` methods, their sends and receives are not (they show as
gaps). The Chrome traces (open in ui.perfetto.dev) are written next to the JSON. The JSON holds, per method, the busy
fraction of each rank over the window: the time inside forwards, backwards and updates over the window's length.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _launch import SINGLE_THREAD_ENV, STABLE_MALLOC_ENV, launch  # noqa: E402 (imports no torch)

os.environ.update(SINGLE_THREAD_ENV)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from common import add_out_argument, build_model, cross_entropy, feed, make_pipeline, progress  # noqa: E402
from common import random_batches, results_path, revnet_config, sgd, write_results  # noqa: E402
from rivals import SCHEDULES, NotApplicable, Rival, chunk_layout, contiguous_split  # noqa: E402
from petra_hub.analysis import profile_stages, simulate, simulate_1f1b  # noqa: E402
from petra_hub.engine import Diagnostics, Layout, Placement  # noqa: E402
from petra_hub.engine.trace import EXCHANGE, Trace, events_as_dicts, gather_events, write_chrome_trace  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

ENGINE_METHODS = {"petra": "PETRA", "reversible_backprop": "naive model parallelism, reversible backprop",
                  "backprop": "naive model parallelism, backprop"}
TORCH_METHODS = {name: f"torch {cls}, checkpointed" for name, (cls, *_) in SCHEDULES.items()
                 if name != "1f1b_but_last"}  # fmt: skip
METHODS = ENGINE_METHODS | TORCH_METHODS
IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batches", type=int, default=None, help="traced window (default 8; quick: 4)")
    parser.add_argument("--images", type=Path, default=None, help=f"PNG folder (default {IMAGES})")
    parser.add_argument("--quick", action="store_true")
    add_out_argument(parser, "timeline")
    args = parser.parse_args(argv)
    args.micro_batches = args.micro_batches or (4 if args.quick else 8)
    args.width = QUICK_WIDTH if args.quick else RECIPE_WIDTH
    args.batch = 8 if args.quick else 32
    return args


def job(rank, world_size, settings):
    torch.manual_seed(0)
    batches = random_batches(4, settings.batch, 32)

    def revnet18_stages():
        return build_model(revnet_config("revnet18", width=settings.width, num_labels=10)).get_stages()

    # the stages' costs under PETRA (the throughput benchmark's split) and plain backprop (the 1F1B simulation),
    # measured once and shared
    profiled = [{mode: profile_stages(revnet18_stages(), batches[0], cross_entropy, mode=mode)
                 for mode in ("petra", "backprop")} if rank == 0 else None]  # fmt: skip
    dist.broadcast_object_list(profiled, src=0)
    costs = [c.compute_s for c in profiled[0]["petra"]]
    partition = contiguous_split(costs, world_size)
    traced = {}
    for mode in ENGINE_METHODS:
        pipeline = make_pipeline(revnet18_stages(), mode, lr=0.01, timeout=600, layout=Layout(partition=partition),
                                 diagnostics=Diagnostics(trace=True))
        feed(pipeline, batches, 2 * pipeline.num_stages)  # warm-up: fill, and leave PETRA in steady state
        pipeline.trace.events.clear()
        feed(pipeline, batches, settings.micro_batches)
        events = pipeline.trace_events()
        pipeline.drain()
        traced[mode] = events_as_dicts(events)
    layout = chunk_layout(costs, partition, world_size)
    for name in TORCH_METHODS:
        traced[name] = torch_schedule(name, rank, world_size, settings, batches, revnet18_stages(), layout)
    return traced, partition, profiled[0]


def simulated_beside_measured(traced, costs, partition, micro_batches) -> dict[str, list]:
    """PETRA and checkpointed 1F1B as measured, each beside `simulate` / `simulate_1f1b` from the profiled costs
    (free transfers), over windows like the measured ones: m ticks of PETRA's steady state, 1F1B's second step."""
    from petra_hub.engine.trace import Event

    placement = Placement.from_sizes(partition)
    petra = simulate("petra", costs["petra"], placement, micro_batches=4 * len(costs["petra"]) + micro_batches)
    first = 2 * len(costs["petra"])  # a micro-batch of the steady state: the window is its tick and the next m - 1

    def entered(micro_batch):
        return min(e.start for e in petra.events if e.micro_batch == micro_batch and e.kind == "forward")

    start, end = entered(first), entered(first + micro_batches)
    rival = simulate_1f1b(costs["backprop"], placement, micro_batches, "all", steps=2)
    second = min(e.start for e in rival.events if e.micro_batch == micro_batches)
    return {
        "PETRA, measured": [Event(**e) for e in traced["petra"]],
        "PETRA, simulated": [e for e in petra.events if start <= e.start < end],
        "torch Schedule1F1B, checkpointed, measured": [Event(**e) for e in traced["1f1b"]],
        "Schedule1F1B, checkpointed, simulated (simulate_1f1b)": [e for e in rival.events if e.start >= second],
    }


def torch_schedule(name, rank, world_size, settings, batches, stages, layout) -> list[dict] | str:
    """torch.distributed.pipelining's schedule `name` (`rivals.SCHEDULES`) over the stages, checkpointed, one step of
    `settings.micro_batches` micro-batches traced after a warm-up step; or why torch refuses that setting. Traced by
    wrapping each local `PipelineStage`'s per-micro-batch forward and backward (and weight backward)."""
    try:
        rival = Rival(name, SCHEDULES[name][3], settings.micro_batches, stages, layout, rank, world_size,
                      cross_entropy, lambda module: sgd(module, 0.01))
    except NotApplicable as reason:
        return str(reason)
    trace = Trace(rank)
    methods = (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward"),
               ("backward_weight_one_chunk", "backward (weights)"))
    for stage, first in zip(rival.pipeline_stages, rival.first_stages):
        for method, kind in methods:
            def recorded(chunk, *args, _run=getattr(stage, method), _kind=kind, _first=first, **kwargs):
                with trace.record(_kind, _first, chunk):
                    return _run(chunk, *args, **kwargs)

            setattr(stage, method, recorded)

    def step(first_micro_batch):
        rival.step(batches, first_micro_batch, update=False)
        with trace.record("update", rival.first_stages[0]):
            rival.optimizer.step()
            rival.optimizer.zero_grad(set_to_none=True)

    step(0)  # warm-up (shape inference)
    trace.events.clear()
    step(rival.m)
    return events_as_dicts(gather_events(trace, True))


def busy_fraction(events: list[dict]) -> dict[int, float]:
    start, end = min(e["start"] for e in events), max(e["end"] for e in events)
    busy = {}
    for event in events:
        if event["stage"] != EXCHANGE:
            busy[event["rank"]] = busy.get(event["rank"], 0.0) + event["end"] - event["start"]
    return {rank: seconds / (end - start) for rank, seconds in sorted(busy.items())}


def main(argv=None) -> dict:
    from petra_hub.engine.trace import Event
    from petra_hub.plots import plot_timelines

    settings = parse_args(argv)
    progress(f"2 processes, RevNet18 width {settings.width}, micro-batch {settings.batch}, "
             f"{settings.micro_batches} traced micro-batches per method")
    traced, partition, costs = launch(job, 2, settings, env=STABLE_MALLOC_ENV)[0]
    images = settings.images or (Path(tempfile.mkdtemp(prefix="petra-timeline-")) if settings.quick else IMAGES)
    out = results_path(settings.out, "timeline", settings.quick)
    summary, panels, torch_panels = {}, {}, {}
    for mode, title in METHODS.items():
        if isinstance(traced[mode], str):  # torch refused the setting
            summary[mode] = {"not_applicable": traced[mode]}
            progress(f"{mode}: not applicable: {traced[mode]}")
            continue
        events = [Event(**e) for e in traced[mode]]
        if mode in ("petra", "backprop", "1f1b"):
            panels[title] = events
        if mode in TORCH_METHODS:
            torch_panels[title] = events
        titled = f"{title}: {settings.micro_batches} micro-batches on 2 processes"
        png = plot_timelines({titled: events}, images / f"timeline-{mode}.png",
                             {titled: sum(partition)} if mode in TORCH_METHODS else None)
        traces = images if settings.quick else out.parent  # quick runs leave nothing in benchmarks/results
        chrome = write_chrome_trace(events, traces / f"{out.stem}-{mode}.trace.json")
        busy = busy_fraction(traced[mode])
        summary[mode] = {"busy_fraction": busy, "png": str(png), "chrome_trace": str(chrome)}
        progress(f"{mode}: busy fraction per rank {', '.join(f'{b:.2f}' for b in busy.values())}; {png}")
    chunked = {title: sum(partition) for title in TORCH_METHODS.values()}  # torch records a chunk's first stage
    comparison = plot_timelines(panels, images / "timeline-comparison.png", chunked)
    schedules = plot_timelines(torch_panels, images / "timeline-torch.png", chunked)
    beside = simulated_beside_measured(traced, costs, partition, settings.micro_batches)
    simulated = plot_timelines(beside, images / "timeline-simulated.png",
                               {title: sum(partition) for title in beside if "1F1B" in title})
    progress(f"side by side: {comparison}, {schedules}, {simulated}")
    settings.partition = partition
    return write_results(out, "timeline", "timeline.py", argv,
                         {k: str(v) for k, v in vars(settings).items()}, summary=summary)


if __name__ == "__main__":
    main()
