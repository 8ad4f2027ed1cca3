#!/usr/bin/env python
"""Each process on its own cores, or wherever the scheduler puts it: PETRA on 2 processes, launched both ways.

    python benchmarks/affinity.py            # benchmarks/results/affinity.json (~5 min)
    python benchmarks/affinity.py --quick    # tiny model, 1 round: affinity-quick.json

Round after round, the same PETRA runs (RevNet18 at the recipe width, micro-batch 32, each `--groups` setting) are
launched twice, once free and once with `bind_cores` (rank r bound to its share of the cores, `testing.affinity`),
in alternating order. Each run times a window of micro-batches after a warm-up (the slower rank's wall time per
micro-batch) and, traced, how far each rank's operations' mean time sits above their median (the tail that a rank
woken on a cold core pays). The report gives the medians over rounds and the median of the paired ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _launch import SINGLE_THREAD_ENV, STABLE_MALLOC_ENV, launch  # noqa: E402 (imports no torch)

os.environ.update(SINGLE_THREAD_ENV)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from common import add_out_argument, build_model, feed, make_pipeline, parse_groups, progress  # noqa: E402
from common import random_batches, results_path, revnet_config, write_results  # noqa: E402
from petra_hub.engine import Diagnostics, Layout, MemoryOptions, merge_stages  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", nargs="+", default=["4/6", "4k/6"],
                        help="PETRA settings as in throughput.py's --petra-groups (default 4/6 4k/6)")
    parser.add_argument("--rounds", type=int, default=None, help="launch pairs (default 5; quick 1)")
    parser.add_argument("--micro-batches", type=int, default=None, help="per timed window (default 40; quick 4)")
    parser.add_argument("--quick", action="store_true")
    add_out_argument(parser, "affinity")
    args = parser.parse_args(argv)
    try:
        args.settings = [parse_groups(spec) for spec in args.groups]
    except ValueError:
        parser.error(f"--groups: expected group sizes like 4/6 or 4k/6, got {args.groups}")
    if any(len(per_rank) != 2 for _, per_rank, _ in args.settings):
        parser.error("--groups: every setting needs 2 ranks ('/'-separated)")
    if len(os.sched_getaffinity(0)) < 2:
        parser.error("needs at least 2 cores, one per process")
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.micro_batches = args.micro_batches or (4 if args.quick else 40)
    if args.rounds < 1 or args.micro_batches < 1:
        parser.error("--rounds and --micro-batches must be >= 1")
    args.width = QUICK_WIDTH if args.quick else RECIPE_WIDTH
    args.batch = 8 if args.quick else 32
    return args


def job(rank, world_size, settings) -> dict:
    """Every setting once: {spec: (the slower rank's seconds per micro-batch, [per rank: mean / median of its
    operations' times])}."""
    torch.manual_seed(0)
    batches = random_batches(4, settings.batch, 32)
    config = revnet_config("revnet18", width=settings.width, num_labels=10)
    out = {}
    for spec, (groups, partition, kept) in zip(settings.groups, settings.settings):
        stages = merge_stages(build_model(config).get_stages(), groups)
        pipeline = make_pipeline(stages, "petra", lr=0.01, timeout=600, layout=Layout(partition=partition),
                                 memory=MemoryOptions(keep_graphs=kept), diagnostics=Diagnostics(trace=True))
        feed(pipeline, batches, pipeline.schedule.latency + 4)
        dist.barrier()
        start = time.perf_counter()
        feed(pipeline, batches, settings.micro_batches)
        end = time.perf_counter()
        pipeline.drain()
        events = [e for e in pipeline.trace_events() if start <= e.start < end]
        every = [None] * world_size
        dist.all_gather_object(every, (end - start) / settings.micro_batches)
        out[spec] = (max(every), [tail(events, r) for r in range(world_size)])
    return out


def tail(events, rank: int) -> float:
    """Mean over median of each of `rank`'s kinds of operation, weighted by their time."""
    by_kind = {}
    for e in events:
        if e.rank == rank and e.stage >= 0 and e.kind != "update":
            by_kind.setdefault((e.stage, e.kind), []).append(e.end - e.start)
    means = sum(statistics.fmean(d) for d in by_kind.values())
    return means / sum(statistics.median(d) for d in by_kind.values())


def main(argv=None) -> dict:
    settings = parse_args(argv)
    progress(f"2 processes, RevNet18 width {settings.width}, PETRA {' '.join(settings.groups)}, {settings.rounds} "
             f"rounds, {len(os.sched_getaffinity(0))} cores")
    runs = {"free": [], "bound": []}
    for round_ in range(settings.rounds):
        for how in ("free", "bound") if round_ % 2 == 0 else ("bound", "free"):
            runs[how].append(launch(job, 2, settings, env=STABLE_MALLOC_ENV, bind_cores=how == "bound")[0])
            progress(f"round {round_ + 1} {how:5s}: " + ", ".join(
                f"{spec} {1e3 * seconds:.1f} ms" for spec, (seconds, _) in runs[how][-1].items()))
    rows = []
    for spec in settings.groups:
        free = [run[spec][0] for run in runs["free"]]
        bound = [run[spec][0] for run in runs["bound"]]
        rows.append({
            "groups": spec, "free_s": statistics.median(free), "bound_s": statistics.median(bound),
            "free_over_bound": statistics.median(f / b for f, b in zip(free, bound)),
            "tail_free": [statistics.median(run[spec][1][r] for run in runs["free"]) for r in range(2)],
            "tail_bound": [statistics.median(run[spec][1][r] for run in runs["bound"]) for r in range(2)],
            "free_runs_s": free, "bound_runs_s": bound,
        })
        row = rows[-1]
        progress(f"{spec}: free {1e3 * row['free_s']:.1f} ms, bound {1e3 * row['bound_s']:.1f} ms, free / bound "
                 f"{row['free_over_bound']:.3f}; operations' mean / median free {row['tail_free']}, bound "
                 f"{row['tail_bound']}")
    out = results_path(settings.out, "affinity", settings.quick)
    return write_results(out, "affinity", "affinity.py", argv,
                         {k: str(v) for k, v in vars(settings).items() if k != "out"}, rows=rows)


if __name__ == "__main__":
    main()
