"""One-device PETRA against plain backprop on a CUDA GPU: RevNet18 at CIFAR size, bf16 and float32.

    python benchmarks/gpu.py            # paper widths 64..512, 32x32, micro-batch 128: benchmarks/results/gpu.json
    python benchmarks/gpu.py --quick    # width 16, micro-batch 32, short windows: gpu-quick.json
    python benchmarks/gpu.py --channels-last --precisions bf16

Without CUDA it prints why and exits (status 0) without measuring anything.

What runs: RevNet18 (J = 10 stages, the paper's widths 64, 128, 256, 512, CIFAR stem), 32x32 images, micro-batches of
128 random images (pre-made on the GPU: no data loading), SGD with momentum 0.9, for each precision (bf16:
`precision="bf16"`, bf16 compute under autocast with float32 streams and master weights; fp32: autocast off, cuDNN's
defaults, TF32 convolutions included):

* PETRA as the paper's simulator: all stages in this process on one GPU (`Layout(device="cuda")`), k = 1.
  Every step is one tick: each stage runs the forward of one micro-batch and the fused reconstruction and backward
  of an older one, so per micro-batch PETRA computes F once more than backprop (the reconstruction) and keeps no
  activations for the reversible stages.
* plain backprop of the same model from the same initial weights: `model(images)` under the same autocast,
  cross-entropy, `loss.backward()`, `optimizer.step()`.

Measured: images/s (medians over `--repeats` windows of `--micro-batches` micro-batches, the two methods alternating
which goes first, `torch.cuda.synchronize()` around every window, after a warm-up that fills PETRA's pipeline) and
their per-window ratio; peak memory, each method alone on the GPU (`torch.cuda.reset_peak_memory_stats()`, then the
warm-up, reset again, one window, then `torch.cuda.max_memory_allocated()`, above what was allocated before the
model was built), with the bytes of the weights (gradients and momentum take as much again each) and, for PETRA,
the engine's own count of the inputs it buffers.

Several GPUs, over NCCL. NCCL needs one GPU per process, so a multi-process PETRA run (each process a contiguous
group of the 10 stages, `--num_processes N` with N <= the number of GPUs and N <= 10) goes through the recipe:

    accelerate launch --config_file accelerate_config.yaml --num_processes 2 --mixed_precision bf16 \\
        recipes/train_revnet.py
    accelerate launch --config_file accelerate_config.yaml --num_processes 10 --mixed_precision bf16 \\
        recipes/train_revnet.py recipes/configs/cifar10_revnet18_petra.yaml

The first trains the recipe's default small RevNet18 on the embedded digits data (nothing to download; 5 stages per
process); the second is the paper's CIFAR-10 recipe (data in data/cifar10, or set hub_id), one stage per GPU.
accelerate_config.yaml is MULTI_GPU with `gpu_ids: all`: each process trains on cuda:LOCAL_RANK and torch.distributed
uses NCCL. `--mixed_precision bf16` (or the recipe flag `--bf16 true`) selects bf16 compute with float32 streams;
`--petra_partition 4,6` chooses the stages per process. With fewer GPUs than processes NCCL refuses to start: use
gloo on CPU instead (the same command on a CPU-only machine).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from common import add_out_argument, build_model, cross_entropy, load_average, make_pipeline, progress  # noqa: E402
from common import random_batches, results_path, revnet_config, sgd, write_results  # noqa: E402
from petra_hub.engine import Layout  # noqa: E402

NUM_DISTINCT_BATCHES = 4
PRECISIONS = {"bf16": torch.bfloat16, "fp32": None}
METHODS = ("petra", "backprop")
MB = 2**20


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precisions", type=str, default="bf16,fp32", help="comma-separated, of bf16, fp32")
    parser.add_argument("--repeats", type=int, default=None, help="timing windows per method (default 5; quick: 2)")
    parser.add_argument("--micro-batches", type=int, default=None, help="N per window (default 50; quick: 10)")
    parser.add_argument("--batch", type=int, default=None, help="micro-batch size (default 128; quick: 32)")
    parser.add_argument("--width", type=int, default=None,
                        help="layers w,2w,4w,8w wide (default: the paper's RevNet18, 64; quick: 16)")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--channels-last", action="store_true", help="model and images in channels_last")
    parser.add_argument("--quick", action="store_true", help="small model, short windows: a smoke test")
    add_out_argument(parser, "gpu")
    args = parser.parse_args(argv)
    quick = args.quick
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    args.repeats = args.repeats or (2 if quick else 5)
    args.micro_batches = args.micro_batches or (10 if quick else 50)
    args.batch = args.batch or (32 if quick else 128)
    args.width = args.width or (16 if quick else None)
    unknown = [p for p in args.precisions if p not in PRECISIONS]
    if unknown or not args.precisions:
        parser.error(f"--precisions: choose among {list(PRECISIONS)}, got {args.precisions}")
    if args.repeats < 1 or args.micro_batches < 1 or args.batch < 2 or (args.width is not None and args.width < 1):
        parser.error("--repeats, --micro-batches, --width must be >= 1 and --batch >= 2 (batch norm)")
    return args


# -- the two methods -------------------------------------------------------------------------------------------------
def new_model(settings):
    """RevNet18 (paper widths unless --width), float32 weights on the GPU, same initial weights every call."""
    config = revnet_config("revnet18", width=settings.width, num_labels=10, stem="cifar")
    model = build_model(config).cuda()
    if settings.channels_last:
        model.to(memory_format=torch.channels_last)
    return model


class Petra:
    """All stages in this process on the GPU: the paper's simulator."""

    def __init__(self, settings, precision: str):
        self.model = new_model(settings)
        self.pipeline = make_pipeline(self.model.get_stages(), "petra", lr=settings.lr, distributed=False,
                                      layout=Layout(device="cuda"),
                                      precision=precision if PRECISIONS[precision] else None)
        self.losses: list[torch.Tensor] = []
        self.warm_up_steps = self.pipeline.schedule.latency  # fills the pipeline: every stage busy from then on

    def step(self, images, labels) -> None:
        self.losses.extend(loss for _, loss in self.pipeline.step(images, labels))

    def held_bytes(self) -> int:
        """What the stages keep between ticks (inputs of non-reversible stages), by the engine's count."""
        return sum(stats.activation_bytes + stats.stash_bytes for stats in self.pipeline.memory().values())

    def finish(self) -> None:
        self.losses.extend(loss for _, loss in self.pipeline.drain())


