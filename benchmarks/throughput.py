"""Throughput of PETRA against naive model parallelism and torch.distributed.pipelining's schedules, on CPU.

    python benchmarks/throughput.py            # full run: benchmarks/results/throughput.json
    python benchmarks/throughput.py --quick    # tiny model and windows (a few minutes): throughput-quick.json

Part 1, one process: per-stage CPU cost under PETRA (balances the partition), per-stage memory figures, PETRA
against a plain backprop loop. Part 2, a gloo group of 2 processes (`--num-processes W`): PETRA (steady state, and
from empty to drained; and in steady state with the model's stages grouped into coarser engine stages,
`--petra-groups`), the engine's synchronous `reversible_backprop` and `backprop` (naive model parallelism),
and torch's `Schedule1F1B`, `ScheduleInterleaved1F1B`, `ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`
and `ScheduleDualPipeV`, each with and without activation checkpointing, at every `--pp-microbatches` m
(benchmarks/rivals.py); the peak activation memory per rank of every method, measured on fresh copies. Timing
windows of all methods are interleaved, repetition after repetition. What is compared and why:
docs/benchmarks-throughput.md; tables: `python benchmarks/report.py`.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _launch import SINGLE_THREAD_ENV, STABLE_MALLOC_ENV, launch  # noqa: E402 (imports no torch)

os.environ.update(SINGLE_THREAD_ENV)  # one thread, here and in the children: before torch is imported

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from common import add_out_argument, build_model, cross_entropy, feed, load_average, make_pipeline  # noqa: E402
from common import parse_groups, progress, random_batches, results_path, revnet_config, sgd  # noqa: E402
from common import tensors_of  # noqa: E402
from common import write_results  # noqa: E402
from rivals import SCHEDULES, build_rivals, chunk_layout, contiguous_split, pipeline_peak  # noqa: E402
from rivals import Part  # noqa: E402, F401 (timeline.py imports it from here)
from rivals import measure_all  # noqa: E402
from petra_hub.engine import Layout, MemoryOptions, merge_stages, stage_layout  # noqa: E402
from petra_hub.engine.accounting import graph_bytes, nbytes  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

NUM_DISTINCT_BATCHES = 4  # the micro-batches fed are these, cycled (content does not matter for speed)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="timing windows per method (default 5; quick: 2)")
    parser.add_argument("--micro-batches", type=int, default=None, help="N per window (default 100; quick: 12)")
    parser.add_argument("--batch", type=int, default=None, help="micro-batch size (default 32; quick: 8)")
    parser.add_argument(
        "--width", type=int, default=None, help=f"layers w,2w,4w,8w wide (default {RECIPE_WIDTH}; quick: {QUICK_WIDTH})"
    )
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument(
        "--pp-microbatches", type=str, default=None,
        help="n_microbatches for every torch schedule (default 2,8,18; quick: 2,4)",
    )
    parser.add_argument(
        "--rivals", type=str, default="all",
        help=f"torch schedules run with and without checkpointing, besides checkpointed Schedule1F1B: 'all', 'none' "
             f"or some of {','.join(SCHEDULES)}",
    )  # fmt: skip
    parser.add_argument("--partition", type=str, default=None, help="stages per rank, e.g. 4,6 (default: balanced)")
    parser.add_argument("--num-processes", type=int, default=2, help="pipeline processes in part 2 (default 2)")
    parser.add_argument(
        "--petra-groups", nargs="*", default=None,
        help="PETRA settings with coarser engine stages, each the group sizes of every rank: ranks separated by '/', "
             "groups by ','; e.g. 1,2/7 (rank 0: the stem, then two blocks as one stage; rank 1: the other 7 blocks "
             "as one stage); a group ending in k keeps its forward's graph (keep_graphs), e.g. 5k/5. Default for 2 "
             "processes: 1,2/7 4/6; none otherwise",
    )  # fmt: skip
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--quick", action="store_true", help="tiny model and windows: a smoke test of the script")
    parser.add_argument(
        "--tuned-malloc", action="store_true",
        help="fix glibc's malloc thresholds in every process (see _launch.py); default: the environment a user has"
    )
    add_out_argument(parser, "throughput")
    args = parser.parse_args(argv)
    quick = args.quick
    args.repeats = args.repeats or (2 if quick else 5)
    args.micro_batches = args.micro_batches or (12 if quick else 100)
    args.batch = args.batch or (8 if quick else 32)
    args.width = args.width or (QUICK_WIDTH if quick else RECIPE_WIDTH)
    args.pp_microbatches = [int(m) for m in (args.pp_microbatches or ("2,4" if quick else "2,8,18")).split(",")]
    args.partition = [int(p) for p in args.partition.split(",")] if args.partition else None
    if args.petra_groups is None:
        args.petra_groups = DEFAULT_PETRA_GROUPS if args.num_processes == 2 else []
    try:
        groupings = [parse_groups(spec) for spec in args.petra_groups]
    except ValueError:
        parser.error(f"--petra-groups: expected group sizes like 1,2/7 or 5k/5, got {args.petra_groups}")
    if any(len(stages_per_rank) != args.num_processes for _, stages_per_rank, _ in groupings):
        parser.error(f"--petra-groups: every setting needs {args.num_processes} ranks ('/'-separated), got "
                     f"{args.petra_groups}")  # fmt: skip
    asked = {"all": list(SCHEDULES), "none": []}.get(args.rivals, [r for r in args.rivals.split(",") if r])
    if set(asked) - set(SCHEDULES):
        parser.error(f"--rivals: unknown {sorted(set(asked) - set(SCHEDULES))}; known: {', '.join(SCHEDULES)}")
    args.rivals = [name for name in SCHEDULES if name in asked]
    if args.repeats < 1 or args.micro_batches < 1 or args.batch < 2 or args.width < 1:
        parser.error("--repeats, --micro-batches, --width must be >= 1 and --batch >= 2 (batch norm)")
    if args.num_processes < 2:
        parser.error("--num-processes must be >= 2")
    if any(m < args.num_processes for m in args.pp_microbatches):
        parser.error(f"Schedule1F1B needs n_microbatches >= the number of stages ({args.num_processes})")
    return args


DEFAULT_PETRA_GROUPS = ["1,2/7", "4/6"]


def grouping_name(spec: str) -> str:
    return f"petra_groups_{spec}"


def revnet18(settings):
    return build_model(revnet_config("revnet18", width=settings.width, num_labels=10))


def batches_for(settings):
    return random_batches(NUM_DISTINCT_BATCHES, settings.batch, settings.image_size)


def engine(settings, mode, groups: list[int] | None = None, **options):
    """A pipeline of a fresh model; `groups`: sizes of the engine stages as groups of the model's stages."""
    stages = revnet18(settings).get_stages()
    return make_pipeline(merge_stages(stages, groups or len(stages)), mode, lr=settings.lr, timeout=600, **options)


