"""PETRA checkpoints: written whole or not at all, and read without running code.

What a PETRA checkpoint adds to a saved model folder: the optimizer and LR-scheduler state of every stage
(`petra_stage_XXX.pt`, from `Pipeline.state_dict`, indexed by stage so a run may resume on another number of
processes with the same stages and the same number of pipeline replicas) and the run's position
(`petra_state.json`).

A checkpoint is written into `_tmp-checkpoint-N/` (which `get_last_checkpoint`, the rotation and the Hub pushes of
output_dir ignore), checked to hold every file, then renamed to `checkpoint-N/` in one step; only then are old
checkpoints rotated out. A run killed at any moment therefore leaves its last complete checkpoint.

Stage files hold tensors and plain containers only and are read with `torch.load(weights_only=True)`: a
checkpoint may come from someone else, and loading it must never run code.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import TrainerState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, HubStrategy, get_last_checkpoint

from ..engine import Pipeline
from .agreement import checkpoints_on_disk, from_rank_zero
from .card import write_run_card
from .distributed import barrier, process_rank
from .guards import checkpoint_bytes
from .rng_state import RNG_STATE_PATTERN, read_rng_state, save_rng_state

PETRA_STATE_NAME = "petra_state.json"
STAGE_STATE_PATTERN = "petra_stage_{:03d}.pt"

logger = logging.getLogger(__name__)


@dataclass
class PetraState:
    micro_batches_fed: int
    num_stages: int
    mode: str
    accumulation_steps: int
    epoch: int | None = None  # where the next micro-batch comes from (None in checkpoints of version 0.1)
    epoch_offset: int | None = None
    micro_batch_size: int | None = None
    dataset: str | None = None  # the train set's name and size, e.g. "digits (1437)"
    stage_groups: list[int] | None = None  # model stages per pipeline stage (None in older checkpoints)
    # pipeline replicas: an epoch's position counts micro-batches per replica (None in older checkpoints)
    data_parallel: int | None = None
    # the stages' optimizer class, e.g. "AdamW": another cannot load their states (None in older checkpoints)
    optimizer: str | None = None
    # `batches.labels_digest` of the train set (None for a stream, and in older checkpoints)
    train_labels: str | None = None
    # [micro-batch, micro-batches of its step] for the micro-batches in flight, whose losses come after the save
    # (`losses.PendingLosses.open_steps`; empty when the pipeline was drained, None in older checkpoints)
    loss_steps: list[list[int]] | None = None

    def check_compatible(self, other: "PetraState", folder) -> None:
        """Refuse to resume a run whose set-up differs from the checkpoint's (fields unknown to old checkpoints are
        not compared)."""
        keys = ("num_stages", "stage_groups", "mode", "accumulation_steps", "micro_batch_size", "dataset",
                "data_parallel", "optimizer", "train_labels")
        differ = [
            f"{key}: checkpoint {getattr(self, key)!r}, this run {getattr(other, key)!r}"
            for key in keys
            if getattr(self, key) is not None and getattr(self, key) != getattr(other, key)
        ]
        if differ:
            raise different_run(folder, differ)

    def save(self, folder: str | Path) -> None:
        Path(folder, PETRA_STATE_NAME).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, folder: str | Path) -> "PetraState":
        path = Path(folder, PETRA_STATE_NAME)
        try:
            state = cls(**json.loads(path.read_text()))
        except FileNotFoundError:
            raise FileNotFoundError(f"{folder} is not a PETRA checkpoint: it lacks {PETRA_STATE_NAME}") from None
        except (ValueError, TypeError, RecursionError) as error:
            raise ValueError(f"{path} is unreadable (the checkpoint is incomplete or corrupt): {type(error).__name__}: "
                             f"{error}") from None
        wrong = [key for key, least in _COUNTS.items() if not _count_or_none(getattr(state, key), least)]
        texts = ("mode", "dataset", "optimizer", "train_labels")
        wrong += [key for key in texts if not isinstance(getattr(state, key), (str, type(None)))]
        if not (state.stage_groups is None or isinstance(state.stage_groups, list)
                and all(_count_or_none(size, 1) and size is not None for size in state.stage_groups)):
            wrong.append("stage_groups")
        if not (state.loss_steps is None or isinstance(state.loss_steps, list) and all(
                isinstance(pair, list) and len(pair) == 2 and _count_or_none(pair[0], 0) and pair[0] is not None
                and _count_or_none(pair[1], 1) and pair[1] is not None for pair in state.loss_steps)):
            wrong.append("loss_steps")
        if wrong:
            raise ValueError(f"{path} is corrupt: {', '.join(wrong)} must be whole numbers (at least 1 for counts "
                             f"of stages, steps, sizes and replicas; at least 0 for positions), got "
                             f"{', '.join(f'{key}={getattr(state, key)!r}' for key in wrong)}")
        return state


def different_run(folder, differences: list[str]) -> ValueError:
    return ValueError(f"cannot resume from {folder}: it belongs to a different run ({'; '.join(differences)})")


# PetraState's whole-number fields and their least values
_COUNTS = {"micro_batches_fed": 0, "num_stages": 1, "accumulation_steps": 1, "epoch": 0, "epoch_offset": 0,
           "micro_batch_size": 1, "data_parallel": 1}


def _count_or_none(value, least: int) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= least)


def missing_files(folder: str, num_stages: int) -> list[str]:
    """The files of a complete checkpoint of `num_stages` stages that `folder` lacks."""
    stages = [STAGE_STATE_PATTERN.format(index) for index in range(num_stages)]
    required = ["config.json", "model.safetensors", "trainer_state.json", PETRA_STATE_NAME, *stages]
    return [name for name in required if not Path(folder, name).is_file()]


def staging_dir(final: str) -> str:
    """Where checkpoint `final` is written before it is published (invisible to `get_last_checkpoint`)."""
    return os.path.join(os.path.dirname(final), "_tmp-" + os.path.basename(final))


def publish_checkpoint(staging: str, final: str, num_stages: int) -> None:
    """Check that `staging` holds the whole checkpoint, then rename it to `final` (replacing an older one)."""
    missing = missing_files(staging, num_stages)
    if missing:
        raise RuntimeError(
            f"checkpoint {final} is incomplete (missing {', '.join(missing[:4])}); it was not published and the "
            "previous checkpoints are kept"
        )
    if os.path.isdir(final):
        aside = os.path.join(os.path.dirname(final), "_tmp-replaced-" + os.path.basename(final))
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(final, aside)
        os.replace(staging, final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.replace(staging, final)


def checkpoint_to_resume(value: str | bool | None, output_dir: str, num_stages: int | None = None) -> str | None:
    """`train(resume_from_checkpoint=...)`: a folder, or True for the last `checkpoint-N` of `output_dir`; None or
    False to start afresh. With `num_stages`, the folder's files are checked before transformers reads any of it."""
    if value is True:
        value = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if value is None:
            raise ValueError(f"resume_from_checkpoint=True, but output_dir {output_dir!r} holds no checkpoint-N "
                             "folder to resume from (save_strategy 'no' saves none)")
    if not value:
        return None
    if not os.path.isdir(value):
        raise FileNotFoundError(f"resume_from_checkpoint {str(value)!r} is not a checkpoint folder")
    if num_stages is not None:
        validate_checkpoint(value, num_stages)
    return str(value)