class Backprop:
    """The same model trained by a standard loop under the same autocast."""

    def __init__(self, settings, precision: str):
        self.model = new_model(settings)
        self.optimizer = sgd(self.model, settings.lr)
        self.dtype = PRECISIONS[precision]
        self.losses: list[torch.Tensor] = []
        self.warm_up_steps = 5

    def step(self, images, labels) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            logits = self.model(images).logits
        loss = cross_entropy(logits.float(), labels)
        loss.backward()
        self.optimizer.step()
        self.losses.append(loss.detach())

    def held_bytes(self) -> int:
        return 0

    def finish(self) -> None:
        pass


METHOD_CLASSES = {"petra": Petra, "backprop": Backprop}


def feed(method, batches, count: int, offset: int = 0) -> None:
    for index in range(offset, offset + count):
        method.step(*batches[index % len(batches)])


def state_bytes(method) -> dict:
    """Weights, gradients and optimizer states held on the GPU."""
    params = list(method.model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    buffers = sum(b.numel() * b.element_size() for b in method.model.buffers())
    return {"weights_bytes": weights, "buffers_bytes": buffers}


def release() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# -- measurements ----------------------------------------------------------------------------------------------------
def peak_memory(settings, precision: str, name: str, batches) -> dict:
    """One method alone on the GPU: the peak of allocated memory over one window after the warm-up (the warm-up's
    own peak, cuDNN's algorithm search included, apart), above what was allocated before the model was built."""
    release()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    method = METHOD_CLASSES[name](settings, precision)
    feed(method, batches, method.warm_up_steps)
    torch.cuda.synchronize()
    warm_up_peak = torch.cuda.max_memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()
    feed(method, batches, settings.micro_batches, method.warm_up_steps)
    torch.cuda.synchronize()
    result = {
        "peak_bytes": torch.cuda.max_memory_allocated() - base,
        "warm_up_peak_bytes": warm_up_peak,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "steady_allocated_bytes": torch.cuda.memory_allocated() - base,  # between two steps
        "engine_held_bytes": method.held_bytes(),
        **state_bytes(method),
    }
    method.finish()
    del method
    release()
    return result


def throughput(settings, precision: str, batches) -> dict:
    """Both methods side by side: images/s per window, alternating which goes first."""
    methods = {name: METHOD_CLASSES[name](settings, precision) for name in METHODS}
    fed = {}
    for name, method in methods.items():
        feed(method, batches, method.warm_up_steps)
        fed[name] = method.warm_up_steps
    torch.cuda.synchronize()
    n = settings.micro_batches
    images_per_s = {name: [] for name in METHODS}
    for repeat in range(settings.repeats):
        order = METHODS if repeat % 2 == 0 else METHODS[::-1]
        for name in order:
            torch.cuda.synchronize()
            start = time.perf_counter()
            feed(methods[name], batches, n, fed[name])
            torch.cuda.synchronize()
            images_per_s[name].append(n * settings.batch / (time.perf_counter() - start))
            fed[name] += n
        progress(f"{precision}, repetition {repeat + 1}/{settings.repeats}: "
                 + ", ".join(f"{name} {values[-1]:.0f} images/s" for name, values in images_per_s.items()))
    losses = {}
    for name, method in methods.items():
        method.finish()
        values = [float(loss) for loss in method.losses]
        if not values or not all(math.isfinite(v) for v in values):
            raise RuntimeError(f"{name} ({precision}): non-finite or missing losses")
        losses[name] = {"first": values[0], "last": values[-1], "count": len(values)}
    ratios = [p / b for p, b in zip(images_per_s["petra"], images_per_s["backprop"])]
    del methods
    release()
    return {
        "images_per_s": images_per_s,
        "median_images_per_s": {name: statistics.median(values) for name, values in images_per_s.items()},
        "petra_over_backprop": ratios,
        "median_petra_over_backprop": statistics.median(ratios),
        "losses": losses,
    }


def device_description() -> dict:
    properties = torch.cuda.get_device_properties(0)
    cudnn = torch.backends.cudnn
    return {
        "name": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "memory_bytes": properties.total_memory,
        "cuda": torch.version.cuda,
        "cudnn": cudnn.version(),
        "cudnn_benchmark": cudnn.benchmark,
        "tf32_convolutions": cudnn.allow_tf32,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def markdown_tables(results: dict) -> str:
    settings = results["settings"]
    width = settings["width"] or 64
    lines = [
        f"RevNet18 (J = 10), widths {width}x[1,2,4,8], {settings['image_size']}x{settings['image_size']}, micro-batch "
        f"{settings['batch']}, one {results['device']['name']}; images/s: median of {settings['repeats']} windows of "
        f"{settings['micro_batches']} micro-batches; peak: max_memory_allocated, each method alone.",
        "",
        "| precision | method | images/s | PETRA / backprop | peak memory (MiB) | held between steps (MiB) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for precision, entry in results["precisions"].items():
        speed, memory = entry["throughput"], entry["memory"]
        for name in METHODS:
            ratio = f"{speed['median_petra_over_backprop']:.2f}" if name == "petra" else ""
            lines.append(f"| {precision} | {name} | {speed['median_images_per_s'][name]:.0f} | {ratio} | "
                         f"{memory[name]['peak_bytes'] / MB:.0f} | {memory[name]['steady_allocated_bytes'] / MB:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict | None:
    settings = parse_args(argv)
    if not torch.cuda.is_available():
        print(f"benchmarks/gpu.py needs a CUDA device, and torch.cuda.is_available() is False here (torch "
              f"{torch.__version__}, CUDA build {torch.version.cuda}): nothing measured, no results written.",
              file=sys.stderr)
        return None
    torch.backends.cudnn.benchmark = True  # fixed shapes: let cuDNN pick its fastest algorithms, as training would
    loads = [load_average()]
    device = device_description()
    progress(f"{device['name']}, torch {torch.__version__}, CUDA {device['cuda']}, cuDNN {device['cudnn']}")
    started = time.time()
    batches = [
        (images.cuda(), labels.cuda())
        for images, labels in random_batches(NUM_DISTINCT_BATCHES, settings.batch, settings.image_size)
    ]
    if settings.channels_last:
        batches = [(images.contiguous(memory_format=torch.channels_last), labels) for images, labels in batches]
    measured = {}
    for precision in settings.precisions:
        progress(f"{precision}: peak memory of each method alone")
        memory = {name: peak_memory(settings, precision, name, batches) for name in METHODS}
        progress(f"{precision}: images/s, side by side")
        measured[precision] = {"memory": memory, "throughput": throughput(settings, precision, batches)}
        loads.append(load_average())
    results = write_results(
        results_path(settings.out, "gpu", settings.quick),
        "gpu",
        "gpu.py",
        argv,
        {key: value for key, value in vars(settings).items() if key != "out"},
        device=device,
        loads=loads,
        elapsed_s=time.time() - started,
        precisions=measured,
    )
    print(markdown_tables(results))
    return results


if __name__ == "__main__":
    main()
