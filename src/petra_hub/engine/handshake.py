"""The start-up handshake: before the first tick every rank learns the shape of each boundary it touches, and a
stage that cannot take its neighbour's output (or ranks that disagree on the set-up) fail on every rank at once.
Settings, shapes and errors travel as JSON (`wire`), never pickled: a peer's message is checked, not executed."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .batchnorm import frozen_running_stats
from .collectives import disagreements
from .errors import StageMismatchError, peer_failure
from .precision import Precision, short_name
from .randomness import preserved
from .routing import Router, empty_like_spec
from .tensors import Activation, as_tuple
from .transport import ActivationSpec, describe_value
from .wire import WireError, all_gather_json, recv_json, send_json


DRY_RUN_BATCH = 2  # samples of the zero batch the handshake runs the stages on


def input_spec_of(inputs: Activation) -> ActivationSpec:
    tensors = as_tuple(inputs) if isinstance(inputs, (tuple, torch.Tensor)) else ()
    if not tensors or not all(torch.is_tensor(t) for t in tensors):
        raise ValueError(f"pipeline inputs must be a tensor or a tuple of tensors, got {type(inputs).__name__}")
    try:
        if tensors[0].dim() == 0:
            raise ValueError(f"{describe_value(inputs)}, without a batch dimension")
        return ActivationSpec.of(inputs, batch=tensors[0].shape[0])
    except ValueError as error:
        raise ValueError(f"pipeline inputs must have the batch as the first dimension of every tensor, got {error}") \
            from None


def check_same_spec(spec: ActivationSpec, first: ActivationSpec) -> None:
    if spec != first:
        raise ValueError(
            f"micro-batch of shape {spec.describe()} differs from the first micro-batch {first.describe()}: "
            "every micro-batch must have the same per-sample shape and dtype"
        )


def handshake(
    input_spec: ActivationSpec,
    stages: list[nn.Module],
    router: Router,
    settings: dict,
    group: dist.ProcessGroup | None,
    job_group: dist.ProcessGroup | None,
    global_ranks: list[int] | None,
    device: torch.device | None,
    precision: Precision | None = None,
) -> None:
    """Fill `router.specs`, checking every stage of this rank against what its predecessor produces under the
    precision policy. `settings` (a dict of what must agree across ranks: stages, mode, k, partition, ...) is compared
    over `job_group` when distributed: every rank of the run, so that data-parallel replicas, whose gradient
    averages pair their stages, agree too. The shapes travel over the pipeline's `group`. A collective that fails (a
    peer died) becomes a PeerFailureError; any other error is this rank's own and stays what it is."""
    precision = precision or Precision()
    distributed = global_ranks is not None

    def exchange():  # wraps the collectives alone: a failure inside one is a peer's
        return peer_failure("complete the start-up handshake", router.transport.describe(router.rank))

    if distributed:
        with exchange():
            everyone, differ = disagreements(settings, job_group)
        if differ:  # the same text on every rank
            raise StageMismatchError("ranks disagree on " + "; ".join(
                f"{key} ({', '.join(f'rank {rank}: {other.get(key)!r}' for rank, other in enumerate(everyone))})"
                for key in differ))
    local, error, spec = router.local, None, input_spec
    if local.start > 0:  # JSON, never pickled (see `wire`)
        sender = router.transport.describe(router.rank - 1)
        with exchange():
            message = recv_json(global_ranks[router.rank - 1], group)
        spec, error = _spec_message(message, sender)
        if spec is not None:
            router.specs[local.start - 1] = spec
    if error is None:
        spec, error = dry_run(stages, local, spec, router.specs, device, precision)
    if local.stop < len(stages):
        with exchange():
            send_json({"spec": None if spec is None else spec.to_json(), "error": error},
                      global_ranks[router.rank + 1], group)
    if distributed:
        with exchange():
            errors = all_gather_json(error, group)
        if not all(e is None or isinstance(e, str) for e in errors):
            raise WireError("a rank sent a handshake error that is not a text")
        error = next((e for e in errors if e is not None), None)
    if error is not None:
        raise StageMismatchError(error)


