"""What a PETRA checkpoint adds to a saved model folder: the optimizer and LR-scheduler state of every stage
(`petra_stage_XXX.pt`, from `Pipeline.state_dict`, indexed by stage so a run may resume on another number of
processes with the same stages) and the run's position (`petra_state.json`).

Stage files hold tensors and plain containers only and are read with `torch.load(weights_only=True)`: a
checkpoint may come from someone else, and loading it must never run code.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ..engine import Pipeline

PETRA_STATE_NAME = "petra_state.json"
STAGE_STATE_PATTERN = "petra_stage_{:03d}.pt"


@dataclass
class PetraState:
    micro_batches_fed: int
    num_stages: int
    mode: str
    accumulation_steps: int
    epoch: int | None = None  # where the next micro-batch comes from (None in checkpoints of version 0.1)
    epoch_offset: int | None = None

    def save(self, folder: str | Path) -> None:
        Path(folder, PETRA_STATE_NAME).write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, folder: str | Path) -> "PetraState":
        return cls(**json.loads(Path(folder, PETRA_STATE_NAME).read_text()))


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
    pipeline.load_state_dict(states)


def save_checkpoint_files(trainer, output_dir: str, run_dir: str, state: PetraState) -> None:
    """Everything a checkpoint holds beside the model folder: the stages' optimizer states (written by replica 0's
    ranks), then, on the saving rank, `petra_state.json`, the callbacks' states and `trainer_state.json` (with the
    best checkpoint so far), and the rotation of old checkpoints (which keeps the best one)."""
    os.makedirs(output_dir, exist_ok=True)
    if trainer.pipeline.replica == 0:
        save_stage_states(output_dir, trainer.pipeline)
    if not trainer.args.should_save:
        return
    state.save(output_dir)
    for callback in [cb for cb in trainer.callback_handler.callbacks + [trainer.control] if isinstance(cb, ExportableState)]:
        name = callback.__class__.__name__
        if isinstance(trainer.state.stateful_callbacks.get(name), list):
            trainer.state.stateful_callbacks[name].append(callback.state())
        else:
            trainer.state.stateful_callbacks[name] = callback.state()
    if trainer.state.best_global_step:
        best = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.best_global_step}")
        if os.path.isdir(best):
            trainer.state.best_model_checkpoint = best
    trainer.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
    rotate_checkpoints(
        output_dir=run_dir,
        save_total_limit=trainer.args.save_total_limit,
        best_model_checkpoint=trainer.state.best_model_checkpoint,
        use_mtime=False,
    )


def load_best_model(model: torch.nn.Module, checkpoint: str | Path) -> None:
    """Load the weights of the best checkpoint into `model` (on every rank: stages share the model's modules)."""
    path = Path(checkpoint, "model.safetensors")
    if not path.is_file():
        raise FileNotFoundError(f"the best checkpoint {checkpoint} holds no model.safetensors")
    model.load_state_dict(load_file(str(path), device=str(next(model.parameters()).device)))
