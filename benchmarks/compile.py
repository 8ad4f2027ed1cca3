"""torch.compile of PETRA's stages against eager execution, one process on CPU: compile time, steady-state speed.

    python benchmarks/compile.py            # RevNet18 w=16, fp32 and bf16, inductor (about 5 min): results/compile.json
    python benchmarks/compile.py --quick    # tiny widths, aot_eager, short windows (under a minute): compile-quick.json
    python benchmarks/compile.py --backends inductor,aot_eager --precisions fp32   # another backend beside

What runs: RevNet18 (J = 10 stages; widths w, 2w, 4w, 8w; w = 16 by default), 32x32 images, micro-batch 32, PETRA
with k = 1 and SGD (momentum 0.9), all stages in this process (`Pipeline`, not distributed), one thread. w = 16 is
where computation dominates: 10-20 ms of convolutions per stage and tick (throughput.json's stage_ms) against
about a millisecond of Python and dispatch per stage (w = 4 runs a whole tick of 10 stages in ~20 ms), so compiled
kernels have something to win; a micro-batch still takes ~0.15 s on one core, so the windows stay short and
most of a run is inductor's compile.

For every precision (fp32: autocast off; bf16: `precision="bf16"`, bf16 compute and float32 streams) and every
backend, an eager pipeline and a compiled one (`compile_options={"backend": ...}`, i.e. `compile_stage`: the
stem, the downsampling blocks and the head compiled whole, the F of every reversible block compiled so that
its forward, inversion and fused backward all run compiled code) are built from the same initial weights and
fed the same micro-batches:

* compile time: the wall time of the first 2(J-1)+1 = 19 micro-batches (the pipeline's fill: micro-batch 0's
  backward reaches stage 0 at tick 2(J-1), so by then every stage has run its forward and its backward once and
  every graph is compiled) minus the eager time of the same micro-batches. `compile_first_J_s` is the same over
  the first J micro-batches, which see every forward but only the backwards of the last stages.
* steady state: then `--repeats` repetitions, alternating which pipeline goes first, each timing `--micro-batches`
  micro-batches of each pipeline; seconds per micro-batch, the per-repetition ratio compiled / eager, medians.
* agreement: the per-micro-batch losses of the two pipelines (same data, same schedule), maximum absolute
  difference over the run, over the fill, and at micro-batch 0 (before any update: the rounding of one forward).
  Compiled kernels round differently (fused, reordered reductions); training then carries the difference on, so
  it grows with the number of updates.
* dynamo: graphs compiled, graphs compiled during the timed windows (0: nothing recompiles in steady state), and
  the functions for which dynamo hit its recompile limit and fell back to eager.

The engine's start-up handshake runs every stage once on a batch of 2 (a dry run) before the first real
micro-batch; it runs eagerly (`torch.compiler.set_stance("force_eager")`), so nothing is compiled for that batch.

Each configuration starts from `torch._dynamo.reset()` and an empty inductor cache directory of its own, so
compile times are those of a first run (a second run of the same program finds the FX graph cache warm:
`--cache-dir DIR` keeps one directory for everything, to measure that).

"isolated": `compile_stage` passes `isolate_recompiles=True` (each module keeps its own dynamo cache). Without it,
all `Module.compile` calls share one cache per code object: the F of every reversible block (an `nn.Sequential`,
entered through the one wrapper of `Module.compile`) needs entries for 4 widths x {the no-grad forward, the
grad-mode fused backward}, more than `torch._dynamo.config.recompile_limit` (8), and dynamo then silently runs the
rest eagerly, the fused backwards first of all. A first version of `compile_stage` did exactly that; this
benchmark found it (`dynamo.recompile_limit_hits` names such functions, and must be empty). A backend named
`NAME+isolated` still adds the option explicitly.

If a compiled pipeline fails (e.g. inductor without a working C++ compiler), the error is recorded and the
configuration is measured again with aot_eager (`fallback_for`).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from _launch import SINGLE_THREAD_ENV  # noqa: E402 (imports no torch)

os.environ.update(SINGLE_THREAD_ENV)  # one thread: before torch is imported

import torch  # noqa: E402

from common import add_out_argument, build_model, load_average, make_pipeline, progress  # noqa: E402
from common import random_batches, results_path, revnet_config, write_results  # noqa: E402
from petra_hub.testing.models import QUICK_WIDTH, RECIPE_WIDTH  # noqa: E402

NUM_DISTINCT_BATCHES = 4
PRECISIONS = {"fp32": None, "bf16": "bf16"}
FALLBACK_BACKEND = "aot_eager"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--backends", type=str, default=None,
        help=(
            "comma-separated torch.compile backends, each optionally NAME+isolated "
            "(default inductor; quick: aot_eager)"
        ),
    )
    parser.add_argument("--precisions", type=str, default="fp32,bf16", help="comma-separated, of fp32, bf16")
    parser.add_argument("--repeats", type=int, default=None, help="timing windows per pipeline (default 5; quick: 2)")
    parser.add_argument("--micro-batches", type=int, default=None, help="N per window (default 10; quick: 3)")
    parser.add_argument("--batch", type=int, default=None, help="micro-batch size (default 32; quick: 8)")
    parser.add_argument(
        "--width", type=int, default=None, help=f"layers w,2w,4w,8w wide (default {RECIPE_WIDTH}; quick: {QUICK_WIDTH})"
    )
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="one inductor cache directory for every configuration (default: a fresh one each: cold)")
    parser.add_argument("--quick", action="store_true", help="tiny model, aot_eager, short windows: a smoke test")
    add_out_argument(parser, "compile")
    args = parser.parse_args(argv)
    quick = args.quick
    args.backends = [
        b.strip() for b in (args.backends or ("aot_eager" if quick else "inductor")).split(",") if b.strip()
    ]
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    args.repeats = args.repeats or (2 if quick else 5)
    args.micro_batches = args.micro_batches or (3 if quick else 10)
    args.batch = args.batch or (8 if quick else 32)
    args.width = args.width or (QUICK_WIDTH if quick else RECIPE_WIDTH)
    if args.repeats < 1 or args.micro_batches < 1 or args.batch < 2 or args.width < 1:
        parser.error("--repeats, --micro-batches, --width must be >= 1 and --batch >= 2 (batch norm)")
    if not args.backends or not args.precisions:
        parser.error("--backends and --precisions need at least one entry each")
    unknown = [p for p in args.precisions if p not in PRECISIONS]
    if unknown:
        parser.error(f"--precisions: unknown {unknown}, choose among {list(PRECISIONS)}")
    return args


def compile_options(variant: str) -> dict:
    """`inductor` -> {"backend": "inductor"}; `inductor+isolated` adds isolate_recompiles=True."""
    backend, _, flag = variant.partition("+")
    if flag not in ("", "isolated"):
        raise SystemExit(f"--backends: unknown suffix +{flag} in {variant!r} (only +isolated)")
    return {"backend": backend, **({"isolate_recompiles": True} if flag else {})}


# -- dynamo bookkeeping ----------------------------------------------------------------------------------------------
class RecompileLimitHits(logging.Handler):
    """Collects dynamo's "hit config.recompile_limit" warnings: the function that then runs eagerly."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.functions: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "hit config." in message:
            lines = message.splitlines()
            function = next((line.split("function:", 1)[1].strip() for line in lines if "function:" in line), "?")
            # "'inner' (/path/to/external_utils.py:67)" -> "inner (external_utils.py:67)"
            name, _, where = function.partition(" (")
            self.functions.append(f"{name.strip(chr(39))} ({Path(where.rstrip(')')).name})" if where else name)


