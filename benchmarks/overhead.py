"""Where PETRA's time goes in one process, operator by operator, against plain backprop on the same model.

    python benchmarks/overhead.py            # RevNet18 at the recipe widths, 32x32, micro-batch 32 (~2 min)
    python benchmarks/overhead.py --quick    # tiny widths and windows (~15 s): overhead-quick.json

One process, one thread. A plain loop (`model(x)`, `loss.backward()`, `opt.step()`) and a `Pipeline(mode="petra")`
holding every stage run interleaved windows of N micro-batches at the steady state, each timed once bare and once
under `torch.profiler`. Per window: wall time, and each operator's calls and self CPU time per micro-batch;
reported as medians over the windows. Bare wall time not spent inside any operator is Python: the training loop,
the engine's bookkeeping, nn.Module calls (under the profiler, wall time also pays the profiler's own cost per
operator, and PETRA runs more operators). The difference between the two columns says what PETRA's
reconstruction costs (the second forward's operators), what the engine costs (time outside operators), and what
is neither (the same operators running slower). Tables: docs/benchmarks-throughput.md (`python benchmarks/report.py`).
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

from _launch import SINGLE_THREAD_ENV  # noqa: E402 (imports no torch)

os.environ.update(SINGLE_THREAD_ENV)

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from common import add_out_argument, build_model, cross_entropy, feed, load_average, make_pipeline  # noqa: E402
from common import progress, random_batches, results_path, revnet_config, sgd, write_results  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="windows per method (default 5; quick: 2)")
    parser.add_argument("--micro-batches", type=int, default=None, help="N per window (default 20; quick: 3)")
    parser.add_argument("--batch", type=int, default=32, help="micro-batch size (default 32)")
    parser.add_argument("--quick", action="store_true")
    add_out_argument(parser, "overhead")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 5)
    args.micro_batches = args.micro_batches or (3 if args.quick else 20)
    return args


def profiled_window(run, count: int) -> dict:
    """Wall time and per-operator (calls, self CPU seconds) of `run(count)`, per micro-batch."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        run(count)
        wall = time.perf_counter() - start
    ops = {e.key: [e.count / count, e.self_cpu_time_total / 1e6 / count] for e in prof.key_averages()}
    return {"wall_s": wall / count, "ops": ops}


def medians(windows: list[dict]) -> dict:
    keys = {key for window in windows for key in window["ops"]}
    ops = {key: [statistics.median(w["ops"].get(key, [0, 0])[i] for w in windows) for i in (0, 1)] for key in keys}
    return {"wall_s": statistics.median(w["wall_s"] for w in windows), "ops": ops,
            "in_ops_s": statistics.median(sum(v[1] for v in w["ops"].values()) for w in windows)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = QUICK_WIDTH if args.quick else RECIPE_WIDTH
    config = revnet_config("revnet18", width=width, num_labels=10)
    batches = random_batches(4, args.batch, 32)

    model = build_model(config)
    optimizer = sgd(model, 0.01)

    def plain(count):
        for index in range(count):
            images, labels = batches[index % len(batches)]
            optimizer.zero_grad(set_to_none=True)
            cross_entropy(model(images).logits, labels).backward()
            optimizer.step()

    pipeline = make_pipeline(build_model(config).get_stages(), "petra", lr=0.01)
    feed(pipeline, batches, pipeline.schedule.latency)  # steady state from here on

    def petra(count):
        feed(pipeline, batches, count)

    plain(3)
    load_before = load_average()
    windows, unprofiled = {"plain": [], "petra": []}, {"plain": [], "petra": []}
    for repeat in range(args.repeats):
        for name, run in (("plain", plain), ("petra", petra)):
            start = time.perf_counter()
            run(args.micro_batches)
            unprofiled[name].append((time.perf_counter() - start) / args.micro_batches)
            windows[name].append(profiled_window(run, args.micro_batches))
        progress(f"repetition {repeat + 1}/{args.repeats}: plain {1e3 * unprofiled['plain'][-1]:.1f} ms, PETRA "
                 f"{1e3 * unprofiled['petra'][-1]:.1f} ms per micro-batch (profiled: "
                 f"{1e3 * windows['plain'][-1]['wall_s']:.1f}, {1e3 * windows['petra'][-1]['wall_s']:.1f})")
    result = {name: {**medians(w), "unprofiled_wall_s": statistics.median(unprofiled[name])}
              for name, w in windows.items()}
    settings = {"model": "revnet18", "width": width, "batch": args.batch, "image_size": 32, "threads": 1,
                "repeats": args.repeats, "micro_batches": args.micro_batches}
    return write_results(results_path(args.out, "overhead", args.quick), "overhead", "overhead.py", argv, settings,
                         load_average=[load_before, load_average()], **result)


if __name__ == "__main__":
    main()
