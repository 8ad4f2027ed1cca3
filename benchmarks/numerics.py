#!/usr/bin/env python
"""Numerics of PETRA under the mixed-precision policies: reconstruction error and gradient fidelity per stage.

    python benchmarks/numerics.py            # about 4 min on 2 shared cores: benchmarks/results/numerics.json
    python benchmarks/numerics.py --quick    # tiny model, few steps (seconds): numerics-quick.json

For each data set (digits; random 32x32 textures) and each policy (float32, the baseline; bf16 with float32 streams;
bf16 with bf16 streams; fp16 with float32 streams and per-stage loss scaling), a RevNet18 cut into its J = 10
stages (same seed, same weights, same micro-batches for every policy) is trained with real PETRA steps (k = 1,
SGD with momentum). Measured per stage:

* training: the relative error ||rebuilt - received|| / ||received|| of the input each reversible stage rebuilds,
  sampled on every micro-batch (`check_reconstruction_every`), median over the run and last value. PETRA rebuilds
  with the weights of the backward, updated since the forward, so this holds the weight drift as well as rounding;
* frozen: the same error at the trained weights with no optimizer, over a few micro-batches: rounding only;
* gradients: at the trained weights, each stage's gradient from the policy's PETRA pipeline (no optimizer, read in
  `on_update`) against plain autograd through all stages in float64, on the same micro-batch, batch norms on batch
  statistics in both: cosine and norm ratio ||g_policy|| / ||g_fp64||; and, as a yardstick, plain backprop under
  the same policy (autocast, streams cast between stages, no reconstruction) against float64 and against PETRA.

Plus one PNG (error by reversible stage, one line per policy). Setup and discussion: docs/benchmarks-precision.md;
tables: `python benchmarks/report.py`.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from pathlib import Path

# On a shared CPU, OpenMP threads that spin while waiting stall whenever another process holds a core. Read when
# torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Read when transformers / huggingface_hub are imported (through petra_hub).
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402

from common import add_out_argument, build_model, cross_entropy, load_average, progress  # noqa: E402
from common import results_path, revnet_config, sgd, write_results  # noqa: E402
from petra_hub.data import collate_image_batch, load_image_dataset  # noqa: E402
from petra_hub.engine import Diagnostics, Pipeline, Precision, stage_layout  # noqa: E402
from petra_hub.engine.batchnorm import frozen_running_stats  # noqa: E402

ROOT = HERE.parent
DEFAULT_PLOT = ROOT / "docs" / "images" / "numerics-reconstruction.png"

# name -> (compute, streams) for `Precision.of`; float32 first: it is the baseline.
POLICIES = {
    "fp32": (None, None),
    "bf16": ("bf16", "fp32"),
    "bf16-streams": ("bf16", "bf16"),
    "fp16": ("fp16", "fp32"),
}
POLICY_LABELS = {
    "fp32": "float32 (baseline)",
    "bf16": "bf16, float32 streams",
    "bf16-streams": "bf16, bf16 streams",
    "fp16": "fp16, float32 streams, loss scale",
}
DATASETS = ["digits", "random"]
RANDOM_SIZE = 32  # side of the random images
RANDOM_HELDOUT = 320
TEXTURE_AMPLITUDE = 1.0  # of the class texture added to the unit Gaussian noise of a random image
FLOOR = 1e-12  # the plot draws an error of 0 here
MAX_SCALE_ATTEMPTS = 30  # fp16: feeds of the gradient-check micro-batch until no stage drops it


# -- data ------------------------------------------------------------------------------------------------------------
class DigitsData:
    """scikit-learn digits (3 x 16 x 16, normalised, random pad-crop for training), drawn once in a fixed order so
    that every policy reads the same micro-batches; the test split is the held-out set."""

    description = "scikit-learn digits, 8x8 upscaled to 16x16 (3 channels, normalised), random pad-crop"

    def __init__(self, batch: int, steps: int, seed: int):
        train = load_image_dataset("digits", "train", seed=seed)
        self.image_size = train.info.image_size
        generator = torch.Generator().manual_seed(seed)
        self.batches, order, epoch = [], [], 0
        while len(self.batches) < steps:
            if len(order) < batch:
                train.set_epoch(epoch)
                order += torch.randperm(len(train), generator=generator).tolist()
                epoch += 1
            items = [train[i] for i in order[:batch]]
            del order[:batch]
            collated = collate_image_batch(items)
            self.batches.append((collated["pixel_values"], collated["labels"]))
        test = load_image_dataset("digits", "test")
        collated = collate_image_batch([test[i] for i in range(len(test))])
        self.heldout = (collated["pixel_values"], collated["labels"])

    def batch(self, step: int):
        return self.batches[step % len(self.batches)]


class RandomData:
    """Random 32x32 images with a learnable labelling: unit Gaussian noise plus the texture of the image's class (a
    fixed random mix of two plane waves per class and channel) at a random phase, so the class is a property of
    the image anywhere in it. Every micro-batch is drawn from its own seed: all policies read the same ones."""

    description = (f"random {RANDOM_SIZE}x{RANDOM_SIZE} images: N(0, 1) noise + a class texture (plane waves, random "
                   f"phase, amplitude {TEXTURE_AMPLITUDE:g}); 10 classes")

    def __init__(self, batch: int, seed: int, num_labels: int = 10):
        self.image_size, self.size, self.seed, self.num_labels = RANDOM_SIZE, batch, seed, num_labels
        generator = torch.Generator().manual_seed(10_000 + seed)
        self.frequencies = torch.randint(1, 7, (num_labels, 2, 2), generator=generator).float()  # class, wave, (x, y)
        self.frequencies *= torch.where(torch.rand(num_labels, 2, 2, generator=generator) < 0.5, -1.0, 1.0)
        self.mixing = torch.randn(num_labels, 2, 3, generator=generator)  # class, wave, channel
        self.mixing /= self.mixing.norm(dim=(1, 2), keepdim=True) / math.sqrt(2.0)
        self.heldout = self._draw(RANDOM_HELDOUT, torch.Generator().manual_seed(20_000 + seed))

    def _draw(self, count: int, generator: torch.Generator):
        labels = torch.randint(0, self.num_labels, (count,), generator=generator)
        coordinates = torch.arange(self.image_size, dtype=torch.float32) * (2 * math.pi / self.image_size)
        phases = torch.rand(count, 2, generator=generator) * 2 * math.pi
        fx, fy = self.frequencies[labels, :, 0], self.frequencies[labels, :, 1]  # [count, 2]
        angle = (fx[:, :, None, None] * coordinates[None, None, None, :]
                 + fy[:, :, None, None] * coordinates[None, None, :, None] + phases[:, :, None, None])
        waves = torch.sin(angle)  # [count, wave, y, x]
        texture = torch.einsum("nwc,nwyx->ncyx", self.mixing[labels], waves)
        noise = torch.randn(count, 3, self.image_size, self.image_size, generator=generator)
        return noise + TEXTURE_AMPLITUDE * texture, labels

    def batch(self, step: int):
        return self._draw(self.size, torch.Generator().manual_seed(self.seed * 1_000_003 + step))


def load_data(name: str, batch: int, steps: int, seed: int):
    return DigitsData(batch, steps, seed) if name == "digits" else RandomData(batch, seed)


# -- measurements ----------------------------------------------------------------------------------------------------
def reversible_indices(stages) -> list[int]:
    return [i for i, letter in enumerate(stage_layout(stages)) if letter == "R"]


class ErrorSampler:
    """Collects every new `reconstruction_error` of the reversible stages of a pipeline (read after each step)."""

    def __init__(self, pipeline: Pipeline, indices: list[int]):
        self.pipeline, self.indices = pipeline, indices
        self.seen = {i: 0 for i in indices}
        self.values: dict[int, list[float]] = {i: [] for i in indices}

    def sample(self) -> None:
        counters = self.pipeline.counters()
        for i in self.indices:
            if counters[i].reconstruction_checks > self.seen[i]:
                self.seen[i] = counters[i].reconstruction_checks
                self.values[i].append(float(counters[i].reconstruction_error))

    def summary(self, last: bool = False) -> dict:
        if not all(self.values[i] for i in self.indices):
            raise RuntimeError("a reversible stage never checked its reconstruction: too few micro-batches")
        result = {
            "median": [statistics.median(self.values[i]) for i in self.indices],
            "max": [max(self.values[i]) for i in self.indices],
            "samples": [len(self.values[i]) for i in self.indices],
        }
        if last:
            result["last"] = [self.values[i][-1] for i in self.indices]
        return result


def petra_pipeline(model, precision: Precision, lr: float | None, **options) -> Pipeline:
    factory = None if lr is None else (lambda index, stage: sgd(stage, lr))
    return Pipeline(model.get_stages(), cross_entropy, mode="petra", accumulation_steps=1, optimizer_factory=factory,
                    precision=precision, **options)


@torch.no_grad()
def heldout_accuracy(pipeline: Pipeline, heldout, batch: int = 128) -> float:
    images, labels = heldout
    correct = 0
    for start in range(0, len(labels), batch):
        logits = pipeline.infer(images[start:start + batch])
        correct += int((logits.float().argmax(-1) == labels[start:start + batch]).sum())
    return correct / len(labels)


def train(model, precision: Precision, data, steps: int, lr: float, check_every: int, indices: list[int]) -> dict:
    """Real PETRA steps on `model` (updated in place); the reversible stages' errors sampled after every step."""
    pipeline = petra_pipeline(model, precision, lr, diagnostics=Diagnostics(check_reconstruction_every=check_every))
    sampler = ErrorSampler(pipeline, indices)
    losses = []
    for step in range(steps):
        losses.extend(float(loss) for _, loss in pipeline.step(*data.batch(step)))
        sampler.sample()
    losses.extend(float(loss) for _, loss in pipeline.drain())
    sampler.sample()
    window = max(1, len(losses) // 10)
    counters = pipeline.counters()
    return {
        "micro_batches": steps,
        "updates": [counters[i].updates for i in sorted(counters)],
        "skipped_updates": [counters[i].skipped_updates for i in sorted(counters)],
        "loss_first": statistics.fmean(losses[:window]),
        "loss_last": statistics.fmean(losses[-window:]),
        "finite_losses": all(math.isfinite(x) for x in losses),
        "heldout_accuracy": heldout_accuracy(pipeline, data.heldout),
        "reconstruction": sampler.summary(last=True),
    }


def frozen_errors(model, precision: Precision, data, count: int, indices: list[int], offset: int) -> dict:
    """The reconstruction error at fixed weights (no optimizer), every micro-batch checked: rounding only."""
    pipeline = petra_pipeline(copy.deepcopy(model), precision, None,
                              diagnostics=Diagnostics(check_reconstruction_every=1))
    sampler = ErrorSampler(pipeline, indices)
    for step in range(count):
        pipeline.step(*data.batch(offset + step))
        sampler.sample()
    pipeline.drain()
    sampler.sample()
    return {"micro_batches": count, "reconstruction": sampler.summary()}


def flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().double().reshape(-1) for t in tensors])


