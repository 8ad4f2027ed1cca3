#!/usr/bin/env python
"""PREDICTIONS, not measurements: PETRA against naive model parallelism on more devices than this machine has.

    python benchmarks/predict.py            # RevNet18 at the paper's widths, CIFAR 32x32, micro-batch 64 (~2 min)
    python benchmarks/predict.py --quick    # recipe widths, micro-batch 8: predict-quick.json

The stages are measured here, on one CPU core, under PETRA and under the synchronous reversible backprop
(`profile_stages`: the same operations, forward and the fused reconstruction and backward, but not the same engine
overhead per tick). `simulate` then replays PETRA and the synchronous model-parallel reversible backprop
(the paper's Table 5 baseline, the same operations one micro-batch at a time) on 2 to 10 devices, each device
running the contiguous group `Placement.auto` gives it, over three links: PCIe 4.0 x16 (25 GB/s, 10 us), NVLink
(300 GB/s, 5 us), and this machine's loopback as the engine uses it (benchmarks/results/simulator.json). Every
device is assumed as fast as this core, and the engine's own time per tick is the one measured here.
"""

from __future__ import annotations

import argparse
import json
import os
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
from petra_hub.engine import Placement, profile_stages, simulate  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH  # noqa: E402

DEVICES = (2, 4, 5, 10)
PAPER_TABLE5 = {"revnet18": {"devices": 10, "speedup": 3.0}, "revnet34": {"devices": 18, "speedup": 2.4}}


def links() -> dict[str, tuple[float, float]]:
    """name -> (bandwidth B/s, latency s per message)."""
    chosen = {"PCIe 4.0 x16": (25e9, 10e-6), "NVLink": (300e9, 5e-6)}
    measured = RESULTS / "simulator.json"
    if measured.exists():
        result = json.loads(measured.read_text())
        chosen["this machine's loopback (engine)"] = (result["bandwidth_Bps"], result["latency_s"])
    return chosen


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    add_out_argument(parser, "predict")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    batch = 8 if args.quick else 64
    config = revnet_config("revnet18", width=QUICK_WIDTH if args.quick else None, stem="cifar", num_labels=10)
    stages = build_model(config).get_stages()
    progress(f"profiling RevNet18 ({'recipe' if args.quick else 'paper'} widths, {len(stages)} stages), CIFAR "
             f"32x32, micro-batch {batch}, one thread")
    sample = random_batches(1, batch, 32)[0]
    costs = profile_stages(stages, sample, cross_entropy, repeats=3, warmup=1)
    naive_costs = profile_stages(stages, sample, cross_entropy, mode="reversible_backprop", repeats=3, warmup=1)
    ideal = sum(c.compute_s for c in costs) / max(c.compute_s for c in costs)
    rows = []
    for name, (bandwidth, latency) in links().items():
        for devices in DEVICES:
            placement = Placement.auto(costs, devices, link_bandwidth=bandwidth, latency=2 * latency)
            petra = simulate("petra", costs, placement, bandwidth, latency)
            naive = simulate("reversible_backprop", naive_costs, placement, bandwidth, latency, micro_batches=8)
            cap = sum(c.compute_s for c in costs) / max(sum(costs[i].compute_s for i in g) for g in placement.groups)
            rows.append({"link": name, "devices": devices, "partition": [len(g) for g in placement.groups],
                         "petra_s": petra.time_per_micro_batch, "naive_s": naive.time_per_micro_batch,
                         "speedup": naive.time_per_micro_batch / petra.time_per_micro_batch, "partition_cap": cap,
                         "petra_utilisation": list(petra.utilisation)})
            progress(f"{name:32s} {devices:2d} devices {rows[-1]['partition']}: PETRA "
                     f"{1e3 * petra.time_per_micro_batch:.0f} ms, naive {1e3 * naive.time_per_micro_batch:.0f} ms, "
                     f"{rows[-1]['speedup']:.2f}x (this split's cap {cap:.2f}x)")
    fast = {}  # devices 100x faster than this core, the engine's own time per tick and the link unchanged
    for name, (bandwidth, latency) in links().items():
        quick_costs, quick_naive = ([replace(c, forward_s=c.forward_s / 100, backward_s=c.backward_s / 100,
                                             update_s=c.update_s / 100) for c in group] for group in (costs, naive_costs))
        placement = Placement.from_sizes([1] * len(costs))
        petra = simulate("petra", quick_costs, placement, bandwidth, latency)
        naive = simulate("reversible_backprop", quick_naive, placement, bandwidth, latency, micro_batches=8)
        fast[name] = naive.time_per_micro_batch / petra.time_per_micro_batch
        progress(f"{name:32s} 10 devices 100x faster than this core: {fast[name]:.2f}x")
    out = results_path(args.out, "predict", args.quick)
    settings = {"model": "revnet18", "widths": list(config.hidden_sizes), "image_size": 32, "micro_batch": batch,
                "num_stages": len(stages), "threads": 1}
    return write_results(out, "predict", "predict.py", argv, settings, prediction=True,
                         stage_costs=[vars(c) for c in costs], naive_stage_costs=[vars(c) for c in naive_costs],
                         ideal_one_stage_per_device=ideal, rows=rows, hundredfold_faster_devices=fast,
                         paper_table5=PAPER_TABLE5)


if __name__ == "__main__":
    main()
