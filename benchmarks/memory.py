"""Memory held by PETRA and its baselines, measured from live buffers (the paper's Tables 3 and 6).

For every model and configuration, the stages are wrapped in a `Pipeline`, enough micro-batches are fed to reach
the steady state (2(J-1)+1), and `pipeline.memory()` is read before draining: the bytes of the inputs (or autograd
graphs) and weight copies that each stage's FIFO holds for its pending backwards. Nothing is modelled: every byte
counted belongs to a tensor the engine keeps alive.

    PYTHONPATH=src OMP_NUM_THREADS=2 python benchmarks/memory.py                  # the documented run
    PYTHONPATH=src python benchmarks/memory.py --fast --models revnet18           # seconds, tiny widths

Every stored input and graph tensor has a size proportional to the micro-batch and, when the image side is a
multiple of 32 (the total downsampling of the ImageNet models), to the image area. A 224x224 run of 6 models x 6
modes x 35 micro-batches takes far longer than a 2-core CPU allows, so the run measures at a small micro-batch
(`--batch`, default 2) and image side (`--image-size`, default 64) and scales activation bytes to `--scale-to`
(default 64, the paper's micro-batch) and `--report-size` (default 224). Two checks print the ratios that justify
the scaling: the first model measured at two micro-batch sizes, and at the measured and the reported image side.
Weight copies and model bytes depend on neither and are never scaled. (Micro-batch 1 is avoided on purpose: at
batch 1 the stem's two output streams are views of one storage, which inflates the bytes counted downstream.)

Synchronous modes (`backprop`, `reversible_backprop`) hold nothing between ticks: for them the table reports what a
stage holds between its forward and its backward for one micro-batch, read from the worker's `peak_bytes`. The
gradient accumulators are kept alive (k larger than the number of micro-batches), so that peak is exactly
"graph (or stored input) + gradients" and the gradient bytes, read afterwards, can be subtracted.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

# On a shared CPU, OpenMP threads that spin while waiting stall whenever another process holds a core (runs of
# seconds became minutes); passive waiting costs little when the machine is idle. Read when torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from petra_hub.engine import Mode, Pipeline  # noqa: E402
from petra_hub.models.revnet import RevNetConfig, RevNetForImageClassification  # noqa: E402

BUFFER_MODES = [Mode.DELAYED, Mode.INPUT_BUFFER, Mode.WEIGHT_STASH, Mode.PETRA]
REFERENCE_MODES = [Mode.BACKPROP, Mode.REVERSIBLE_BACKPROP]
ALL_MODES = BUFFER_MODES + REFERENCE_MODES
DOWNSAMPLINGS = ["buffered", "invertible"]
GB, MB = 1e9, 1e6

# Paper Table 3 (RevNet50, ImageNet, micro-batch 64, "model + buffers", GB): an analytic estimate, for reference.
PAPER_TABLE3 = {Mode.DELAYED: 44.5, Mode.INPUT_BUFFER: 43.6, Mode.WEIGHT_STASH: 21.2, Mode.PETRA: 20.3}

# Tiny widths for --fast (and the tests): every preset keeps its depth and block type.
FAST_WIDTHS = {"basic": [8, 16, 16, 16], "bottleneck": [16, 16, 32, 32]}
# The depth study (per-stage memory against J): basic blocks, CIFAR stem, narrow streams.
DEPTHS = [[1, 1, 1, 1], [2, 2, 2, 2], [3, 4, 6, 3], [3, 4, 23, 3]]
DEPTH_WIDTHS = [16, 32, 64, 128]
FAST_DEPTHS = [[1, 1, 1, 1], [2, 2, 2, 2]]


@dataclass
class StageMemory:
    index: int
    kind: str  # S stem, R reversible, D non-reversible block, H head
    in_flight: int  # micro-batches between forward and backward when read
    activation_bytes: int  # at the measured micro-batch
    stash_bytes: int
    gradient_bytes: int

    def buffer_bytes(self, scale: float) -> float:
        """Activations scaled to the target micro-batch, plus weight copies (batch independent)."""
        return self.activation_bytes * scale + self.stash_bytes


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


# -- measuring -----------------------------------------------------------------------------------------------------
def stage_kinds(stages) -> str:
    last = len(stages) - 1
    return "".join(
        "S" if i == 0 else "H" if i == last else "R" if getattr(s, "reversible", False) else "D"
        for i, s in enumerate(stages)
    )


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def measure(model: RevNetForImageClassification, mode: Mode, batch: int, image_size: int) -> ModeResult:
    """Run `mode` on the model's stages until the steady state and read every stage's buffers."""
    config = model.config
    model.train()
    model.zero_grad(set_to_none=True)
    stages = model.get_stages()
    J = len(stages)
    count = 2 * (J - 1) + 1 if mode.pipelined else 2
    # k > count: gradients are accumulated and never applied nor freed, so `gradient_bytes` is steady.
    pipeline = Pipeline(stages, cross_entropy, mode=mode, accumulation_steps=count + 1, optimizer_factory=None)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(count):
        # A fresh tensor per micro-batch, as a data loader gives: feeding one tensor again and again would let the
        # stem's FIFO hold a single storage and hide its image buffer.
        images = torch.randn(batch, config.num_channels, image_size, image_size, generator=generator)
        labels = torch.randint(0, config.num_labels, (batch,), generator=generator)
        pipeline.step(images, labels)
    seconds = time.perf_counter() - start
    memory, in_flight = pipeline.memory(), pipeline.in_flight()
    kinds = stage_kinds(stages)
    result = ModeResult(mode.value, count, seconds)
    for i in range(J):
        stats = memory[i]
        expected = 2 * (J - 1 - i) if mode.pipelined else 0
        if len(in_flight[i]) != expected:
            raise RuntimeError(f"{mode.value}: stage {i} holds {len(in_flight[i])} micro-batches, expected {expected}")
        if mode.pipelined:
            activations, stash = stats.activation_bytes, stats.stash_bytes
        else:
            # Nothing is held now; the peak was "one micro-batch's graph (or input) + the accumulated gradients".
            if stats.activation_bytes or stats.stash_bytes:
                raise RuntimeError(f"{mode.value}: stage {i} holds buffers between micro-batches")
            activations, stash = stats.peak_bytes - stats.gradient_bytes, 0
        result.stages.append(StageMemory(i, kinds[i], len(in_flight[i]), activations, stash, stats.gradient_bytes))
    del pipeline, memory  # reference counting frees the buffers; a full gc.collect() per run costs ~0.25 s
    model.zero_grad(set_to_none=True)
    return result


def parameter_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def build(config: RevNetConfig) -> RevNetForImageClassification:
    torch.manual_seed(0)
    return RevNetForImageClassification(config).float()


def model_config(preset: str, downsampling: str, fast: bool) -> RevNetConfig:
    if fast:
        block_type = RevNetConfig.from_preset(preset).block_type
        return RevNetConfig.from_preset(
            preset, stem="cifar", num_labels=10, downsampling=downsampling,
            hidden_sizes=FAST_WIDTHS[block_type], embedding_size=8,
        )
    return RevNetConfig.from_preset(preset, stem="imagenet", num_labels=1000, downsampling=downsampling)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_all(model, modes, batch, image_size, label) -> dict[str, ModeResult]:
    results = {}
    for mode in modes:
        results[mode.value] = result = measure(model, mode, batch, image_size)
        log(f"  {label} {mode.value:<20} {result.micro_batches:3d} micro-batches in {result.seconds:6.1f} s")
    return results


# -- reporting -----------------------------------------------------------------------------------------------------
def markdown_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [header, rule, *rows]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def describe(mode: Mode) -> tuple[str, str]:
    """(input buffer, weight stash) columns of the paper's Table 3."""
    if not mode.pipelined:
        return ("graph" if mode.keeps_graph else "non-rev. only"), "-"
    stores = "non-rev. only" if mode.reconstructs else "yes"
    return stores, ("yes" if mode.stashes_weights else "no")