# -- part 1: one process -------------------------------------------------------------------------------------------
def one_process_job(rank, world_size, settings):
    torch.manual_seed(0)
    batches = batches_for(settings)
    result = {"threads": torch.get_num_threads()}

    # (a) per-stage CPU time under PETRA (the engine's counters), to balance the partition; per-stage FIFO sizes
    pipeline = engine(settings, "petra", distributed=False)
    num_stages, fill = pipeline.num_stages, pipeline.schedule.latency
    feed(pipeline, batches, fill)
    before = [pipeline.counters()[i].compute_seconds for i in range(num_stages)]
    count = max(8, settings.micro_batches // 4)
    fifo = [0] * num_stages
    for step in range(count):
        feed(pipeline, batches, 1, step)
        for index, stats in pipeline.memory().items():
            fifo[index] = max(fifo[index], stats.activation_bytes)
    after = pipeline.counters()  # read before the drain's ticks
    result["stage_ms"] = [1e3 * (after[i].compute_seconds - before[i]) / count for i in range(num_stages)]
    pipeline.drain()
    result.update(layout=stage_layout(pipeline.stages), latency=fill, fifo_bytes=fifo)

    # (b) per-stage activation sizes and recomputation graphs, for one micro-batch
    value = batches[0][0]
    sizes = {"input_bytes": [], "output_bytes": [], "graph_bytes": []}
    with torch.no_grad():
        for stage in pipeline.stages:
            sizes["input_bytes"].append(nbytes(tensors_of(value)))
            sizes["graph_bytes"].append(graph_bytes(stage, value))
            value = stage(value)
            sizes["output_bytes"].append(nbytes(tensors_of(value)))
    result.update(sizes, image_bytes=nbytes([batches[0][0]]))

    # (c) PETRA (all stages in this process) against a plain backprop loop, windows interleaved
    model = revnet18(settings)
    optimizer = sgd(model, settings.lr)
    split = dict.fromkeys(("forward", "backward", "step"), 0.0)

    def plain_step(images, labels):
        start = time.process_time()
        optimizer.zero_grad(set_to_none=True)
        loss = cross_entropy(model(images).logits, labels)
        middle = time.process_time()
        loss.backward()
        end = time.process_time()
        optimizer.step()
        split["forward"] += middle - start
        split["backward"] += end - middle
        split["step"] += time.process_time() - end

    def plain_window():
        for index in range(settings.micro_batches):
            plain_step(*batches[index % len(batches)])

    petra = engine(settings, "petra", distributed=False)
    for index in range(3):
        plain_step(*batches[index % len(batches)])
    feed(petra, batches, fill)  # filled once: every window below is steady state
    split.update(dict.fromkeys(split, 0.0))
    n = settings.micro_batches
    times, cpu, faults = ({"plain": [], "petra": []} for _ in range(3))
    for repeat in range(settings.repeats):
        for name, work in (("plain", plain_window), ("petra", lambda: feed(petra, batches, n, fill))):
            usage = resource.getrusage(resource.RUSAGE_SELF)
            start, start_cpu = time.perf_counter(), time.process_time()
            work()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            faults[name].append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - usage.ru_minflt) / n)
        progress(
            f"one process, repetition {repeat + 1}/{settings.repeats}: plain {1e3 * times['plain'][-1] / n:.1f} ms, "
            f"PETRA {1e3 * times['petra'][-1] / n:.1f} ms per micro-batch"
        )
    petra.drain()
    result.update(times=times, cpu=cpu, faults=faults)
    result["plain_split"] = {key: value / (settings.repeats * n) for key, value in split.items()}
    return result


