"""Kept graphs: what PETRA gains in time and pays in memory when its stages keep their forward's graph.

    python benchmarks/kept_graphs.py            # RevNet18 at the recipe widths, 32x32, micro-batch 32 (~8 min)
    python benchmarks/kept_graphs.py --quick    # tiny widths and windows (~20 s): kept_graphs-quick.json

One process, one thread, all stages of the pipeline in it, in the environment a user has (no allocator tuning).
Methods, timed in interleaved windows of N micro-batches at the steady state (medians over the repetitions): a plain
torch loop (`model(x)`, `cross_entropy`, `backward`, SGD step: what a user would otherwise run, the reference), the
same loop with a forward without a graph first (PETRA's operations, without the engine: the bound PETRA can reach),
the same loop split into the model's J stages (a graph, a backward call and an SGD step per stage: what the split
costs by itself, without the engine), the engine's `backprop` mode (the same operations through the engine's
stages), PETRA recomputing (the paper), PETRA with the graphs that fit a memory budget halfway between that and
every graph kept (`memory_budget`), PETRA keeping the graphs of the stages that store their input (`keep_graphs`:
stem and downsampling blocks), and PETRA keeping every stage's graph (the reversible ones then skip their
reconstruction). Memory: the activation and weight-copy bytes the stages hold between ticks (`Pipeline.memory()`),
the largest seen, and the largest total the stages held after any of their operations within a tick (`peak_bytes`,
gradients and waiting messages included). Beside each time, the process's minor page faults per micro-batch: with
glibc's adaptive thresholds a loop whose freed memory goes back to the kernel pays to fault it in again, which
depends on the order of its allocations and frees. `--tuned-malloc` runs it all again in a fresh process with fixed
thresholds (`STABLE_MALLOC_ENV`), where nothing goes back: the difference between the two runs is the allocator's
share. Discussion: docs/benchmarks-throughput.md.
"""

from __future__ import annotations

import argparse
import os
import resource
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

from common import add_out_argument, build_model, cross_entropy, feed, load_average, make_pipeline  # noqa: E402
from common import progress, sgd, tensors_of  # noqa: E402
from common import random_batches, results_path, revnet_config, write_results  # noqa: E402
from petra_hub.engine import MemoryOptions, Mode  # noqa: E402
from petra_hub.engine.graph_budget import keepable_stages, recomputing_stages  # noqa: E402
from petra_hub.engine.tensors import detached  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

METHODS = ("plain", "plain_second_forward", "plain_staged", "backprop", "petra", "petra_budget", "petra_kept",
           "petra_all_kept")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="windows per method (default 7; quick: 2)")
    parser.add_argument("--micro-batches", type=int, default=None, help="N per window (default 60; quick: 6)")
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size (default 32)")
    parser.add_argument("--width", type=int, default=None, help=f"widths w..8w (default {RECIPE_WIDTH}; quick: "
                                                                 f"{QUICK_WIDTH})")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tuned-malloc", action="store_true",
                        help="run in a fresh process with glibc's malloc thresholds fixed (benchmarks/_launch.py)")
    add_out_argument(parser, "kept_graphs[_tuned_malloc]")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 7)
    args.micro_batches = args.micro_batches or (6 if args.quick else 60)
    args.width = args.width or (QUICK_WIDTH if args.quick else RECIPE_WIDTH)
    return args


class PlainLoop:
    """What a user runs without the engine: the whole model, one backward, one SGD step per micro-batch. With
    `second_forward`, first a forward without a graph, as PETRA's forward is: the loop then runs PETRA's operations
    (its backward recomputes the forward with a graph), so PETRA's time over it is the engine's own."""

    def __init__(self, model, second_forward: bool = False):
        self.model, self.optimizer, self.second_forward = model, sgd(model, 0.01), second_forward

    def step(self, images, labels):
        if self.second_forward:
            with torch.no_grad():
                self.model(images)
        self.optimizer.zero_grad(set_to_none=True)
        cross_entropy(self.model(images).logits, labels).backward()
        self.optimizer.step()

    def memory(self):
        return {}

    def drain(self):
        pass


class StagedLoop(PlainLoop):
    """The plain loop on the model's J stages, without the engine: each stage's input detached from the one before,
    so there is one graph, one backward call and one SGD step per stage, as any pipeline engine has. What splitting
    the model costs by itself; the engine's `backprop` mode over it is the engine's own cost."""

    def __init__(self, model):
        self.stages = model.get_stages()
        self.optimizers = [sgd(stage, 0.01) for stage in self.stages]

    def step(self, images, labels):
        inputs, outputs = [images], [self.stages[0](images)]
        for stage in self.stages[1:]:
            inputs.append(detached(outputs[-1], requires_grad=True))
            outputs.append(stage(inputs[-1]))
        cross_entropy(outputs[-1], labels).backward()
        for index in range(len(self.stages) - 2, -1, -1):
            torch.autograd.backward(tensors_of(outputs[index]), [t.grad for t in tensors_of(inputs[index + 1])])
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def held_bytes(pipeline) -> int:
    return sum(stats.activation_bytes + stats.stash_bytes for stats in pipeline.memory().values())


