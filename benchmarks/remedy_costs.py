"""What each delay remedy costs per sample in time and memory, against PETRA without it, side by side in one run.

    python benchmarks/remedy_costs.py            # RevNet18 at the recipe widths, J = 10, 32x32 (~8 min)
    python benchmarks/remedy_costs.py --quick    # tiny widths and windows (~20 s): remedy_costs-quick.json
    python benchmarks/remedy_costs.py --model revvit-tiny   # the convolutional stem: remedy_costs_revvit.json

One process, one thread, all ten stages in it, SGD with momentum 0.9 on every stage. Each setting runs the same
32 samples per update: PETRA at k = 1 over micro-batches of 32 (the reference), with weight prediction over half the
delay (the recipe's default), with delay-matched momentum, with both, and k = 4 over micro-batches of 8
(accumulation at equal updates). Time: interleaved windows of N updates at the steady state, per update, the
median over the windows and the median of the paired ratios to the reference. Memory, summed over the stages at the
steady state: what they hold between ticks (`Pipeline.memory()`, the remedies' own state in `remedy_bytes`), and the
most each held at any moment inside one of its operations (`op_peaks.OperationPeaks`, profiled over a window of its
own; a predicted forward's weights exist only inside the forward). The weights and the optimizer's momentum are the
same in every setting and are left out. What the remedies do for accuracy: docs/delay-remedies.md.

With `--model revvit-tiny` the settings are RevViT-Ti as the recipe trains it on digits (16x16 images, 4x4 patches,
LayerScale, one stage per block: J = 14) with the patchify stem (the reference) and with the convolutional stem, a
change of the model rather than of training: its weights are counted too (`weight_bytes`).
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
from petra_hub import RevViTConfig, RevViTForImageClassification  # noqa: E402
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
# --model revvit-tiny: name -> conv_stem, at k = 1 without remedies
STEMS = {"petra": False, "conv-stem": True}
VIT_IMAGES = 16  # the recipe's digits


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=None, help="windows per setting (default 7; quick: 2)")
    parser.add_argument("--updates", type=int, default=None, help="updates per window (default 30; quick: 3)")
    parser.add_argument("--model", choices=("revnet18", "revvit-tiny"), default="revnet18")
    parser.add_argument("--quick", action="store_true")
    add_out_argument(parser, "remedy_costs (remedy_costs_revvit with --model revvit-tiny)")
    args = parser.parse_args(argv)
    args.repeats = args.repeats or (2 if args.quick else 7)
    args.updates = args.updates or (3 if args.quick else 30)
    return args


def held(pipeline) -> dict[str, int]:
    stats = pipeline.memory().values()
    return {"total_bytes": sum(s.total_bytes for s in stats), "remedy_bytes": sum(s.remedy_bytes for s in stats)}


def revnet_cases(quick: bool) -> tuple[dict, dict]:
    """name -> (k, pipeline, micro-batches) for SETTINGS, and what identifies the model."""
    width = QUICK_WIDTH if quick else RECIPE_WIDTH
    config = revnet_config("revnet18", width=width, num_labels=10)
    cases = {name: (k, make_pipeline(build_model(config).get_stages(), "petra", lr=0.01, accumulation_steps=k,
                                      remedies=remedies), random_batches(4 * k, SAMPLES // k, 32))
             for name, (k, remedies) in SETTINGS.items()}
    return cases, {"model": "revnet18", "width": width, "image_size": 32}


def revvit_cases(quick: bool) -> tuple[dict, dict]:
    """name -> (1, pipeline, micro-batches) for STEMS, and what identifies the model."""
    small = dict(hidden_size=24, num_hidden_layers=2, num_attention_heads=3) if quick else {}
    cases = {}
    for name, conv_stem in STEMS.items():
        config = RevViTConfig.from_preset("revvit-tiny", image_size=VIT_IMAGES, patch_size=4, num_labels=10,
                                          layer_scale_init_value=1e-4, conv_stem=conv_stem, **small)
        torch.manual_seed(0)
        model = RevViTForImageClassification(config).float().train()
        cases[name] = (1, make_pipeline(model.get_stages(), "petra", lr=0.01),
                       random_batches(4, SAMPLES, VIT_IMAGES))
    return cases, {"model": "revvit-tiny", "hidden_size": config.hidden_size, "image_size": VIT_IMAGES}


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(0)
    cases, model_settings = (revvit_cases if args.model == "revvit-tiny" else revnet_cases)(args.quick)
    pipelines = {name: pipeline for name, (_, pipeline, _) in cases.items()}
    batches = {name: micro_batches for name, (_, _, micro_batches) in cases.items()}
    stages = len(pipelines["petra"].workers)
    weight_bytes = {name: sum(p.numel() * p.element_size() for worker in pipeline.workers.values()
                              for p in worker.stage.parameters()) for name, pipeline in pipelines.items()}

    def run(name, updates):
        k = cases[name][0]
        feed(pipelines[name], batches[name], updates * k)

    within, between = {}, {}
    for name, pipeline in pipelines.items():
        full = pipeline.schedule.latency  # the first tick with every stage busy
        with OperationPeaks(pipeline) as profiled:  # from the first micro-batch: see op_peaks
            feed(pipeline, batches[name], full + 2 * stages)
        within[name] = sum(profiled.stage_peaks(from_tick=full).values())
        between[name] = held(pipeline)
    progress(f"{os.cpu_count()} CPUs, load average {load_average()}; J = {stages}")

    times = {name: [] for name in cases}
    for repeat in range(args.repeats):
        for name in cases:
            start = time.perf_counter()
            run(name, args.updates)
            times[name].append((time.perf_counter() - start) / args.updates)
        progress(f"repetition {repeat + 1}/{args.repeats} (ms per update of {SAMPLES} samples): "
                 + ", ".join(f"{name} {1e3 * values[-1]:.1f}" for name, values in times.items()))
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratios = {name: statistics.median(t / p for t, p in zip(times[name], times["petra"])) for name in cases}
    for name in cases:
        progress(f"{name:28s} {1e3 * medians[name]:7.2f} ms per update ({ratios[name]:.3f}x PETRA); holds "
                 f"{between[name]['total_bytes'] / 2**20:.2f} MiB between ticks (remedy "
                 f"{between[name]['remedy_bytes'] / 2**20:.2f}), {within[name] / 2**20:.2f} MiB inside operations")
    settings = {**model_settings, "stages": stages, "samples_per_update": SAMPLES, "threads": 1,
                "repeats": args.repeats, "updates": args.updates,
                "accumulation_steps": {name: k for name, (k, _, _) in cases.items()}}
    name = "remedy_costs_revvit" if args.model == "revvit-tiny" else "remedy_costs"
    return write_results(results_path(args.out, name, args.quick), "remedy_costs", "remedy_costs.py", argv,
                         settings, times=times, median_s=medians, ratio_to_petra=ratios, held=between,
                         peak_within_bytes=within, weight_bytes=weight_bytes, load=load_average())


if __name__ == "__main__":
    main()
