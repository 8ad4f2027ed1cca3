#!/usr/bin/env python
"""Faults injected into a PetraTrainer job under `torchrun --max-restarts`, and what recovering from each cost.

    python benchmarks/chaos.py                 # 10 runs on 2 processes, 3 on 3: benchmarks/results/chaos.json
    python benchmarks/chaos.py --quick         # 30 steps, 2 faults (SIGKILL, SIGTERM), one run: chaos-quick.json

The job trains a small RevNet18 on the digits with PetraTrainer, saving every `--save-steps` steps, each step
slowed to `--step-seconds` so that faults land while it runs. A reference job runs untouched and never saves
(`save_strategy="no"`); then, for each process count, `--repeats` jobs run under `torchrun --max-restarts 5` with
faults at random steps (each run its own seed), one after the other, each once the job trains again after the
previous one:

- SIGKILL to a random process (three times): its peers fail on it within seconds, torchrun restarts the job, which
  resumes from its last complete checkpoint by itself;
- SIGTERM to a random process, as a scheduler preempting one worker: every process saves a checkpoint at the next
  step end and exits with status 75, and torchrun restarts the job;
- SIGSTOP to a random process: its peers fail after `petra_timeout`, and torchrun, which asks every process to end
  with SIGTERM and kills those still there 30 s later (fixed for a restart), restarts the job.

Per fault: the seconds from the fault to the job training again (its first step end after the restart), the steps
recomputed (the step the job had reached, less the step it resumed from) and the checkpoints written since the
fault before (and their bytes: the count times the size of the job's last checkpoint). Per run: whether the final
weights equal the reference's, bit for bit (checkpoints keep the micro-batches in flight, so neither the saves nor
the restarts may change them).

Each process writes its progress (a JSON line per step end, save and start) into a marks folder the driver reads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from common import add_out_argument, progress, results_path, write_results  # noqa: E402

FAULTS = ("SIGKILL", "SIGKILL", "SIGTERM", "SIGSTOP", "SIGKILL")


# -- the job (one torchrun worker) ---------------------------------------------------------------------------------
def worker(output_dir: str, marks: str, steps: int, save_steps: int, step_seconds: float, timeout: float) -> None:
    import torch
    from transformers import TrainerCallback

    from petra_hub import RevNetConfig, RevNetForImageClassification
    from petra_hub.data import collate_image_batch, load_image_dataset, take
    from petra_hub.training import PetraTrainer, PetraTrainingArguments

    rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    log = Path(marks, f"rank{rank}.jsonl")

    def mark(event: str, step: int) -> None:
        with log.open("a") as out:
            out.write(json.dumps({"event": event, "step": step, "attempt": attempt, "pid": os.getpid(),
                                  "time": time.time()}) + "\n")

    class Marks(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            mark("start", state.global_step)

        def on_step_end(self, args, state, control, **kwargs):
            time.sleep(step_seconds)
            mark("step", state.global_step)

        def on_save(self, args, state, control, **kwargs):
            mark("save", state.global_step)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = RevNetConfig.from_preset("revnet18", stem="cifar", num_labels=10, hidden_sizes=[8, 8, 16, 16],
                                      embedding_size=8)
    args = PetraTrainingArguments(output_dir=output_dir, per_device_train_batch_size=16, max_steps=steps,
                                  learning_rate=0.05, optim="sgd", save_strategy="steps" if save_steps else "no",
                                  save_steps=save_steps or 1,
                                  eval_strategy="no", logging_steps=steps, report_to=[], disable_tqdm=True,
                                  petra_timeout=timeout, max_grad_norm=0.0)
    trainer = PetraTrainer(model=RevNetForImageClassification(config), args=args,
                           train_dataset=take(load_image_dataset("digits", "train"), 256),
                           data_collator=collate_image_batch, callbacks=[Marks()])
    trainer.train()
    if rank == 0:
        from safetensors.torch import save_file

        save_file({name: value.contiguous() for name, value in trainer.model.state_dict().items()},
                  str(Path(marks, "trained.safetensors")))


# -- the driver ----------------------------------------------------------------------------------------------------
def read_marks(marks: Path) -> list[dict]:
    events = []
    for path in sorted(marks.glob("rank*.jsonl")):
        rank = int(path.stem[4:])
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    events.append({**json.loads(line), "rank": rank})
                except json.JSONDecodeError:  # a line being written
                    pass
    return sorted(events, key=lambda event: event["time"])


def launch(output_dir: Path, marks: Path, args, processes: int, save_steps: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               "--max-restarts", "5", __file__, "--worker",
               str(output_dir), str(marks), str(args.steps), str(save_steps), str(args.step_seconds), str(args.timeout)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def checkpoint_bytes(output_dir: Path) -> int:
    """The size of the last checkpoint of `output_dir`."""
    last = max(output_dir.glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    return sum(path.stat().st_size for path in last.rglob("*") if path.is_file())


def inject(job: subprocess.Popen, marks: Path, plan: list[tuple[str, int]], rng: random.Random, processes: int,
           deadline: float) -> list[dict]:
    """Wait for each planned step, send its signal to a random process of the current attempt, then wait until the
    job trains again; returns what each fault cost."""
    records, previous_fault = [], 0.0
    for name, at_step in plan:
        while True:
            events = read_marks(marks)
            steps = [event for event in events if event["event"] == "step"]
            if steps and steps[-1]["step"] >= at_step:
                break
            if job.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the job ended or stalled before step {at_step}: {job.stderr.read()[-2000:]}")
            time.sleep(0.05)
        attempt = max(event["attempt"] for event in events)
        pids = {event["rank"]: event["pid"] for event in events if event["attempt"] == attempt}
        rank = rng.randrange(processes)
        reached = steps[-1]["step"]
        fault_time = time.time()
        os.kill(pids[rank], getattr(signal, name))
        while True:  # training again: a step end of a later attempt
            events = read_marks(marks)
            later = [event for event in events if event["attempt"] > attempt]
            started = [event for event in later if event["event"] == "start"]
            stepped = [event for event in later if event["event"] == "step"]
            if stepped:
                break
            if job.poll() is not None or time.time() > deadline:
                raise RuntimeError(f"the job did not come back after {name}: {job.stderr.read()[-2000:]}")
            time.sleep(0.05)
        resumed_from = min(event["step"] for event in started)
        saves = [event["step"] for event in events if event["event"] == "save" and event["rank"] == 0
                 and previous_fault < event["time"] <= stepped[0]["time"]]
        records.append({"fault": name, "rank": rank, "at_step": reached, "resumed_from_step": resumed_from,
                        "steps_recomputed": max(0, reached - resumed_from),
                        "seconds_to_training": stepped[0]["time"] - fault_time, "saves_since_last_fault": saves,
                        "attempt": attempt + 1})
        previous_fault = fault_time
        progress(f"{name} to process {rank} at step {reached}: training again after "
                 f"{records[-1]['seconds_to_training']:.1f} s, from step {resumed_from}")
    return records


def run_job(folder: Path, args, processes: int, plan: list[tuple[str, int]], seed: int, save_steps: int) -> dict:
    output_dir, marks = folder / "run", folder / "marks"
    marks.mkdir(parents=True)
    started = time.time()
    job = launch(output_dir, marks, args, processes, save_steps)
    records = inject(job, marks, plan, random.Random(seed), processes, started + args.deadline)
    try:
        job.wait(timeout=max(1.0, started + args.deadline - time.time()))
    except subprocess.TimeoutExpired:
        job.kill()
        raise RuntimeError("the job did not finish before the deadline") from None
    if job.returncode != 0:
        raise RuntimeError(f"the job failed ({job.returncode}): {job.stderr.read()[-3000:]}")
    saves = [event for event in read_marks(marks) if event["event"] == "save" and event["rank"] == 0]
    size = checkpoint_bytes(output_dir) if saves else 0
    for record in records:
        record["bytes_written"] = len(record["saves_since_last_fault"]) * size
    return {"faults": records, "wall_s": time.time() - started, "saves": [event["step"] for event in saves],
            "checkpoint_bytes": size, "weights": marks / "trained.safetensors"}


def same_weights(first: Path, second: Path) -> bool:
    from safetensors.torch import load_file

    a, b = load_file(str(first)), load_file(str(second))
    return a.keys() == b.keys() and all(bool((a[name] == b[name]).all()) for name in a)


def fault_plan(faults: tuple[str, ...], steps: int, seed: int) -> list[tuple[str, int]]:
    """Each fault at a random step around its share of the run."""
    rng = random.Random(seed)
    spacing = steps // (len(faults) + 1)
    return [(name, spacing * (index + 1) + rng.randrange(-spacing // 3, spacing // 3 + 1))
            for index, name in enumerate(faults)]


def summary(runs: list[dict]) -> list[dict]:
    """Per fault kind over every run: how many, the median and largest seconds to training again, the median steps
    recomputed."""
    rows = []
    for name in dict.fromkeys(record["fault"] for run in runs for record in run["faults"]):
        records = [record for run in runs for record in run["faults"] if record["fault"] == name]
        seconds = [record["seconds_to_training"] for record in records]
        rows.append({"fault": name, "count": len(records), "median_seconds_to_training": statistics.median(seconds),
                     "max_seconds_to_training": max(seconds),
                     "median_steps_recomputed": statistics.median(r["steps_recomputed"] for r in records)})
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", default="2,3", help="process counts, each with its own runs")
    parser.add_argument("--repeats", default="10,3", help="faulty runs per process count")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.2, help="each step slowed by this much")
    parser.add_argument("--timeout", type=float, default=10.0, help="petra_timeout (what a stalled peer costs)")
    parser.add_argument("--seed", type=int, default=0, help="the first run's seed: where its faults land")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds a faulty job may take")
    parser.add_argument("--quick", action="store_true", help="30 steps, saved every 5, a SIGKILL and a SIGTERM, "
                                                             "one run on 2 processes")
    add_out_argument(parser, "chaos")
    args = parser.parse_args(argv)
    faults = FAULTS
    counts, repeats = [int(n) for n in args.processes.split(",")], [int(n) for n in args.repeats.split(",")]
    if args.quick:
        args.steps, args.save_steps, faults, counts, repeats = 30, 5, ("SIGKILL", "SIGTERM"), [2], [1]
    if len(repeats) != len(counts):
        parser.error(f"--repeats gives {len(repeats)} counts for {len(counts)} --processes")
    by_processes = {}
    with tempfile.TemporaryDirectory(prefix="petra-chaos-") as tmp:
        reference = run_job(Path(tmp, "reference"), args, counts[0], [], args.seed, save_steps=0)
        progress(f"reference (never saves, never stopped): {reference['wall_s']:.1f} s")
        for processes, runs in zip(counts, repeats):
            untouched = run_job(Path(tmp, f"untouched-{processes}"), args, processes, [], args.seed, args.save_steps)
            results = []
            for run in range(runs):
                seed = args.seed + run
                faulty = run_job(Path(tmp, f"faulty-{processes}-{run}"), args, processes,
                                 fault_plan(faults, args.steps, seed), seed, args.save_steps)
                faulty["bit_identical"] = same_weights(reference["weights"], faulty["weights"])
                progress(f"{processes} processes, run {run + 1}/{runs}: {faulty['wall_s']:.1f} s, bit-identical to "
                         f"the reference: {faulty['bit_identical']}")
                results.append({key: value for key, value in faulty.items() if key != "weights"} | {"seed": seed})
            by_processes[str(processes)] = {
                "runs": results, "bit_identical_runs": sum(run["bit_identical"] for run in results),
                "untouched_wall_s": untouched["wall_s"], "untouched_bit_identical":
                    same_weights(reference["weights"], untouched["weights"]),
                "summary": summary(results)}
    settings = {"processes": counts, "repeats": repeats, "steps": args.steps, "save_steps": args.save_steps,
                "step_seconds": args.step_seconds, "petra_timeout": args.timeout,
"seed": args.seed, "max_restarts": 5, "faults": list(faults)}
    return write_results(results_path(args.out, "chaos", args.quick), "chaos", "chaos.py", argv, settings,
                         reference_wall_s=reference["wall_s"], by_processes=by_processes)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        output_dir, marks, steps, save_steps, step_seconds, timeout = sys.argv[2:8]
        worker(output_dir, marks, int(steps), int(save_steps), float(step_seconds), float(timeout))
    else:
        main()