def _spec_message(message, sender: str) -> tuple[ActivationSpec | None, str | None]:
    """The (spec, error) of the previous rank's handshake message, checked (a WireError naming `sender` if not)."""
    try:
        if not isinstance(message, dict) or set(message) != {"spec", "error"}:
            raise ValueError("not a handshake message")
        error = message["error"]
        if not (error is None or isinstance(error, str)) or (error is None) == (message["spec"] is None):
            raise ValueError("neither a spec nor an error")
        return (None if message["spec"] is None else ActivationSpec.from_json(message["spec"])), error
    except ValueError as problem:
        raise WireError(f"{sender} sent a start-up handshake message that cannot be read: {problem}") from None


def dry_run(
    stages: list[nn.Module],
    local: range,
    spec: ActivationSpec,
    specs: dict[int, ActivationSpec],
    device,
    precision: Precision | None = None,
) -> tuple[ActivationSpec | None, str | None]:
    """Run the `local` stages on a zero batch of `spec` as training will (under the precision policy), without
    changing any state (running statistics and the random generators included); record each output spec in
    `specs`. Returns (the last output spec, None) or (None, a description of the first mismatch)."""
    precision = precision or Precision()
    value = empty_like_spec(spec, DRY_RUN_BATCH, device or torch.device("cpu"))
    for index in local:
        stage = stages[index]
        previous = f"stage {index - 1} ({type(stages[index - 1]).__name__})" if index else "the input"
        here = f"stage {index} ({type(stage).__name__})"
        mismatch = _dtype_mismatch(stage, spec, index, precision)
        if mismatch:
            return None, f"{here} {mismatch} (from {previous}, {spec.describe()})"
        try:
            with torch.no_grad(), frozen_running_stats(stage), preserved(as_tuple(value)[0].device), _eager():
                with precision.autocast(as_tuple(value)[0].device):
                    value = stage(value)
                value = precision.cast_streams(value) if index < len(stages) - 1 else value
        except Exception as error:  # any failure here is a mismatch between the two stages
            return None, f"{here} cannot take the output of {previous}, {spec.describe()}: {error}"
        if index < len(stages) - 1:
            try:  # what crosses a boundary is batch-major: its size follows from the batch (see `routing`)
                spec = ActivationSpec.of(value, batch=DRY_RUN_BATCH)
            except ValueError as error:
                return None, (f"{here} returns {error} (a dry run on {DRY_RUN_BATCH} samples): every tensor a stage "
                              "passes on must have the batch as its first dimension")
            specs[index] = spec
    return spec, None


def _eager():
    """Compiled stages run their dry run eagerly: a batch of 2 would otherwise compile graphs training never uses."""
    return torch.compiler.set_stance("force_eager")


def _dtype_mismatch(stage: nn.Module, spec: ActivationSpec, index: int, precision: Precision) -> str | None:
    """Without autocast a stage computes in its parameters' dtype and must receive it. Under autocast the
    parameters are the float32 master weights and a stage after the first receives the stream dtype."""
    dtypes = {p.dtype for p in stage.parameters() if p.is_floating_point()}
    received = {t.dtype for t in spec.tensors if t.dtype.is_floating_point}
    if precision.compute is None:
        if dtypes and received and not received <= dtypes:
            return f"has {sorted(map(str, dtypes))} parameters but receives {sorted(map(str, received))}"
        return None
    if dtypes - {torch.float32}:
        return (f"has {sorted(map(str, dtypes))} parameters, but mixed precision ({precision.describe()}) keeps "
                "float32 master weights: leave the model in float32")
    if index > 0 and received - {precision.streams}:
        return f"receives {sorted(map(str, received))}, but the policy's streams are {short_name(precision.streams)}"
    return None
