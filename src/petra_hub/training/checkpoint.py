"""What a PETRA checkpoint adds to a saved model folder: the optimizer and LR-scheduler state of every stage
(`petra_stage_XXX.pt`, from `Pipeline.state_dict`, indexed by stage so a run may resume on another number of
processes with the same stages) and the run's position (`petra_state.json`).

Stage files hold tensors and plain containers only and are read with `torch.load(weights_only=True)`: a
checkpoint may come from someone else, and loading it must never run code.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..engine import Pipeline

PETRA_STATE_NAME = "petra_state.json"
STAGE_STATE_PATTERN = "petra_stage_{:03d}.pt"


@dataclass
class PetraState:
    micro_batches_fed: int
    num_stages: int
    mode: str
    accumulation_steps: int

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
