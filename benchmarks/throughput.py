"""Throughput of PETRA against naive model parallelism and torch.distributed.pipelining's 1F1B, on CPU.

    python benchmarks/throughput.py            # full run (several minutes), rewrites docs/benchmarks-throughput.md
    python benchmarks/throughput.py --quick    # small model, few micro-batches: checks that everything runs

One invocation does everything, in spawned processes that each use one thread (OMP_NUM_THREADS=1):

1. one process: per-stage cost of the RevNet18 stages under PETRA (to balance the 2-rank partition), per-stage
   memory figures, and the one-process cost of PETRA against a plain `model(x); loss.backward(); opt.step()` loop;
2. one gloo group of 2 processes (TCP on 127.0.0.1), the J = 10 RevNet18 stages split in 2 contiguous groups:
   - PETRA (`mode="petra"`, one micro-batch per tick, k = 1), steady state and from-empty-to-drained;
   - naive model parallelism with the engine's synchronous schedule: `reversible_backprop` and `backprop`;
   - `torch.distributed.pipelining.Schedule1F1B` over 2 `PipelineStage`s, each stage's forward wrapped in
     `torch.utils.checkpoint`, SGD step after every `schedule.step()` (one step = m micro-batches, fill + drain).

Every measurement is a timing window of N micro-batches; the windows of all methods are interleaved, repetition
after repetition, inside the same processes, so slow drifts of a shared machine hit every method alike. Reported:
median (min, max) over the repetitions of wall time / N, where a window's wall time is the slower rank's.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for path in (str(HERE), str(ROOT / "src")):
    if path not in sys.path:
        sys.path.insert(0, path)

os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")  # before torch is imported (petra_hub imports it)

from _launch import SINGLE_THREAD_ENV, STABLE_MALLOC_ENV, launch

os.environ.update(SINGLE_THREAD_ENV)  # inherited by the children

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

DOC = ROOT / "docs" / "benchmarks-throughput.md"
NUM_DISTINCT_BATCHES = 4  # the micro-batches fed are these, cycled (content does not matter for speed)


# ---------------------------------------------------------------------------------------------------------------------
# Settings, model, data
# ---------------------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=None, help="timing windows per method (default 5; quick: 2)")
    parser.add_argument(
        "--micro-batches", type=int, default=None, help="micro-batches per timing window, N (default 100; quick: 12)"
    )
    parser.add_argument("--batch", type=int, default=None, help="micro-batch size (default 32; quick: 8)")
    parser.add_argument(
        "--width",
        type=int,
        default=None,
        help="stream width of the first layer; layers use w,2w,4w,8w (default 16; quick: 4)",
    )
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument(
        "--pp-microbatches",
        type=str,
        default=None,
        help="comma-separated n_microbatches for Schedule1F1B (default 2,8,18; quick: 2,4)",
    )
    parser.add_argument(
        "--partition", type=str, default=None, help="stages per rank, e.g. 4,6 (default: balanced by measured cost)"
    )
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--quick", action="store_true", help="tiny model and windows: a smoke test of the script")
    parser.add_argument(
        "--doc",
        type=str,
        default=None,
        help=f"where to write the markdown report (default {DOC.relative_to(ROOT)} for full runs, none with --quick)",
    )
    parser.add_argument("--no-doc", action="store_true", help="do not write the markdown report")
    parser.add_argument("--preliminary", action="store_true", help="mark the report's numbers as preliminary")
    parser.add_argument("--json", type=str, default=None, help="also save the raw measurements to this JSON file")
    parser.add_argument(
        "--render-only", type=str, default=None, metavar="JSON", help="rebuild the tables / report from a --json file"
    )
    parser.add_argument(
        "--default-malloc",
        action="store_true",
        help="keep glibc's adaptive malloc thresholds (default: fixed, see benchmarks/_launch.py STABLE_MALLOC_ENV)",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    args.repeats = args.repeats or (2 if quick else 5)
    args.micro_batches = args.micro_batches or (12 if quick else 100)
    args.batch = args.batch or (8 if quick else 32)
    args.width = args.width or (4 if quick else 16)
    args.pp_microbatches = [int(m) for m in (args.pp_microbatches or ("2,4" if quick else "2,8,18")).split(",")]
    args.partition = [int(p) for p in args.partition.split(",")] if args.partition else None
    if args.doc is None and not quick:
        args.doc = str(DOC)
    if args.no_doc:
        args.doc = None
    if args.repeats < 1 or args.micro_batches < 1 or args.batch < 2 or args.width < 1:
        parser.error("--repeats, --micro-batches, --width must be >= 1 and --batch >= 2 (batch norm)")
    if any(m < 2 for m in args.pp_microbatches):
        parser.error("Schedule1F1B needs n_microbatches >= the number of stages (2)")
    return args


def build_model(settings):
    from petra_hub import RevNetConfig, RevNetForImageClassification

    w = settings.width
    config = RevNetConfig.from_preset(
        "revnet18", hidden_sizes=[w, 2 * w, 4 * w, 8 * w], embedding_size=w, num_labels=10
    )
    torch.manual_seed(0)
    model = RevNetForImageClassification(config)
    model.train()
    return model


def make_batches(settings):
    generator = torch.Generator().manual_seed(1)
    size = settings.image_size
    return [
        (
            torch.randn(settings.batch, 3, size, size, generator=generator),
            torch.randint(0, 10, (settings.batch,), generator=generator),
        )
        for _ in range(NUM_DISTINCT_BATCHES)
    ]


def cross_entropy(logits, labels):
    return F.cross_entropy(logits, labels)


def sgd(lr, index, stage):
    return torch.optim.SGD(stage.parameters(), lr=lr, momentum=0.9)


def make_pipeline(settings, mode, partition=None, distributed=None):
    from petra_hub.engine import Pipeline

    return Pipeline(
        build_model(settings).get_stages(),
        cross_entropy,
        mode=mode,
        accumulation_steps=1,
        optimizer_factory=functools.partial(sgd, settings.lr),
        partition=partition,
        distributed=distributed,
        timeout=600,
    )


def feed(pipeline, batches, count, offset=0):
    for index in range(offset, offset + count):
        pipeline.step(*batches[index % len(batches)])


def fill_count(num_stages: int) -> int:
    """Micro-batches after which a pipelined schedule is in steady state (every stage forwards and backwards)."""
    return 2 * (num_stages - 1) + 1


# ---------------------------------------------------------------------------------------------------------------------
# Memory accounting helpers (bytes of distinct storages)
# ---------------------------------------------------------------------------------------------------------------------
def storage_bytes(tensors, exclude=()) -> int:
    skip = {p.untyped_storage().data_ptr() for p in exclude}
    seen, total = set(), 0
    for tensor in tensors:
        pointer = tensor.untyped_storage().data_ptr()
        if pointer in skip or pointer in seen:
            continue
        seen.add(pointer)
        total += tensor.untyped_storage().nbytes()
    return total


def as_list(value):
    return list(value) if isinstance(value, (tuple, list)) else [value]


def graph_bytes(module: nn.Module, inputs) -> int:
    """Activations autograd keeps for the backward of `module(inputs)` (plus its output): what a recomputation
    holds at its peak, for one micro-batch. Parameters excluded; running statistics not touched."""
    from petra_hub.engine.batchnorm import frozen_running_stats

    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    leaves = [t.detach().requires_grad_(True) for t in as_list(inputs)]
    leaves = tuple(leaves) if isinstance(inputs, tuple) else leaves[0]
    with torch.enable_grad(), frozen_running_stats(module), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        outputs = module(leaves)
    return storage_bytes(saved + as_list(outputs), exclude=list(module.parameters()))


# ---------------------------------------------------------------------------------------------------------------------
# Part 1: one process (calibration, memory figures, PETRA vs plain backprop)
# ---------------------------------------------------------------------------------------------------------------------
def instrument_workers(pipeline):
    """Accumulate the CPU time spent in each stage worker (forward, backward, update): the engine's own work.
    CPU time (not wall time) so that other processes sharing the cores do not skew the partition."""
    costs = defaultdict(float)
    for index, worker in pipeline.workers.items():
        for name in ("forward", "backward", "forward_backward_last", "maybe_update"):
            original = getattr(worker, name)

            def timed(*args, _original=original, _index=index, **kwargs):
                start = time.process_time()
                try:
                    return _original(*args, **kwargs)
                finally:
                    costs[_index] += time.process_time() - start

            setattr(worker, name, timed)
    return costs


def one_process_job(rank, world_size, settings):
    torch.manual_seed(0)
    batches = make_batches(settings)
    result = {"threads": torch.get_num_threads()}

    # (a) per-stage cost under PETRA, to balance the partition, and per-stage FIFO sizes
    pipeline = make_pipeline(settings, "petra", distributed=False)
    num_stages = pipeline.num_stages
    fill = fill_count(num_stages)
    feed(pipeline, batches, fill)
    costs = instrument_workers(pipeline)
    count = max(8, settings.micro_batches // 4)
    fifo = defaultdict(int)
    for step in range(count):
        feed(pipeline, batches, 1, step)
        for index, stats in pipeline.memory().items():
            fifo[index] = max(fifo[index], stats.activation_bytes)
    result["stage_ms"] = [1e3 * costs[i] / count for i in range(num_stages)]  # read before the drain's ticks
    pipeline.drain()
    result["stage_names"] = [type(s).__name__ for s in pipeline.stages]
    result["fifo_bytes"] = [fifo[i] for i in range(num_stages)]

    # (b) per-stage activation sizes and recomputation graphs, for one micro-batch
    value = batches[0][0]
    inputs_bytes, outputs_bytes, graphs = [], [], []
    with torch.no_grad():
        for stage in pipeline.stages:
            inputs_bytes.append(storage_bytes(as_list(value)))
            graphs.append(graph_bytes(stage, value))
            value = stage(value)
            outputs_bytes.append(storage_bytes(as_list(value)))
    result["input_bytes"], result["output_bytes"], result["graph_bytes"] = inputs_bytes, outputs_bytes, graphs
    result["image_bytes"] = storage_bytes([batches[0][0]])

    # (c) PETRA (all stages in this process) against a plain backprop loop, windows interleaved
    model = build_model(settings)
    optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=0.9)

    split = {"forward": 0.0, "backward": 0.0, "step": 0.0}

    def plain_step(images, labels):
        start = time.process_time()
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(images).logits, labels)
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

    petra = make_pipeline(settings, "petra", distributed=False)
    for index in range(3):
        plain_step(*batches[index % len(batches)])
    feed(petra, batches, fill)  # filled once: every window below is steady state
    times = {"plain": [], "petra": []}
    cpu = {"plain": [], "petra": []}
    faults = {"plain": [], "petra": []}
    for key in split:
        split[key] = 0.0
    for repeat in range(settings.repeats):
        for name, work in (
            ("plain", plain_window),
            ("petra", lambda: feed(petra, batches, settings.micro_batches, fill)),
        ):
            usage = resource.getrusage(resource.RUSAGE_SELF)
            start, start_cpu = time.perf_counter(), time.process_time()
            work()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
            faults[name].append(
                (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - usage.ru_minflt) / settings.micro_batches
            )
        progress(
            f"one process, repetition {repeat + 1}/{settings.repeats}: "
            f"plain {1e3 * times['plain'][-1] / settings.micro_batches:.1f} ms, "
            f"PETRA {1e3 * times['petra'][-1] / settings.micro_batches:.1f} ms per micro-batch"
        )
    petra.drain()
    result["times"], result["cpu"], result["faults"] = times, cpu, faults
    plain_count = settings.repeats * settings.micro_batches
    result["plain_split"] = {key: value / plain_count for key, value in split.items()}
    return result


# ---------------------------------------------------------------------------------------------------------------------
# Part 2: two processes
# ---------------------------------------------------------------------------------------------------------------------
class Part(nn.Module):
    """A contiguous group of RevNet stages as one `PipelineStage` submodule, checkpointed as a whole.

    The two streams cross the boundary as one tensor (concatenated on channels, split on arrival), which is the
    simplest thing `PipelineStage` accepts; the engine flattens its messages the same way."""

    def __init__(self, stages, first: bool, last: bool, checkpoint: bool = True):
        super().__init__()
        self.body = nn.ModuleList(stages)
        self.first, self.last, self.checkpoint = first, last, checkpoint

    def run(self, x):
        value = x if self.first else tuple(t.contiguous() for t in x.chunk(2, dim=1))
        for stage in self.body:
            value = stage(value)
        return value if self.last else torch.cat(value, dim=1)

    def forward(self, x):
        if self.checkpoint:
            from torch.utils.checkpoint import checkpoint

            return checkpoint(self.run, x, use_reentrant=False)
        return self.run(x)


class ExchangeTimer:
    """Wraps the engine's transport to measure the time a rank spends in (waiting for) its neighbour exchanges."""

    def __init__(self, transport):
        self.seconds = 0.0
        self.transport = transport
        self.original = transport.exchange

        def exchange(*args, **kwargs):
            start = time.perf_counter()
            try:
                return self.original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        transport.exchange = exchange


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