def peak_bytes(pipeline) -> int:
    return sum(stats.peak_bytes for stats in pipeline.memory().values())


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.tuned_malloc:
        (measured,) = launch(_measure_job, 1, args, env=STABLE_MALLOC_ENV)
    else:
        measured = measure(args)
    name = "kept_graphs_tuned_malloc" if args.tuned_malloc else "kept_graphs"
    return write_results(results_path(args.out, name, args.quick), "kept_graphs", "kept_graphs.py", argv,
                         {key: value for key, value in vars(args).items() if key != "out"}, **measured)


def _measure_job(rank, world_size, args) -> dict:
    return measure(args)


def paired_ratios(times: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Per reference (the plain loop, the same with PETRA's operations, split into stages, the engine's `backprop`
    mode), each method's median over the repetitions of its window's time over the reference's window."""
    return {reference: {name: statistics.median(t / r for t, r in zip(values, times[reference]))
                        for name, values in times.items()}
            for reference in ("plain", "plain_second_forward", "plain_staged", "backprop") if reference in times}


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def measure(args) -> dict:
    torch.manual_seed(0)
    config = revnet_config("revnet18", width=args.width, num_labels=10)
    batches = random_batches(4, args.batch, 32)
    stages = build_model(config).get_stages()
    candidates = recomputing_stages(stages, Mode.PETRA)

    def pipeline(mode, **options):
        return make_pipeline(build_model(config).get_stages(), mode, lr=0.01, **options)

    engines = {"backprop": pipeline("backprop"), "petra": pipeline("petra"),
               "petra_kept": pipeline("petra", memory=MemoryOptions(keep_graphs=candidates)),
               "petra_all_kept": pipeline(
                   "petra", memory=MemoryOptions(keep_graphs=keepable_stages(stages, Mode.PETRA)))}
    held = {}
    for name in ("petra", "petra_kept", "petra_all_kept"):  # fill, and read what the steady state holds
        feed(engines[name], batches, 2 * len(stages))
        held[name] = held_bytes(engines[name])
    budget = (held["petra"] + held["petra_all_kept"]) // 2
    engines["petra_budget"] = pipeline("petra", memory=MemoryOptions(memory_budget=budget), profile_batch=batches[0])
    feed(engines["petra_budget"], batches, 2 * len(stages))
    feed(engines["backprop"], batches, 3)
    engines["plain"] = PlainLoop(build_model(config))
    engines["plain_second_forward"] = PlainLoop(build_model(config), second_forward=True)
    engines["plain_staged"] = StagedLoop(build_model(config))
    for name in ("plain", "plain_second_forward", "plain_staged"):
        feed(engines[name], batches, 3)
    progress(f"{os.cpu_count()} CPUs, load average {load_average()}; stages that recompute: {candidates}; budget "
             f"{budget} bytes keeps {sorted(engines['petra_budget'].kept_graphs)}")

    times = {name: [] for name in METHODS}
    faults = {name: [] for name in METHODS}
    peaks = dict.fromkeys(METHODS, 0)
    for repeat in range(args.repeats):
        for name in METHODS:
            elapsed, faulted = 0.0, 0
            for index in range(args.micro_batches):
                before = minor_faults()
                start = time.perf_counter()
                engines[name].step(*batches[index % len(batches)])
                elapsed += time.perf_counter() - start
                faulted += minor_faults() - before
                peaks[name] = max(peaks[name], held_bytes(engines[name]))  # untimed: costlier with kept graphs
            times[name].append(elapsed / args.micro_batches)
            faults[name].append(faulted / args.micro_batches)
        progress(f"repetition {repeat + 1}/{args.repeats} (ms per micro-batch): "
                 + ", ".join(f"{name} {1e3 * values[-1]:.1f}" for name, values in times.items()))
    for name in METHODS:
        engines[name].drain()
    medians = {name: statistics.median(values) for name, values in times.items()}
    paired = paired_ratios(times)
    within = {name: peak_bytes(engines[name]) for name in METHODS}
    for name in METHODS:
        progress(f"{name:14s} {1e3 * medians[name]:7.2f} ms per micro-batch ({paired['plain'][name]:.3f}x plain, "
                 f"{paired['backprop'][name]:.3f}x backprop mode, {statistics.median(faults[name]):.0f} minor faults), "
                 f"holds {peaks[name] / 2**20:.2f} MiB between ticks, {within[name] / 2**20:.2f} MiB at its peak")
    return dict(
        malloc="fixed thresholds (STABLE_MALLOC_ENV)" if args.tuned_malloc else "glibc's default",
        layout="".join("R" if getattr(s, "reversible", False) else "B" for s in stages),
        recomputing=candidates, budget_bytes=budget,
        kept={name: sorted(getattr(engines[name], "kept_graphs", ())) for name in METHODS},
        times=times, median_s=medians, ratio_to_plain=paired["plain"], ratio_to_backprop=paired["backprop"],
        ratio_to_operations=paired["plain_second_forward"], ratio_to_staged=paired["plain_staged"],
        minor_faults=faults, median_minor_faults={name: statistics.median(v) for name, v in faults.items()},
        held_bytes=peaks, peak_bytes=within, load=load_average(),
    )


if __name__ == "__main__":
    main()
