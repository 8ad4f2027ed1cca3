"""Checks of a checkpoint's contents against the run that resumes from it, before anything is loaded.

`check_model_tensors`: every tensor of `model.safetensors` has the name, shape and dtype the model's own
`save_pretrained` writes (read from the file's header: no tensor is loaded), where transformers would load a
checkpoint missing most of its weights with a one-line "missing keys" log.

`check_positions`: the run's position saved in `petra_state.json` agrees with itself and with `trainer_state.json`'s
global step, as `PetraTrainer`'s training loop advances them (a step is k micro-batches, or fewer at an epoch's end;
a checkpoint is saved at a step's end, or at an epoch's end).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

SHOWN = 5  # names listed per kind of difference

# safetensors' dtype names (the header's "dtype") of torch's dtypes
_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz", "C64": "complex64",
    "U64": "uint64", "U32": "uint32", "U16": "uint16",
}
_TORCH_DTYPES = {getattr(torch, name): code for code, name in _SAFETENSORS_DTYPES.items() if hasattr(torch, name)}


def _dtype_name(code: str) -> str:
    return _SAFETENSORS_DTYPES.get(code, code)


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else "")


def saved_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], list[set[str]]]:
    """The tensors `save_pretrained` writes for `model`: its state dict (which leaves non-persistent buffers out) but
    for `_keys_to_ignore_on_save`, and the groups of names that are one tensor (tied or shared weights), of which
    `save_pretrained` writes one name only."""
    state = model.state_dict()
    for name in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(name, None)
    views = defaultdict(set)
    for name, tensor in state.items():
        if tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            views[(tensor.device, storage.data_ptr(), storage.nbytes(), tensor.storage_offset(), tuple(tensor.shape),
                   tensor.stride())].add(name)
    return state, [names for names in views.values() if len(names) > 1]


def check_model_tensors(folder: str | Path, model: nn.Module) -> None:
    """Raise a ValueError naming `folder/model.safetensors` unless it holds exactly the tensors `model`'s
    `save_pretrained` writes, each with the model's shape and dtype: none missing (of tied or shared weights, one
    name suffices), none unexpected, none of another shape or dtype. Only the file's header is read."""
    from safetensors import safe_open

    path = Path(folder, "model.safetensors")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: the checkpoint holds no model weights")
    try:
        with safe_open(str(path), framework="pt") as handle:
            found = {}
            for name in handle.keys():
                tensor = handle.get_slice(name)
                found[name] = (list(tensor.get_shape()), tensor.get_dtype())
    except Exception as error:
        raise ValueError(f"{path} is unreadable (the checkpoint is incomplete or corrupt): {error}") from None
    expected, tied = saved_tensors(model)
    optional = {name for names in tied if names & found.keys() for name in names}  # a tied group saved once
    missing = sorted(name for name in expected if name not in found and name not in optional)
    unexpected = sorted(name for name in found if name not in expected)
    mismatched = []
    for name in sorted(found.keys() & expected.keys()):
        tensor = expected[name]
        shape, code = found[name]
        want = _TORCH_DTYPES.get(tensor.dtype, str(tensor.dtype).removeprefix("torch."))
        if shape != list(tensor.shape) or code != want:
            mismatched.append(f"{name} (expected {list(tensor.shape)} {_dtype_name(want)}, found {shape} "
                              f"{_dtype_name(code)})")
    problems = []
    if missing:
        problems.append(f"{len(missing)} of the model's {len(expected)} tensors are missing: {_listed(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} are not the model's: {_listed(unexpected)}")
    if mismatched:
        problems.append(f"{len(mismatched)} have another shape or dtype: {_listed(mismatched)}")
    if problems:
        raise ValueError(f"{path} does not hold the weights of this {type(model).__name__} "
                         f"({len(found)} tensors in the file): {'; '.join(problems)}. It belongs to another model or "
                         "configuration, or is corrupt")