def totals_table(results: dict[str, ModeResult], params: int, scale: float) -> tuple[str, dict]:
    delayed = results.get(Mode.DELAYED.value)

    def totals(result: ModeResult, with_stem: bool) -> float:
        activations = sum(s.activation_bytes for s in result.stages if with_stem or s.kind != "S")
        return params + activations * scale + result.stash_bytes()

    rows, summary = [], {}
    for name, result in results.items():
        mode = Mode(name)
        inputs, stash = describe(mode)
        total, no_stem = totals(result, True), totals(result, False)
        stem = result.stages[0].activation_bytes * scale
        if delayed is not None and mode.pipelined:
            saving = f"{100 * (1 - total / totals(delayed, True)):.1f}%"
            saving_no_stem = f"{100 * (1 - no_stem / totals(delayed, False)):.1f}%"
        else:
            saving = saving_no_stem = "-"
        label = name if mode.pipelined else f"{name} (1 micro-batch)"
        rows.append([
            label, inputs, stash,
            f"{result.activation_bytes() * scale / GB:.2f}", f"{stem / GB:.2f}", f"{result.stash_bytes() / GB:.2f}",
            f"{params / GB:.3f}", f"**{total / GB:.2f}**", saving, f"{no_stem / GB:.2f}", saving_no_stem,
        ])
        summary[name] = {
            "activations_gb": result.activation_bytes() * scale / GB,
            "stem_gb": stem / GB,
            "stash_gb": result.stash_bytes() / GB,
            "params_gb": params / GB,
            "total_gb": total / GB,
            "total_without_stem_gb": no_stem / GB,
            "saving_vs_delayed": saving,
            "saving_vs_delayed_without_stem": saving_no_stem,
        }
    header = [
        "configuration", "input buffer", "weight stash", "activations (GB)", "of which stem (GB)",
        "weight stash (GB)", "model (GB)", "model + buffers (GB)", "saving vs delayed",
        "model + buffers without the stem's buffer (GB)", "saving",
    ]
    return markdown_table(header, rows, "lll" + "r" * 8), summary


