"""The schedule as it really ran on 2 processes: PETRA against naive model parallelism (the engine's synchronous
`backprop` and `reversible_backprop`) and torch's `Schedule1F1B` with checkpointing, traced and drawn as per-rank
timelines.

    python benchmarks/timeline.py            # docs/images/timeline-*.png + benchmarks/results/timeline.json (1 min)
                                             # (timeline-comparison.png: PETRA, naive MP, 1F1B on one time scale)
    python benchmarks/timeline.py --quick    # tiny model: timeline-quick.json and PNGs in a temporary folder

Each method trains its own copy of the same RevNet18 (recipe width, micro-batch 32) for a few micro-batches after
a warm-up; every forward, backward, update and exchange is recorded (`Pipeline(trace=True)`) and the window is
drawn, one row per stage (`petra_hub.plots.plot_timeline`). The Chrome traces (open in ui.perfetto.dev) are
written next to the JSON. The JSON holds, per method, the busy fraction of each rank over the window: the time
inside forwards, backwards and updates over the window's length.
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

from common import add_out_argument, build_model, cross_entropy, feed, make_pipeline, progress  # noqa: E402
from common import random_batches, results_path, revnet_config, sgd, write_results  # noqa: E402
from petra_hub.engine import Placement  # noqa: E402
from petra_hub.engine.trace import EXCHANGE, Trace, events_as_dicts, gather_events, write_chrome_trace  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

METHODS = {"petra": "PETRA", "reversible_backprop": "naive model parallelism, reversible backprop",
           "backprop": "naive model parallelism, backprop",
           "1f1b": "torch Schedule1F1B, checkpointed (one PipelineStage per rank)"}
ENGINE_METHODS = ("petra", "reversible_backprop", "backprop")  # the rest are torch's schedules
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
    traced = {}
    for mode in ENGINE_METHODS:
        model = build_model(revnet_config("revnet18", width=settings.width, num_labels=10))
        pipeline = make_pipeline(model.get_stages(), mode, lr=0.01, timeout=600, trace=True)
        feed(pipeline, batches, 2 * pipeline.num_stages)  # warm-up: fill, and leave PETRA in steady state
        pipeline.trace.events.clear()
        feed(pipeline, batches, settings.micro_batches)
        events = pipeline.trace_events()
        pipeline.drain()
        traced[mode] = events_as_dicts(events)
    traced["1f1b"] = one_f_one_b(rank, world_size, settings, batches)
    return traced


def one_f_one_b(rank, world_size, settings, batches) -> list[dict]:
    """torch.distributed.pipelining's `Schedule1F1B` over the same stages, split as the engine splits them, each
    rank's group one checkpointed `PipelineStage` (throughput.py's `Part`, what PETRA is compared with at equal
    activation memory). Traced by wrapping the stage's per-micro-batch forward and backward; its sends and
    receives are not recorded (they show as gaps)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    from throughput import Part

    stages = build_model(revnet_config("revnet18", width=settings.width, num_labels=10)).get_stages()
    local = Placement.balanced(len(stages), world_size).groups[rank]
    part = Part(stages[local.start : local.stop], first=rank == 0, last=rank == world_size - 1)
    part.train()
    optimizer = sgd(part, 0.01)
    stage = PipelineStage(part, rank, world_size, torch.device("cpu"))
    count = settings.micro_batches
    schedule = Schedule1F1B(stage, n_microbatches=count, loss_fn=cross_entropy)
    trace = Trace(rank)
    for method, kind in (("forward_one_chunk", "forward"), ("backward_one_chunk", "backward")):
        def recorded(chunk, *args, _run=getattr(stage, method), _kind=kind, **kwargs):
            with trace.record(_kind, local.start, chunk):
                return _run(chunk, *args, **kwargs)

        setattr(stage, method, recorded)

    def step():
        chosen = [batches[i % len(batches)] for i in range(count)]
        if rank == 0:
            schedule.step(*[torch.cat([images for images, _ in chosen])])
        else:
            schedule.step(target=torch.cat([labels for _, labels in chosen]), losses=[])
        with trace.record("update", local.start):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    step()  # warm-up (shape inference)
    trace.events.clear()
    step()
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
    from petra_hub.plots import plot_timeline, plot_timelines

    settings = parse_args(argv)
    progress(f"2 processes, RevNet18 width {settings.width}, micro-batch {settings.batch}, "
             f"{settings.micro_batches} traced micro-batches per method")
    traced = launch(job, 2, settings, env=STABLE_MALLOC_ENV)[0]
    images = settings.images or (Path(tempfile.mkdtemp(prefix="petra-timeline-")) if settings.quick else IMAGES)
    out = results_path(settings.out, "timeline", settings.quick)
    summary, panels = {}, {}
    for mode, title in METHODS.items():
        events = [Event(**e) for e in traced[mode]]
        if mode != "reversible_backprop":
            panels[title] = events
        png = plot_timeline(events, images / f"timeline-{mode}.png",
                            title=f"{title}: {settings.micro_batches} micro-batches on 2 processes")
        traces = images if settings.quick else out.parent  # quick runs leave nothing in benchmarks/results
        chrome = write_chrome_trace(events, traces / f"{out.stem}-{mode}.trace.json")
        busy = busy_fraction(traced[mode])
        summary[mode] = {"busy_fraction": busy, "png": str(png), "chrome_trace": str(chrome)}
        progress(f"{mode}: busy fraction per rank {', '.join(f'{b:.2f}' for b in busy.values())}; {png}")
    comparison = plot_timelines(panels, images / "timeline-comparison.png")
    progress(f"side by side: {comparison}")
    return write_results(out, "timeline", "timeline.py", argv,
                         {k: str(v) for k, v in vars(settings).items()}, summary=summary)


if __name__ == "__main__":
    main()
