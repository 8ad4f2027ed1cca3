#!/usr/bin/env python
"""What reading the data costs each process: every process reading every micro-batch (the engine's first way)
against each reading only what its stages need (the first stage's process the images, the last's the labels, the
others nothing), side by side, on the same data, processes and model.

    python benchmarks/data_reading.py              # ImageNet32 npz files of 100,000 images, and 3,000 PNGs
    python benchmarks/data_reading.py --quick      # 4,000 images and 300 PNGs: data_reading-quick.json

Two data sets are made in a temporary folder: ImageNet32-format batch files (`train_data_batch_1..10.npz`, random
32x32 images, the built-in `imagenet32` reader) and a folder of 64x64 PNG files in 10 classes (the built-in
`imagenet` reader: PIL decoding, then its 224-pixel random-resized-crop augmentation, where decoding and
augmenting dominate). Each is trained on by a small RevNet18 (stream widths 8-16) with PetraTrainer on
`--processes` processes of one thread, one after the other for the two ways of reading: an epoch of the ImageNet32
images, `--png-steps` steps of the PNGs, micro-batch 32. The first way is the trainer with every process loading
every item (its choice of what to read replaced for the measurement).

Per process: CPU seconds spent producing micro-batches (inside the data iterator: loading, decoding, augmenting,
collating, or indexing the labels), total CPU seconds, peak resident memory (`ru_maxrss`, which includes building
the data set), and the run's images per second (steps x micro-batch / the slowest process's training wall time).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import add_out_argument, progress, results_path, write_results  # noqa: E402

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


def _measure(rank: int, world_size: int, kind: str, data_dir: str, way: str, steps: int, output_dir: str) -> dict:
    os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size))
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
    cpu_start = time.process_time()
    dataset = load_image_dataset(kind, "train", data_dir=data_dir)
    torch.manual_seed(0)
    stem = "cifar" if kind == "imagenet32" else "imagenet"
    config = RevNetConfig.from_preset("revnet18", stem=stem, num_labels=dataset.info.num_labels,
                                      hidden_sizes=[8, 8, 16, 16], embedding_size=8)
    args = PetraTrainingArguments(output_dir=output_dir, per_device_train_batch_size=MICRO_BATCH, max_steps=steps,
                                  learning_rate=0.05, optim="sgd", save_strategy="no", eval_strategy="no",
                                  logging_steps=steps, report_to=[], disable_tqdm=True, petra_timeout=120)
    trainer = PetraTrainer(model=RevNetForImageClassification(config), args=args, train_dataset=dataset,
                           data_collator=collate_image_batch)
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    return {"rank": rank, "data_cpu_s": spent[0], "cpu_s": time.process_time() - cpu_start, "train_wall_s": wall,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=100_000, help="ImageNet32 images (default 100,000)")
    parser.add_argument("--pngs", type=int, default=3_000, help="PNG files (default 3,000)")
    parser.add_argument("--png-steps", type=int, default=60, help="steps on the PNGs (default 60)")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="4,000 images, 300 PNGs, 10 PNG steps")
    add_out_argument(parser, "data_reading")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.pngs, args.png_steps = 4_000, 300, 10
    rows = []
    with tempfile.TemporaryDirectory(prefix="petra-data-reading-") as tmp:
        folder = Path(tmp)
        (folder / "imagenet32").mkdir()
        imagenet32 = make_imagenet32(folder / "imagenet32", args.images)
        pngs = make_pngs(folder / "pngs", args.pngs)
        progress(f"made {args.images:,} ImageNet32 images and {args.pngs:,} PNGs in {folder}")
        for kind, data_dir, steps in (("imagenet32", imagenet32, args.images // MICRO_BATCH),
                                      ("imagenet", pngs, args.png_steps)):
            for way in WAYS:
                row = measure(kind, data_dir, way, steps, args.processes, folder)
                rows.append(row)
                progress(f"{kind} {way}: {row['images_per_s']:.0f} images/s; data CPU s per rank "
                         f"{[round(r['data_cpu_s'], 1) for r in row['ranks']]}, peak MiB "
                         f"{[round(r['peak_rss_mib']) for r in row['ranks']]}")
    settings = {"images": args.images, "pngs": args.pngs, "png_steps": args.png_steps, "processes": args.processes,
                "micro_batch": MICRO_BATCH, "threads": 1}
    return write_results(results_path(args.out, "data_reading", args.quick), "data_reading", "data_reading.py",
                         argv, settings, rows=rows)


if __name__ == "__main__":
    main()
