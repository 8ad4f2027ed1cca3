"""What each delay remedy costs per sample in time and memory, against PETRA without it, side by side in one run.

    python benchmarks/remedy_costs.py            # RevNet18 at the recipe widths, J = 10, 32x32 (~8 min)
    python benchmarks/remedy_costs.py --quick    # tiny widths and windows (~20 s): remedy_costs-quick.json

One process, one thread, all ten stages in it, SGD with momentum 0.9 on every stage. Each setting runs the same
32 samples per update: PETRA at k = 1 over micro-batches of 32 (the reference), with weight prediction over half the
delay (the recipe's default), with delay-matched momentum, with both, and k = 4 over micro-batches of 8
(accumulation at equal updates). Time: interleaved windows of N updates at the steady state, per update, the
median over the windows and the median of the paired ratios to the reference. Memory, summed over the stages at the
steady state: what they hold between ticks (`Pipeline.memory()`, the remedies' own state in `remedy_bytes`), and the
most each held at any moment inside one of its operations (`op_peaks.OperationPeaks`, profiled over a window of its
own; a predicted forward's weights exist only inside the forward). The weights and the optimizer's momentum are the
same in every setting and are left out. What the remedies do for accuracy: docs/delay-remedies.md.
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

from common import add_out_argument, build_model, feed, load_average, make_pipeline, progress  # noqa: E402
from common import random_batches, results_path, revnet_config, write_results  # noqa: E402
from op_peaks import OperationPeaks  # noqa: E402
from petra_hub.engine import Remedies  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

SAMPLES = 32  # per update, in every setting
# name -> (accumulation steps k, Remedies); each micro-batch holds SAMPLES / k samples
SETTINGS = {
    "petra": (1, Remedies()),
    "predict-half": (1, Remedies(weight_prediction=0.5)),
    "delay-momentum": (1, Remedies(delay_momentum=True)),
    "predict-half+delay-momentum": (1, Remedies(weight_prediction=0.5, delay_momentum=True)),
    "k4-over-8": (4, Remedies()),
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="windows per setting (default 7; quick: 2)")
    parser.add_argument("--updates", type=int, default=None, help="updates per window (default 30; quick: 3)")
    parser.add_argument("--quick", action="store_true")
    add_out_argument(parser, "remedy_costs")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 7)
    args.updates = args.updates or (3 if args.quick else 30)
    return args


def held(pipeline) -> dict[str, int]:
    stats = pipeline.memory().values()
    return {"total_bytes": sum(s.total_bytes for s in stats), "remedy_bytes": sum(s.remedy_bytes for s in stats)}


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(0)
    width = QUICK_WIDTH if args.quick else RECIPE_WIDTH
    config = revnet_config("revnet18", width=width, num_labels=10)
    pipelines, batches = {}, {}
    for name, (k, remedies) in SETTINGS.items():
        pipelines[name] = make_pipeline(build_model(config).get_stages(), "petra", lr=0.01, accumulation_steps=k,
                                        remedies=remedies)
        batches[name] = random_batches(4 * k, SAMPLES // k, 32)
    stages = len(pipelines["petra"].workers)

    def run(name, updates):
        k = SETTINGS[name][0]
        feed(pipelines[name], batches[name], updates * k)

    within, between = {}, {}
    for name, pipeline in pipelines.items():
        full = pipeline.schedule.latency  # the first tick with every stage busy
        with OperationPeaks(pipeline) as profiled:  # from the first micro-batch: see op_peaks
            feed(pipeline, batches[name], full + 2 * stages)
        within[name] = sum(profiled.stage_peaks(from_tick=full).values())
        between[name] = held(pipeline)
    progress(f"{os.cpu_count()} CPUs, load average {load_average()}; J = {stages}")

    times = {name: [] for name in SETTINGS}
    for repeat in range(args.repeats):
        for name in SETTINGS:
            start = time.perf_counter()
            run(name, args.updates)
            times[name].append((time.perf_counter() - start) / args.updates)
        progress(f"repetition {repeat + 1}/{args.repeats} (ms per update of {SAMPLES} samples): "
                 + ", ".join(f"{name} {1e3 * values[-1]:.1f}" for name, values in times.items()))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratios = {name: statistics.median(t / p for t, p in zip(times[name], times["petra"])) for name in SETTINGS}
    for name in SETTINGS:
        progress(f"{name:28s} {1e3 * medians[name]:7.2f} ms per update ({ratios[name]:.3f}x PETRA); holds "
                 f"{between[name]['total_bytes'] / 2**20:.2f} MiB between ticks (remedy "
                 f"{between[name]['remedy_bytes'] / 2**20:.2f}), {within[name] / 2**20:.2f} MiB inside operations")
    settings = {"model": "revnet18", "width": width, "stages": stages, "samples_per_update": SAMPLES,
                "image_size": 32, "threads": 1, "repeats": args.repeats, "updates": args.updates,
                "accumulation_steps": {name: k for name, (k, _) in SETTINGS.items()}}
    return write_results(results_path(args.out, "remedy_costs", args.quick), "remedy_costs", "remedy_costs.py", argv,
                         settings, times=times, median_s=medians, ratio_to_petra=ratios, held=between,
                         peak_within_bytes=within, load=load_average())


if __name__ == "__main__":
    main()