@contextlib.contextmanager
def watching_recompile_limits():
    handler = RecompileLimitHits()
    logger = logging.getLogger("torch._dynamo.convert_frame")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def graphs_compiled() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


@contextlib.contextmanager
def inductor_cache(settings, name: str):
    """An empty inductor cache directory for one configuration (a first run's compile), or `--cache-dir`."""
    directory = settings.cache_dir if settings.cache_dir is not None else settings.cache_root / name
    directory.mkdir(parents=True, exist_ok=True)
    try:
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
    except ImportError:  # older torch: the variable alone (in-memory caches are cleared by torch._dynamo.reset)
        temporary_cache_dir = None
    if temporary_cache_dir is not None:
        with temporary_cache_dir(str(directory)):
            yield directory
    else:
        previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory)
        try:
            yield directory
        finally:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous or ""
    if settings.cache_dir is None:
        shutil.rmtree(directory, ignore_errors=True)


# -- one configuration -----------------------------------------------------------------------------------------------
def engine(settings, precision: str, options: dict | None):
    model = build_model(revnet_config("revnet18", width=settings.width, num_labels=10))
    return make_pipeline(model.get_stages(), "petra", lr=settings.lr, distributed=False,
                         precision=PRECISIONS[precision], compile_options=options)


def measure(settings, precision: str, variant: str, batches) -> dict:
    """Eager and compiled pipelines side by side (see the module docstring); raises if the compiled one fails."""
    options = compile_options(variant)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    name = f"{precision}-{variant.replace('+', '-')}"
    result = {"precision": precision, "variant": variant, "compile_options": options}
    with inductor_cache(settings, name), watching_recompile_limits() as hits:
        pipelines = {"eager": engine(settings, precision, None), "compiled": engine(settings, precision, options)}
        fill = pipelines["eager"].schedule.latency
        num_stages = pipelines["eager"].num_stages
        losses = {key: {} for key in pipelines}
        fed = dict.fromkeys(pipelines, 0)

        def run(key, count, times=None):
            for _ in range(count):
                images, labels = batches[fed[key] % len(batches)]
                start = time.perf_counter()
                finished = pipelines[key].step(images, labels)
                if times is not None:
                    times.append(time.perf_counter() - start)
                losses[key].update((b, float(loss)) for b, loss in finished)
                fed[key] += 1

        fill_times = {key: [] for key in pipelines}
        for key in pipelines:  # eager first: the compiled one's first steps are its compile
            progress(
                f"{name}: {key} pipeline, the first {fill} micro-batches "
                f"(fill{', compiling' if key == 'compiled' else ''})"
            )
            run(key, fill, fill_times[key])
        graphs_after_fill = graphs_compiled()

        n = settings.micro_batches
        times = {key: [] for key in pipelines}
        for repeat in range(settings.repeats):
            order = ("eager", "compiled") if repeat % 2 == 0 else ("compiled", "eager")
            for key in order:
                start = time.perf_counter()
                run(key, n)
                times[key].append((time.perf_counter() - start) / n)
            progress(f"{name}, repetition {repeat + 1}/{settings.repeats}: eager {1e3 * times['eager'][-1]:.1f} ms, "
                     f"compiled {1e3 * times['compiled'][-1]:.1f} ms per micro-batch")
        graphs_in_windows = graphs_compiled() - graphs_after_fill
        for key, pipeline in pipelines.items():
            losses[key].update((b, float(loss)) for b, loss in pipeline.drain())
        counters = {key: pipeline.counters() for key, pipeline in pipelines.items()}

    micro_batches = sorted(losses["eager"])
    if sorted(losses["compiled"]) != micro_batches or micro_batches != list(range(fed["eager"])):
        raise RuntimeError(f"{name}: the pipelines finished different micro-batches")
    for key, per_stage in counters.items():
        if any(c.updates != fed[key] for c in per_stage.values()):
            raise RuntimeError(f"{name}, {key}: not every micro-batch was applied at every stage")
    differences = [abs(losses["compiled"][b] - losses["eager"][b]) for b in micro_batches]
    ratios = [c / e for c, e in zip(times["compiled"], times["eager"])]
    result.update(
        num_stages=num_stages,
        fill_micro_batches=fill,
        fill_s=fill_times,
        compile_s=sum(fill_times["compiled"]) - sum(fill_times["eager"]),
        compile_first_J_s=sum(fill_times["compiled"][:num_stages]) - sum(fill_times["eager"][:num_stages]),
        times=times,
        median_s={key: statistics.median(values) for key, values in times.items()},
        ratios=ratios,
        median_ratio=statistics.median(ratios),
        loss={
            "micro_batches": len(micro_batches),
            "max_abs_diff": max(differences),
            "first_micro_batch_abs_diff": differences[0],
            "max_abs_diff_in_fill": max(differences[:fill]),
            "max_relative_diff": max(d / abs(losses["eager"][b]) for d, b in zip(differences, micro_batches)),
            "eager_first_last": [losses["eager"][0], losses["eager"][micro_batches[-1]]],
            "eager": [losses["eager"][b] for b in micro_batches],
            "compiled": [losses["compiled"][b] for b in micro_batches],
        },
        dynamo={
            "graphs": graphs_after_fill,
            "graphs_in_windows": graphs_in_windows,
            "recompile_limit": torch._dynamo.config.recompile_limit,
            "recompile_limit_hits": sorted(set(hits.functions)),
        },
        load_after=load_average(),
    )
    pipelines.clear()
    gc.collect()
    return result


