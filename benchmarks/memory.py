"""Memory held by PETRA and its baselines, measured from live buffers (the paper's Tables 3 and 6).

    OMP_NUM_THREADS=2 python benchmarks/memory.py                 # about 15 min: benchmarks/results/memory.json
    python benchmarks/memory.py --fast --models revnet18          # seconds, tiny widths: memory-quick.json
    python benchmarks/memory.py --models --revvit revvit-small --modes delayed petra backprop \
        --out benchmarks/results/memory_revvit.json               # RevViT-S at 224, J = 14 (about 2 min)

For every model and configuration the stages run in a `Pipeline` until the steady state (2(J-1)+1 micro-batches),
and `pipeline.memory()` is read before draining: the bytes of the inputs (or autograd graphs) and weight copies
each stage keeps for its pending backwards. Activation bytes are measured at a small micro-batch and image side
and scaled to `--scale-to` and `--report-size`; two checks measure that they scale exactly. What is measured and
why: docs/benchmarks-memory.md; tables: `python benchmarks/report.py`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

# On a shared CPU, OpenMP threads that spin while waiting stall whenever another process holds a core (runs of
# seconds became minutes); passive waiting costs little when the machine is idle. Read when torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from common import add_out_argument, build_model, make_pipeline, progress, random_batches  # noqa: E402
from common import results_path, revnet_config, write_results  # noqa: E402
from _launch import launch  # noqa: E402
from op_peaks import OperationPeaks  # noqa: E402
from petra_hub.engine import Mode, Schedule, stage_layout  # noqa: E402
from petra_hub.models.revnet import RevNetConfig  # noqa: E402
from petra_hub.models.revvit import RevViTConfig, RevViTForImageClassification  # noqa: E402
from petra_hub.testing.malloc import malloc_available, steady_state_growth  # noqa: E402
from petra_hub.testing.models import FAST_WIDTHS, RECIPE_WIDTH, doubling_widths, small_revvit_config  # noqa: E402

BUFFER_MODES = [Mode.DELAYED, Mode.INPUT_BUFFER, Mode.WEIGHT_STASH, Mode.PETRA]
REFERENCE_MODES = [Mode.BACKPROP, Mode.REVERSIBLE_BACKPROP]
ALL_MODES = BUFFER_MODES + REFERENCE_MODES
DOWNSAMPLINGS = ["buffered", "invertible"]
GB, MB = 1e9, 1e6
# The depth study (per-stage memory against J): basic blocks, CIFAR stem, narrow streams.
DEPTHS = [[1, 1, 1, 1], [2, 2, 2, 2], [3, 4, 6, 3], [3, 4, 23, 3]]
FAST_DEPTHS = [[1, 1, 1, 1], [2, 2, 2, 2]]


@dataclass
class StageMemory:
    index: int
    kind: str  # S stem, R reversible, D non-reversible block, H head (`stage_layout`)
    in_flight: int  # micro-batches between forward and backward when read
    activation_bytes: int  # at the measured micro-batch
    stash_bytes: int
    gradient_bytes: int
    message_bytes: int = 0  # at the measured micro-batch: messages delivered to the stage for its next tick
    # the most the stage held inside any of its operations (`op_peaks`, gradients included), at the measured
    # micro-batch and at twice it: what does not grow with the micro-batch (gradients, weight copies) and what does
    peak_bytes: int = 0
    peak_bytes_double: int = 0

    def peak(self, scale: float) -> float:
        """The within-operation peak at `scale` times the measured micro-batch (and area): the two measurements
        give its part that grows with the micro-batch and the part that does not."""
        return self.peak_bytes + (self.peak_bytes_double - self.peak_bytes) * (scale - 1)

    def buffer_bytes(self, scale: float) -> float:
        """Activations and waiting messages scaled to the target micro-batch, plus weight copies (batch
        independent)."""
        return (self.activation_bytes + self.message_bytes) * scale + self.stash_bytes


@dataclass
class ModeResult:
    mode: str
    micro_batches: int
    seconds: float
    stages: list[StageMemory] = field(default_factory=list)

    def activation_bytes(self) -> int:
        return sum(s.activation_bytes for s in self.stages)

    def stash_bytes(self) -> int:
        return sum(s.stash_bytes for s in self.stages)

    def message_bytes(self) -> int:
        return sum(s.message_bytes for s in self.stages)


# -- measuring -----------------------------------------------------------------------------------------------------
def measure(model, mode: Mode, batch: int, image_size: int, peaks: bool = False) -> ModeResult:
    """Run `mode` on the model's stages until the steady state and read every stage's buffers; with `peaks`, also
    the most each stage held inside an operation (`op_peaks.OperationPeaks`, profiled from the first micro-batch).

    Synchronous modes hold nothing between ticks: for them a stage's figure is what it holds between its forward
    and its backward for one micro-batch, its `peak_bytes`, minus the gradient accumulators (kept alive, and so
    steady, by a k larger than the number of micro-batches fed)."""
    config = model.config
    model.train()
    model.zero_grad(set_to_none=True)
    stages = model.get_stages()
    schedule = Schedule(len(stages), mode.pipelined)
    count = schedule.latency if mode.pipelined else 2
    pipeline = make_pipeline(stages, mode, accumulation_steps=count + 1)
    # A fresh tensor per micro-batch, as a data loader gives: feeding one tensor again and again would let the
    # stem's FIFO hold a single storage and hide its image buffer.
    batches = random_batches(
        count, batch, image_size, channels=config.num_channels, num_labels=config.num_labels, seed=0
    )
    start = time.perf_counter()
    with OperationPeaks(pipeline) if peaks else contextlib.nullcontext() as profiled:
        for images, labels in batches:
            pipeline.step(images, labels)
    seconds = time.perf_counter() - start
    del batches
    within = profiled.stage_peaks() if peaks else {}
    memory, in_flight, layout = pipeline.memory(), pipeline.in_flight(), stage_layout(stages)
    result = ModeResult(mode.value, count, seconds)
    for i, stats in sorted(memory.items()):
        if len(in_flight[i]) != schedule.in_flight(i):
            raise RuntimeError(f"{mode.value}: stage {i} holds {len(in_flight[i])} micro-batches, expected "
                               f"{schedule.in_flight(i)}")
        if mode.pipelined:
            activations, stash, messages = stats.activation_bytes, stats.stash_bytes, stats.message_bytes
        elif stats.activation_bytes or stats.stash_bytes or stats.message_bytes:
            raise RuntimeError(f"{mode.value}: stage {i} holds buffers between micro-batches")
        else:
            activations, stash, messages = stats.peak_bytes - stats.gradient_bytes, 0, 0
        result.stages.append(StageMemory(i, layout[i], len(in_flight[i]), activations, stash, stats.gradient_bytes,
                                         messages, peak_bytes=within.get(i, 0)))
    del pipeline, memory  # reference counting frees the buffers; a full gc.collect() per run costs ~0.25 s
    model.zero_grad(set_to_none=True)
    return result


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def model_config(preset: str, downsampling: str, fast: bool) -> RevNetConfig:
    if fast:
        return revnet_config(preset, fast=True, stem="cifar", num_labels=10, downsampling=downsampling)
    return revnet_config(preset, stem="imagenet", num_labels=1000, downsampling=downsampling)


def measure_all(model, modes, batch, image_size, label, peaks: bool = False) -> dict[str, ModeResult]:
    """Every mode's buffers; with `peaks`, each stage's within-operation peak at `batch` and at twice it."""
    results = {}
    for mode in modes:
        results[mode.value] = result = measure(model, mode, batch, image_size, peaks)
        if peaks:
            double = measure(model, mode, 2 * batch, image_size, peaks)
            for stage, twice in zip(result.stages, double.stages):
                stage.peak_bytes_double = twice.peak_bytes
        progress(f"{label} {mode.value:<20} {result.micro_batches:3d} micro-batches in {result.seconds:6.1f} s")
    return results


def describe(mode: Mode) -> tuple[str, str]:
    """(input buffer, weight stash) columns of the paper's Table 3."""
    if not mode.pipelined:
        return ("graph" if mode.keeps_graph else "non-rev. only"), "-"
    return ("non-rev. only" if mode.reconstructs else "yes"), ("yes" if mode.stashes_weights else "no")