def two_process_job(rank, world_size, settings, partition, boundary_numel, copies):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    torch.manual_seed(0)
    batches = make_batches(settings)
    n = settings.micro_batches
    results = defaultdict(list)  # name -> per-repetition seconds per micro-batch (slowest rank)
    exchange = defaultdict(list)  # name -> per-repetition [per-rank seconds in exchanges per micro-batch]
    cpu = defaultdict(list)  # name -> per-repetition [per-rank CPU seconds per micro-batch]
    faults = defaultdict(list)  # name -> per-repetition [per-rank minor page faults per micro-batch]
    info = {"threads": torch.get_num_threads(), "world_size": dist.get_world_size(), "backend": dist.get_backend()}
    info["bare_exchange"] = all_values(bare_exchange(rank, boundary_numel, copies))

    # --- engine pipelines, one per mode, each with its own copy of the model
    # "petra" runs continuously (steady state); "petra_drain" is cycled from empty to drained in every window
    modes = {
        "petra": "petra",
        "petra_drain": "petra",
        "reversible_backprop": "reversible_backprop",
        "backprop": "backprop",
    }
    engines = {name: make_pipeline(settings, mode, partition=partition) for name, mode in modes.items()}
    fill = fill_count(engines["petra"].num_stages)
    timers = {}
    for name, pipeline in engines.items():  # warm-up and the start-up handshake
        feed(pipeline, batches, fill if modes[name] == "petra" else 3)
        pipeline.drain()
        timers[name] = ExchangeTimer(pipeline.transport)

    # PETRA's held activations per rank: sampled between ticks in steady state (engine accounting)
    petra = engines["petra"]
    feed(petra, batches, fill)
    held = 0
    for index in range(fill):
        feed(petra, batches, 1, fill + index)
        held = max(held, sum(s.activation_bytes for s in petra.memory().values()))
    info["petra_held_bytes"] = all_values(held)  # and "petra" stays filled from here on

    # --- torch.distributed.pipelining: one PipelineStage per rank, Schedule1F1B, checkpointed stages
    bounds = [0]
    for size in partition:
        bounds.append(bounds[-1] + size)
    schedules, pp_optimizers = {}, {}
    for m in settings.pp_microbatches:  # one model copy, stage and schedule per n_microbatches
        stages = build_model(settings).get_stages()
        part = Part(stages[bounds[rank] : bounds[rank + 1]], first=rank == 0, last=rank == world_size - 1)
        part.train()
        pp_optimizers[m] = torch.optim.SGD(part.parameters(), lr=settings.lr, momentum=0.9)
        stage = PipelineStage(part, rank, world_size, torch.device("cpu"))
        schedules[m] = Schedule1F1B(stage, n_microbatches=m, loss_fn=cross_entropy)

    def pp_step(m, first_micro_batch):
        chosen = [batches[(first_micro_batch + i) % len(batches)] for i in range(m)]
        if rank == 0:
            schedules[m].step(arg_mbs=[(images,) for images, _ in chosen], kwarg_mbs=[{}] * m)
        elif rank == world_size - 1:
            losses = []
            schedules[m].step(
                target_mbs=[labels for _, labels in chosen],
                arg_mbs=[()] * m,
                kwarg_mbs=[{}] * m,
                losses=losses,
                return_outputs=False,
            )
        else:
            schedules[m].step(arg_mbs=[()] * m, kwarg_mbs=[{}] * m)
        pp_optimizers[m].step()
        pp_optimizers[m].zero_grad(set_to_none=True)

    for m in settings.pp_microbatches:  # warm-up (shape inference on the first step)
        pp_step(m, 0)
        pp_step(m, m)

    # --- timing windows, interleaved
    def window(name, work, micro_batches, timer=None):
        dist.barrier()
        before = timer.seconds if timer else 0.0
        usage = resource.getrusage(resource.RUSAGE_SELF)
        start, start_cpu = time.perf_counter(), time.process_time()
        work()
        elapsed, used = time.perf_counter() - start, time.process_time() - start_cpu
        faulted = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - usage.ru_minflt
        ranks = all_values((elapsed, used, timer.seconds - before if timer else None, faulted))
        results[name].append(max(r[0] for r in ranks) / micro_batches)
        cpu[name].append([r[1] / micro_batches for r in ranks])
        faults[name].append([r[3] / micro_batches for r in ranks])
        if timer:
            exchange[name].append([r[2] / micro_batches for r in ranks])

    for repeat in range(settings.repeats):
        # PETRA, steady state: N more micro-batches through the pipeline that is kept full
        window("petra", lambda: feed(petra, batches, n, fill), n, timers["petra"])
        # PETRA, from empty to drained: N micro-batches, fill and drain included
        cycled = engines["petra_drain"]
        window("petra_drain", lambda p=cycled: (feed(p, batches, n), p.drain()), n, timers["petra_drain"])
        for mode in ("reversible_backprop", "backprop"):
            pipeline = engines[mode]
            window(mode, lambda p=pipeline: (feed(p, batches, n), p.drain()), n, timers[mode])
        for m in settings.pp_microbatches:
            steps = math.ceil(n / m)
            window(f"1f1b_m{m}", lambda m=m, steps=steps: [pp_step(m, s * m) for s in range(steps)], steps * m)
        if rank == 0:
            line = ", ".join(f"{name} {1e3 * values[-1]:.1f}" for name, values in results.items())
            progress(f"two processes, repetition {repeat + 1}/{settings.repeats} (ms per micro-batch): {line}")

    petra.drain()
    # sanity: every micro-batch fed was backpropagated and applied (k = 1) at every local stage
    for mode, pipeline in engines.items():
        for index, counters in pipeline.counters().items():
            if not counters.forwards == counters.backwards == counters.updates == pipeline.fed:
                raise RuntimeError(f"{mode}, stage {index}: {counters} after {pipeline.fed} micro-batches")
    info["local_stages"] = list(range(bounds[rank], bounds[rank + 1]))
    return {"times": dict(results), "exchange": dict(exchange), "cpu": dict(cpu), "faults": dict(faults), "info": info}