def load_trainer_state(folder: str, run_dir: str) -> TrainerState:
    """The `trainer_state.json` of checkpoint `folder` (errors name the file), its best checkpoint derived inside
    `run_dir`, the folder this run saves into, from `best_global_step`: a path read from a checkpoint is never used
    (it may name any folder, and one outside `run_dir` would be loaded at the end and protected from rotation). Where
    `run_dir` holds no checkpoint of that step (resumed from another folder's checkpoint, or pruned), the best
    checkpoint is forgotten with a warning and, as in Trainer, the best metric stays, so that only a better model
    is named the best."""
    path = os.path.join(folder, "trainer_state.json")
    state = _read_trainer_state(path)
    named, state.best_model_checkpoint = state.best_model_checkpoint, None
    if state.best_global_step:
        best = checkpoint_folder(run_dir, state.best_global_step)
        if Path(best, "model.safetensors").is_file():
            state.best_model_checkpoint = best
        else:
            logger.warning("the best checkpoint that %s names (step %d, %s) does not exist anymore in %s; it is "
                           "ignored for this run", path, state.best_global_step, named, run_dir)
    return state


def _read_trainer_state(path: str) -> TrainerState:
    try:
        state = TrainerState.load_from_json(path)
    except (TypeError, ValueError, KeyError, RecursionError) as error:
        raise ValueError(f"{path} is not a trainer state transformers can read: {type(error).__name__}: "
                         f"{error}") from None
    counts = {"global_step": state.global_step, "max_steps": state.max_steps}
    wrong = [key for key, value in counts.items() if not _count_or_none(value, 0) or value is None]
    if wrong or not isinstance(state.log_history, list):
        raise ValueError(f"{path} is corrupt: {', '.join(wrong) or 'log_history'} is not what Trainer writes")
    return state