def totals(results: dict[str, ModeResult], params: int, scale: float) -> dict:
    """Model + buffers per configuration (paper Table 3), with and without the stem's image buffer, in GB; where the
    peaks were measured, also the sum of the stages' within-operation peaks with the weights and the momentum of
    the paper's SGD (one buffer per weight): what the devices must hold at their busiest."""

    def peak(result: ModeResult) -> float:
        return sum(s.peak(scale) for s in result.stages) + 2 * params

    def total(result: ModeResult, with_stem: bool) -> float:
        activations = sum(s.activation_bytes for s in result.stages if with_stem or s.kind != "S")
        return params + (activations + result.message_bytes()) * scale + result.stash_bytes()

    delayed = results.get(Mode.DELAYED.value)
    summary = {}
    for name, result in results.items():
        mode = Mode(name)
        with_stem, without_stem = total(result, True), total(result, False)
        compare = delayed is not None and mode.pipelined
        inputs, stash = describe(mode)
        summary[name] = {
            "pipelined": mode.pipelined,
            "input_buffer": inputs,
            "weight_stash": stash,
            "activations_gb": result.activation_bytes() * scale / GB,
            "stem_gb": result.stages[0].activation_bytes * scale / GB,
            "stash_gb": result.stash_bytes() / GB,
            "messages_gb": result.message_bytes() * scale / GB,
            "params_gb": params / GB,
            "total_gb": with_stem / GB,
            "total_without_stem_gb": without_stem / GB,
            "saving_vs_delayed": 1 - with_stem / total(delayed, True) if compare else None,
            "saving_vs_delayed_without_stem": 1 - without_stem / total(delayed, False) if compare else None,
        }
        if all(s.peak_bytes for s in result.stages):
            summary[name]["peak_gb"] = peak(result) / GB
            summary[name]["peak_saving_vs_delayed"] = 1 - peak(result) / peak(delayed) if compare else None
    return summary


