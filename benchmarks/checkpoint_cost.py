#!/usr/bin/env python
"""What a checkpoint costs when it keeps the micro-batches in flight, against one that drains the pipeline first,
and against not saving, side by side on the same job.

    python benchmarks/checkpoint_cost.py           # 3 repeats of 3 runs: benchmarks/results/checkpoint_cost.json
    python benchmarks/checkpoint_cost.py --quick   # 1 repeat, fewer steps: checkpoint_cost-quick.json

The job is the recipe's RevNet18 (stream widths 16-128, J = 10) on the digits, trained by PetraTrainer on
`--processes` processes of one thread (the stages split evenly), micro-batch 32, k = 1, for `--steps` steps, saving
every `--save-steps` steps (the model, each stage's file, the trainer's JSON, the random generators). Three ways,
run in turn `--repeats` times (the order rotating):

- `no saves`: `save_strategy="no"`;
- `in flight`: PetraTrainer's checkpoints, which keep what is in flight (`Pipeline.state_dict`);
- `drained`: the same checkpoints, each after a drain (the pipeline finishes the micro-batches in flight, applies
  them, and refills afterwards), as a save did before it could keep them.

Per way: the run's wall time (the slowest process's), the seconds spent inside the saves (from the save's start
to its end on disk), the bytes of the first checkpoint and of its stage files (mid-run: the last is at the end,
where training drains), and whether the final weights equal those of `no saves`, bit for bit. The summary gives
medians over the repeats, and the extra seconds per save against `no saves` (which for `drained` includes the
refill the drain causes: ticks where some processes wait).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import add_out_argument, launched_as, progress, results_path, write_results  # noqa: E402

WAYS = ("no saves", "in flight", "drained")
MICRO_BATCH = 32


def run(way: str, folder: Path, steps: int, save_steps: int, rank: int = 0, world_size: int = 1) -> dict:
    """One run of the job as process `rank` of `world_size` (the whole model's weights come back from each)."""
    if world_size > 1:
        launched_as(rank, world_size)
    import torch

    from petra_hub import RevNetConfig, RevNetForImageClassification
    from petra_hub.data import collate_image_batch, load_image_dataset
    from petra_hub.training import PetraTrainer, PetraTrainingArguments

    class Trainer(PetraTrainer):
        save_seconds = 0.0

        def _save_checkpoint(self, model, trial):
            started = time.perf_counter()
            if way == "drained":
                self._sync_model()  # drain first: the micro-batches in flight finish, the pipeline refills after
            super()._save_checkpoint(model, trial)
            Trainer.save_seconds += time.perf_counter() - started

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = RevNetConfig.from_preset("revnet18", stem="cifar", num_labels=10, hidden_sizes=[16, 32, 64, 128],
                                      embedding_size=16)
    args = PetraTrainingArguments(
        output_dir=str(folder), per_device_train_batch_size=MICRO_BATCH, max_steps=steps, learning_rate=0.05,
        optim="sgd", save_strategy="no" if way == "no saves" else "steps", save_steps=save_steps,
        save_total_limit=None, eval_strategy="no", logging_steps=steps, report_to=[], disable_tqdm=True,
        max_grad_norm=0.0, seed=0)
    trainer = Trainer(model=RevNetForImageClassification(config), args=args,
                      train_dataset=load_image_dataset("digits", "train"), data_collator=collate_image_batch)
    started = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - started
    checkpoints = sorted(folder.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    first = checkpoints[0] if checkpoints else None  # mid-run (the last one is at the end, drained either way)
    return {
        "wall_s": wall, "save_s": Trainer.save_seconds, "saves": len(checkpoints),
        "checkpoint_bytes": sum(p.stat().st_size for p in first.rglob("*") if p.is_file()) if first else 0,
        "stage_file_bytes": sum(p.stat().st_size for p in first.glob("petra_stage_*.pt")) if first else 0,
        "weights": {name: value.clone() for name, value in trainer.model.state_dict().items()},
    }


def _process(rank: int, world_size: int, way: str, folder: Path, steps: int, save_steps: int) -> dict:
    return run(way, folder, steps, save_steps, rank, world_size)


def measure(way: str, folder: Path, steps: int, save_steps: int, processes: int) -> dict:
    """`run` on `processes` fresh processes: the slowest's wall and save times, rank 0's files and weights."""
    from petra_hub.testing.ranks import run_ranks

    results, codes, _ = run_ranks(_process, processes, way, folder, steps, save_steps, deadline=1800,
                                  start_method="spawn")
    failed = [r.get("traceback") if r else f"exit code {code}" for r, code in zip(results, codes)
              if not r or "value" not in r]
    if failed:
        raise RuntimeError(f"{way}: {failed[0]}")
    ranks = [r["value"] for r in results]
    return {**ranks[0], "wall_s": max(r["wall_s"] for r in ranks), "save_s": max(r["save_s"] for r in ranks)}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="30 steps, saved every 10, one repeat")
    add_out_argument(parser, "checkpoint_cost")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.save_steps, args.repeats = 30, 10, 1
    import torch

    runs = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="petra-checkpoint-cost-") as tmp:
        for repeat in range(args.repeats):
            for way in WAYS[repeat % 3:] + WAYS[:repeat % 3]:
                result = measure(way, Path(tmp, f"{way.replace(' ', '-')}-{repeat}"), args.steps, args.save_steps,
                                 args.processes)
                runs[way].append(result)
                progress(f"{way}, repeat {repeat + 1}: {result['wall_s']:.2f} s, {result['saves']} saves in "
                         f"{result['save_s']:.2f} s")
    reference = runs["no saves"][0]["weights"]
    summary = {}
    for way, results in runs.items():
        identical = [all(torch.equal(r["weights"][name], value) for name, value in reference.items())
                     for r in results]
        saves = results[0]["saves"]
        extra = [r["wall_s"] - base["wall_s"] for r, base in zip(results, runs["no saves"])]
        summary[way] = {
            "wall_s": statistics.median(r["wall_s"] for r in results),
            "save_s": statistics.median(r["save_s"] for r in results), "saves": saves,
            "extra_s_per_save": statistics.median(extra) / saves if saves else 0.0,
            "seconds_per_save": statistics.median(r["save_s"] for r in results) / saves if saves else 0.0,
            "checkpoint_bytes": results[0]["checkpoint_bytes"], "stage_file_bytes": results[0]["stage_file_bytes"],
            "bit_identical_to_no_saves": all(identical),
            "runs": [{key: value for key, value in r.items() if key != "weights"} for r in results],
        }
        progress(f"{way}: {summary[way]['wall_s']:.2f} s, {summary[way]['seconds_per_save'] * 1e3:.0f} ms per save, "
                 f"{summary[way]['checkpoint_bytes'] / 2**20:.2f} MiB, bit-identical to no saves: {all(identical)}")
    settings = {"steps": args.steps, "save_steps": args.save_steps, "repeats": args.repeats,
                "micro_batch": MICRO_BATCH, "model": "revnet18, widths 16-128, J = 10", "threads": 1,
                "processes": args.processes}
    return write_results(results_path(args.out, "checkpoint_cost", args.quick), "checkpoint_cost",
                         "checkpoint_cost.py", argv, settings, ways=summary)


if __name__ == "__main__":
    main()