def float64_gradients(model, images, labels) -> list[torch.Tensor]:
    """Per stage, the gradient of the micro-batch's mean loss by plain autograd through all stages in float64, batch
    norms on batch statistics (running statistics untouched), as the pipeline's training-time evaluations."""
    reference = copy.deepcopy(model).double().train()
    stages = reference.get_stages()
    with torch.enable_grad(), frozen_running_stats(reference):
        value = images.double()
        for stage in stages:
            value = stage(value)
        cross_entropy(value, labels).backward()
    return [flat(p.grad if p.grad is not None else torch.zeros_like(p) for p in stage.parameters() if p.requires_grad)
            for stage in stages]


def backprop_gradients(model, precision: Precision, images, labels) -> list[torch.Tensor]:
    """Per stage, the gradient of plain autograd through all stages under the same policy (autocast, streams cast
    between stages as the pipeline casts them; fp16: a static loss scale, halved until the gradients are finite):
    what the policy costs without PETRA's reconstructions, the yardstick of the PETRA gradient's error."""
    reference = copy.deepcopy(model).train()
    stages = reference.get_stages()
    scale = 2.0**16 if precision.scales_loss else 1.0
    while True:
        for parameter in reference.parameters():
            parameter.grad = None
        with torch.enable_grad(), frozen_running_stats(reference):
            value = images
            for index, stage in enumerate(stages):
                with precision.autocast(images.device):
                    value = stage(value) if index < len(stages) - 1 else cross_entropy(stage(value), labels)
                if index < len(stages) - 1:
                    value = precision.cast_streams(value)
            (value.float() * scale).backward()
        gradients = [flat(p.grad if p.grad is not None else torch.zeros_like(p)
                          for p in stage.parameters() if p.requires_grad) / scale for stage in stages]
        if scale <= 1.0 or all(bool(torch.isfinite(g).all()) for g in gradients):
            return gradients
        scale /= 2.0


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    norms = float(a.norm()) * float(b.norm())
    return float(torch.dot(a, b)) / norms if norms > 0 else 0.0