def per_stage_table(results: dict[str, ModeResult], scale: float) -> str:
    """Per stage: activations (scaled) plus weight stash, in GB, one column per configuration."""
    names = list(results)
    first = results[names[0]].stages
    header = ["stage", "kind", "in flight"] + [f"{n} (GB)" for n in names]
    rows = []
    for i, stage in enumerate(first):
        in_flight = next((results[n].stages[i].in_flight for n in names if Mode(n).pipelined), 0)
        cells = [f"{results[n].stages[i].buffer_bytes(scale) / GB:.3f}" for n in names]
        rows.append([str(i), stage.kind, str(in_flight)] + cells)
    rows.append(["all", "", ""] + [f"{sum(s.buffer_bytes(scale) for s in results[n].stages) / GB:.2f}" for n in names])
    return markdown_table(header, rows, "llr" + "r" * len(names))


def scaling_check(
    model, modes, settings: list[tuple[int, int]], expected: float, label: str
) -> tuple[str, dict]:
    """Measure at two (micro-batch, image side) settings and compare the activation bytes with `expected`."""
    (b1, s1), (b2, s2) = settings
    first = measure_all(model, modes, b1, s1, f"{label} b={b1} {s1}x{s1}")
    second = measure_all(model, modes, b2, s2, f"{label} b={b2} {s2}x{s2}")
    rows, summary = [], {}
    for name in first:
        a, b = first[name].activation_bytes(), second[name].activation_bytes()
        ratios = [
            y.activation_bytes / x.activation_bytes
            for x, y in zip(first[name].stages, second[name].stages)
            if x.activation_bytes
        ]
        stash_same = first[name].stash_bytes() == second[name].stash_bytes()
        ratio = b / a if a else float("nan")
        spread = f"{min(ratios):.4f} .. {max(ratios):.4f}" if ratios else "-"
        rows.append([name, f"{a:,}", f"{b:,}", f"{ratio:.4f}", spread, "yes" if stash_same else "NO"])
        summary[name] = {"bytes": [a, b], "ratio": ratio, "stage_ratios": ratios, "stash_unchanged": stash_same}
    header = [
        "configuration", f"activations, b={b1} {s1}x{s1} (bytes)", f"b={b2} {s2}x{s2} (bytes)",
        f"ratio (expected {expected:.4f})", "per-stage ratios", "stash unchanged",
    ]
    return markdown_table(header, rows, "lrrrrl"), summary