def scaling_check(model, modes, settings: list[tuple[int, int]], expected: float, label: str) -> dict:
    """Measure at two (micro-batch, image side) settings and compare the activation bytes (`expected` ratio)."""
    (b1, s1), (b2, s2) = settings
    first = measure_all(model, modes, b1, s1, f"{label} b={b1} {s1}x{s1}")
    second = measure_all(model, modes, b2, s2, f"{label} b={b2} {s2}x{s2}")
    summary = {}
    for name in first:
        a, b = first[name].activation_bytes(), second[name].activation_bytes()
        ratios = [
            y.activation_bytes / x.activation_bytes
            for x, y in zip(first[name].stages, second[name].stages)
            if x.activation_bytes
        ]
        summary[name] = {
            "bytes": [a, b],
            "ratio": b / a if a else float("nan"),
            "stage_ratios": ratios,
            "stash_unchanged": first[name].stash_bytes() == second[name].stash_bytes(),
            "measured_at": [[b1, s1], [b2, s2]],
            "expected": expected,
        }
    return summary


def depth_study(depths, widths, downsamplings, batch, scale_to) -> dict:
    """Largest per-stage and total buffer bytes against J, every buffer configuration (CIFAR stem, 32x32)."""
    summary, scale = {}, scale_to / batch
    for downsampling in downsamplings:
        for depth in depths:
            config = RevNetConfig(
                block_type="basic", depths=depth, hidden_sizes=widths, embedding_size=widths[0], stem="cifar",
                num_labels=10, downsampling=downsampling,
            )
            model = build_model(config)
            stages = model.get_stages()
            results = measure_all(model, BUFFER_MODES, batch, 32, f"J={len(stages)} {downsampling}")
            entry = {"layout": stage_layout(stages), "params_mb": parameter_bytes(model) / MB, "modes": {}}
            for name, result in results.items():
                per_stage = [s.buffer_bytes(scale) for s in result.stages]
                worst = max(range(len(per_stage)), key=per_stage.__getitem__)
                entry["modes"][name] = {"max_stage_mb": max(per_stage) / MB, "max_stage": worst,
                                        "total_mb": sum(per_stage) / MB}
            summary.setdefault(downsampling, {})[str(len(stages))] = entry
            del model, stages
            gc.collect()
    return summary


