#!/usr/bin/env python
"""The schedule simulator against real 2-process runs: predicted and measured time per micro-batch.

    python benchmarks/simulator.py            # 6 modes x 3 partitions, RevNet18 recipe width (~2 min)
    python benchmarks/simulator.py --quick    # 2 modes x 1 partition, tiny model: simulator-quick.json
    python benchmarks/simulator.py --modes petra --groups 1,2/7 4/6 --out benchmarks/results/simulator_groups.json
                                              # PETRA on coarser engine stages instead of the 3 partitions
    python benchmarks/simulator.py --modes --rival-microbatches 2 8 18 --out benchmarks/results/simulator_1f1b.json
                                              # torch's Schedule1F1B against `simulate_schedule` instead

In a gloo group of 2 processes (one thread each): both ranks measure the stages of every mode with `profile_stages`
at the same time (medians of 5 timings after the pipeline has filled, averaged over the ranks, so that the timings
see the machine as busy as during the run), both ranks measure the link (bandwidth by a ping-pong, whether its two
directions share it by a swap, the per-tick exchange cost on a pipeline of near-empty stages), and then, for every
mode and partition, train for a warm-up and time 3 windows of micro-batches (the slower rank's wall time per
micro-batch, median over the windows), traced. `simulate` predicts the same from the profile and the link; the JSON
holds both, the relative error, each rank's time in operations and in exchanges during the windows, and the
prediction from the operations' mean times in the run instead of the profile's. With
`--rival-microbatches`, torch's `Schedule1F1B` (one chunk per rank, on each partition, without checkpointing,
checkpointed, and checkpointed on every chunk but the last) is measured the same way at each n_microbatches m and
predicted by `simulate_schedule` from the stages profiled under the engine's `backprop` mode (the ranks paying for
each transfer, as processes sharing this machine's cores do, and with torch's buffers; beside it the prediction with
transfers overlapping compute and the memory the schedule itself needs); `--rival-schedules` adds torch's
multi-chunk schedules (rivals.py's names, on its 2W chunks, without and with checkpointing). Every run's allocation
peak per rank (`rivals.pipeline_peak`, measured fresh as the throughput benchmark does) stands beside the
simulated peak memory, both without the parameters.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
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

from common import add_out_argument, build_model, cross_entropy, feed, make_pipeline, progress  # noqa: E402
from common import parse_groups, random_batches, results_path, revnet_config, sgd, write_results  # noqa: E402
from petra_hub.analysis import profile_stages, simulate, simulate_schedule  # noqa: E402
from petra_hub.engine import Diagnostics, Layout, MemoryOptions, Mode, Placement, StageCost, merge_stages  # noqa: E402
from petra_hub.engine.trace import EXCHANGE  # noqa: E402
from rivals import SCHEDULES, NotApplicable, Rival, chunk_layout, chunk_owner, measure_fresh  # noqa: E402
from rivals import pipeline_peak  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

PARTITIONS = ([5, 5], [4, 6], [6, 4])
LR = 0.01  # every run's SGD (momentum 0.9), whose step the profile times
MULTI_CHUNK = [key for key, (_, per_rank, _, _) in SCHEDULES.items() if per_rank > 1]  # rivals.py's names


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="*", default=None, help="default: all six (quick: petra backprop)")
    parser.add_argument("--rival-microbatches", nargs="+", type=int, default=[],
                        help="also torch's schedules at these n_microbatches, against simulate_schedule")
    parser.add_argument("--rival-schedules", nargs="+", default=["1f1b"],
                        choices=["1f1b", *MULTI_CHUNK],
                        help="with --rival-microbatches: which (default 1f1b; rivals.py's names)")
    parser.add_argument("--micro-batches", type=int, default=None, help="per timed window (default 12; quick 4)")
    parser.add_argument(
        "--groups", nargs="+", default=None,
        help="instead of the 3 partitions of the model's stages: coarser engine stages, each the group sizes per rank "
             "(ranks separated by '/', groups by ','), e.g. 1,2/7 4/6; a group ending in k keeps its graph: 4k/6",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true")
    add_out_argument(parser, "simulator")
    args = parser.parse_args(argv)
    try:
        args.groups = [parse_groups(spec) for spec in args.groups or []]
    except ValueError:
        parser.error(f"--groups: expected group sizes like 1,2/7, got {args.groups}")
    if any(len(stages_per_rank) != 2 for _, stages_per_rank, _ in args.groups):
        parser.error("--groups: every setting needs 2 ranks ('/'-separated)")
    if args.modes is None:
        args.modes = ["petra", "backprop"] if args.quick else Mode.names()
    if any(m < 1 for m in args.rival_microbatches):
        parser.error(f"--rival-microbatches: expected positive counts, got {args.rival_microbatches}")
    args.micro_batches = args.micro_batches or (4 if args.quick else 12)
    args.width = QUICK_WIDTH if args.quick else RECIPE_WIDTH
    args.batch = 8 if args.quick else 32
    # (group sizes or None, stages per rank, engine stages keeping their graph): the 3 partitions of the model's
    # own stages, or the --groups
    args.settings = [(None, p, []) for p in (PARTITIONS[:1] if args.quick else PARTITIONS)]
    if args.groups:
        args.settings = args.groups
    return args


def link(rank: int, repeats: int = 20) -> dict:
    """The link as the engine uses it: "latency_s", "bandwidth_Bps", "duplex" (with the timings behind them).
    Bandwidth: 4 MB over the median one-way time of a ping-pong (an underestimate by the latency, small at this
    size). Duplex: whether a swap of 4 MB each way (both posted at once, as the engine posts a tick's payloads) takes
    less than 1.5 one-way times; on loopback the CPUs copy every byte, so the two directions share them and a swap
    costs about two sends. Latency: half the time per tick of a 2-stage pipeline of near-empty stages (synchronous,
    so every tick is one header swap and one payload exchange, with the engine's own Python around them), which is
    what the simulator charges per tick (2 x latency)."""
    message, reply = torch.randn(2**20), torch.empty(2**20)  # 4 MB
    one_way, swap = [], []
    for _ in range(repeats + 3):  # the first 3 warm the link up
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(message, 1)
            dist.recv(reply, 1)
        else:
            dist.recv(reply, 0)
            dist.send(message, 0)
        one_way.append((time.perf_counter() - start) / 2)
        dist.barrier()
        start = time.perf_counter()
        for work in (dist.irecv(reply, 1 - rank), dist.isend(message, 1 - rank)):
            work.wait()
        swap.append(time.perf_counter() - start)
    one_way_s, swap_s = statistics.median(one_way[3:]), statistics.median(swap[3:])
    stages = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)]
    pipeline = make_pipeline(stages, "backprop", lr=LR, timeout=600)
    inputs, labels = torch.randn(2, 4), torch.tensor([0, 1])
    feed(pipeline, [(inputs, labels)], 5)
    samples = []
    for _ in range(5):
        dist.barrier()
        start = time.perf_counter()
        feed(pipeline, [(inputs, labels)], repeats)
        samples.append((time.perf_counter() - start) / (repeats * pipeline.schedule.ticks_per_micro_batch))
    return {"latency_s": statistics.median(samples) / 2, "bandwidth_Bps": 4 * 2**20 / one_way_s,
            "duplex": swap_s < 1.5 * one_way_s, "one_way_4MB_s": one_way_s, "swap_4MB_s": swap_s}


def profile_on_every_rank(stages, sample, mode: str, world_size: int, **options) -> list[StageCost]:
    """Every rank profiles the stages at once, so that each timing sees the other process using the machine as it
    will during the run (the 2 cores share caches and memory bandwidth); the timings are averaged over the ranks.
    `options` go to `profile_stages` (e.g. `memory`)."""
    mine = profile_stages(stages, sample, cross_entropy, mode=mode, optimizer_factory=lambda i, s: sgd(s, LR),
                          **options)
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    timed = ("forward_s", "backward_s", "update_s", "overhead_s")
    return [replace(cost, **{f: statistics.fmean(getattr(c[i], f) for c in everyone) for f in timed})
            for i, cost in enumerate(mine)]


def job(rank, world_size, settings):
    torch.manual_seed(0)
    batches = random_batches(4, settings.batch, 32)
    config = revnet_config("revnet18", width=settings.width, num_labels=10)
    measured_link = link(rank)
    latency, bandwidth, duplex = (measured_link[key] for key in ("latency_s", "bandwidth_Bps", "duplex"))
    rows, auto = [], {}

    def stages(groups):
        model_stages = build_model(config).get_stages()
        return merge_stages(model_stages, groups or len(model_stages))

    for mode in settings.modes:
        profiled = {}  # (group sizes, kept) -> costs
        for groups, partition, kept in settings.settings:
            key = tuple(groups or ()), tuple(kept)
            if key not in profiled:
                profiled[key] = profile_on_every_rank(stages(groups), batches[0], mode, world_size,
                                                       memory=MemoryOptions(keep_graphs=kept))
            costs = profiled[key]
            if groups is None and mode not in auto:
                chosen = Placement.auto(costs, world_size, link_bandwidth=bandwidth, latency=2 * latency)
                auto[mode] = [len(group) for group in chosen.groups]
            pipeline = make_pipeline(stages(groups), mode, lr=LR, timeout=600, layout=Layout(partition=partition),
                                     memory=MemoryOptions(keep_graphs=kept), diagnostics=Diagnostics(trace=True))
            peak = pipeline_peak(pipeline, batches)
            feed(pipeline, batches, pipeline.schedule.latency if pipeline.mode.pipelined else 2)
            timed = (time.perf_counter(), None)
            windows = slowest_rank_windows(lambda: feed(pipeline, batches, settings.micro_batches),
                                           settings.micro_batches, world_size)
            timed = (timed[0], time.perf_counter())
            pipeline.drain()
            inside = [e for e in pipeline.trace_events() if timed[0] <= e.start < timed[1]]
            split = time_split(inside, 3 * settings.micro_batches, world_size)
            predicted, overlapped, full_duplex, from_run = (
                simulate(mode, stage_costs, Placement.from_sizes(partition), link_bandwidth=bandwidth,
                         latency=latency, overlap_transfers=overlap, duplex=two_ways)
                for stage_costs, overlap, two_ways in ((costs, False, duplex), (costs, True, duplex),
                                                       (costs, False, True), (as_run(costs, inside), False, duplex)))
            row = compared(mode, partition, groups, windows, peak, predicted, costs, world_size)
            profiled_ops = [sum(costs[i].compute_s for i in group) for group in Placement.from_sizes(partition).groups]
            rows.append(row | split | {
                "kept": kept, "predicted_overlapped_s": overlapped.time_per_micro_batch,
                "error_overlapped": overlapped.time_per_micro_batch / row["measured_s"] - 1,
                "predicted_full_duplex_s": full_duplex.time_per_micro_batch,
                "error_full_duplex": full_duplex.time_per_micro_batch / row["measured_s"] - 1,
                "predicted_from_run_s": from_run.time_per_micro_batch,
                "error_from_run": from_run.time_per_micro_batch / row["measured_s"] - 1,
                "profiled_operations_s": profiled_ops})
            if rank == 0:
                progress(f"{mode:20s} {groups or ''} {partition}: {summary(rows[-1])}")
    if settings.rival_microbatches:
        rows += rival_rows(rank, world_size, settings, stages, batches, latency, bandwidth)
    return measured_link | {"rows": rows, "auto_partition": auto}


def time_split(inside, micro_batches: int, world_size: int) -> dict:
    """Where each rank's time went in the timed windows (the trace events `inside` them), per micro-batch: in the
    stages' operations and in exchanges with its neighbours (the rest is the engine's own time and the timing's
    barriers)."""
    return {f"measured_{name}_s": [sum(e.end - e.start for e in inside if e.rank == rank and chosen(e))
                                   / micro_batches for rank in range(world_size)]
            for name, chosen in (("operations", lambda e: e.stage != EXCHANGE),
                                 ("exchange", lambda e: e.stage == EXCHANGE))}


def slowest_rank_windows(work, micro_batches: int, world_size: int, count: int = 3) -> list[float]:
    """`count` timed windows of `work()` (`micro_batches` micro-batches each), started together on every rank: the
    slower rank's wall time per micro-batch of each."""
    windows = []
    for _ in range(count):
        dist.barrier()
        start = time.perf_counter()
        work()
        every = [None] * world_size
        dist.all_gather_object(every, (time.perf_counter() - start) / micro_batches)
        windows.append(max(every))
    return windows


def compared(mode, partition, groups, windows, peak, predicted, costs, world_size, owners=None) -> dict:
    """One results row: the measured windows and this rank's allocation peak (gathered from every rank) beside the
    simulation."""
    measured = statistics.median(windows)
    peaks = [None] * world_size
    dist.all_gather_object(peaks, peak)
    return {"mode": mode, "partition": partition, "groups": groups, "measured_s": measured,
            "predicted_s": predicted.time_per_micro_batch, "error": predicted.time_per_micro_batch / measured - 1,
            "predicted_utilisation": list(predicted.utilisation), "windows_s": windows,
            "measured_peak_bytes": peaks,
            "predicted_peak_bytes": without_parameters(predicted, costs, partition, owners)}


def summary(row: dict) -> str:
    return (f"measured {1e3 * row['measured_s']:.1f} ms, predicted {1e3 * row['predicted_s']:.1f} ms "
            f"({100 * row['error']:+.1f}%)")


def without_parameters(predicted, costs, partition, owners=None) -> list[int]:
    """A simulation's peak memory per rank less the parameters of the rank's stages (which the measured allocation
    peak leaves out); `partition` the sizes of the groups, `owners` each group's rank (default: group r on rank r)."""
    groups = Placement.from_sizes(partition).groups
    owners = owners or list(range(len(groups)))
    return [peak - sum(costs[i].parameter_bytes for group, owner in zip(groups, owners) if owner == rank for i in group)
            for rank, peak in enumerate(predicted.peak_memory)]



def as_run(costs: list[StageCost], inside) -> list[StageCost]:
    """The profile with each operation's time replaced by its mean in the run (the trace events `inside` the timed
    windows): what the simulator predicts when its only inputs of its own are the schedule and the link."""
    def mean(stage: int, kinds: tuple[str, ...], profiled: float) -> float:
        times = [e.end - e.start for e in inside if e.stage == stage and e.kind in kinds]
        return statistics.fmean(times) if times else profiled

    return [replace(cost, forward_s=mean(i, ("forward",), cost.forward_s),
                    backward_s=mean(i, ("backward", "forward+backward"), cost.backward_s),
                    update_s=mean(i, ("update",), cost.update_s)) for i, cost in enumerate(costs)]

CHECKPOINTING = {"none": None, "all": "torch", "but_last": "torch_but_last"}  # simulate_1f1b's name -> rivals.py's


def rival_rows(rank, world_size, settings, stages, batches, latency, bandwidth) -> list[dict]:
    """torch's schedules (`settings.rival_schedules`) on every partition, checkpointing and m, measured, and
    predicted by `simulate_schedule`; `stages(None)` builds a fresh copy of the model's stages. Schedule1F1B runs each
    partition; the multi-chunk schedules run the 2W chunks of `rivals.chunk_layout` (one layout: it depends only on
    the costs), checkpointed as the throughput benchmark checkpoints them."""
    costs = profile_on_every_rank(stages(None), batches[0], "backprop", world_size)
    runs = []  # (schedule key, torch class, layout style, checkpointing, partition or chunk sizes)
    for schedule in settings.rival_schedules:
        torch_class, _, style, _ = SCHEDULES[schedule]
        if schedule == "1f1b":
            runs += [(schedule, torch_class, "1f1b", c, partition) for _, partition, _ in settings.settings
                     for c in CHECKPOINTING]  # fmt: skip
        else:
            layout = chunk_layout([c.compute_s for c in costs], settings.settings[0][1], world_size)
            if style not in layout:
                raise ValueError(f"{schedule} needs 2W = {2 * world_size} chunks of the {len(costs)} stages")
            runs += [(schedule, torch_class, style, c, layout[style]["sizes"]) for c in ("none", "all")]
    rows = []
    for schedule, torch_class, style, checkpointing, sizes in runs:
        owners = [chunk_owner(style, c, world_size) if style != "1f1b" else c for c in range(len(sizes))]
        layout = {style: {"sizes": sizes, "ranks": owners}}
        torch_checkpointing = CHECKPOINTING[checkpointing] if schedule == "1f1b" else (
            SCHEDULES[schedule][3] if checkpointing == "all" else None)
        for m in settings.rival_microbatches:
            try:
                rival = Rival(schedule, torch_checkpointing, m, stages(None), layout, rank, world_size, cross_entropy,
                              lambda module: sgd(module, LR))
            except NotApplicable as reason:
                if rank == 0:
                    progress(f"{schedule} m = {m}: not applicable ({reason})")
                continue
            peak, _ = measure_fresh(rival, batches)
            steps = max(1, -(-settings.micro_batches // m))  # whole steps, at least the window's micro-batches
            rival.step(batches, 0)
            windows = slowest_rank_windows(lambda: [rival.step(batches, step * m) for step in range(steps)],
                                           steps * m, world_size)
            copied, overlapped = (
                simulate_schedule(torch_class, costs, Placement.from_sizes(sizes), world_size, m, checkpointing,
                                  bandwidth, latency, overlap_transfers=overlap, buffers=buffers)
                for overlap, buffers in ((False, "torch"), (True, "needed")))  # fmt: skip
            label = "1f1b" if schedule == "1f1b" else torch_class
            row = compared(f"{label} ({checkpointing})", sizes, None, windows, peak, copied, costs, world_size, owners)
            rows.append(row | {"m": m, "predicted_overlapped_s": overlapped.time_per_micro_batch,
                               "error_overlapped": overlapped.time_per_micro_batch / row["measured_s"] - 1,
                               "predicted_needed_peak_bytes": without_parameters(overlapped, costs, sizes, owners)})
            if rank == 0:
                progress(f"{label} {checkpointing:8s} m = {m:2d} {sizes}: {summary(rows[-1])}")
    return rows


def main(argv=None) -> dict:
    settings = parse_args(argv)
    progress(f"2 processes, RevNet18 width {settings.width}, micro-batch {settings.batch}, modes "
             f"{' '.join(settings.modes)}, (groups, stages per rank) {settings.settings}")
    result = launch(job, 2, settings, env=STABLE_MALLOC_ENV)[0]
    errors = [abs(row["error"]) for row in result["rows"]]
    progress(f"link: latency {1e6 * result['latency_s']:.0f} us, bandwidth {result['bandwidth_Bps'] / 1e9:.2f} GB/s, "
             f"{'full' if result['duplex'] else 'half'} duplex; "
             f"|error| median {100 * statistics.median(errors):.1f}%, max {100 * max(errors):.1f}%")
    out = results_path(settings.out, "simulator", settings.quick)
    return write_results(out, "simulator", "simulator.py", argv, {k: str(v) for k, v in vars(settings).items()},
                         **result)


if __name__ == "__main__":
    main()