# -- part 2: two processes -----------------------------------------------------------------------------------------
def all_values(value) -> list:
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def bare_exchange(rank, numel: int, copies: int, repeats: int = 20) -> float:
    """Median time of one PETRA tick's messages alone: rank 0 sends the boundary activation (numel floats) and
    receives its gradient (with the rebuilt activation when the boundary stage is reversible: copies = 2); rank 1
    the reverse; receives posted first, like the engine."""
    forward, backward = torch.randn(numel), torch.randn(copies * numel)
    receive = torch.empty(copies * numel if rank == 0 else numel)
    peer = 1 - rank
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        works = [dist.irecv(receive, src=peer, tag=7), dist.isend(forward if rank == 0 else backward, dst=peer, tag=7)]
        for work in works:
            work.wait()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def engine_peak(settings, mode, partition, batches, groups=None, **options) -> int:
    """Activation memory at its peak (`rivals.pipeline_peak`) on a fresh pipeline."""
    return pipeline_peak(engine(settings, mode, groups, layout=Layout(partition=partition), **options), batches)


def multi_process_job(rank, world_size, settings, partition, boundary_numel, copies, layout):
    torch.manual_seed(0)
    batches = batches_for(settings)
    n = settings.micro_batches
    results = defaultdict(list)  # name -> per-repetition seconds per micro-batch (slowest rank)
    exchange = defaultdict(list)  # name -> per-repetition [per-rank seconds in exchanges per micro-batch]
    cpu = defaultdict(list)  # name -> per-repetition [per-rank CPU seconds per micro-batch]
    faults = defaultdict(list)  # name -> per-repetition [per-rank minor page faults per micro-batch]
    info = {"threads": torch.get_num_threads(), "world_size": dist.get_world_size(), "backend": dist.get_backend()}
    # the messages of one tick alone, between the two ranks (measured for 2 processes only)
    info["bare_exchange"] = all_values(bare_exchange(rank, boundary_numel, copies)) if world_size == 2 else None

    peaks = {mode: all_values(engine_peak(settings, mode, partition, batches))
             for mode in ("petra", "reversible_backprop", "backprop")}  # fmt: skip
    # PETRA with coarser engine stages: {name: (group sizes, stages per rank)}
    grouped = {grouping_name(spec): parse_groups(spec) for spec in settings.petra_groups}
    for name, (groups, stages_per_rank, kept) in grouped.items():
        peaks[name] = all_values(engine_peak(settings, "petra", stages_per_rank, batches, groups,
                                             memory=MemoryOptions(keep_graphs=kept)))

    # engine pipelines, one per method, each with its own copy of the model: "petra" and the grouped settings run
    # continuously (steady state), "petra_drain" goes from empty to drained in every window
    modes = {"petra": "petra", "petra_drain": "petra"} | {mode: mode for mode in ("reversible_backprop", "backprop")}
    engines = {name: engine(settings, mode, layout=Layout(partition=partition)) for name, mode in modes.items()}
    for name, (groups, stages_per_rank, kept) in grouped.items():
        modes[name], engines[name] = "petra", engine(
            settings, "petra", groups, layout=Layout(partition=stages_per_rank), memory=MemoryOptions(keep_graphs=kept))
    steady = ["petra", *grouped]
    fed = dict.fromkeys(engines, 0)

    def run(name, count, drain=True):
        feed(engines[name], batches, count, fed[name])
        fed[name] += count
        if drain:
            engines[name].drain()

    for name in engines:  # warm-up and the start-up handshake
        run(name, engines[name].schedule.latency if modes[name] == "petra" else 3)
    for name in grouped:  # filled: steady state from here on
        run(name, engines[name].schedule.latency, drain=False)
    fill = engines["petra"].schedule.latency

    # PETRA's held activations per rank: sampled between ticks in steady state (engine accounting)
    petra = engines["petra"]
    run("petra", fill, drain=False)
    held = 0
    for _ in range(fill):
        run("petra", 1, drain=False)
        held = max(held, sum(s.activation_bytes for s in petra.memory().values()))
    info["petra_held_bytes"] = all_values(held)  # and "petra" stays filled from here on

    # torch.distributed.pipelining: every schedule and setting on its own model copy (rivals.py); each measured
    # fresh (memory, recomputations), then warmed up
    rivals = build_rivals(settings, lambda: revnet18(settings).get_stages(), layout, rank, world_size, cross_entropy,
                          lambda module: sgd(module, settings.lr))  # fmt: skip
    records, measured = measure_all(rivals, batches, all_values)
    info["activation_peak_bytes"] = peaks

    def window(name, work, micro_batches, pipeline=None):
        dist.barrier()
        exchanged = pipeline.exchange_seconds if pipeline else 0.0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start, start_cpu = time.perf_counter(), time.process_time()
        work()
        elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
        faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - usage.ru_minflt
        exchanged = pipeline.exchange_seconds - exchanged if pipeline else None
        ranks = all_values((elapsed, used, exchanged, faulted))
        results[name].append(max(r[0] for r in ranks) / micro_batches)
        cpu[name].append([r[1] / micro_batches for r in ranks])
        faults[name].append([r[3] / micro_batches for r in ranks])
        if pipeline:
            exchange[name].append([r[2] / micro_batches for r in ranks])

    for repeat in range(settings.repeats):  # timing windows, interleaved
        for name in steady:  # N more through the full pipeline
            window(name, lambda name=name: run(name, n, drain=False), n, engines[name])
        for name in ("petra_drain", "reversible_backprop", "backprop"):  # N micro-batches from empty to drained
            window(name, lambda name=name: run(name, n), n, engines[name])
        for key, rival in measured.items():  # whole steps of m micro-batches, at least N in all
            steps = math.ceil(n / rival.m)
            window(key, lambda rival=rival, steps=steps: [rival.step(batches, s * rival.m) for s in range(steps)],
                   steps * rival.m)  # fmt: skip
        if rank == 0:
            line = ", ".join(f"{name} {1e3 * results[name][-1]:.1f}" for name in [*modes, *measured][:8])
            fastest = min(measured, key=lambda key: results[key][-1])
            progress(f"{world_size} processes, repetition {repeat + 1}/{settings.repeats} (ms per micro-batch): "
                     f"{line}, ...; fastest torch schedule {fastest} {1e3 * results[fastest][-1]:.1f}")  # fmt: skip

    for name in steady:
        engines[name].drain()
    # sanity: every micro-batch fed was backpropagated and applied (k = 1) at every local stage
    for name, pipeline in engines.items():
        for index, counters in pipeline.counters().items():
            if not counters.forwards == counters.backwards == counters.updates == fed[name]:
                raise RuntimeError(f"{name}, stage {index}: {counters} after {fed[name]} micro-batches")
    info["local_stages"] = list(petra.placement.groups[rank])
    info["petra_groups"] = {name: {"groups": groups, "partition": stages_per_rank, "kept": kept,
                                   "layout": stage_layout(engines[name].stages)}
                            for name, (groups, stages_per_rank, kept) in grouped.items()}  # fmt: skip
    return {"times": dict(results), "exchange": dict(exchange), "cpu": dict(cpu), "faults": dict(faults), "info": info,
            "rivals": records}  # fmt: skip


