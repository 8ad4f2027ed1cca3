#!/usr/bin/env python
"""PREDICTIONS, not measurements: PETRA against naive model parallelism on more devices than this machine has.

    python benchmarks/predict.py            # RevNet18/34/50 at the paper's widths, CIFAR 32x32, micro-batch 64
                                            # (~2 h): benchmarks/results/predict.json
    python benchmarks/predict.py --quick    # RevNet18 at recipe widths, micro-batch 8: predict-quick.json

The stages are measured here, on one CPU core (3 rounds of every profile, interleaved, each stage's times the median
of the rounds), under PETRA and under the synchronous reversible backprop (`profile_stages`: the same operations,
forward and the fused reconstruction and backward, but not the same engine overhead per tick). `simulate` then replays
PETRA and the synchronous model-parallel reversible backprop (the paper's Table 5 baseline, the same operations one
micro-batch at a time) on 2 devices up to one stage per device (J = 10 for RevNet18, 18 for RevNet34/50), each device
running the contiguous group `Placement.auto` gives it, over three links: PCIe 4.0 x16 (25 GB/s, 10 us), NVLink
(300 GB/s, 5 us), and this machine's loopback as the engine uses it (benchmarks/results/simulator.json). Every device is
assumed as fast as this core, and the engine's own time per tick is the one measured here.

Against the strongest synchronous rival at equal memory: the stages are also profiled under the engine's `backprop`
mode (forward, and backward through the kept graph), and `simulate_1f1b` replays torch's `Schedule1F1B` on each
device count, without checkpointing, checkpointed, and checkpointed on every chunk but the last, at m = W, 2W and 4W
micro-batches per step (4W: GPipe's rule for a negligible bubble), each on the `Placement.auto` split of its own
costs; `simulate_schedule` replays torch's multi-chunk schedules (`ScheduleInterleaved1F1B`,
`ScheduleInterleavedZeroBubble`, `ScheduleZBVZeroBubble`, `ScheduleDualPipeV`) in torch's own order on 2W chunks,
without and with checkpointing, where the model has 2W stages and torch accepts the m. PETRA is predicted in four
settings: one engine stage per model stage (J); on fewer devices than stages, one engine stage per device (each
device's group of `Placement.auto` merged, profiled as merged), which holds less; one engine stage per device
keeping every graph it can (`keep_graphs`: each group but the last keeps its forward's graph instead of recomputing
it or rebuilding its input), which spends memory on speed; and in between, the devices keeping their graph where it
fits a budget (the settings `memory_budget` gives, from the same profiles). The kept graphs are profiled in passes
that each keep some groups' graphs, at most `--kept-memory` bytes of them together (all at once, they would not fit
this machine's memory), each group's kept costs taken from its pass; every profile runs in a forked process.
Peak memory per device (`Simulation.peak_memory`): PETRA's stages' measured `held_bytes` plus the graph the largest
operation builds; a rival's parameters, the micro-batches in flight and, checkpointed, the recomputation's graph
(what the schedule needs), and beside it the same with the buffers torch 2.14 allocates around that (`buffers=
"torch"`: a receive buffer per micro-batch and chunk, and the multi-chunk runtime's sends held until the step ends;
checked against torch's measured peaks by benchmarks/simulator.py).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _launch import SINGLE_THREAD_ENV  # noqa: E402 (imports no torch)

os.environ.update(SINGLE_THREAD_ENV)

import torch  # noqa: E402

from common import RESULTS, add_out_argument, build_model, cross_entropy, progress, random_batches  # noqa: E402
from common import results_path, revnet_config, write_results  # noqa: E402
from petra_hub.analysis import profile_stages, simulate, simulate_schedule  # noqa: E402
from petra_hub.engine import MemoryOptions, Mode, Placement, merge_stages  # noqa: E402
from petra_hub.engine.graph_budget import keepable_stages, kept_graph_bytes, stage_inputs  # noqa: E402
from petra_hub.engine.schedule import Schedule  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH  # noqa: E402
from rivals import SCHEDULES  # noqa: E402

DEVICES = {10: (2, 4, 5, 10), 18: (2, 6, 9, 18)}  # by number of stages J: 2 devices up to one stage each
MODELS = ("revnet18", "revnet34", "revnet50")
PAPER_TABLE5 = {"revnet18": {"devices": 10, "speedup": 3.0}, "revnet34": {"devices": 18, "speedup": 2.4}}
CHECKPOINTING = ("none", "but_last", "all")  # simulate_1f1b's settings of the rival
# simulate_schedule's rivals on 2W chunks: the torch classes of rivals.py's multi-chunk schedules
MULTI_CHUNK = tuple(dict.fromkeys(name for name, per_rank, _, _ in SCHEDULES.values() if per_rank > 1))

def links() -> dict[str, tuple[float, float]]:
    """name -> (bandwidth B/s, latency s per message)."""
    chosen = {"PCIe 4.0 x16": (25e9, 10e-6), "NVLink": (300e9, 5e-6)}
    measured = RESULTS / "simulator.json"
    if measured.exists():
        result = json.loads(measured.read_text())
        chosen["this machine's loopback (engine)"] = (result["bandwidth_Bps"], result["latency_s"])
    return chosen


TIMES = ("forward_s", "backward_s", "update_s", "overhead_s")  # the StageCost fields a profile times


def profile_in_child(stages, sample, options: dict) -> list:
    """`profile_stages` in a forked process, which hands all its memory back when it exits: in this one, the heap
    of a run that profiles dozens of pipelines, some holding gigabytes of graphs, grew to 23 GB of fragments even
    with the freed pages trimmed."""
    receiving, sending = multiprocessing.Pipe(duplex=False)

    def work():
        try:
            sending.send(("costs", profile_stages(stages, sample, cross_entropy, repeats=3, warmup=1, **options)))
        except BaseException as error:  # noqa: BLE001 - the parent raises it
            sending.send(("error", f"{type(error).__name__}: {error}"))

    child = multiprocessing.get_context("fork").Process(target=work)
    child.start()
    try:
        kind, value = receiving.recv()
    except EOFError:  # killed before it could answer (out of memory, ...)
        kind, value = "error", "the profiling process died without an answer"
    child.join()
    if kind == "error":
        raise RuntimeError(f"profiling {len(stages)} stages with {options}: {value} (exit code {child.exitcode})")
    return value


def median_profiles(jobs: dict, sample, rounds: int) -> dict:
    """{key: (stages, profile_stages options)} profiled `rounds` times, interleaved (every key once a round, so that
    the machine's drift spreads over all of them), each stage's times the median of the rounds."""
    runs = {key: [] for key in jobs}
    for _ in range(rounds):
        for key, (stages, options) in jobs.items():
            runs[key].append(profile_in_child(stages, sample, options))
    return {key: [replace(cost, **{f: statistics.median(getattr(run[i], f) for run in profiled) for f in TIMES})
                  for i, cost in enumerate(profiled[0])]
            for key, profiled in runs.items()}  # fmt: skip


def kept_passes(groups: list, sample_inputs, memory: int) -> list[list[int]]:
    """The groups that can keep their graph, split into runs of consecutive groups whose kept graphs (and weight
    copies), for every micro-batch in flight at each, add up to at most `memory` bytes (a group over it alone)."""
    schedule = Schedule(len(groups), pipelined=True)
    inputs = stage_inputs(groups, sample_inputs, len(groups) - 1)
    passes, total = [[]], 0
    for index in keepable_stages(groups, Mode.PETRA):
        extra = kept_graph_bytes(groups[index], inputs[index], schedule.in_flight(index), pipelined=True)
        if passes[-1] and total + extra > memory:
            passes.append([])
            total = 0
        passes[-1].append(index)
        total += extra
    return [chosen for chosen in passes if chosen]


def predict_model(preset: str, quick: bool, rounds: int, kept_memory: int) -> dict:
    """Profile `preset` here and simulate it on every device count of its J and every link."""
    batch = 8 if quick else 64
    config = revnet_config(preset, width=QUICK_WIDTH if quick else None, stem="cifar", num_labels=10)
    stages = build_model(config).get_stages()
    progress(f"profiling {preset} ({'recipe' if quick else 'paper'} widths, {len(stages)} stages), CIFAR 32x32, "
             f"micro-batch {batch}, one thread, {rounds} rounds")
    sample = random_batches(1, batch, 32)[0]
    base = median_profiles({mode: (stages, {"mode": mode}) for mode in ("petra", "reversible_backprop", "backprop")},
                           sample, rounds)
    costs, naive_costs, plain_costs = base["petra"], base["reversible_backprop"], base["backprop"]
    splits = {tuple(map(len, Placement.auto(costs, devices, link_bandwidth=bandwidth, latency=2 * latency).groups))
              for bandwidth, latency in links().values() for devices in DEVICES[len(stages)]}  # fmt: skip
    jobs, passes = {}, {}  # one engine stage per device, recomputing, and keeping graphs pass by pass
    for sizes in splits:
        grouped = merge_stages(build_model(config).get_stages(), list(sizes))
        jobs[sizes, None] = (grouped, {})
        passes[sizes] = kept_passes(grouped, sample[0], kept_memory)
        for number, kept in enumerate(passes[sizes]):
            jobs[sizes, number] = (grouped, {"memory": MemoryOptions(keep_graphs=kept)})
    progress(f"profiling {preset} as one engine stage per device: {sorted(splits)}, the kept graphs in "
             f"{sum(map(len, passes.values()))} passes of at most {kept_memory / 2**30:.1f} GiB")
    profiled = median_profiles(jobs, sample, rounds)
    merged = {}  # (sizes, keep) -> the groups' costs, recomputing or keeping every graph it can
    for sizes in splits:
        merged[sizes, False] = profiled[sizes, None]
        merged[sizes, True] = kept = list(profiled[sizes, None])
        for number, chosen in enumerate(passes[sizes]):
            for index in chosen:
                kept[index] = profiled[sizes, number][index]

    def one_stage_per_device(sizes: list[int], bandwidth: float, latency: float, keep: bool = False):
        return simulate("petra", merged[tuple(sizes), keep], Placement.from_sizes([1] * len(sizes)), bandwidth,
                        latency)

    def within_budgets(sizes: list[int], bandwidth: float, latency: float) -> list[dict]:
        """One engine stage per device keeping graphs where they fit, as `memory_budget` does: for each budget
        (each device's peak when it keeps its graph), the devices whose kept graph fits keep it, the others
        recompute; the settings no other beats in both time and memory."""
        recompute, keep = merged[tuple(sizes), False], merged[tuple(sizes), True]
        keepable = {index for chosen in passes[tuple(sizes)] for index in chosen}
        settings = []
        for budget in [-1, *sorted({keep[i].held_bytes for i in keepable})]:  # -1: none kept
            kept = [i in keepable and keep[i].held_bytes <= budget for i in range(len(sizes))]
            result = simulate("petra", [k if chosen else r for k, r, chosen in zip(keep, recompute, kept)],
                              Placement.from_sizes([1] * len(sizes)), bandwidth, latency)
            settings.append({"time_s": result.time_per_micro_batch, "peak_bytes": max(result.peak_memory),
                             "kept": kept})
        front = [a for a in settings if not any(
            (b["time_s"], b["peak_bytes"]) != (a["time_s"], a["peak_bytes"])
            and b["time_s"] <= a["time_s"] and b["peak_bytes"] <= a["peak_bytes"] for b in settings)]
        return sorted({(a["peak_bytes"], a["time_s"]): a for a in front}.values(), key=lambda a: a["peak_bytes"])

    ideal = sum(c.compute_s for c in costs) / max(c.compute_s for c in costs)
    rows = []
    for name, (bandwidth, latency) in links().items():
        for devices in DEVICES[len(stages)]:
            placement = Placement.auto(costs, devices, link_bandwidth=bandwidth, latency=2 * latency)
            petra = simulate("petra", costs, placement, bandwidth, latency)
            naive = simulate("reversible_backprop", naive_costs, placement, bandwidth, latency, micro_batches=8)
            cap = sum(c.compute_s for c in costs) / max(sum(costs[i].compute_s for i in g) for g in placement.groups)
            sizes = [len(g) for g in placement.groups]
            coarse = one_stage_per_device(sizes, bandwidth, latency) if devices < len(stages) else None
            kept = one_stage_per_device(sizes, bandwidth, latency, keep=True)
            rows.append({"link": name, "devices": devices, "partition": sizes,
                         "petra_s": petra.time_per_micro_batch, "naive_s": naive.time_per_micro_batch,
                         "speedup": naive.time_per_micro_batch / petra.time_per_micro_batch, "partition_cap": cap,
                         "petra_utilisation": list(petra.utilisation), "petra_peak_bytes": max(petra.peak_memory),
                         "petra_per_device": None if coarse is None else {
                             "time_s": coarse.time_per_micro_batch, "peak_bytes": max(coarse.peak_memory)},
                         "petra_per_device_kept": {"time_s": kept.time_per_micro_batch,
                                                   "peak_bytes": max(kept.peak_memory)},
                         "petra_per_device_budgets": within_budgets(sizes, bandwidth, latency),
                         "rivals": rivals(plain_costs, devices, bandwidth, latency)})
            progress(f"{preset} {name:32s} {devices:2d} devices {rows[-1]['partition']}: PETRA "
                     f"{1e3 * petra.time_per_micro_batch:.0f} ms, naive {1e3 * naive.time_per_micro_batch:.0f} ms, "
                     f"{rows[-1]['speedup']:.2f}x (this split's cap {cap:.2f}x)")
    fast = {}  # devices 100x faster than this core, the engine's own time per tick and the link unchanged
    for name, (bandwidth, latency) in links().items():
        quick_costs, quick_naive = (
            [replace(c, forward_s=c.forward_s / 100, backward_s=c.backward_s / 100, update_s=c.update_s / 100)
             for c in group]
            for group in (costs, naive_costs)
        )
        placement = Placement.from_sizes([1] * len(costs))
        petra = simulate("petra", quick_costs, placement, bandwidth, latency)
        naive = simulate("reversible_backprop", quick_naive, placement, bandwidth, latency, micro_batches=8)
        fast[name] = naive.time_per_micro_batch / petra.time_per_micro_batch
        progress(f"{preset} {name:32s} {len(costs)} devices 100x faster than this core: {fast[name]:.2f}x")
    return {"widths": list(config.hidden_sizes), "micro_batch": batch, "num_stages": len(stages),
            "stage_costs": [vars(c) for c in costs], "naive_stage_costs": [vars(c) for c in naive_costs],
            "plain_stage_costs": [vars(c) for c in plain_costs],
            "ideal_one_stage_per_device": ideal, "rows": rows, "hundredfold_faster_devices": fast,
            "kept_graph_passes": {"-".join(map(str, sizes)): chosen for sizes, chosen in passes.items()}}


def rivals(costs, devices: int, bandwidth: float, latency: float) -> list[dict]:
    """`simulate_1f1b` at every checkpointing and m in (W, 2W, 4W), then torch's multi-chunk schedules
    (`simulate_schedule`, 2W chunks) without and with checkpointing at the same m where the stages make 2W chunks
    and torch accepts the setting; each on the split that balances its own costs."""
    rows = []
    for schedule in ("Schedule1F1B", *MULTI_CHUNK):
        chunks = devices if schedule == "Schedule1F1B" else 2 * devices
        if chunks > len(costs):
            continue
        for checkpointing in CHECKPOINTING if schedule == "Schedule1F1B" else ("none", "all"):
            # what a chunk computes per micro-batch: a checkpointed chunk runs its forward twice
            timed = costs if checkpointing == "none" else [replace(c, backward_s=c.backward_s + c.forward_s)
                                                           for c in costs]  # fmt: skip
            placement = Placement.auto(timed, chunks, link_bandwidth=bandwidth, latency=latency)
            for m in (devices, 2 * devices, 4 * devices):
                try:
                    result, allocated = (simulate_schedule(schedule, costs, placement, devices, m, checkpointing,
                                                           bandwidth, latency, buffers=buffers)
                                         for buffers in ("needed", "torch"))  # fmt: skip
                except ValueError:  # torch refuses the setting (DualPipeV needs m >= 2W, ...)
                    continue
                rows.append({"schedule": schedule, "checkpointing": checkpointing, "m": m,
                             "partition": [len(g) for g in placement.groups], "time_s": result.time_per_micro_batch,
                             "peak_bytes": max(result.peak_memory), "torch_peak_bytes": max(allocated.peak_memory),
                             "bubble_fraction": result.bubble_fraction})
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="recipe widths, micro-batch 8 (RevNet18 unless --models)")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=None,
                        help="presets to predict (default: all three; RevNet18 with --quick)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="profiles of every setting, interleaved, medians taken (default 3; quick: 1)")
    parser.add_argument("--kept-memory", type=float, default=4.0,
                        help="GiB of kept graphs one profile may hold: the groups keep their graphs in as many "
                             "passes as that takes (default 4)")
    add_out_argument(parser, "predict")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    presets = args.models or (["revnet18"] if args.quick else list(MODELS))
    rounds = args.rounds or (1 if args.quick else 3)
    if rounds < 1:
        parser.error(f"--rounds must be at least 1, got {rounds}")
    if args.kept_memory <= 0:
        parser.error(f"--kept-memory must be positive, got {args.kept_memory}")
    kept_memory = int(args.kept_memory * 2**30)
    models = {preset: predict_model(preset, args.quick, rounds, kept_memory) for preset in presets}
    settings = {"models": presets, "image_size": 32, "quick": args.quick, "threads": 1, "rounds": rounds,
                "kept_memory_bytes": kept_memory}
    return write_results(results_path(args.out, "predict", args.quick), "predict", "predict.py", argv, settings,
                         prediction=True, models=models, paper_table5=PAPER_TABLE5)

if __name__ == "__main__":
    main()
