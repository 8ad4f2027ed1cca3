"""What the benchmarks share: models, batches, loss, optimizer, pipelines, run descriptions and results files.

Every benchmark measures and writes one JSON file: benchmarks/results/<name>.json by default, or
<name>-quick.json for its quick/fast settings (no table in the docs reads those), `--out` to choose.
`benchmarks/report.py` turns the files into the tables of docs/benchmarks*.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from petra_hub.engine import Pipeline
from petra_hub.models.revnet import RevNetConfig, RevNetForImageClassification
from petra_hub.testing.models import FAST_EMBEDDING, FAST_WIDTHS, doubling_widths

RESULTS = Path(__file__).resolve().parent / "results"


# -- models, data, training ----------------------------------------------------------------------------------------
def revnet_config(preset: str = "revnet18", *, width: int | None = None, fast: bool = False, **overrides):
    """A paper preset: at its own widths, at the benchmark widths [w, 2w, 4w, 8w] (`width=w`), or with the tiny
    widths of `--fast` runs. `overrides` go to `RevNetConfig.from_preset` (stem, num_labels, downsampling...)."""
    if fast:
        block_type = RevNetConfig.from_preset(preset).block_type
        overrides = {"hidden_sizes": FAST_WIDTHS[block_type], "embedding_size": FAST_EMBEDDING, **overrides}
    elif width is not None:
        overrides = {"hidden_sizes": doubling_widths(width), "embedding_size": width, **overrides}
    return RevNetConfig.from_preset(preset, **overrides)


def build_model(config: RevNetConfig, seed: int = 0) -> RevNetForImageClassification:
    """The model of `config` in float32 and training mode, its weights drawn after `torch.manual_seed(seed)`."""
    torch.manual_seed(seed)
    model = RevNetForImageClassification(config).float()
    model.train()
    return model


def random_batches(count: int, batch: int, image_size: int, *, channels: int = 3, num_labels: int = 10, seed: int = 1):
    """`count` distinct (images, labels) micro-batches of random data (speed and memory do not depend on it)."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(batch, channels, image_size, image_size, generator=generator),
            torch.randint(0, num_labels, (batch,), generator=generator),
        )
        for _ in range(count)
    ]


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits, labels)


def sgd(module: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(module.parameters(), lr=lr, momentum=0.9)


def make_pipeline(stages, mode, *, lr: float | None = None, accumulation_steps: int = 1, **options) -> Pipeline:
    """A `Pipeline` with the cross-entropy loss and, given `lr`, SGD (momentum 0.9) on every stage; `options` go to
    `Pipeline` (partition, distributed, timeout...)."""
    factory = None if lr is None else (lambda index, stage: sgd(stage, lr))
    return Pipeline(
        stages, cross_entropy, mode=mode, accumulation_steps=accumulation_steps, optimizer_factory=factory, **options
    )


def parse_groups(spec: str) -> tuple[list[int], list[int], list[int]]:
    """"1,2k/7" -> ([1, 2, 7], [2, 1], [1]): the sizes of the engine stages (groups of model stages), how many of them
    each rank runs (ranks separated by '/', groups by ','), and the engine stages marked "k", which keep their
    forward's graph (`keep_graphs`). Raises ValueError on anything else."""
    ranks = [rank.split(",") for rank in spec.split("/")]
    groups = [group for rank in ranks for group in rank]
    sizes = [int(group.removesuffix("k")) for group in groups]
    if any(size < 1 for size in sizes):
        raise ValueError(spec)
    return sizes, [len(rank) for rank in ranks], [index for index, group in enumerate(groups) if group.endswith("k")]


def feed(pipeline: Pipeline, batches, count: int, offset: int = 0) -> None:
    """`count` steps, with micro-batches `offset`, `offset + 1`, ... of `batches` (cycled)."""
    for index in range(offset, offset + count):
        pipeline.step(*batches[index % len(batches)])


def tensors_of(value) -> list[torch.Tensor]:
    """A stage's activation (a tensor or a tuple of tensors) as a list."""
    return list(value) if isinstance(value, (tuple, list)) else [value]


# -- runs and results ----------------------------------------------------------------------------------------------
def launched_as(rank: int, world_size: int) -> None:
    """The environment `accelerate launch` gives process `rank` of `world_size` (PetraTrainer reads it)."""
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine_description() -> dict:
    # GNU nproc honours OMP_NUM_THREADS, which the benchmarks set: ask it without that variable.
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")}
    try:
        nproc = subprocess.run(["nproc"], capture_output=True, text=True, timeout=10, env=env).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        nproc = "?"
    cpu = "?"
    try:
        names = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")]
        cpu = names[0].split(":", 1)[1].strip() if names else cpu
    except OSError:
        pass
    return {
        "nproc": nproc,
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def add_out_argument(parser: argparse.ArgumentParser, name: str) -> None:
    parser.add_argument(
        "--out",
        "--json",
        dest="out",
        type=Path,
        default=None,
        help=f"results file (default benchmarks/results/{name}.json; {name}-quick.json for quick settings)",
    )


def results_path(out: Path | None, name: str, quick: bool) -> Path:
    return out if out is not None else RESULTS / f"{name}{'-quick' if quick else ''}.json"


def write_results(path: Path, benchmark: str, script: str, argv, settings: dict, **measurements) -> dict:
    """Write a benchmark's results with what identifies the run; returns what was written."""
    argv = sys.argv[1:] if argv is None else list(argv)
    payload = {
        "benchmark": benchmark,
        "command": " ".join([f"python benchmarks/{script}", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_description(),
        "settings": settings,
        **measurements,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str))
    progress(f"wrote {path}")
    return payload