class PetraGradients:
    """The gradient a policy's PETRA pipeline applies for one micro-batch at fixed weights, per stage (read in
    `on_update`; no optimizer). fp16: a micro-batch is fed again while a stage drops it for an overflow (that
    stage's scale halves), so `feeds` counts the feeds of the last micro-batch; the scales carry over."""

    def __init__(self, model, precision: Precision):
        self.model = copy.deepcopy(model)
        self.precision = precision
        self.count = len(self.model.get_stages())
        self.captured: dict[int, torch.Tensor] = {}
        self.pipeline = petra_pipeline(self.model, precision, None, on_update=self._capture)
        self.feeds = 0

    def _capture(self, index, micro_batches, stage) -> None:
        self.captured[index] = flat(p.grad if p.grad is not None else torch.zeros_like(p)
                                    for p in stage.parameters() if p.requires_grad)

    def __call__(self, images, labels) -> list[torch.Tensor]:
        for feeds in range(1, MAX_SCALE_ATTEMPTS + 1):
            self.captured.clear()
            self.pipeline.step(images, labels)
            self.pipeline.drain()
            if len(self.captured) == self.count:
                self.feeds += feeds
                return [self.captured[i] for i in range(self.count)]
        raise RuntimeError(f"{self.precision.describe()}: a stage dropped the micro-batch {MAX_SCALE_ATTEMPTS} times")


