"""The schedule as it really ran on 2 processes: PETRA against naive model parallelism (the engine's synchronous
`backprop` and `reversible_backprop`), traced and drawn as per-rank timelines.

    python benchmarks/timeline.py            # docs/images/timeline-*.png + benchmarks/results/timeline.json (1 min)
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

from common import add_out_argument, build_model, feed, make_pipeline, progress, random_batches  # noqa: E402
from common import results_path, revnet_config, write_results  # noqa: E402
from petra_hub.engine.trace import EXCHANGE, events_as_dicts, write_chrome_trace  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

METHODS = {"petra": "PETRA", "reversible_backprop": "naive model parallelism, reversible backprop",
           "backprop": "naive model parallelism, backprop"}
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
    for mode in METHODS:
        model = build_model(revnet_config("revnet18", width=settings.width, num_labels=10))
        pipeline = make_pipeline(model.get_stages(), mode, lr=0.01, timeout=600, trace=True)
        feed(pipeline, batches, 2 * pipeline.num_stages)  # warm-up: fill, and leave PETRA in steady state
        pipeline.trace.events.clear()
        feed(pipeline, batches, settings.micro_batches)
        events = pipeline.trace_events()
        pipeline.drain()
        traced[mode] = events_as_dicts(events)
    return traced


def busy_fraction(events: list[dict]) -> dict[int, float]:
    start, end = min(e["start"] for e in events), max(e["end"] for e in events)
    busy = {}
    for event in events:
        if event["stage"] != EXCHANGE:
            busy[event["rank"]] = busy.get(event["rank"], 0.0) + event["end"] - event["start"]
    return {rank: seconds / (end - start) for rank, seconds in sorted(busy.items())}


def main(argv=None) -> dict:
    from petra_hub.engine.trace import Event
    from petra_hub.plots import plot_timeline

    settings = parse_args(argv)
    progress(f"2 processes, RevNet18 width {settings.width}, micro-batch {settings.batch}, "
             f"{settings.micro_batches} traced micro-batches per method")
    traced = launch(job, 2, settings, env=STABLE_MALLOC_ENV)[0]
    images = settings.images or (Path(tempfile.mkdtemp(prefix="petra-timeline-")) if settings.quick else IMAGES)
    out = results_path(settings.out, "timeline", settings.quick)
    summary = {}
    for mode, title in METHODS.items():
        events = [Event(**e) for e in traced[mode]]
        png = plot_timeline(events, images / f"timeline-{mode}.png",
                            title=f"{title}: {settings.micro_batches} micro-batches on 2 processes")
        traces = images if settings.quick else out.parent  # quick runs leave nothing in benchmarks/results
        chrome = write_chrome_trace(events, traces / f"{out.stem}-{mode}.trace.json")
        busy = busy_fraction(traced[mode])
        summary[mode] = {"busy_fraction": busy, "png": str(png), "chrome_trace": str(chrome)}
        progress(f"{mode}: busy fraction per rank {', '.join(f'{b:.2f}' for b in busy.values())}; {png}")
    return write_results(out, "timeline", "timeline.py", argv,
                         {k: str(v) for k, v in vars(settings).items()}, summary=summary)


if __name__ == "__main__":
    main()
