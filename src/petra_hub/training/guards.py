"""Checks that keep a run from losing work or writing something it cannot resume from: finite weights before
every drain point and save, a writable output folder with room for a checkpoint, one run per folder at a time."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import socket
import time
from itertools import chain
from pathlib import Path

import torch

from ..engine import Pipeline, all_gather_json
from ..models.families import family_named
from ..models.loading_checks import non_finite_tensors
from .distributed import together, world_size

# Named `_*`, as the staging folders (checkpoint.py), so that Trainer's Hub pushes of output_dir (which ignore `_*`
# and `checkpoint-*`) never upload it: a clone of the repository must not hold this host's lock.
LOCK_NAME = "_petra_run.lock"
RUN_FILES = ("trainer_state.json", "model.safetensors", "petra_state.json")
# What a run writes at the top of output_dir, cleared by overwrite_output_dir when an earlier run is there (its
# RUN_FILES or checkpoints); nothing else is touched. Checkpoint folders must hold a run's files, and the model
# card, the configuration and the code files save_pretrained copies must be petra_hub's.
RUN_OUTPUTS = {*RUN_FILES, "training_args.bin", "preprocessor_config.json", "model.safetensors.index.json",
               "all_results.json", "train_results.json", "eval_results.json", "predict_results.json",
               "predict_results.txt"}
CHECKPOINT_FOLDER = re.compile(r"(_tmp-)?checkpoint-\d+")  # published or staged
SHARDS = re.compile(r"model-\d+-of-\d+\.safetensors")
CHECKPOINT_MARKS = ("trainer_state.json", "petra_state.json", "petra_stage_*.pt", "rng_state_*.pth")

logger = logging.getLogger(__name__)


def check_finite(pipeline: Pipeline, when: str) -> None:
    """Raise FloatingPointError on every rank if any rank's stage holds a non-finite weight or statistic."""
    problem = None
    for index in pipeline.local:
        names = non_finite_tensors(pipeline.stages[index])
        if names:
            problem = f"stage {index} ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''})"
            break
    if world_size() > 1:
        with together(f"agree that every stage's weights are finite {when}"):
            problems = all_gather_json(problem)  # JSON: a peer's message is never unpickled
        problem = next((str(p) for p in problems if p), None)
    if problem:
        raise FloatingPointError(
            f"non-finite weights or batch-norm statistics in {problem} {when}: training diverged (lower the "
            "learning rate, clip gradients with max_grad_norm, check the inputs); nothing is saved in this state"
        )


def checkpoint_bytes(model: torch.nn.Module) -> int:
    """A generous estimate of one checkpoint's size: weights, two optimizer buffers per weight, the model folder."""
    weights = sum(t.numel() * t.element_size() for t in chain(model.parameters(), model.buffers()))
    return 4 * weights + (1 << 20)


def check_output_dir(folder: str, model: torch.nn.Module) -> None:
    """Fail before the first step if `folder` cannot be written or has no room for a checkpoint."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = Path(folder, f"_petra_write_probe_{os.getpid()}")
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as error:
        raise PermissionError(f"output_dir {folder!r} is not writable ({error}); nothing was trained") from error
    free, needed = shutil.disk_usage(folder).free, checkpoint_bytes(model)
    if free < needed:
        raise OSError(
            f"output_dir {folder!r} has {free / 2**20:.0f} MiB free, less than one checkpoint needs "
            f"(about {needed / 2**20:.0f} MiB); nothing was trained"
        )


def check_not_another_run(folder: str, resume_from_checkpoint: str | None, overwrite: bool) -> None:
    """Refuse to train into a folder that holds another run's results (unless told to overwrite them): exactly the
    files `clear_earlier_run` would remove, so that the remedy the error names clears what it complains of."""
    if overwrite or not os.path.isdir(folder) or resumes_its_own_run(folder, resume_from_checkpoint):
        return
    found = earlier_run_outputs(Path(folder))
    if found:
        raise FileExistsError(
            f"output_dir {folder!r} already holds another run "
            f"({', '.join(found[:3])}{', ...' if len(found) > 3 else ''}): "
            "choose another output_dir, resume from one of its checkpoints, or set overwrite_output_dir=True"
        )


def resumes_its_own_run(folder: str, resume_from_checkpoint: str | None) -> bool:
    """Whether the run continues from one of `folder`'s own checkpoints (then the folder's run is not another's)."""
    return bool(resume_from_checkpoint) and Path(resume_from_checkpoint).resolve().parent == Path(folder).resolve()


def clear_earlier_run(folder: str, resume_from_checkpoint: str | None) -> list[str]:
    """overwrite_output_dir: remove what an earlier run wrote in `folder`, so that its metrics, checkpoints and
    model files cannot mix with this run's (or be pushed with them). Only where an earlier run is there (one of
    `RUN_FILES` or of its checkpoints), only its outputs (`earlier_run_outputs`), never when resuming from a
    checkpoint of `folder`. Returns the names removed, also logged."""
    if not os.path.isdir(folder) or resumes_its_own_run(folder, resume_from_checkpoint):
        return []
    removed = earlier_run_outputs(Path(folder))
    for name in removed:
        path = Path(folder, name)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    if removed:
        logger.warning("overwrite_output_dir: removed the earlier run's files from %s: %s", folder, ", ".join(removed))
    return removed