def validate_checkpoint(folder: str, num_stages: int) -> None:
    """Before resuming: the checkpoint has this run's `num_stages`, and every file is there and readable (a
    truncated file names itself)."""
    from safetensors import safe_open

    if Path(folder, PETRA_STATE_NAME).is_file():  # each reader names its file when it is truncated or corrupt
        saved = PetraState.load(folder)
        if saved.num_stages != num_stages:  # not "incomplete": it lacks this run's stages, or has more
            raise different_run(folder, [f"num_stages: checkpoint {saved.num_stages}, this run {num_stages}"])
    missing = missing_files(folder, num_stages)
    if missing:
        raise FileNotFoundError(f"checkpoint {folder} is incomplete: it lacks {', '.join(missing[:4])}")
    _read_trainer_state(os.path.join(folder, "trainer_state.json"))
    try:
        with safe_open(str(Path(folder, "model.safetensors")), framework="pt") as handle:
            handle.keys()
    except Exception as error:
        raise ValueError(
            f"{Path(folder, 'model.safetensors')} is unreadable (the checkpoint is incomplete): {error}"
        ) from None
    for path in sorted(Path(folder).glob(RNG_STATE_PATTERN.format("*"))):
        read_rng_state(path)


def save_stage_states(folder: str | Path, pipeline: Pipeline) -> None:
    """Write one file per stage this rank runs."""
    for index, state in pipeline.state_dict().items():
        torch.save(state, Path(folder, STAGE_STATE_PATTERN.format(index)))


def load_stage_states(folder: str | Path, pipeline: Pipeline) -> None:
    """Restore the states of the stages this rank runs from `folder`."""
    saved = PetraState.load(folder)
    if saved.num_stages != pipeline.num_stages:
        raise ValueError(
            f"checkpoint {folder} was trained with {saved.num_stages} stages, this run has {pipeline.num_stages}"
        )
    states = {}
    for index in pipeline.local:
        path = Path(folder, STAGE_STATE_PATTERN.format(index))
        if not path.exists():
            raise FileNotFoundError(f"checkpoint {folder} lacks {path.name} (optimizer state of stage {index})")
        try:  # never unpickle code: a checkpoint may come from someone else
            states[index] = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as error:
            raise ValueError(
                f"cannot resume from {path}: not a readable stage state (optimizer and scheduler tensors only); "
                f"the checkpoint is incomplete, corrupt or unsafe ({type(error).__name__}: {error})"
            ) from error
    try:
        pipeline.load_state_dict(states)
    except Exception as error:  # a corrupt or foreign state: the optimizer's or scheduler's own error
        raise ValueError(f"cannot resume from {folder}: the stage states ({', '.join(map(str, states))}) do not fit "
                         f"this run's optimizers and schedulers ({type(error).__name__}: {error})") from error


