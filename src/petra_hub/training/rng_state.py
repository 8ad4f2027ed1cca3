"""Each rank's random number generators in a checkpoint (`rng_state_<rank>.pth`), so that a resumed run draws what
the uninterrupted run would have drawn: dropout and stochastic depth in the stages, random augmentations read in
the main process. Tensors only, read with `torch.load(weights_only=True)`.

The generators are restored only where the checkpoint was written by as many processes as resume it (rank r then
runs the same stages as before); otherwise, or from a checkpoint older than this file, the run goes on with fresh
generators and says so.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import torch

RNG_STATE_PATTERN = "rng_state_{}.pth"

logger = logging.getLogger(__name__)


def save_rng_state(folder: str | Path, rank: int) -> None:
    python = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "python": torch.tensor(python[1], dtype=torch.int64),
        "python_gauss": torch.tensor([] if python[2] is None else [python[2]], dtype=torch.float64),
        "numpy_keys": torch.from_numpy(keys.astype(np.int64)),
        "numpy_position": torch.tensor([position, has_gauss], dtype=torch.int64),
        "numpy_gauss": torch.tensor([cached], dtype=torch.float64),
    }
    torch.save(state, Path(folder, RNG_STATE_PATTERN.format(rank)))


def restore_rng_state(folder: str | Path, rank: int, world_size: int) -> bool:
    """Restore this rank's generators from checkpoint `folder`; False (with a warning) where it cannot."""
    saved = sorted(Path(folder).glob(RNG_STATE_PATTERN.format("*")))
    if len(saved) != world_size:
        logger.warning(
            "%s holds the random generators of %d processes, this run has %d: random draws (dropout, stochastic "
            "depth, augmentations) go on from fresh generators, not as the uninterrupted run's would",
            folder, len(saved), world_size,
        )
        return False
    state = read_rng_state(Path(folder, RNG_STATE_PATTERN.format(rank)))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    gauss = state["python_gauss"].tolist()
    random.setstate((3, tuple(state["python"].tolist()), gauss[0] if gauss else None))
    position, has_gauss = state["numpy_position"].tolist()
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), position, has_gauss,
                         float(state["numpy_gauss"][0])))
    return True


def read_rng_state(path: Path) -> dict:
    """One rank's saved generators, checked against what each generator takes (so that restoring cannot fail half
    way, after some generators were set): a ValueError naming the file otherwise."""
    try:  # never unpickle code: a checkpoint may come from someone else
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(f"cannot resume from {path}: not a readable generator state ({error})") from error
    expected = {  # name: (dtype, number of elements, or None for any)
        "torch": (torch.uint8, torch.get_rng_state().numel()), "python": (torch.int64, 625),
        "python_gauss": (torch.float64, None), "numpy_keys": (torch.int64, 624),
        "numpy_position": (torch.int64, 2), "numpy_gauss": (torch.float64, 1),
    }
    problems = [name for name, (dtype, numel) in expected.items()
                if not isinstance(state, dict) or not torch.is_tensor(state.get(name)) or state[name].dtype != dtype
                or (numel is not None and state[name].numel() != numel)]
    if not problems and (state["python_gauss"].numel() > 1 or not isinstance(state.get("cuda"), list)):
        problems = ["python_gauss" if state["python_gauss"].numel() > 1 else "cuda"]
    if problems:
        raise ValueError(f"cannot resume from {path}: not the generator state petra_hub writes "
                         f"({', '.join(problems)} missing or of the wrong type or size)")
    return state