def earlier_run_outputs(folder: Path) -> list[str]:
    """The names of what an earlier petra_hub run wrote at the top of `folder`: none unless one of its `RUN_FILES` or
    checkpoints is there."""
    family = family_named(_model_type(folder / "config.json"))
    ours = set() if family is None else {*family.code_files(), "config.json"}
    if _is_our_card(folder / "README.md"):
        ours.add("README.md")
    names = []
    for path in folder.iterdir():
        if path.is_dir() and not path.is_symlink():
            if CHECKPOINT_FOLDER.fullmatch(path.name) and any(any(path.glob(mark)) for mark in CHECKPOINT_MARKS):
                names.append(path.name)
        elif path.name in RUN_OUTPUTS or path.name in ours or SHARDS.fullmatch(path.name):
            names.append(path.name)
    earlier = any(name in RUN_FILES or CHECKPOINT_FOLDER.fullmatch(name) for name in names)
    return sorted(names) if earlier else []


def _model_type(config: Path) -> str | None:
    try:
        value = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value.get("model_type") if isinstance(value, dict) else None


def _is_our_card(card: Path) -> bool:
    """A model card petra_hub wrote: its YAML header tags it `petra_hub`."""
    try:
        text = card.read_text(encoding="utf-8", errors="replace")[:8192]
    except OSError:
        return False
    header = text.split("---", 2)[1] if text.startswith("---") and text.count("---") >= 2 else ""
    return "petra_hub" in header


class RunLock:
    """`output_dir/_petra_run.lock`, held by the saving process while it trains: a second run into the same folder
    fails at once instead of silently mixing checkpoints. Held as an exclusive `fcntl.flock` on the file, which the
    kernel drops when the holder dies: a dead run's lock is free at once, and no pid is read to decide it. The file
    holds the holder's {pid, host, since} for the error message only.
    Across hosts (a folder on NFS) it holds only as far as flock does there."""

    ATTEMPTS = 100  # each retry follows a release or a takeover that happened between our open and our flock

    def __init__(self, folder: str):
        self.path = Path(folder, LOCK_NAME)
        self.held = False
        self._fd: int | None = None
        self._owner_pid: int | None = None

    def acquire(self) -> None:
        for _ in range(self.ATTEMPTS):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                taken = self._take(fd)
            except BaseException:
                os.close(fd)
                raise
            if taken:
                self._fd, self._owner_pid, self.held = fd, os.getpid(), True
                return
            os.close(fd)
        raise FileExistsError(f"could not take the run lock {str(self.path)!r}")

    def _take(self, fd: int) -> bool:
        """Lock the file open as `fd` and write this process in; False where the path names another file by then
        (its holder released it, unlinking it, after our open): lock the path's new file instead. Refuses where
        the path's file is locked by a live holder."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not self._names(fd):
                return False
            self._refuse(_holder_of(fd))
        if not self._names(fd):
            return False
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(owner).encode(), 0)
        return True

    def _names(self, fd: int) -> bool:
        """Whether the lock's path still names the file open as `fd`."""
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path))
        except FileNotFoundError:
            return False

    def _refuse(self, holder: dict) -> None:
        raise FileExistsError(
            f"another run (process {holder.get('pid')} on {holder.get('host')}) is training into "
            f"{str(self.path.parent)!r}; wait for it or choose another output_dir"
        ) from None

    def release(self) -> None:
        if not self.held:
            return
        fd, self._fd, self.held = self._fd, None, False
        if self._owner_pid == os.getpid():  # a forked child's copy of the fd must not end its parent's lock
            self.path.unlink(missing_ok=True)  # before the close: whoever flocks this file next sees it unlinked
        os.close(fd)

    def __del__(self):
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter exit the kernel drops the lock anyway
            pass


def _holder_of(fd: int, patience: float = 0.25) -> dict:
    """Who holds the lock open as `fd`, as it wrote after taking it: a holder between its flock and its write has
    written nothing yet, so an empty or partial file is read again, for `patience` seconds at most."""
    delay, waited = 0.0005, 0.0
    while True:
        try:
            holder = json.loads(os.pread(fd, 4096, 0))
        except (OSError, ValueError):
            holder = None
        if isinstance(holder, dict):
            return holder
        if waited >= patience:
            return {"pid": "unknown", "host": "an unknown host"}
        time.sleep(delay)
        waited, delay = waited + delay, min(2 * delay, 0.02)


def check_and_lock_output_dir(args, model: torch.nn.Module, replica: int,
                              resume_from_checkpoint: str | None) -> RunLock:
    """What can fail later is checked before any work: the output folder (writable, room for a checkpoint, not
    another run's unless overwrite_output_dir, which clears the earlier run's files, not in use); returns its lock,
    taken where this process saves. (The checkpoint to resume from is checked by `PetraTrainer.train`.)"""
    writes_checkpoints = args.save_strategy != "no" and replica == 0  # its stages' optimizer states
    if args.should_save or writes_checkpoints:
        check_output_dir(args.output_dir, model)
    lock = RunLock(args.output_dir)
    if args.should_save:
        check_not_another_run(args.output_dir, resume_from_checkpoint, args.overwrite_output_dir)
        lock.acquire()
        if args.overwrite_output_dir:
            try:
                clear_earlier_run(args.output_dir, resume_from_checkpoint)
            except BaseException:
                lock.release()  # the caller never gets it: do not leave the folder locked by this process
                raise
    return lock