# ---------------------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------------------
def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def balanced_partition(costs: list[float]) -> list[int]:
    """The contiguous 2-way split of the stages minimising the larger group's cost."""
    best = min(range(1, len(costs)), key=lambda s: max(sum(costs[:s]), sum(costs[s:])))
    return [best, len(costs) - best]


def summary(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def ms(value: float) -> str:
    return f"{1e3 * value:.1f}"


def mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def machine_description() -> dict:
    def run(command):
        # GNU nproc honours OMP_NUM_THREADS, which this script sets to 1: ask it without that variable
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")}
        try:
            return subprocess.run(
                command, check=False, capture_output=True, text=True, timeout=10, env=env
            ).stdout.strip()
        except Exception:  # noqa: BLE001 - informative only
            return "?"

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": run(["nproc"]),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


STAGE_LETTERS = {"RevNetStem": "S", "ReversibleBlock": "R", "DownsampleBlock": "D", "RevNetHead": "H"}


def pair(values) -> str:
    return " / ".join(ms(v) for v in values)


def per_rank_median(rows: list[list[float]]) -> list[float]:
    """Median over repetitions of each rank's value (rows: one list of per-rank values per repetition)."""
    return [statistics.median(column) for column in zip(*rows)]


def render(settings, machine, one, two, partition, loads) -> tuple[str, dict]:
    """The markdown tables, and the headline numbers (for the discussion)."""
    lines = []
    out = lines.append
    n = settings.micro_batches
    names = one["stage_names"]
    num_stages = len(names)
    letters = [STAGE_LETTERS.get(name, "?") for name in names]
    stage_ms = one["stage_ms"]
    groups = [list(range(partition[0])), list(range(partition[0], num_stages))]
    rank_ms = [sum(stage_ms[i] for i in group) for group in groups]
    balance = sum(rank_ms) / max(rank_ms)
    times, cpu, exchange = two[0]["times"], two[0]["cpu"], two[0]["exchange"]
    med = {name: statistics.median(values) for name, values in times.items()}
    petra = med["petra"]
    cpu_med = {name: per_rank_median(rows) for name, rows in cpu.items()}
    exchange_med = {name: per_rank_median(rows) for name, rows in exchange.items()}
    busy = {name: statistics.median(sum(row) / wall for row, wall in zip(cpu[name], times[name])) for name in times}
    w = settings.width
    headline = {
        "balance": balance,
        "rank_ms": rank_ms,
        "med": med,
        "busy": busy,
        "cpu": cpu_med,
        "exchange": exchange_med,
        "vs_naive": med["reversible_backprop"] / petra,
        "vs_naive_best": min(times["reversible_backprop"]) / min(times["petra"]),
        "vs_backprop": med["backprop"] / petra,
        "vs_1f1b": {m: med[f"1f1b_m{m}"] / petra for m in settings.pp_microbatches},
        "drain": med["petra_drain"] / petra,
        "drain_best": min(times["petra_drain"]) / min(times["petra"]),
        "vs_1f1b_best": {m: min(times[f"1f1b_m{m}"]) / min(times["petra"]) for m in settings.pp_microbatches},
    }

    out(
        f"Model: RevNet18 (stages {' '.join(letters)}: J = {num_stages} engine stages), CIFAR stem, stream widths "
        f"{w}/{2 * w}/{4 * w}/{8 * w}, {settings.image_size}x{settings.image_size} random images, 10 classes, "
        f"micro-batch {settings.batch}, float32. SGD (lr {settings.lr:g}, momentum 0.9): after every micro-batch "
        f"for the engine modes (k = 1), after every `step()` for 1F1B."
    )
    out(
        f"Timing: N = {n} micro-batches per window, {settings.repeats} windows per method, interleaved across "
        f"methods; ms per micro-batch = window wall time (slowest rank) / N: median, min, max over the windows."
    )
    out(f"Load average (1, 5, 15 min) at start / after part 1 / at the end: {' / '.join(loads)}.")
    malloc = (
        "glibc default (adaptive)"
        if settings.default_malloc
        else ", ".join(f"{k}={v}" for k, v in STABLE_MALLOC_ENV.items())
    )
    out(f"malloc: {malloc}.")
    out("")

    out("### Per-stage cost under PETRA (one process, one thread, CPU time) and the 2-rank partition")
    out("")
    out("| stage | " + " | ".join(f"{i} {letter}" for i, letter in enumerate(letters)) + " |")
    out("|---|" + "---|" * num_stages)
    out("| ms per micro-batch (fwd + bwd + update) | " + " | ".join(f"{c:.1f}" for c in stage_ms) + " |")
    out("")
    out(
        f"Partition {partition}: rank 0 runs stages {groups[0][0]}-{groups[0][-1]} ({rank_ms[0]:.1f} ms per tick), "
        f"rank 1 stages {groups[1][0]}-{groups[1][-1]} ({rank_ms[1]:.1f} ms per tick). A perfectly overlapped "
        f"2-rank pipeline is at best sum / max = {balance:.2f}x faster than the same 2 ranks without overlap "
        f"(communication ignored)."
    )
    out("")

    out("### Two processes (gloo over TCP on 127.0.0.1, 1 thread each)")
    out("")
    labels = {
        "petra": 'PETRA, steady state (`mode="petra"`, k = 1)',
        "petra_drain": f"PETRA, {n} micro-batches from empty, fill + drain included",
        "reversible_backprop": "naive MP: engine `reversible_backprop` (synchronous)",
        "backprop": "naive MP: engine `backprop` (synchronous, keeps the graph)",
    }
    for m in settings.pp_microbatches:
        labels[f"1f1b_m{m}"] = f"`Schedule1F1B` + checkpoint, n_microbatches = {m}"
    out(
        "| method | ms / micro-batch | min | max | PETRA faster by | CPU ms/mb, rank 0 / 1 | in exchange ms/mb, "
        "rank 0 / 1 | cores busy | page faults / mb |"
    )
    out("|---|---|---|---|---|---|---|---|---|")
    for name, label in labels.items():
        median, low, high = summary(times[name])
        speed = "-" if name == "petra" else f"{median / petra:.2f}x"
        ex = pair(exchange_med[name]) if name in exchange_med else "n/a"
        faulted = statistics.median(max(row) for row in two[0]["faults"][name])
        out(
            f"| {label} | {ms(median)} | {ms(low)} | {ms(high)} | {speed} | {pair(cpu_med[name])} | {ex} "
            f"| {busy[name]:.2f} | {faulted:.0f} |"
        )
    out("")
    boundary = one["output_bytes"][partition[0] - 1]
    bare = max(two[0]["info"]["bare_exchange"])
    headline["bare_exchange"] = bare
    reversible_boundary = names[partition[0] - 1] == "ReversibleBlock"
    back = (
        "the rebuilt activation and its gradient"
        if reversible_boundary
        else "its gradient only: the boundary stage is not reversible, so nothing is rebuilt from it"
    )
    out(
        f"A bare exchange of one PETRA tick's boundary messages ({mib(boundary)} MiB forward, "
        f"{mib((2 if reversible_boundary else 1) * boundary)} MiB back: {back}) takes {ms(bare)} ms (median of 20)."
    )
    out("")
    out(
        '"PETRA faster by" = that method\'s median / PETRA\'s steady-state median. "cores busy" = CPU time of both '
        "ranks / wall time (2.00 = both cores computing all the time; a rank blocked in gloo uses no CPU). "
        '"in exchange" = time inside the engine\'s neighbour exchange (transfer + waiting for the other rank). '
        '"page faults / mb" = minor page faults per micro-batch (the larger rank, median window).'
    )
    out("")
    petra_bound = max(cpu_med["petra"])
    cpu_bound = {mode: sum(cpu_med[mode]) / petra_bound for mode in ("reversible_backprop", "backprop")}
    headline["cpu_bound"] = cpu_bound

    def fastest(name):
        return f"{min(times[name]) / min(times['petra']):.2f}x"

    out("| PETRA (steady state) against | measured (medians) | fastest windows | ideal here | from CPU times | why |")
    out("|---|---|---|---|---|---|")
    out(
        f"| naive MP, `reversible_backprop` | **{headline['vs_naive']:.2f}x** | {fastest('reversible_backprop')} | "
        f"{balance:.2f}x | {cpu_bound['reversible_backprop']:.2f}x | same work per micro-batch, no overlap; ideal = "
        f"sum / max of the rank costs |"
    )
    out(
        f"| naive MP, `backprop` | {headline['vs_backprop']:.2f}x | {fastest('backprop')} | {0.75 * balance:.2f}x | "
        f"{cpu_bound['backprop']:.2f}x | no reconstruction: about 3/4 of PETRA's work |"
    )
    for m in settings.pp_microbatches:
        out(
            f"| `Schedule1F1B` + checkpoint, m = {m} | {headline['vs_1f1b'][m]:.2f}x | {fastest(f'1f1b_m{m}')} | "
            f"{(m + 1) / m:.2f}x | - | same work (checkpoint = 1 extra forward); bubble (p-1)/(m+p-1) |"
        )
    drain_bound = (n + 2 * (num_stages - 1)) / n
    out(
        f"| itself with fill + drain ({n} micro-batches) | {headline['drain']:.2f}x the steady cost | "
        f"{fastest('petra_drain')} | <= {drain_bound:.2f}x | - | N + 2(J-1) ticks for N micro-batches, fill/drain "
        f"ticks are partly idle |"
    )
    out("")
    out('"fastest windows" = ratio of the two methods\' fastest windows, the least disturbed ones on a shared machine.')
    out("")
    out(
        '"from CPU times" = (rank 0 + rank 1 CPU time per micro-batch of the synchronous run) / (the larger rank\'s '
        "CPU time per micro-batch under PETRA): the speed-up if each rank had a core to itself and waiting for "
        "messages cost nothing. It separates what the schedule can deliver from what a busy machine allowed."
    )
    out("")

    graphs, inputs_b, outputs_b = one["graph_bytes"], one["input_bytes"], one["output_bytes"]
    held_engine = two[0]["info"]["petra_held_bytes"]
    out("### Activation memory per rank (MiB)")
    out("")
    out(
        '"held" = kept between a micro-batch\'s forward and its backward (PETRA: engine accounting of the '
        "non-reversible stages' input FIFOs, steady state; 1F1B: stage input and output of each micro-batch in "
        'flight, plus on rank 0 the m input micro-batches of the step); "transient" = the autograd graph of one '
        "recomputation (PETRA: one engine stage at a time; 1F1B + checkpoint: the whole rank's part)."
    )
    out("")
    out("| method | rank 0: held + transient = total | rank 1: held + transient = total |")
    out("|---|---|---|")

    def row(label, cells):
        out(f"| {label} | " + " | ".join(f"{mib(h)} + {mib(t)} = **{mib(h + t)}**" for h, t in cells) + " |")

    row("PETRA", [(held_engine[r], max(graphs[i] for i in g)) for r, g in enumerate(groups)])
    row("naive `reversible_backprop`", [(0, max(graphs[i] for i in g)) for g in groups])
    row("naive `backprop` (one graph)", [(sum(graphs[i] for i in g), 0) for g in groups])
    for m in settings.pp_microbatches:
        cells = []
        for r, g in enumerate(groups):
            stored = min(m, len(groups) - r) * (inputs_b[g[0]] + outputs_b[g[-1]])
            if r == 0:
                stored += m * one["image_bytes"]
            cells.append((stored, sum(graphs[i] for i in g)))
        row(f"`Schedule1F1B` + checkpoint, m = {m}", cells)
    out("")
    fifo = one["fifo_bytes"]
    out(
        "PETRA FIFOs per stage (MiB): "
        + ", ".join(f"stage {i} {letters[i]}: {mib(b)}" for i, b in enumerate(fifo) if b)
        + f"; one image micro-batch is {mib(one['image_bytes'])} MiB."
    )
    out("")

    n_one = settings.micro_batches
    plain, petra1 = one["times"]["plain"], one["times"]["petra"]
    plain_cpu, petra_cpu = one["cpu"]["plain"], one["cpu"]["petra"]
    split = one["plain_split"]
    wall_ratio = statistics.median(p / b for p, b in zip(petra1, plain))
    cpu_ratio = statistics.median(p / b for p, b in zip(petra_cpu, plain_cpu))
    expected = (2 * split["forward"] + split["backward"] + split["step"]) / sum(split.values())
    headline.update(one_wall=wall_ratio, one_cpu=cpu_ratio, one_expected=expected, split=split)
    out("### One process, one thread: PETRA (all 10 stages local) against plain backprop")
    out("")
    out("| loop | wall ms / micro-batch | min | max | CPU ms / micro-batch | page faults / mb |")
    out("|---|---|---|---|---|---|")
    for label, values, used, key in (
        ("plain `model(x)`; `loss.backward()`; `opt.step()`", plain, plain_cpu, "plain"),
        ('`Pipeline(stages, mode="petra")`, steady state', petra1, petra_cpu, "petra"),
    ):
        median, low, high = summary([v / n_one for v in values])
        out(
            f"| {label} | {ms(median)} | {ms(low)} | {ms(high)} | {ms(statistics.median(used) / n_one)} "
            f"| {statistics.median(one['faults'][key]):.0f} |"
        )
    out("")
    out(
        f"PETRA / plain: **{wall_ratio:.2f}** (wall time), {cpu_ratio:.2f} (CPU time); medians of the per-repetition "
        f"ratios. Paper's FLOP model (backward = 2 forwards): 4/3 = 1.33. With this machine's measured plain "
        f"forward {ms(split['forward'])} ms, backward {ms(split['backward'])} ms and SGD step {ms(split['step'])} ms, "
        f'"one more forward" predicts (2F + B + U) / (F + B + U) = {expected:.2f}.'
    )
    return "\n".join(lines), headline


def main(argv=None) -> None:
    settings = parse_args(argv)
    if settings.render_only:
        rerender(settings)
        return
    command = "python benchmarks/throughput.py" + "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv))
    machine = machine_description()
    loads = [load_average()]
    progress(f"{machine['nproc']} CPUs, torch {machine['torch']}, load average {loads[0]}")

    started = time.time()
    progress("part 1, one process: per-stage cost, memory, PETRA against plain backprop")
    env = {} if settings.default_malloc else STABLE_MALLOC_ENV
    (one,) = launch(one_process_job, 1, settings, env=env)
    partition = settings.partition or balanced_partition(one["stage_ms"])
    if len(partition) != 2 or sum(partition) != len(one["stage_names"]) or min(partition) < 1:
        raise SystemExit(f"--partition must split the {len(one['stage_names'])} stages in 2 groups, got {partition}")
    progress(f"partition {partition} (per-stage CPU ms {[round(c, 1) for c in one['stage_ms']]})")
    loads.append(load_average())

    progress("part 2, two processes: PETRA, naive model parallelism, Schedule1F1B")
    boundary_numel = one["output_bytes"][partition[0] - 1] // 4  # float32 activation leaving rank 0
    copies = 2 if one["stage_names"][partition[0] - 1] == "ReversibleBlock" else 1  # PETRA returns x with dx
    two = launch(two_process_job, 2, settings, partition, boundary_numel, copies, env=env)
    loads.append(load_average())
    elapsed = time.time() - started

    if settings.json:
        record = {
            "command": command,
            "settings": vars(settings),
            "machine": machine,
            "one": one,
            "two": two[:1],
            "partition": partition,
            "loads": loads,
            "elapsed": elapsed,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        }
        Path(settings.json).write_text(json.dumps(record, indent=1))
        progress(f"wrote {settings.json}")
    report(settings, command, machine, one, two, partition, loads, elapsed)


def report(settings, command, machine, one, two, partition, loads, elapsed, date=None):
    tables, headline = render(settings, machine, one, two, partition, loads)
    print(tables)
    if settings.doc:
        write_doc(Path(settings.doc), command, machine, settings, tables, headline, elapsed, partition, loads, date)
        progress(f"wrote {settings.doc}")


def rerender(settings) -> None:
    """Rebuild the tables and the report from a `--json` record, without measuring anything."""
    record = json.loads(Path(settings.render_only).read_text())
    saved = argparse.Namespace(**record["settings"])
    saved.doc, saved.preliminary = settings.doc, saved.preliminary or settings.preliminary
    report(
        saved,
        record["command"],
        record["machine"],
        record["one"],
        record["two"],
        record["partition"],
        record["loads"],
        record["elapsed"],
        record["date"],
    )


def verdict(value: float, target: float) -> str:
    return "meets" if value >= target else "misses"


def write_doc(path, command, machine, settings, tables, headline, elapsed, partition, loads, date=None):
    first_load = float(loads[0].split()[0])
    busy_petra = headline["busy"]["petra"]
    shared = first_load > 0.5 or busy_petra < 1.75  # our own 2 busy processes add ~2 to the later load averages
    m_list = settings.pp_microbatches
    rank_ms = headline["rank_ms"]
    ex = headline["exchange"]["petra"]
    cpu = headline["cpu"]["petra"]
    naive_cpu = headline["cpu"]["reversible_backprop"]
    text = []
    out = text.append
    out("# Throughput: PETRA against naive model parallelism and 1F1B on 2 CPU processes")
    out("")
    conditions = (
        f"load average at start {loads[0]}, at the end {loads[-1]} (the benchmark's own 2 processes count "
        f"for about 2 of it); PETRA's 2 processes kept {busy_petra:.2f} of the 2 cores busy"
    )
    if shared or settings.preliminary:
        out(
            f"> **Preliminary numbers.** Measured on a machine shared with other developers' jobs ({conditions}). "
            f"Timings on a shared machine are noisy and penalise the methods that need both cores at once (PETRA, "
            f"1F1B) more than the synchronous baselines, which use one core at a time. Re-run on a quiet machine "
            f"(`uptime` load average near 0) before quoting them."
        )
    else:
        out(f"> Machine quiet during the run ({conditions}).")
    out("")
    out(
        f"Generated by `benchmarks/throughput.py` on {date or time.strftime('%Y-%m-%d %H:%M')} (run time "
        f'{elapsed / 60:.1f} min). Everything below the "Results" heading is the script\'s standard output.'
    )
    out("")
    out("## Command")
    out("")
    out("```")
    out(command)
    out("```")
    out("")
    out(
        "Flags: `--repeats` (windows per method), `--micro-batches` (N per window), `--batch` (micro-batch size), "
        "`--width`, `--pp-microbatches` (list of 1F1B n_microbatches), `--partition` (e.g. `4,6`), `--quick` "
        "(tiny smoke test, writes no report), `--doc PATH` / `--no-doc`, `--preliminary` (flag the report), "
        "`--default-malloc`."
    )
    out("")
    out("## Machine")
    out("")
    out(f"- `nproc`: {machine['nproc']} (CPUs this process may run on: {machine['affinity']}); CPU: {machine['cpu']}")
    out(f"- torch {machine['torch']}, Python {machine['python']}, {machine['platform']}")
    out(
        "- glibc malloc with fixed thresholds in every benchmark process (`MALLOC_MMAP_THRESHOLD_`, "
        "`MALLOC_TRIM_THRESHOLD_`; `--default-malloc` turns this off): with the adaptive defaults, whether a loop "
        "page-faults on freshly allocated activations depends on its allocation history (the same PETRA schedule "
        "measured twice in one process took ~7000 minor faults and ~20 ms of system time per micro-batch in one "
        "pipeline and none in another), which is noise, not a property of any method"
    )
    out(
        "- every process: 1 intra-op thread (`OMP_NUM_THREADS=1`, `torch.set_num_threads(1)`); the 2-process group "
        "uses gloo with a TCP rendezvous on 127.0.0.1, started by the script (`torch.multiprocessing` spawn)"
    )
    out("")
    out("## What is compared")
    out("")
    out(
        f"- **Model**: the paper's RevNet18 stage list (stem, 8 blocks of which 3 non-reversible downsampling blocks, "
        f"head: J = 10) with reduced widths so that a tick costs tens of milliseconds on one core. All 10 stages go "
        f"to the engine; `partition={partition}` groups them on the 2 ranks, chosen by the script to balance the "
        f"per-stage cost it measures first (PETRA's forward + backward + update, CPU time)."
    )
    out(
        '- **PETRA**: `Pipeline(stages, loss, mode="petra", accumulation_steps=1, partition=...)`; one micro-batch '
        "enters per tick and every stage runs one forward and one (delayed) backward per tick. Steady state: one "
        "pipeline is filled once (2(J-1)+1 micro-batches, untimed) and then kept running: each window feeds it N "
        'more micro-batches. "From empty": a second pipeline, N micro-batches plus `drain()` per window, all '
        "timed."
    )
    out(
        "- **Naive model parallelism**: the same engine, stages and partition with a synchronous schedule: "
        '`mode="reversible_backprop"` (same work as PETRA: inputs rebuilt by inversion) and `mode="backprop"` '
        "(keeps the autograd graph: no reconstruction, 3/4 of the work). Each micro-batch goes forward through both "
        "ranks and back before the next enters, so only one rank computes at a time."
    )
    out(
        "- **torch.distributed.pipelining**: `PipelineStage(part, rank, 2, cpu)` + `Schedule1F1B(stage, "
        "n_microbatches=m, loss_fn=cross_entropy)` (default `scale_grads=True`: the gradient is the mean over the "
        "m micro-batches), `SGD.step()` after every `schedule.step()`. Each rank's part is the same group of "
        "RevNet stages wrapped in one `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`, so it keeps "
        "only its input per micro-batch in flight and recomputes its forward in the backward: the same "
        "4-forwards-worth of work per micro-batch as PETRA. The two RevNet streams cross the boundary as one tensor "
        "(concatenated on channels, split on arrival; the engine also sends one flat buffer). Micro-batches are "
        "passed pre-split (`arg_mbs` / `target_mbs`). Every `step()` fills and drains the pipeline."
    )
    out(
        f'- **Choice of n_microbatches ("equal memory")**: with p = 2 ranks, 1F1B keeps at most p - rank '
        f"micro-batches in flight per rank whatever m is, and checkpointing reduces each to its stage input; its "
        f"activation memory is the recomputation graph of one micro-batch of the whole part plus those few inputs "
        f"(and, on rank 0, the step's m image micro-batches, which are small). The memory table below shows that "
        f"this is about PETRA's own footprint (PETRA keeps the inputs of its non-reversible stages for up to "
        f"2(J-1) = 18 ticks but recomputes one engine stage at a time). Equal memory therefore holds for every m "
        f">= 2 and does not pin m down; m only trades the fill/drain bubble (p-1)/(m+p-1) against update "
        f"frequency. We report m = {', '.join(map(str, m_list))}: m = 2 updates most often (every 2 micro-batches; "
        f"PETRA updates every micro-batch), and m = 18 = 2(J-1) keeps as many micro-batches resident in the "
        f"pipeline as PETRA does in steady state (PETRA's stem FIFO holds 18 image micro-batches, 1F1B's rank 0 "
        f"holds the step's 18); it also has the smallest bubble of those tried, 1/19."
    )
    out(
        "- **One process**: PETRA with all 10 stages local (`distributed=False`) against a plain loop "
        "`opt.zero_grad(); F.cross_entropy(model(x).logits, y).backward(); opt.step()` on the same model, one thread."
    )
    out(
        "- **Timing**: every window starts after a `dist.barrier()`; a window's time is that of its slowest rank. "
        "Windows of all methods are interleaved, repetition after repetition, in the same 2 processes, so a change "
        "of machine load hits all of them. Reported: median (min, max) over the repetitions of time / N."
    )
    out("")
    out("## Results")
    out("")
    out(tables)
    out("")
    out("## Discussion")
    out("")
    vs_naive = headline["vs_naive"]
    best = headline["vs_naive_best"]
    out(
        f"- **PETRA against naive model parallelism: {vs_naive:.2f}x** (`reversible_backprop`, the same work per "
        f"micro-batch; medians), which {verdict(vs_naive, 1.8)} the 1.8x target; the least disturbed windows "
        f"(fastest of each) give {best:.2f}x. The ideal on 2 processes is 2x minus "
        f"communication; with the measured per-stage costs the partition {partition} "
        f"({rank_ms[0]:.0f} / {rank_ms[1]:.0f} ms) caps it at {headline['balance']:.2f}x. Against synchronous "
        f"`backprop`, which skips the reconstruction, PETRA is {headline['vs_backprop']:.2f}x "
        f"(ideal {0.75 * headline['balance']:.2f}x). From the per-rank CPU times alone (each rank on its own core, "
        f"free messages) PETRA would be {headline['cpu_bound']['reversible_backprop']:.2f}x faster than "
        f"`reversible_backprop`: that is what the schedule delivers; the gap between it and the measured ratio is "
        f"communication, waiting and, on a shared machine, cores taken by other processes."
    )
    out(
        f"- **Where PETRA's time goes** (steady state, per micro-batch): rank 0 / rank 1 compute "
        f"{ms(cpu[0])} / {ms(cpu[1])} ms of CPU and spend {ms(ex[0])} / {ms(ex[1])} ms in the tick's exchange "
        f"(a bare exchange of the same messages takes {ms(headline['bare_exchange'])} ms). The engine's ticks are "
        f"lock-step: each rank computes its stages, then both swap the boundary messages, so a tick lasts the "
        f"slower rank's compute plus the transfer; the faster rank's exchange time is mostly waiting for the "
        f"slower one. Both cores were busy {busy_petra:.2f} of 2 on average. The naive schedule "
        f"computes {ms(naive_cpu[0])} / {ms(naive_cpu[1])} ms per micro-batch on rank 0 / 1, one rank at a time "
        f"(cores busy {headline['busy']['reversible_backprop']:.2f})."
    )
    best_m = max(m_list)
    out(
        "- **PETRA against `Schedule1F1B` + checkpointing** (medians; fastest windows): "
        + ", ".join(
            f"{headline['vs_1f1b'][m]:.2f}x; {headline['vs_1f1b_best'][m]:.2f}x at m = {m} (bubble ideal "
            f"{(m + 1) / m:.2f}x)"
            for m in m_list
        )
        + f". Both do the same arithmetic per micro-batch (checkpointing costs 1F1B the extra forward that "
        f"reconstruction costs PETRA) and hold about the same activation memory, so with p = 2 the only structural "
        f"difference is 1F1B's fill/drain bubble at every step, which shrinks as m grows: at m = {best_m} the two "
        f"are within noise of each other. The bubble grows with the number of pipeline stages p, and a large m "
        f"means one optimizer step per m micro-batches, whereas PETRA steps after every micro-batch (k = 1) and "
        f"pays for it with stale gradients."
    )
    out(
        f"- **Fill and drain**: PETRA's {settings.micro_batches} micro-batches from an empty pipeline to a drained "
        f"one cost {headline['drain']:.2f}x its steady-state time per micro-batch in medians, "
        f"{headline['drain_best']:.2f}x in the fastest windows (a schedule of N + 2(J-1) ticks whose first and "
        f"last ticks are partly idle: at most {(settings.micro_batches + 18) / settings.micro_batches:.2f}x). "
        f"On a shared machine the window-to-window noise is of the same order as this difference."
    )
    split = headline["split"]
    backward_over_forward = split["backward"] / split["forward"]
    gap = headline["one_cpu"] - headline["one_expected"]
    sentence = (
        f"- **One process**: PETRA costs {headline['one_wall']:.2f}x plain backprop in wall time "
        f"({headline['one_cpu']:.2f}x in CPU time); the paper's FLOP count gives 4/3. Here the plain loop's "
        f"backward takes {backward_over_forward:.2f}x its forward"
    )
    if backward_over_forward < 1.9:
        sentence += " (not the 2x of the FLOP model), so one extra forward weighs more than a third"
    sentence += f"; the measured forward and backward times predict {headline['one_expected']:.2f}x. "
    if abs(gap) <= 0.05:
        sentence += "The CPU-time ratio matches that prediction: the engine adds no significant overhead of its own."
    else:
        sentence += (
            f"The CPU-time ratio is {gap:+.2f} away from that prediction. The engine's own Python work "
            f"(detaching, mailboxes, per-stage optimizers, memory accounting after every forward and "
            f"backward) costs a few ms per micro-batch at most; in a torch.profiler comparison of the two "
            f"loops the excess sits in memory-bound kernels that run slower per call inside PETRA's schedule "
            f"(ReLU and batch-norm backward on the 32x32 activations of the stem, the head's concatenation), "
            f"i.e. cache and memory traffic of a schedule that keeps more activations alive."
        )
    out(sentence)
    out(
        "- **Caveats**: CPU, 2 cores, 1 thread per process; the model is shrunk so that a tick takes tens of ms, "
        "which keeps communication (a few ms per exchange over loopback TCP) small but not negligible. The paper's "
        "Table 5 numbers (10 and 18 GPUs, 2.4-3.0x) are for one stage per GPU and are not comparable to 2 ranks."
    )
    out("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text))


if __name__ == "__main__":
    main()
