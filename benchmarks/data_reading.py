#!/usr/bin/env python
"""What reading the data costs each process: every process reading every micro-batch (the engine's first way)
against each reading only what its stages need (the first stage's process the images, the last's the labels, the
others nothing), side by side, on the same data, processes and model.

    python benchmarks/data_reading.py              # ImageNet32 npz files of 100,000 images, and 3,000 PNGs
    python benchmarks/data_reading.py --quick      # 4,000 images and 300 PNGs, 1 repeat: data_reading-quick.json

Two data sets are made in a temporary folder: ImageNet32-format batch files (`train_data_batch_1..10.npz`, random
32x32 images, the built-in `imagenet32` reader) and a folder of 64x64 PNG files in 10 classes (the built-in
`imagenet` reader: PIL decoding, then its 224-pixel random-resized-crop augmentation, where decoding and
augmenting dominate). Each is trained on by a small RevNet18 (stream widths 8-16) with PetraTrainer on
`--processes` processes of one thread, for the two ways of reading in turn, `--repeats` times (the order of the
two alternating): an epoch of the ImageNet32 images, `--png-steps` steps of the PNGs, micro-batch 32. The first way
is the trainer with every process loading every item and holding every image (its choice of what to read replaced
for the measurement); the second is what the recipe does (`load_image_dataset(..., keep_images=
args.runs_first_stage())`, then the trainer's own choice).

Per process: CPU seconds spent producing micro-batches (inside the data iterator: loading, decoding, augmenting,
collating, or indexing the labels), total CPU seconds, the memory the data set holds (resident memory after
building it, less before), peak resident memory (`ru_maxrss`, which includes building the data set), and the run's
images per second (steps x micro-batch / the slowest process's training wall time); the summary gives medians over
the repeats, and the median of the paired ratios of images per second. Separately, the peak memory of building the
ImageNet32 set alone, with and without its images, at a quarter, half and all of `--images`: what a process that
needs no images pays, against the data set's size.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import add_out_argument, launched_as, progress, results_path, write_results  # noqa: E402

WAYS = ("every-process", "only-what-it-needs")
MICRO_BATCH = 32


def make_imagenet32(folder: Path, images: int, seed: int = 0) -> Path:
    import numpy as np

    if images < 10:
        raise ValueError(f"ImageNet32's layout has 10 train files: expected at least 10 images, got {images}")
    rng = np.random.default_rng(seed)
    for index, count in enumerate(len(part) for part in np.array_split(np.arange(images), 10)):
        data = rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)
        np.savez(folder / f"train_data_batch_{index + 1}.npz", data=data,
                 labels=rng.integers(1, 1001, size=count).astype(np.int64))
    return folder


def make_pngs(folder: Path, images: int, classes: int = 10, side: int = 64, seed: int = 0) -> Path:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    for index in range(images):
        target = folder / "train" / f"class{index % classes:02d}"
        target.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, size=(side, side, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(target / f"{index:06d}.png")
    return folder


def _resident_mib() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(rank: int, world_size: int, kind: str, data_dir: str, way: str, steps: int, output_dir: str) -> dict:
    launched_as(rank, world_size)
    import torch

    torch.set_num_threads(1)
    from petra_hub import RevNetConfig, RevNetForImageClassification
    from petra_hub.data import collate_image_batch, load_image_dataset
    from petra_hub.training import PetraTrainer, PetraTrainingArguments
    from petra_hub.training import trainer as trainer_module
    from petra_hub.training.feeding import Reading

    if way == "every-process":  # the first way: every process loads every item
        trainer_module.reading_for = lambda *args, **kwargs: Reading(images=True)
    spent = [0.0]
    produce = trainer_module.rank_batches

    def timed(*args, **kwargs):
        batches = produce(*args, **kwargs)
        while True:
            start = time.process_time()
            try:
                batch = next(batches)
            except StopIteration:
                spent[0] += time.process_time() - start
                return
            spent[0] += time.process_time() - start
            yield batch

    trainer_module.rank_batches = timed
    args = PetraTrainingArguments(output_dir=output_dir, per_device_train_batch_size=MICRO_BATCH, max_steps=steps,
                                  learning_rate=0.05, optim="sgd", save_strategy="no", eval_strategy="no",
                                  logging_steps=steps, report_to=[], disable_tqdm=True, petra_timeout=120)
    cpu_start, resident_before = time.process_time(), _resident_mib()
    keep_images = way == "every-process" or args.runs_first_stage()
    dataset = load_image_dataset(kind, "train", data_dir=data_dir, keep_images=keep_images)
    data_set_mib = _resident_mib() - resident_before
    torch.manual_seed(0)
    stem = "cifar" if kind == "imagenet32" else "imagenet"
    config = RevNetConfig.from_preset("revnet18", stem=stem, num_labels=dataset.info.num_labels,
                                      hidden_sizes=[8, 8, 16, 16], embedding_size=8)
    trainer = PetraTrainer(model=RevNetForImageClassification(config), args=args, train_dataset=dataset,
                           data_collator=collate_image_batch)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    return {"rank": rank, "data_cpu_s": spent[0], "cpu_s": time.process_time() - cpu_start, "train_wall_s": wall,
            "data_set_mib": data_set_mib, "peak_rss_mib": _peak_mib(), "holds_images": keep_images,
            "reads_images": trainer._reading.images, "reads_labels": trainer._reading.labels is not None}


def measure(kind: str, data_dir: Path, way: str, steps: int, processes: int, folder: Path) -> dict:
    from petra_hub.testing.ranks import run_ranks

    results, codes, _ = run_ranks(_measure, processes, kind, str(data_dir), way, steps, str(folder / f"{kind}-{way}"),
                                  deadline=3600, pg_timeout=600, start_method="spawn")
    failed = [r.get("traceback") if r else f"exit code {code}" for r, code in zip(results, codes)
              if not r or "value" not in r]
    if failed:
        raise RuntimeError(f"{kind}, {way}: {failed[0]}")
    ranks = [r["value"] for r in results]
    slowest = max(r["train_wall_s"] for r in ranks)
    return {"data": kind, "way": way, "steps": steps, "processes": processes, "ranks": ranks,
            "images_per_s": steps * MICRO_BATCH / slowest}


def _building_peak(rank: int, world_size: int, data_dir: str, keep_images: bool) -> dict:
    from petra_hub.data import load_image_dataset

    peak_before, resident_before = _peak_mib(), _resident_mib()
    dataset = load_image_dataset("imagenet32", "train", data_dir=data_dir, keep_images=keep_images)
    dataset[0], dataset[len(dataset) - 1]  # the items a process without the first stage checks
    return {"images": len(dataset), "keep_images": keep_images, "peak_mib": _peak_mib() - peak_before,
            "held_mib": _resident_mib() - resident_before}


def building_peaks(folder: Path, images: int) -> list[dict]:
    """The peak memory of building the ImageNet32 set (and reading two items), each in a fresh process."""
    from petra_hub.testing.ranks import run_ranks

    rows = []
    for count in (images // 4, images // 2, images):
        data_dir = folder / f"imagenet32-{count}"
        data_dir.mkdir()
        make_imagenet32(data_dir, count, seed=1)
        for keep_images in (True, False):
            results, _, _ = run_ranks(_building_peak, 1, str(data_dir), keep_images, deadline=600,
                                      start_method="spawn")
            rows.append(results[0]["value"])
        shutil.rmtree(data_dir)
    return rows


def _median(values) -> float:
    return statistics.median(values)


def summarize(rows: list[dict]) -> list[dict]:
    """Per data set and way: medians over the repeats, per process and of the run; and the median of the paired
    (same repeat) ratios of images per second, only-what-it-needs over every-process."""
    summary = []
    for kind in dict.fromkeys(row["data"] for row in rows):
        runs = {way: [row for row in rows if row["data"] == kind and row["way"] == way] for way in WAYS}
        ratios = [b["images_per_s"] / a["images_per_s"] for a, b in zip(*runs.values())]
        for way, measured in runs.items():
            ranks = [{key: _median([run["ranks"][rank][key] for run in measured])
                      for key in ("data_cpu_s", "cpu_s", "data_set_mib", "peak_rss_mib")}
                     | {"rank": rank, "reads_images": measured[0]["ranks"][rank]["reads_images"],
                        "reads_labels": measured[0]["ranks"][rank]["reads_labels"]}
                     for rank in range(len(measured[0]["ranks"]))]
            summary.append({"data": kind, "way": way, "repeats": len(measured), "ranks": ranks,
                            "images_per_s": _median([run["images_per_s"] for run in measured]),
                            "images_per_s_ratio": _median(ratios) if way == WAYS[1] else 1.0})
    return summary


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=100_000, help="ImageNet32 images (default 100,000)")
    parser.add_argument("--pngs", type=int, default=3_000, help="PNG files (default 3,000)")
    parser.add_argument("--png-steps", type=int, default=60, help="steps on the PNGs (default 60)")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way (default 3)")
    parser.add_argument("--quick", action="store_true", help="4,000 images, 300 PNGs, 10 PNG steps, 1 repeat")
    add_out_argument(parser, "data_reading")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.pngs, args.png_steps, args.repeats = 4_000, 300, 10, 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="petra-data-reading-") as tmp:
        folder = Path(tmp)
        building = building_peaks(folder, args.images)
        progress("peak MiB of building: " + ", ".join(
            f"{row['images']:,} images {'with' if row['keep_images'] else 'without'} {row['peak_mib']:.0f}"
            for row in building))
        (folder / "imagenet32").mkdir()
        imagenet32 = make_imagenet32(folder / "imagenet32", args.images)
        pngs = make_pngs(folder / "pngs", args.pngs)
        progress(f"made {args.images:,} ImageNet32 images and {args.pngs:,} PNGs in {folder}")
        for repeat in range(args.repeats):
            for kind, data_dir, steps in (("imagenet32", imagenet32, args.images // MICRO_BATCH),
                                          ("imagenet", pngs, args.png_steps)):
                for way in WAYS if repeat % 2 == 0 else WAYS[::-1]:
                    row = measure(kind, data_dir, way, steps, args.processes, folder) | {"repeat": repeat}
                    rows.append(row)
                    progress(f"{repeat}: {kind} {way}: {row['images_per_s']:.0f} images/s; data CPU s per rank "
                             f"{[round(r['data_cpu_s'], 1) for r in row['ranks']]}, data set MiB "
                             f"{[round(r['data_set_mib']) for r in row['ranks']]}, peak MiB "
                             f"{[round(r['peak_rss_mib']) for r in row['ranks']]}")
    rows.sort(key=lambda row: (row["data"] != "imagenet32", WAYS.index(row["way"]), row["repeat"]))
    settings = {"images": args.images, "pngs": args.pngs, "png_steps": args.png_steps, "processes": args.processes,
                "repeats": args.repeats, "micro_batch": MICRO_BATCH, "threads": 1}
    return write_results(results_path(args.out, "data_reading", args.quick), "data_reading", "data_reading.py",
                         argv, settings, rows=rows, summary=summarize(rows), building=building)

if __name__ == "__main__":
    main()