def compare_gradients(model, precision: Precision, batches, layout: str) -> dict:
    """Per stage and micro-batch of `batches`: cosine, norm ratio and relative error of the policy's PETRA gradient
    against the float64 one, and the cosine of plain backprop under the same policy against the float64 one; per
    stage their medians over the micro-batches and the worst PETRA cosine."""
    petra = PetraGradients(model, precision)
    per_batch = []
    for images, labels in batches:
        exact = float64_gradients(model, images, labels)
        plain = backprop_gradients(model, precision, images, labels)
        rows = []
        for g, reference, backprop in zip(petra(images, labels), exact, plain):
            norm, reference_norm = float(g.norm()), float(reference.norm())
            rows.append((
                cosine(g, reference),
                norm / reference_norm if reference_norm > 0 else float("nan"),
                float((g - reference).norm()) / reference_norm if reference_norm > 0 else float("nan"),
                reference_norm,
                cosine(backprop, reference),
                float((g - backprop).norm()) / float(backprop.norm()) if float(backprop.norm()) > 0 else float("nan"),
            ))  # fmt: skip
        per_batch.append(rows)
    stages = []
    for index in range(len(layout)):
        columns = (list(column) for column in zip(*(rows[index] for rows in per_batch)))
        cosines, ratios, errors, norms, backprop_cosines, to_backprop = columns
        stages.append({
            "index": index,
            "kind": layout[index],
            "cosine": statistics.median(cosines),
            "min_cosine": min(cosines),
            "norm_ratio": statistics.median(ratios),
            "norm_ratio_range": [min(ratios), max(ratios)],
            "relative_error": statistics.median(errors),
            "reference_norm": statistics.median(norms),
            "backprop_cosine": statistics.median(backprop_cosines),
            "relative_error_to_backprop": statistics.median(to_backprop),
            "cosines": cosines,
            "norm_ratios": ratios,
        })  # fmt: skip
    return {"micro_batches": len(per_batch), "micro_batch": len(batches[0][1]), "feeds": petra.feeds,
            "stages": stages}