def depth_study(depths, widths, downsamplings, batch, scale_to) -> tuple[str, dict]:
    """Largest per-stage and total buffer bytes against J, for every buffer configuration (CIFAR stem, 32x32)."""
    out, summary = [], {}
    scale = scale_to / batch
    for downsampling in downsamplings:
        rows = []
        for depth in depths:
            config = RevNetConfig(
                block_type="basic", depths=depth, hidden_sizes=widths, embedding_size=widths[0], stem="cifar",
                num_labels=10, downsampling=downsampling,
            )
            model = build(config)
            J = len(model.get_stages())
            results = measure_all(model, BUFFER_MODES, batch, 32, f"J={J} {downsampling}")
            row = [str(J), stage_kinds(model.get_stages())]
            for name, result in results.items():
                per_stage = [s.buffer_bytes(scale) for s in result.stages]
                worst = max(range(J), key=per_stage.__getitem__)
                row.append(f"{max(per_stage) / MB:,.1f} ({worst}{result.stages[worst].kind})")
                row.append(f"{sum(per_stage) / MB:,.1f}")
                summary.setdefault(downsampling, {}).setdefault(str(J), {})[name] = {
                    "max_stage_mb": max(per_stage) / MB, "max_stage": worst, "total_mb": sum(per_stage) / MB,
                    "params_mb": parameter_bytes(model) / MB,
                }
            rows.append(row)
            del model
            gc.collect()
        header = ["J", "layout"]
        for mode in BUFFER_MODES:
            header += [f"{mode.value}: largest stage (MB)", f"{mode.value}: all stages (MB)"]
        out.append(f"**{downsampling} downsampling**\n\n" + markdown_table(header, rows, "ll" + "r" * 8))
    return "\n\n".join(out), summary


def table6_counterpart(presets, batch, fast) -> tuple[str, dict]:
    """PETRA per stage on CIFAR-10 (32x32, 10 labels), buffered downsampling, scaled to micro-batch 256."""
    results = {}
    for preset in presets:
        config = model_config(preset, "buffered", fast)
        if not fast:
            config = RevNetConfig.from_preset(preset, stem="cifar", num_labels=10, downsampling="buffered")
        model = build(config)
        results[preset] = measure(model, Mode.PETRA, batch, 32)
        log(f"  table 6 {preset} petra {results[preset].micro_batches} micro-batches in "
            f"{results[preset].seconds:.1f} s")
        del model
        gc.collect()
    scale = 256 / batch
    depth = max(len(r.stages) for r in results.values())
    header = ["stage"]
    for preset in presets:
        header += [f"{preset} kind", f"{preset} in flight", f"{preset} buffer (GB)"]
    rows = []
    for i in range(depth):
        row = [str(i)]
        for preset in presets:
            stages = results[preset].stages
            if i < len(stages):
                s = stages[i]
                row += [s.kind, str(s.in_flight), f"{s.activation_bytes * scale / GB:.3f}"]
            else:
                row += ["", "", ""]
        rows.append(row)
    summary = {p: [s.activation_bytes * scale / GB for s in r.stages] for p, r in results.items()}
    return markdown_table(header, rows, "l" + "lrr" * len(presets)), summary