def check_positions(petra_state, global_step: int, per_epoch: int | None, accumulation_steps: int,
                    path: str | Path, strict: bool = True) -> None:
    """Raise a ValueError naming `path` unless the positions a checkpoint saved agree, as `PetraTrainer` advances
    them: `petra_state` (a `checkpoint.PetraState`: micro_batches_fed, epoch, epoch_offset), `global_step` (from
    trainer_state.json), `per_epoch` the micro-batches of an epoch per replica (the train loader's length; None for a
    stream) and k = `accumulation_steps`.

    With an epoch length P and S = ceil(P / k) steps an epoch (the partial group at an epoch's end is a step of its
    own): 0 <= epoch_offset <= P (P: saved at the epoch's last step, before the position moves to the next epoch),
    micro_batches_fed == epoch * P + epoch_offset and global_step == epoch * S + ceil(epoch_offset / k). A checkpoint
    without epoch (older versions): global_step agrees with micro_batches_fed split into epochs the same way.

    `strict=False` keeps only the bounds every run meets, also one where a callback ended an epoch early
    (`should_epoch_stop`: its position moves on to the next epoch with fewer micro-batches fed) or stopped training
    inside a step (a partial step of its own), then resumed: each step holds 1 to k micro-batches, each epoch at
    most P and at least one. For a stream only bounds can be checked: those, and with `strict`, that each epoch's
    end adds at most one partial step, and that in the first epoch micro_batches_fed == epoch_offset."""
    k = accumulation_steps
    fed, epoch, offset = petra_state.micro_batches_fed, petra_state.epoch, petra_state.epoch_offset
    if epoch is None or offset is None:
        epoch = offset = None
    problems = []
    if per_epoch is not None and offset is not None and not 0 <= offset <= per_epoch:
        problems.append(f"epoch_offset {offset} is outside 0 .. {per_epoch} (micro-batches an epoch)")
    elif per_epoch is not None and strict:
        steps_per_epoch = _ceil(per_epoch, k)
        if epoch is None:
            epoch, offset = divmod(fed, per_epoch)
            position = f"micro_batches_fed {fed} (epoch {epoch}, offset {offset}) implies"
        else:
            implied = epoch * per_epoch + offset
            if fed != implied:
                problems.append(f"micro_batches_fed is {fed}, but epoch {epoch} and epoch_offset {offset} imply "
                                f"{implied} ({per_epoch} micro-batches an epoch)")
            position = f"epoch {epoch} and epoch_offset {offset} imply"
        steps = epoch * steps_per_epoch + _ceil(offset, k)
        if global_step != steps:
            problems.append(f"global_step (trainer_state.json) is {global_step}, but {position} {steps} "
                            f"({steps_per_epoch} steps of k = {k} micro-batches an epoch of {per_epoch})")
    else:
        problems += _bounds(fed, epoch, offset, global_step, per_epoch, k, strict)
    if problems:
        unless = " (unless a callback ended an epoch early or stopped training inside a step)" \
            if strict and per_epoch is not None else ""
        raise ValueError(f"{path}: the checkpoint's positions disagree: {'; '.join(problems)}. The checkpoint is "
                         f"corrupt or was edited{unless}")


def _ceil(count: int, k: int) -> int:
    """ceil(count / k) in whole numbers (exact for counts beyond a float's precision)."""
    return -(-count // k)


def _bounds(fed: int, epoch: int | None, offset: int | None, global_step: int, per_epoch: int | None, k: int,
            strict: bool) -> list[str]:
    """What every run's positions meet: each step holds 1 to k micro-batches, the current epoch `offset` of them,
    and every earlier epoch at least one and at most `per_epoch`; `strict` (a stream's regular run): each epoch's
    end adds at most one partial step, and the first epoch's position is the micro-batches fed."""
    problems = []
    least, most = _ceil(fed, k), fed
    if strict and epoch is not None:
        most = min(most, least + epoch)
    if not least <= global_step <= most:
        problems.append(f"global_step (trainer_state.json) is {global_step}, but micro_batches_fed {fed} makes "
                        f"{least} to {most} steps of 1 to k = {k} micro-batches"
                        + (f" over {epoch + 1} epochs" if strict and epoch is not None else ""))
    if epoch is not None:
        if fed < epoch + offset or (strict and epoch == 0 and fed != offset):
            problems.append(f"micro_batches_fed is {fed}, but epoch {epoch} and epoch_offset {offset} imply "
                            + (f"{offset}" if strict and epoch == 0 else
                               f"at least {epoch + offset} (every epoch feeds at least one)"))
        elif per_epoch is not None and fed > epoch * per_epoch + offset:
            problems.append(f"micro_batches_fed is {fed}, but epoch {epoch} and epoch_offset {offset} imply at most "
                            f"{epoch * per_epoch + offset} ({per_epoch} micro-batches an epoch)")
    return problems