def run_policy(name: str, base_model, data, args, indices: list[int], layout: str) -> dict:
    precision = Precision.of(*POLICIES[name])
    model = copy.deepcopy(base_model)
    started = time.perf_counter()
    training = train(model, precision, data, args.steps, args.lr, args.check_every, indices)
    frozen = frozen_errors(model, precision, data, args.frozen_batches, indices, offset=args.steps)
    images, labels = data.heldout
    if args.grad_batches * args.batch > len(labels):
        raise SystemExit(f"--grad-batches x --batch exceeds the {len(labels)} held-out images of {args.datasets}")
    batches = [(images[i * args.batch:(i + 1) * args.batch], labels[i * args.batch:(i + 1) * args.batch])
               for i in range(args.grad_batches)]
    gradients = compare_gradients(model, precision, batches, layout)
    return {
        "label": POLICY_LABELS[name],
        "precision": precision.describe(),
        "training": training,
        "frozen": frozen,
        "gradients": gradients,
        "seconds": time.perf_counter() - started,
    }


# -- the plot --------------------------------------------------------------------------------------------------------
def plot(report: dict, path: Path) -> None:
    from petra_hub.plots.figures import pyplot, save

    plt = pyplot()
    datasets = list(report["datasets"])
    indices = report["reversible_stages"]
    floor = FLOOR  # an error of exactly 0 (a bit-exact rebuild) would vanish on the log scale
    figure, axes = plt.subplots(len(datasets), 2, figsize=(10, 3.6 * len(datasets)), squeeze=False, sharey=True)
    markers = dict(zip(POLICIES, "osD^"))
    names = list(report["policy_labels"])
    shift = {name: 0.08 * (k - (len(names) - 1) / 2) for k, name in enumerate(names)}  # overlapping points stay visible
    for row, dataset in enumerate(datasets):
        for column, (part, title) in enumerate((("frozen", "frozen weights (rounding only)"),
                                                ("training", "during training (median over the run)"))):
            ax = axes[row][column]
            for name, result in report["datasets"][dataset]["policies"].items():
                values = [max(v, floor) for v in result[part]["reconstruction"]["median"]]
                ax.plot([i + shift.get(name, 0.0) for i in indices], values, marker=markers.get(name, "o"),
                        label=report["policy_labels"].get(name, name))
            if any(v == 0 for result in report["datasets"][dataset]["policies"].values()
                   for v in result[part]["reconstruction"]["median"]):
                ax.axhline(floor, color="grey", linestyle=":", linewidth=1)
                ax.annotate("0 (bit-exact) drawn here", (indices[0], floor), textcoords="offset points",
                            xytext=(2, 4), fontsize=7, color="grey")
            ax.set_yscale("log")
            ax.set_xticks(indices)
            ax.set_title(f"{dataset}: {title}", fontsize=10)
            ax.set_xlabel("reversible stage")
            ax.grid(True, which="major", alpha=0.3)
            if column == 0:
                ax.set_ylabel("||rebuilt - received|| / ||received||")
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    widths = report["settings"]["hidden_sizes"]
    figure.suptitle(f"PETRA reconstruction error by stage and precision policy (RevNet18, J = 10, widths "
                    f"{','.join(map(str, widths))})", fontsize=11)
    save(figure, path, dpi=110, rect=(0, 0.05, 1, 1))
    progress(f"wrote {path}")