def table6_counterpart(presets, batch, fast) -> dict:
    """PETRA per stage on CIFAR-10 (32x32, 10 labels), buffered downsampling, scaled to micro-batch 256."""
    summary = {}
    for preset in presets:
        config = revnet_config(preset, fast=fast, stem="cifar", num_labels=10, downsampling="buffered")
        result = measure(build_model(config), Mode.PETRA, batch, 32)
        progress(f"table 6 {preset} petra {result.micro_batches} micro-batches in {result.seconds:.1f} s")
        summary[preset] = {
            "layout": "".join(s.kind for s in result.stages),
            "in_flight": [s.in_flight for s in result.stages],
            "buffer_gb": [s.activation_bytes * 256 / batch / GB for s in result.stages],
        }
        gc.collect()
    return summary


def process_growth_job(rank, world_size, mode: str, widths: list[int], batch: int) -> dict:
    """On one rank: what the pipeline's buffers add to the process (engine process view, per-stage sum, malloc)."""
    model = build_model(revnet_config("revnet18", stem="cifar", num_labels=10, hidden_sizes=widths,
                                      embedding_size=widths[0]))  # fmt: skip
    batches = random_batches(4, batch, 32)
    pipeline = make_pipeline(model.get_stages(), Mode(mode))
    return steady_state_growth(pipeline, lambda step: batches[step % len(batches)])


def process_check(modes, widths: list[int], batch: int, world_sizes=(1, 2)) -> dict:
    """The engine's accounting against the allocator: RevNet18 (CIFAR stem, 32x32) in fresh processes, one rank
    holding all 10 stages and two ranks holding 5 each."""
    summary = {}
    for mode in modes:
        for world_size in world_sizes:
            per_rank = launch(process_growth_job, world_size, mode.value, widths, batch, deadline=900)
            summary.setdefault(mode.value, {})[str(world_size)] = per_rank
            ratios = ", ".join(f"{g['malloc_bytes'] / g['process_bytes']:.3f}" for g in per_rank)
            progress(f"process check {mode.value}, {world_size} process(es): malloc / engine {ratios}")
    return {"widths": widths, "batch": batch, "image_size": 32, "modes": summary}