# -- main ----------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["revnet18", "revnet34", "revnet50"])
    parser.add_argument("--downsampling", nargs="+", default=DOWNSAMPLINGS, choices=DOWNSAMPLINGS)
    parser.add_argument("--modes", nargs="+", default=[m.value for m in ALL_MODES], choices=[m.value for m in Mode])
    parser.add_argument("--batch", type=int, default=2, help="measured micro-batch (default 2)")
    parser.add_argument("--scale-to", type=int, default=64, help="micro-batch the activation bytes are scaled to")
    parser.add_argument("--image-size", type=int, default=None, help="measured image side (default 64; 32 --fast)")
    parser.add_argument("--report-size", type=int, default=None, help="image side reported (default 224; 32 --fast)")
    parser.add_argument("--fast", action="store_true", help="tiny widths, CIFAR stem, 32x32 images (smoke test)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: OMP_NUM_THREADS; 1 --fast)")
    parser.add_argument("--no-checks", action="store_true", help="skip the micro-batch and image-size scaling checks")
    parser.add_argument("--no-depth-study", action="store_true", help="skip memory against J")
    parser.add_argument("--no-table6", action="store_true", help="skip the CIFAR per-stage counterpart of Table 6")
    parser.add_argument("--json", help="also write every number to this JSON file")
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
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    modes = [Mode(m) for m in args.modes]
    batch_scale = args.scale_to / args.batch
    area_scale = (args.report_size / args.image_size) ** 2
    scale = batch_scale * area_scale
    report: dict = {"settings": {**vars(args), "torch": torch.__version__, "threads": torch.get_num_threads()}}
    command = " ".join(["python benchmarks/memory.py", *(sys.argv[1:] if argv is None else argv)])
    print("# PETRA memory benchmark: live buffers (paper Tables 3 and 6)\n")
    stem = "CIFAR stem, 10 labels, tiny widths (--fast)" if args.fast else "ImageNet stem, 1000 labels"
    print(
        f"`{command}`, torch {torch.__version__}, {torch.get_num_threads()} threads.\n\n"
        f"Models: {stem}, float32. Measured at micro-batch {args.batch} and {args.image_size}x{args.image_size} "
        f"images; activation bytes (stored inputs, autograd graphs) scaled x{scale:g} "
        f"(= {args.scale_to}/{args.batch} x ({args.report_size}/{args.image_size})^2) to micro-batch "
        f"{args.scale_to} at {args.report_size}x{args.report_size}; weight stash and model bytes are not scaled. "
        "Buffers are read from `pipeline.memory()` after 2(J-1)+1 micro-batches, before draining. "
        "`backprop` / `reversible_backprop` are synchronous: their rows give what each stage holds between its "
        "forward and its backward for one micro-batch (its peak). In pipelined modes the stem's buffer is the "
        "images it keeps; a data loader that can re-read them would make it free (the paper leaves it out). "
        "Gradient accumulators and optimizer state (the same in every configuration) are not included. "
        "GB = 1e9 bytes.\n"
    )
    report["models"] = {}
    for preset in args.models:
        for downsampling in args.downsampling:
            model = build(model_config(preset, downsampling, args.fast))
            stages = model.get_stages()
            params = parameter_bytes(model)
            label = f"{preset} {downsampling}"
            results = measure_all(model, modes, args.batch, args.image_size, label)
            table, summary = totals_table(results, params, scale)
            print(f"## {preset}, {downsampling} downsampling: J = {len(stages)}, layout {stage_kinds(stages)}, "
                  f"{params / 4 / 1e6:.2f}M parameters\n")
            print(table + "\n")
            if preset == "revnet50" and downsampling == "buffered" and not args.fast:
                paper = ", ".join(f"{m.value} {v}" for m, v in PAPER_TABLE3.items())
                print(f"Paper Table 3 (analytic model that leaves out the stem's image buffer: compare with the "
                      f"column without the stem's buffer): {paper} GB; PETRA saves 54.3%.\n")
            print(per_stage_table(results, scale) + "\n")
            report["models"][label] = {
                "layout": stage_kinds(stages),
                "param_bytes": params,
                "summary": summary,
                "modes": {name: asdict(result) for name, result in results.items()},
            }
            del model, stages
            gc.collect()

    if not args.no_checks:
        preset, downsampling = args.models[0], args.downsampling[0]
        model = build(model_config(preset, downsampling, args.fast))
        label = f"{preset} {downsampling}"
        b, side = args.batch, args.image_size
        table, summary = scaling_check(model, modes, [(b, side), (2 * b, side)], 2.0, label)
        print(f"## Check: activation bytes are linear in the micro-batch ({label})\n")
        print(table + "\n")
        report["batch_check"] = summary
        if args.report_size != args.image_size:
            check_modes = [m for m in (Mode.DELAYED, Mode.PETRA, Mode.BACKPROP, Mode.REVERSIBLE_BACKPROP) if m in modes]
            table, summary = scaling_check(
                model, check_modes, [(b, side), (b, args.report_size)], area_scale, label
            )
            print(f"## Check: activation bytes scale with the image area ({label}, {side} -> {args.report_size})\n")
            print(table + "\n")
            report["area_check"] = summary
        del model
        gc.collect()

    if not args.no_depth_study:
        depths = FAST_DEPTHS if args.fast else DEPTHS
        widths = FAST_WIDTHS["basic"] if args.fast else DEPTH_WIDTHS
        table, summary = depth_study(depths, widths, args.downsampling, args.batch, args.scale_to)
        print(f"## Growth with J (basic blocks, CIFAR stem, stream widths {widths}, 32x32 images, micro-batch "
              f"{args.scale_to})\n")
        print("Each cell: the largest per-stage buffer (stage index and kind in brackets), then the sum over all "
              "stages; activations plus weight stash, model excluded.\n")
        print(table + "\n")
        report["depth_study"] = summary

    if not args.no_table6:
        presets = [p for p in args.models if p in ("revnet18", "revnet34")] or args.models[:1]
        table, summary = table6_counterpart(presets, args.batch, args.fast)
        print("## Counterpart of paper Table 6 (PETRA, per stage, CIFAR-10 32x32, micro-batch 256, buffers only)\n")
        print(table + "\n")
        report["table6"] = summary

    elapsed = time.perf_counter() - started
    report["seconds"] = elapsed
    print(f"Measured in {elapsed:.0f} s (after imports) with {torch.get_num_threads()} threads.")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    return report


if __name__ == "__main__":
    main()