# -- main ------------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=DATASETS, choices=DATASETS)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    parser.add_argument("--steps", type=int, default=None, help="training micro-batches (default 320; quick: 24)")
    parser.add_argument("--batch", type=int, default=None, help="micro-batch size (default 16; quick: 8)")
    parser.add_argument("--width", type=int, default=None,
                        help="stream widths w,2w,4w,8w, stem w (default 4; quick: 2)")
    parser.add_argument("--lr", type=float, default=0.025,
                        help="SGD learning rate, momentum 0.9 (default 0.025: the recipe's 0.4 x 16 / 256)")
    parser.add_argument("--check-every", type=int, default=1, help="check_reconstruction_every while training")
    parser.add_argument("--frozen-batches", type=int, default=None, help="micro-batches at frozen weights (8; quick 4)")
    parser.add_argument("--grad-batches", type=int, default=None,
                        help="held-out micro-batches of the gradient check (default 4; quick: 2)")
    parser.add_argument("--seed", type=int, default=0, help="weights and data (the same for every policy)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="tiny model and few steps: a smoke test of the script")
    parser.add_argument("--plot", type=Path, default=None,
                        help=f"PNG to write (default {DEFAULT_PLOT.relative_to(ROOT)}; with --quick, next to the "
                        "results file)")
    add_out_argument(parser, "numerics")
    args = parser.parse_args(argv)
    quick = args.quick
    args.steps = args.steps or (24 if quick else 320)
    args.batch = args.batch or (8 if quick else 16)
    args.width = args.width or (2 if quick else 4)
    args.frozen_batches = args.frozen_batches or (4 if quick else 8)
    args.grad_batches = args.grad_batches or (2 if quick else 4)
    if min(args.steps, args.frozen_batches, args.grad_batches, args.check_every) < 1:
        parser.error("--steps, --frozen-batches, --grad-batches and --check-every must be >= 1")
    if args.batch < 2:
        parser.error("--batch must be >= 2 (batch norms on batch statistics)")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = results_path(args.out, "numerics", args.quick)
    plot_path = args.plot or (out.with_suffix(".png") if args.quick else DEFAULT_PLOT)
    progress(f"policies {', '.join(args.policies)} on {', '.join(args.datasets)}: {args.steps} PETRA steps, "
             f"micro-batch {args.batch}, width {args.width}; {torch.get_num_threads()} thread(s), load average "
             f"{load_average()}")
    started = time.perf_counter()
    report: dict = {"datasets": {}}
    for dataset in args.datasets:
        data = load_data(dataset, args.batch, args.steps + args.frozen_batches, args.seed)
        config = revnet_config(width=args.width, stem="cifar", num_labels=10, num_channels=3)
        base = build_model(config, seed=args.seed)
        stages = base.get_stages()
        layout, indices = stage_layout(stages), reversible_indices(stages)
        report.update(layout=layout, reversible_stages=indices)
        entry = {"description": data.description, "image_size": data.image_size, "policies": {}}
        for name in args.policies:
            result = run_policy(name, base, data, args, indices, layout)
            entry["policies"][name] = result
            t, fr = result["training"], result["frozen"]["reconstruction"]["median"]
            cosines = [s["min_cosine"] for s in result["gradients"]["stages"]]
            progress(f"{dataset:6s} {name:12s} loss {t['loss_first']:.3f} -> {t['loss_last']:.3f}, held-out accuracy "
                     f"{100 * t['heldout_accuracy']:.1f}%; reconstruction error frozen {min(fr):.2e}..{max(fr):.2e}, "
                     f"training {min(t['reconstruction']['median']):.2e}..{max(t['reconstruction']['median']):.2e}; "
                     f"gradient cosine >= {min(cosines):.6f}; {result['seconds']:.0f} s (load {load_average()})")
        report["datasets"][dataset] = entry
    report["elapsed_s"] = time.perf_counter() - started
    progress(f"measured in {report['elapsed_s']:.0f} s")
    settings = {key: value for key, value in vars(args).items() if key not in ("out", "plot")}
    settings.update(hidden_sizes=config.hidden_sizes, embedding_size=config.embedding_size, stem=config.stem,
                    optimizer=f"SGD, lr {args.lr:g}, momentum 0.9", threads=torch.get_num_threads(),
                    plot=str(plot_path.resolve().relative_to(ROOT)) if plot_path.resolve().is_relative_to(ROOT)
                    else str(plot_path))  # fmt: skip
    report["policy_labels"] = {name: POLICY_LABELS[name] for name in args.policies}
    payload = write_results(out, "numerics", "numerics.py", argv, settings, **report)
    plot(payload, plot_path)
    return payload


if __name__ == "__main__":
    main()