balanced_partition = contiguous_split  # the W-way split of the stages (Placement.auto), by part 1's costs


def main(argv=None) -> dict:
    settings = parse_args(argv)
    loads = [load_average()]
    progress(f"{os.cpu_count()} CPUs, torch {torch.__version__}, load average {loads[0]}")
    model_stages = len(revnet18(settings).get_stages())
    for spec in settings.petra_groups:  # before any work
        if sum(parse_groups(spec)[0]) != model_stages:
            raise SystemExit(f"--petra-groups {spec}: the group sizes must add up to the {model_stages} stages")
    started = time.time()
    env = STABLE_MALLOC_ENV if settings.tuned_malloc else {}

    progress("part 1, one process: per-stage cost, memory, PETRA against plain backprop")
    (one,) = launch(one_process_job, 1, settings, env=env)
    layout = one["layout"]
    processes = settings.num_processes
    partition = settings.partition or balanced_partition(one["stage_ms"], processes)
    if len(partition) != processes or sum(partition) != len(layout) or min(partition) < 1:
        raise SystemExit(f"--partition must split the {len(layout)} stages in {processes} groups, got {partition}")
    progress(f"partition {partition} (per-stage CPU ms {[round(c, 1) for c in one['stage_ms']]})")
    loads.append(load_average())

    chunks = chunk_layout(one["stage_ms"], partition, processes)
    progress(f"part 2, {processes} processes: PETRA, naive model parallelism, torch's schedules; chunks {chunks}")
    boundary_numel = one["output_bytes"][partition[0] - 1] // 4  # float32 activation leaving rank 0
    copies = 2 if layout[partition[0] - 1] == "R" else 1  # PETRA returns x with dx from a reversible stage
    multi = launch(multi_process_job, processes, settings, partition, boundary_numel, copies, chunks, env=env)
    loads.append(load_average())

    return write_results(
        results_path(settings.out, "throughput", settings.quick),
        "throughput",
        "throughput.py",
        argv,
        {key: value for key, value in vars(settings).items() if key != "out"},
        malloc=env or "glibc default (adaptive)",
        loads=loads,
        elapsed_s=time.time() - started,
        partition=partition,
        chunks=chunks,
        one=one,
        multi=multi[0],
    )


if __name__ == "__main__":
    main()