def save_checkpoint_files(trainer, folder: str, state: PetraState) -> None:
    """Everything a checkpoint holds beside the model folder: the stages' optimizer states (written by replica 0's
    ranks), every rank's random generators, then, on the saving rank, `petra_state.json` and `trainer_state.json`."""
    os.makedirs(folder, exist_ok=True)
    if trainer.pipeline.replica == 0:
        save_stage_states(folder, trainer.pipeline)
    save_rng_state(folder, process_rank())
    if trainer.args.should_save:
        state.save(folder)
        trainer.state.save_to_json(os.path.join(folder, "trainer_state.json"))


def record_callback_states(trainer) -> None:
    """The callbacks' states go into the trainer state a checkpoint saves, on every rank (as Trainer does)."""
    for callback in trainer._exportable_callbacks():
        name = callback.__class__.__name__
        if isinstance(trainer.state.stateful_callbacks.get(name), list):
            trainer.state.stateful_callbacks[name].append(callback.state())
        else:
            trainer.state.stateful_callbacks[name] = callback.state()


def best_checkpoint(state: TrainerState, run_dir: str, final: str) -> str | None:
    """The best checkpoint so far: the one of step `best_global_step` in `run_dir`, once published (or `final`,
    being written), as Trainer decides it; None while there is none."""
    if not state.best_global_step:
        return None
    best = checkpoint_folder(run_dir, state.best_global_step)
    return best if best == final or os.path.isdir(best) else None


def checkpoint_folder(run_dir: str, step: int) -> str:
    return os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")


def checkpoint_step(path: str) -> int:
    return int(os.path.basename(os.path.normpath(path)).rsplit("-", 1)[1])


def rotate(trainer, run_dir: str, final: str) -> None:
    """After `final` is published: delete the checkpoints numbered beyond it, which belong to a continuation the run
    abandoned when it resumed from an earlier checkpoint (so that `resume_from_checkpoint=True` never returns to it),
    then the oldest beyond `save_total_limit`, never `final` nor the best one."""
    step = checkpoint_step(final)
    checkpoints = [os.path.join(run_dir, name) for name in checkpoints_on_disk(run_dir)]
    abandoned = [path for path in checkpoints if checkpoint_step(path) > step]
    if abandoned:
        logger.warning("deleted %s: checkpoints beyond step %d, of the continuation this run abandoned when it "
                       "resumed from an earlier checkpoint", ", ".join(map(os.path.basename, abandoned)), step)
    for path in abandoned:
        shutil.rmtree(path, ignore_errors=True)
    limit = trainer.args.save_total_limit
    if not limit or limit <= 0:
        return
    kept = [path for path in checkpoints if path not in abandoned]
    best = trainer.state.best_model_checkpoint
    protected = {step} | ({checkpoint_step(best)} if best else set())
    remaining = len(kept)
    for path in kept:  # oldest first
        if remaining <= max(limit, len(protected)):
            break
        if checkpoint_step(path) not in protected:
            shutil.rmtree(path, ignore_errors=True)
            remaining -= 1


def end_with_the_best(trainer, run_dir: str) -> None:
    """At the end of training, as Trainer: the best checkpoint's weights in the model (`load_best_model_at_end`),
    and, with `save_total_limit=1`, every other checkpoint deleted."""
    best = trainer.state.best_model_checkpoint
    if best is None:
        return
    if trainer.args.load_best_model_at_end:
        load_best_model(trainer.model, best)
    if trainer.args.save_total_limit == 1:
        if trainer.args.should_save:
            for name in checkpoints_on_disk(run_dir):
                if checkpoint_step(name) != checkpoint_step(best):
                    shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
        barrier(f"see the checkpoints other than the best deleted from {run_dir}")


def load_best_model(model: torch.nn.Module, checkpoint: str | Path) -> None:
    """Load the weights of the best checkpoint into `model` (on every rank: stages share the model's modules)."""
    path = Path(checkpoint, "model.safetensors")
    if not path.is_file():
        raise FileNotFoundError(f"the best checkpoint {checkpoint} holds no model.safetensors")
    model.load_state_dict(load_file(str(path), device=str(next(model.parameters()).device)))


