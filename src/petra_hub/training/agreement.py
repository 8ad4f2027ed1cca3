"""One run, whatever the number of processes: what the Trainer decides and writes is the same on every rank.

Every rank runs the whole Trainer loop (callbacks, evaluation, best-model tracking) around its own stages. A decision
that changes what a rank loads, saves, deletes, stops or reports is therefore made once, by rank 0, and sent to the
others (`from_rank_zero`, `agreed_control`); and at every drain point each rank's `TrainerState` and the checkpoints
it sees on disk are compared (`check_ranks_agree`), so that a rank that went its own way is an error naming the field
and the ranks, not a model that never existed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re

from transformers import TrainerControl, TrainerState

from ..engine import all_gather_json, broadcast_json, disagreements
from .distributed import together, world_size

# TrainerControl's flags: what the callbacks decide at each step end, epoch end, evaluation and save.
CONTROL_FLAGS = ("should_training_stop", "should_epoch_stop", "should_save", "should_evaluate", "should_log")

# TrainerState fields that are truly per process.
PER_RANK_FIELDS = frozenset({"is_local_process_zero", "is_world_process_zero"})
# Logged values that are timings, measured by each process on its own clock.
TIMING = re.compile(r"(.*_)?(runtime|samples_per_second|steps_per_second)")
CHECKPOINT = re.compile(r"checkpoint-\d+")


def from_rank_zero(value, doing: str):
    """Rank 0's `value` (JSON), on every rank; `value` itself with one process."""
    if world_size() <= 1:
        return value
    with together(f"receive what process 0 decided ({doing})"):
        return broadcast_json(value, src=0)


def agreed_control(control: TrainerControl, when: str, signal: str | None = None) -> tuple[TrainerControl, dict]:
    """`control` with rank 0's flags: a callback that decides from one rank's view (its `is_world_process_zero`, its
    clock, its files) cannot make the ranks stop, save or evaluate at different steps. With them, the preemption
    signals the ranks received (`signal`: its name, or None), as {rank: name} of those that did, the same on every
    rank: a signal to one process is an event for all."""
    mine = {"flags": {flag: bool(getattr(control, flag)) for flag in CONTROL_FLAGS}, "signal": signal}
    if world_size() <= 1:
        every = [mine]
    else:
        with together(f"agree with the other processes on the callbacks' {when}"):
            every = all_gather_json(mine)
    for flag in CONTROL_FLAGS:
        setattr(control, flag, bool(every[0]["flags"][flag]))
    return control, {rank: str(told["signal"]) for rank, told in enumerate(every) if told["signal"] is not None}


def shared_fields(state: TrainerState) -> dict:
    """`state` as `trainer_state.json` holds it, less what is per process: its rank flags, logged timings, and where
    output_dir is mounted (the best checkpoint is compared by its folder's name)."""
    fields = json.loads(json.dumps(dataclasses.asdict(state), default=str))
    for name in PER_RANK_FIELDS:
        fields.pop(name, None)
    if fields.get("best_model_checkpoint"):
        fields["best_model_checkpoint"] = os.path.basename(os.path.normpath(fields["best_model_checkpoint"]))
    fields["log_history"] = [{key: value for key, value in entry.items() if not TIMING.fullmatch(key)}
                             for entry in fields.get("log_history", [])]
    return fields


def checkpoints_on_disk(run_dir: str) -> list[str]:
    """The published checkpoint folders of `run_dir`, by step."""
    if not os.path.isdir(run_dir):
        return []
    names = [name for name in os.listdir(run_dir) if CHECKPOINT.fullmatch(name)]
    return sorted(names, key=lambda name: int(name.rsplit("-", 1)[1]))


def check_ranks_agree(state: TrainerState, run_dir: str, where: str) -> None:
    """At a drain point: every rank holds the same `TrainerState` (`shared_fields`) and sees the same checkpoints
    in `run_dir`; else the same RuntimeError on every rank, naming the fields and what each rank holds (a
    collective; nothing to compare with one process). Fields travel as digests, their values only when they differ."""
    if world_size() <= 1:
        return
    fields = shared_fields(state)
    fields["checkpoints on disk"] = checkpoints_on_disk(run_dir)
    with together(f"compare its trainer state with the other processes' {where}"):
        differ = _differing(fields)
        if not differ:
            return
        lists = {key: fields[key] for key in differ if isinstance(fields.get(key), list)}
        if lists:  # name the first entries that differ, not the whole log history
            entries = {f"{key}[{index}]": entry for key, value in lists.items() for index, entry in enumerate(value)}
            entries.update({f"{key} length": len(value) for key, value in lists.items()})
            differ = [key for key in differ if key not in lists] + _differing(entries)
            fields.update(entries)
        everyone, _ = disagreements({key: fields.get(key) for key in differ[:4]})
    shown = "; ".join(f"{key}: " + ", ".join(f"rank {rank} {_short(other.get(key))}" for rank, other in
                                             enumerate(everyone)) for key in differ[:4])
    raise RuntimeError(f"the processes disagree on {', '.join(differ[:8])} {where} ({shown}): every process must "
                       "make the same decisions (a callback or a change to trainer.state on one process only?)")


def _differing(fields: dict) -> list[str]:
    """The keys of `fields` whose values differ between ranks (compared as digests; a collective)."""
    digests = {key: hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]
               for key, value in fields.items()}
    return disagreements(digests)[1]


def _short(value, limit: int = 120) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[: limit - 3] + "..."
