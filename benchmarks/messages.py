"""Narrower messages between stages: bytes sent and time per micro-batch with activations and gradients on the
wire in float32, bf16 and fp16 (`Precision(messages=...)`), across a gloo group of 2 processes on CPU.

    python benchmarks/messages.py            # full run (about 3 min): benchmarks/results/messages.json
    python benchmarks/messages.py --quick    # tiny model and windows (under a minute): messages-quick.json

The stages compute in float32 in every column; only the dtype activations and gradients cross the rank boundary
in changes (what a stage sends back for its predecessor's reconstruction stays float32). Each configuration
trains its own copy of the same model; timing windows of the configurations are interleaved, repetition after
repetition, and each window's time is the slowest rank's. Accuracy with narrower messages: the accuracy benchmark's
`@wire-bf16` / `@wire-fp16` configurations (docs/benchmarks-precision.md).
"""

from __future__ import annotations

import argparse
import os
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

from common import add_out_argument, build_model, feed, load_average, make_pipeline, progress  # noqa: E402
from common import random_batches, results_path, revnet_config, write_results  # noqa: E402
from petra_hub.engine import Precision  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

WIRES = {"fp32": None, "bf16": "bf16", "fp16": "fp16"}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="timing windows per configuration (default 5)")
    parser.add_argument("--micro-batches", type=int, default=None, help="N per window (default 60; quick: 10)")
    parser.add_argument("--batch", type=int, default=None, help="micro-batch size (default 32; quick: 8)")
    parser.add_argument("--width", type=int, default=None, help=f"layers w,2w,4w,8w (default {RECIPE_WIDTH})")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="tiny model and windows: a smoke test of the script")
    add_out_argument(parser, "messages")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.micro_batches = args.micro_batches or (10 if args.quick else 60)
    args.batch = args.batch or (8 if args.quick else 32)
    args.width = args.width or (QUICK_WIDTH if args.quick else RECIPE_WIDTH)
    return args


def job(rank, world_size, settings):
    torch.manual_seed(0)
    batches = random_batches(4, settings.batch, settings.image_size)
    engines = {
        name: make_pipeline(
            build_model(revnet_config("revnet18", width=settings.width, num_labels=10)).get_stages(),
            "petra", lr=0.01, timeout=600, precision=Precision.of(messages=wire),
        )
        for name, wire in WIRES.items()
    }
    fed = dict.fromkeys(engines, 0)
    for name, pipeline in engines.items():  # warm-up: fill the pipeline (and the start-up handshake)
        feed(pipeline, batches, pipeline.schedule.latency)
        fed[name] += pipeline.schedule.latency
    times, sent = defaultdict(list), defaultdict(list)
    n = settings.micro_batches
    for repeat in range(settings.repeats):
        for name, pipeline in engines.items():
            dist.barrier()
            before, start = pipeline.exchange_bytes, time.perf_counter()
            feed(pipeline, batches, n, fed[name])
            elapsed = time.perf_counter() - start
            fed[name] += n
            gathered = [None] * world_size
            dist.all_gather_object(gathered, (elapsed, pipeline.exchange_bytes - before))
            times[name].append(max(g[0] for g in gathered) / n)
            sent[name].append([g[1] / n for g in gathered])
        if rank == 0:
            line = ", ".join(f"{name} {1e3 * values[-1]:.1f}" for name, values in times.items())
            progress(f"repetition {repeat + 1}/{settings.repeats} (ms per micro-batch): {line}")
    losses = {}
    for name, pipeline in engines.items():
        finished = pipeline.drain()
        losses[name] = [float(loss) for _, loss in finished]
    return {"times": dict(times), "bytes": dict(sent), "final_losses": losses}


def summarise(per_rank: list[dict]) -> dict:
    times = per_rank[0]["times"]
    reference = times["fp32"]
    rows = {}
    for name, values in times.items():
        ratios = [ref / value for ref, value in zip(reference, values)]
        rows[name] = {
            "seconds_per_micro_batch": statistics.median(values),
            "speedup_vs_fp32": statistics.median(ratios),
            "bytes_sent_per_micro_batch": [statistics.median(r[rank] for r in per_rank[0]["bytes"][name])
                                           for rank in range(len(per_rank))],
        }
    for name, row in rows.items():
        row["bytes_vs_fp32"] = sum(row["bytes_sent_per_micro_batch"]) / sum(rows["fp32"]["bytes_sent_per_micro_batch"])
    return rows


def main(argv=None) -> dict:
    settings = parse_args(argv)
    load = load_average()
    progress(f"2 processes, RevNet18 width {settings.width}, micro-batch {settings.batch}, {settings.repeats} x "
             f"{settings.micro_batches} micro-batches per configuration; load average {load}")
    per_rank = launch(job, 2, settings, env=STABLE_MALLOC_ENV)
    summary = summarise(per_rank)
    for name, row in summary.items():
        progress(f"wire {name}: {1e3 * row['seconds_per_micro_batch']:.1f} ms per micro-batch "
                 f"({row['speedup_vs_fp32']:.3f}x fp32), {row['bytes_vs_fp32']:.3f}x the bytes")
    out = results_path(settings.out, "messages", settings.quick)
    return write_results(out, "messages", "messages.py", argv, vars(settings) | {"out": str(settings.out)},
                         summary=summary, load_average=[load, load_average()], ranks=per_rank)


if __name__ == "__main__":
    main()