def measure_or_fall_back(settings, precision: str, variant: str, batches) -> list[dict]:
    try:
        return [measure(settings, precision, variant, batches)]
    except Exception as error:  # a compiler that fails here (no C++ toolchain, an unsupported operator...)
        failure = {
            "precision": precision,
            "variant": variant,
            "compile_options": compile_options(variant),
            "error": f"{type(error).__name__}: {error}"[:2000],
            "traceback": traceback.format_exc()[-4000:],
        }
        progress(f"{precision} {variant} failed: {failure['error'][:300]}")
        backend = compile_options(variant)["backend"]
        if backend == FALLBACK_BACKEND:
            return [failure]
        fallback_variant = FALLBACK_BACKEND + variant[len(backend):]
        progress(f"measuring {precision} with {fallback_variant} instead")
        fallback = measure(settings, precision, fallback_variant, batches)
        fallback["fallback_for"] = variant
        return [failure, fallback]


# -- environment and report ------------------------------------------------------------------------------------------
def compiler_description() -> dict:
    info = {"cxx": None, "cpu_flags": []}
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        info["cxx"] = get_cpp_compiler()
    except Exception:  # informational only (older torch, no compiler found)
        pass
    try:
        first = subprocess.run(["gcc", "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()
        info["gcc"] = first[0] if first else None
    except (OSError, subprocess.SubprocessError):
        info["gcc"] = None
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
        wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
        info["cpu_flags"] = [flag for flag in wanted if flag in flags.split()]
    except (OSError, StopIteration):
        pass
    return info


def markdown_tables(results: dict) -> str:
    """The results as a markdown table (for stdout and for benchmarks/report.py)."""
    settings = results["settings"]
    lines = [
        f"RevNet18 (J = 10), widths {settings['width']}x[1,2,4,8], {settings['image_size']}x{settings['image_size']}, "
        f"micro-batch {settings['batch']}, PETRA k = 1, one process, {results.get('threads', 1)} thread; steady "
        f"state: median of {settings['repeats']} windows of {settings['micro_batches']} micro-batches.",
        "",
        "| precision | backend | compile (s) | eager (ms / micro-batch) | compiled (ms / micro-batch) "
        "| compiled / eager | max abs loss diff | graphs | recompile-limit fallbacks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for entry in results["configurations"]:
        label = entry["variant"] + (f" (fallback for {entry['fallback_for']})" if entry.get("fallback_for") else "")
        if "error" in entry:
            lines.append(f"| {entry['precision']} | {label} | failed: {entry['error'][:120].replace('|', '/')} "
                         "| | | | | | |")
            continue
        medians, dynamo = entry["median_s"], entry["dynamo"]
        hits = ", ".join(dynamo["recompile_limit_hits"]) or "none"
        lines.append(
            f"| {entry['precision']} | {label} | {entry['compile_s']:.1f} | {1e3 * medians['eager']:.1f} | "
            f"{1e3 * medians['compiled']:.1f} | {entry['median_ratio']:.2f} "
            f"(min {min(entry['ratios']):.2f}, max {max(entry['ratios']):.2f}) | {entry['loss']['max_abs_diff']:.1e} | "
            f"{dynamo['graphs']} | {hits} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    settings = parse_args(argv)
    torch.set_num_threads(1)
    loads = [load_average()]
    progress(f"{os.cpu_count()} CPUs, torch {torch.__version__}, load average {loads[0]}")
    started = time.time()
    batches = random_batches(NUM_DISTINCT_BATCHES, settings.batch, settings.image_size)
    # Compile into directories of this run, never the user's default cache (each configuration gets its own).
    settings.cache_root = Path(tempfile.mkdtemp(prefix="petra-compile-bench-"))
    configurations = []
    try:
        for precision in settings.precisions:
            for variant in settings.backends:
                configurations.extend(measure_or_fall_back(settings, precision, variant, batches))
                loads.append(load_average())
    finally:
        shutil.rmtree(settings.cache_root, ignore_errors=True)
    stored = {key: (str(value) if isinstance(value, Path) else value) for key, value in vars(settings).items()
              if key not in ("out", "cache_root")}
    results = write_results(
        results_path(settings.out, "compile", settings.quick),
        "compile",
        "compile.py",
        argv,
        stored,
        threads=torch.get_num_threads(),
        compiler=compiler_description(),
        cache="--cache-dir (shared)" if settings.cache_dir else "a fresh inductor cache per configuration (cold)",
        loads=loads,
        elapsed_s=time.time() - started,
        configurations=configurations,
    )
    print(markdown_tables(results))
    return results


if __name__ == "__main__":
    main()