def write_checkpoint_card(trainer, final: str) -> None:
    """The model card `save_model` wrote in the staging folder names that folder (its model name, where the snippets
    load from, unless the run has a Hub repository): it is written again for `final`, once published (a run killed
    in between leaves the first one)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="model card:")  # given when the first one was written
        write_run_card(trainer, final)


def pushes_now(trainer) -> bool:
    """Whether `Trainer._push_from_checkpoint` uploads now: on process 0, unless `hub_strategy` is "end" or the
    previous push is still uploading (and `hub_always_push` is false)."""
    busy = trainer.push_in_progress is not None and not trainer.push_in_progress.is_done()
    return (trainer.is_world_process_zero() and trainer.args.hub_strategy != HubStrategy.END
            and (trainer.args.hub_always_push or not busy))


def copy_repository_files(checkpoint: str, output_dir: str) -> None:
    """Besides the configuration and weights Trainer copies from `checkpoint` to `output_dir` before pushing it: the
    code files its config.json names in auto_map (`trust_remote_code`), its image processor (which Trainer saves
    again only from a `processing_class`) and its model card."""
    extras = [Path(checkpoint, name) for name in ("preprocessor_config.json", "README.md")]
    for path in [*sorted(Path(checkpoint).glob("*.py")), *extras]:
        if path.is_file():
            shutil.copyfile(path, Path(output_dir, path.name))


def write_checkpoint(trainer, run_dir: str, state: PetraState) -> None:
    """Write `checkpoint-N` whole or not at all (call it on every rank): into `_tmp-checkpoint-N`, then checked and
    renamed by the saving rank, which only then gives it its card, rotates old checkpoints out and pushes (per
    `hub_strategy`). The best checkpoint is decided by rank 0 and is the same on every rank."""
    final = checkpoint_folder(run_dir, trainer.state.global_step)
    staging = staging_dir(final)
    if trainer.args.should_save:
        shutil.rmtree(staging, ignore_errors=True)  # left by a run killed while saving
    with device_room(trainer, staging, run_dir):
        trainer.save_model(staging, _internal_call=True)
        record_callback_states(trainer)
        best = best_checkpoint(trainer.state, run_dir, final)
        trainer.state.best_model_checkpoint = from_rank_zero(best, "the best checkpoint")
        save_checkpoint_files(trainer, staging, state)
    barrier(f"write their parts of {final}")
    if trainer.args.should_save:
        publish_checkpoint(staging, final, state.num_stages)
        write_checkpoint_card(trainer, final)
        rotate(trainer, run_dir, final)
    if trainer.args.push_to_hub:
        trainer._push_from_checkpoint(final)
    barrier(f"see {final} published")


@contextlib.contextmanager
def device_room(trainer, staging: str, run_dir: str):
    """A checkpoint that cannot be written because its device is full is an OSError that says so, names the file
    being written and the last complete checkpoint (the half-written one is removed, to give the room back)."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        full = isinstance(error, OSError) and error.errno == errno.ENOSPC
        try:
            full = full or shutil.disk_usage(run_dir).free < checkpoint_bytes(trainer.model)
        except OSError:
            pass
        if not full:
            raise
        written = sorted(Path(staging).glob("*"), key=lambda path: path.stat().st_mtime) if os.path.isdir(staging) \
            else []
        last = get_last_checkpoint(run_dir) if os.path.isdir(run_dir) else None
        shutil.rmtree(staging, ignore_errors=True)
        raise OSError(
            errno.ENOSPC,
            f"the device holding {run_dir} is full: writing {written[-1] if written else staging} failed "
            f"({type(error).__name__}: {error}). The checkpoint of step {trainer.state.global_step} was not "
            f"published; the last complete checkpoint is {last or 'none (no checkpoint was written yet)'}. Free "
            "space (or lower save_total_limit) and resume from it",
        ) from error