# -- main ----------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="*", default=["revnet18", "revnet34", "revnet50"])
    parser.add_argument("--revvit", nargs="*", default=[], metavar="PRESET",
                        help="RevViT presets, measured at their own image size (224; 16 --fast), in a run of their "
                             "own: pass --models with no name")
    parser.add_argument("--downsampling", nargs="+", default=DOWNSAMPLINGS, choices=DOWNSAMPLINGS)
    parser.add_argument("--modes", nargs="+", default=[m.value for m in ALL_MODES], choices=Mode.names())
    parser.add_argument("--batch", type=int, default=2, help="measured micro-batch (default 2)")
    parser.add_argument("--scale-to", type=int, default=64, help="micro-batch the activation bytes are scaled to")
    parser.add_argument("--image-size", type=int, default=None, help="measured image side (default 64; 32 --fast)")
    parser.add_argument("--report-size", type=int, default=None, help="image side reported (default 224; 32 --fast)")
    parser.add_argument("--fast", action="store_true", help="tiny widths, CIFAR stem, 32x32 images (smoke test)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: OMP_NUM_THREADS; 1 --fast)")
    parser.add_argument("--no-peaks", action="store_true",
                        help="skip the within-operation peaks (each configuration then runs once, unprofiled)")
    parser.add_argument("--no-checks", action="store_true", help="skip the micro-batch and image-size scaling checks")
    parser.add_argument("--no-depth-study", action="store_true", help="skip memory against J")
    parser.add_argument("--no-table6", action="store_true", help="skip the CIFAR per-stage counterpart of Table 6")
    parser.add_argument("--no-process-check", action="store_true",
                        help="skip checking the engine's accounting against malloc in 1 and 2 processes")
    add_out_argument(parser, "memory")
    args = parser.parse_args(argv)
    if args.image_size is None:
        args.image_size = 32 if args.fast else 64
    if args.report_size is None:
        args.report_size = 32 if args.fast else 224
    if args.threads is None and args.fast:
        args.threads = 1
    for side in (args.image_size, args.report_size):
        if side % 32:
            parser.error(f"image sides must be multiples of 32 for bytes to scale exactly with the area, got {side}")
    if args.batch < 2:
        parser.error("--batch must be >= 2 (at batch 1 the stem's two streams share one storage)")
    if args.revvit and args.models:
        parser.error("--revvit runs on their own (pass --models with no name): RevViT activations are measured at "
                     "the model's image size and scale with the micro-batch only, RevNet ones also with the area")
    if not args.revvit and not args.models:
        parser.error("nothing to measure: name --models or --revvit presets")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    modes = [Mode(m) for m in args.modes]
    area_scale = 1.0 if args.revvit else (args.report_size / args.image_size) ** 2
    scale = args.scale_to / args.batch * area_scale
    settings = {key: value for key, value in vars(args).items() if key != "out"}
    report: dict = {"threads": torch.get_num_threads(), "scale": scale, "models": {}}
    for preset in args.models:
        for downsampling in args.downsampling:
            model = build_model(model_config(preset, downsampling, args.fast))
            params = parameter_bytes(model)
            results = measure_all(model, modes, args.batch, args.image_size, f"{preset} {downsampling}",
                                  peaks=not args.no_peaks)
            report["models"][f"{preset} {downsampling}"] = {
                "layout": stage_layout(model.get_stages()),
                "param_bytes": params,
                "summary": totals(results, params, scale),
                "modes": {name: asdict(result) for name, result in results.items()},
            }
            del model
            gc.collect()

    for preset in args.revvit:
        config = small_revvit_config(preset) if args.fast else RevViTConfig.from_preset(preset, num_labels=1000)
        torch.manual_seed(0)
        model = RevViTForImageClassification(config).float()
        label = f"{preset.replace('-', '_')} patch{config.patch_size}"
        results = measure_all(model, modes, args.batch, config.image_size, label, peaks=not args.no_peaks)
        report["models"][label] = {
            "layout": stage_layout(model.get_stages()), "param_bytes": parameter_bytes(model),
            "image_size": config.image_size, "summary": totals(results, parameter_bytes(model), scale),
            "modes": {name: asdict(result) for name, result in results.items()},
        }
        del model
        gc.collect()
    if args.revvit:
        args.no_checks = args.no_depth_study = args.no_table6 = args.no_process_check = True  # RevNet studies

    if not args.no_checks:
        preset, downsampling = args.models[0], args.downsampling[0]
        model = build_model(model_config(preset, downsampling, args.fast))
        label, b, side = f"{preset} {downsampling}", args.batch, args.image_size
        report["batch_check"] = scaling_check(model, modes, [(b, side), (2 * b, side)], 2.0, label)
        if args.report_size != args.image_size:
            check_modes = [m for m in (Mode.DELAYED, Mode.PETRA, Mode.BACKPROP, Mode.REVERSIBLE_BACKPROP) if m in modes]
            sides = [(b, side), (b, args.report_size)]
            report["area_check"] = scaling_check(model, check_modes, sides, area_scale, label)
        del model
        gc.collect()

    if not args.no_depth_study:
        depths = FAST_DEPTHS if args.fast else DEPTHS
        widths = FAST_WIDTHS["basic"] if args.fast else doubling_widths(RECIPE_WIDTH)
        report["depth_widths"] = widths
        report["depth_study"] = depth_study(depths, widths, args.downsampling, args.batch, args.scale_to)

    if not args.no_table6:
        presets = [p for p in args.models if p in ("revnet18", "revnet34")] or args.models[:1]
        report["table6"] = table6_counterpart(presets, args.batch, args.fast)

    if not args.no_process_check:
        if malloc_available():
            widths = FAST_WIDTHS["basic"] if args.fast else doubling_widths(RECIPE_WIDTH)
            report["process_check"] = process_check([m for m in BUFFER_MODES if m in modes], widths, 16)
        else:
            progress("process check skipped: it reads glibc's mallinfo2, which this C library lacks")

    report["seconds"] = time.perf_counter() - started
    progress(f"measured in {report['seconds']:.0f} s (after imports) with {torch.get_num_threads()} threads")
    return write_results(results_path(args.out, "memory", args.fast), "memory", "memory.py", argv, settings, **report)


if __name__ == "__main__":
    main()
