"""What is in flight at a step boundary, as plain containers of CPU tensors, and back.

A pipeline that saves without draining keeps, for every stage: what its worker keeps per micro-batch between forward
and backward (`Pending`), its accumulated gradients and open group, its counters, and the messages delivered to it
for its next ticks; the last stage also keeps the targets of the micro-batches that have not reached it. Each is
converted here to tensors, numbers, lists, tuples and dicts only, so that a saved snapshot loads with
`torch.load(weights_only=True)`, and converted back onto the stage's device.

Micro-batch numbers are dict keys; `torch.save` keeps int keys as they are.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from .accounting import StageCounters
from .pending import Pending
from .randomness import RngState
from .tensors import Activation, as_tuple, to_device

_ACTIVATIONS = ("inputs", "reference")  # the `Pending` fields that hold an activation


def saved_tensor(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A CPU copy that shares nothing with the running state."""
    return None if tensor is None else tensor.detach().to("cpu", copy=True)


def saved_activation(value: Activation | None) -> Activation | None:
    if value is None:
        return None
    copies = tuple(saved_tensor(t) for t in as_tuple(value))
    return copies if isinstance(value, tuple) else copies[0]


def saved_rng(state: RngState | None) -> dict | None:
    return None if state is None else {"cpu": saved_tensor(state.cpu), "cuda": saved_tensor(state.cuda)}


def loaded_rng(saved: dict | None, device: torch.device | None) -> RngState | None:
    """The generator states, the CUDA one for `device` (the stage's device now, which may differ from the one it
    was saved on: the state is the generator's seed and offset, whichever device replays it)."""
    if saved is None:
        return None
    cuda = saved["cuda"]
    index = None
    if cuda is not None:
        if device is None or device.type != "cuda":
            raise ValueError("a saved CUDA generator state needs a stage on a CUDA device")
        index = device.index if device.index is not None else torch.cuda.current_device()
    return RngState(saved["cpu"], cuda, index)


def saved_pending(pending: Pending) -> dict:
    """`pending` without a graph (a stage that keeps its forward's graph cannot be snapshot: see `Pipeline`)."""
    if pending.outputs is not None:
        raise ValueError("a micro-batch whose forward graph is kept cannot be saved")
    return {
        "inputs": saved_activation(pending.inputs),
        "reference": saved_activation(pending.reference),
        "weights": None if pending.weights is None else [saved_tensor(w) for w in pending.weights],
        "rng": saved_rng(pending.rng),
        "unit_rngs": None if pending.unit_rngs is None else [saved_rng(state) for state in pending.unit_rngs],
    }


def loaded_pending(saved: dict, device: torch.device | None) -> Pending:
    pending = Pending()
    for name in _ACTIVATIONS:
        setattr(pending, name, to_device(saved[name], device) if saved[name] is not None else None)
    if saved["weights"] is not None:
        pending.weights = [w.to(device) if device is not None else w for w in saved["weights"]]
    pending.rng = loaded_rng(saved["rng"], device)
    if saved["unit_rngs"] is not None:
        pending.unit_rngs = [loaded_rng(state, device) for state in saved["unit_rngs"]]
    return pending


def saved_counters(counters: StageCounters) -> dict[str, Any]:
    """The counters the schedule and the logs read (not the time spent, which a resumed run measures afresh)."""
    state = dataclasses.asdict(counters)
    state["last_grad_norm"] = saved_tensor(counters.last_grad_norm)
    del state["compute_seconds"]
    return state


def loaded_counters(saved: dict[str, Any], device: torch.device | None) -> StageCounters:
    known = {field.name for field in dataclasses.fields(StageCounters)}
    unknown = sorted(set(saved) - known)
    if unknown:
        raise ValueError(f"unknown stage counters {unknown}")
    counters = StageCounters(**saved)
    if counters.last_grad_norm is not None and device is not None:
        counters.last_grad_norm = counters.last_grad_norm.to(device)
    return counters


def saved_targets(value: Any, where: str) -> Any:
    """A micro-batch's targets (tensors, numbers and strings in tuples, lists and dicts) as CPU copies; anything
    else could not be read back without unpickling code, and is refused."""
    if torch.is_tensor(value):
        return saved_tensor(value)
    if isinstance(value, (tuple, list)):
        return type(value)(saved_targets(part, where) for part in value)
    if isinstance(value, dict):
        return {key: saved_targets(part, where) for key, part in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"cannot save the targets of {where}: a {type(value).__name__} (targets in flight are saved as "
                    "tensors, numbers and strings in tuples, lists and dicts)")


def loaded_targets(value: Any, device: torch.device | None) -> Any:
    """What `saved_targets` gave, placed as `Pipeline.step` places targets (a tensor on the device, else as is)."""
    return value.to(device) if torch.is_tensor(value) and device is not None else value
