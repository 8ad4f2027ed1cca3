#!/usr/bin/env python
"""Faults injected into a PetraTrainer job under `torchrun --max-restarts`, and what recovering from each cost.

    python benchmarks/chaos.py                 # 2 processes, 80 steps, 5 faults: benchmarks/results/chaos.json
    python benchmarks/chaos.py --quick         # 30 steps, 2 faults (SIGKILL, SIGTERM): chaos-quick.json

The job trains a small RevNet18 on the digits with PetraTrainer, saving every `--save-steps` steps, each step
slowed to `--step-seconds` so that faults land while it runs. It runs twice under `torchrun --max-restarts 5`: once
untouched, once with faults at seeded random steps, one after the other, each once the job trains again after the
previous one:

- SIGKILL to a random process (three times): its peers fail on it within seconds, torchrun restarts the job, which
  resumes from its last complete checkpoint by itself;
- SIGTERM to a random process, as a scheduler preempting one worker: every process saves a checkpoint at the next
  step end and exits with status 75, and torchrun restarts the job;
- SIGSTOP to a random process: its peers fail after `petra_timeout`, and torchrun, which asks with SIGTERM and kills
  after 30 s, restarts the job.

Per fault: the seconds from the fault to the job training again (its first step end after the restart), the steps
recomputed (the step the job had reached, less the step it resumed from) and the checkpoints written since the
fault before (and their bytes: the count times the size of the job's last checkpoint). At the end, whether the
final weights equal the untouched run's, bit for bit, and those of an untouched run that also saved where the
faulty job's preemption saved: every save drains the pipeline, so a preemption save off the schedule changes
PETRA's trajectory from that step on, as the same save in an untouched run does.

Each process writes its progress (a JSON line per step end, save and start) into a marks folder the driver reads.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
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
def worker(output_dir: str, marks: str, steps: int, save_steps: int, step_seconds: float, timeout: float,
           extra_saves: set[int]) -> None:
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
            if state.global_step in extra_saves:  # where the faulty job saved off its schedule (a preemption)
                control.should_save = True

        def on_save(self, args, state, control, **kwargs):
            mark("save", state.global_step)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = RevNetConfig.from_preset("revnet18", stem="cifar", num_labels=10, hidden_sizes=[8, 8, 16, 16],
                                      embedding_size=8)
    args = PetraTrainingArguments(output_dir=output_dir, per_device_train_batch_size=16, max_steps=steps,
                                  learning_rate=0.05, optim="sgd", save_strategy="steps", save_steps=save_steps,
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


def launch(output_dir: Path, marks: Path, args, processes: int, extra_saves: list[int]) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               "--max-restarts", "5", __file__, "--worker", str(output_dir), str(marks), str(args.steps),
               str(args.save_steps), str(args.step_seconds), str(args.timeout), ",".join(map(str, extra_saves))]
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


def run_job(folder: Path, args, processes: int, plan: list[tuple[str, int]], seed: int,
            extra_saves: list[int] = ()) -> dict:
    output_dir, marks = folder / "run", folder / "marks"
    marks.mkdir(parents=True)
    started = time.time()
    job = launch(output_dir, marks, args, processes, list(extra_saves))
    records = inject(job, marks, plan, random.Random(seed), processes, started + args.deadline)
    try:
        job.wait(timeout=max(1.0, started + args.deadline - time.time()))
    except subprocess.TimeoutExpired:
        job.kill()
        raise RuntimeError("the job did not finish before the deadline") from None
    if job.returncode != 0:
        raise RuntimeError(f"the job failed ({job.returncode}): {job.stderr.read()[-3000:]}")
    saves = [event for event in read_marks(marks) if event["event"] == "save" and event["rank"] == 0]
    size = checkpoint_bytes(output_dir)
    for record in records:
        record["bytes_written"] = len(record["saves_since_last_fault"]) * size
    return {"faults": records, "wall_s": time.time() - started, "saves": [event["step"] for event in saves],
            "checkpoint_bytes": size, "weights": marks / "trained.safetensors"}


def same_weights(first: Path, second: Path) -> bool:
    from safetensors.torch import load_file

    a, b = load_file(str(first)), load_file(str(second))
    return a.keys() == b.keys() and all(bool((a[name] == b[name]).all()) for name in a)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--step-seconds", type=float, default=0.2, help="each step slowed by this much")
    parser.add_argument("--timeout", type=float, default=10.0, help="petra_timeout (what a stalled peer costs)")
    parser.add_argument("--seed", type=int, default=0, help="where the faults land and whom they hit")
    parser.add_argument("--deadline", type=float, default=900.0, help="seconds the faulty job may take")
    parser.add_argument("--quick", action="store_true", help="30 steps, saved every 5, a SIGKILL and a SIGTERM")
    add_out_argument(parser, "chaos")
    args = parser.parse_args(argv)
    faults = FAULTS
    if args.quick:
        args.steps, args.save_steps, faults = 30, 5, ("SIGKILL", "SIGTERM")
    rng = random.Random(args.seed)
    spacing = args.steps // (len(faults) + 1)
    plan = [(name, spacing * (index + 1) + rng.randrange(-spacing // 3, spacing // 3 + 1))
            for index, name in enumerate(faults)]
    with tempfile.TemporaryDirectory(prefix="petra-chaos-") as tmp:
        untouched = run_job(Path(tmp, "untouched"), args, args.processes, [], args.seed)
        progress(f"untouched: {untouched['wall_s']:.1f} s")
        faulty = run_job(Path(tmp, "faulty"), args, args.processes, plan, args.seed)
        off_schedule = sorted(set(faulty["saves"]) - set(untouched["saves"]))  # preemption saves
        identical = same_weights(untouched["weights"], faulty["weights"])
        same_saves = run_job(Path(tmp, "same-saves"), args, args.processes, [], args.seed, off_schedule) \
            if off_schedule else untouched
        identical_to_same_saves = same_weights(same_saves["weights"], faulty["weights"])
    progress(f"faulty: {faulty['wall_s']:.1f} s; final weights bit-identical to the untouched run's: {identical}, "
             f"to an untouched run that also saved at {off_schedule}: {identical_to_same_saves}")
    settings = {"processes": args.processes, "steps": args.steps, "save_steps": args.save_steps,
                "step_seconds": args.step_seconds, "petra_timeout": args.timeout, "seed": args.seed,
                "max_restarts": 5}
    return write_results(results_path(args.out, "chaos", args.quick), "chaos", "chaos.py", argv, settings,
                         faults=faulty["faults"], untouched_wall_s=untouched["wall_s"], faulty_wall_s=faulty["wall_s"],
                         untouched_saves=untouched["saves"], faulty_saves=faulty["saves"],
                         checkpoint_bytes=faulty["checkpoint_bytes"],
                         saves_off_schedule=off_schedule, bit_identical=identical,
                         bit_identical_to_same_saves=identical_to_same_saves)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        output_dir, marks, steps, save_steps, step_seconds, timeout, extra = sys.argv[2:9]
        worker(output_dir, marks, int(steps), int(save_steps), float(step_seconds), float(timeout),
               {int(step) for step in extra.split(",") if step})
    else:
        main()
