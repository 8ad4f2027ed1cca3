"""Gradient fidelity: how close each stage's delayed gradient is to the gradients it stands for (paper Figures 5-6).

For a probed micro-batch m, every stage keeps, besides running it as usual:
- at its forward: a copy of its weights (theta_F), the RNG state the forward started from, and, at stage 0, the
  input (the last stage keeps the targets);
- at its backward: a copy of its weights before any update (theta_B) and the gradient its backward of m added to
  `.grad` (unscaled), i.e. the gradient of the pipeline's mode.
When m's backward has reached stage 0 (every rank knows when from the schedule), `Pipeline.gradient_fidelity()`
runs two synchronous reference passes of m through all stages, forward then backward, each stage evaluated with
`torch.func.functional_call` on fresh copies of those weights, so nothing of the training state moves (no `.grad`,
no running statistics, no RNG, no weights):
- "stashed": every stage at theta_F: the gradient of the forward that really ran, which is what delayed gradients
  with weight stashing and input buffers compute (Zhuang et al.; the paper's "standard delayed gradient");
- "true": every stage at theta_B: end-to-end backprop at the weights each stage held when it ran m's backward
  (the paper's "current weights"; the last stage's backward runs in the tick of its forward).
Between ranks the passes send one activation forward and one gradient backward per boundary, in the dtypes of
training messages; then each rank compares its stages' gradients and the results are gathered on every rank.
Costs only for probed micro-batches: two weight copies and one gradient per stage, and the two passes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import nn
from torch.func import functional_call

from .batchnorm import frozen_running_stats
from .messages import round_trip
from .precision import LOW_PRECISION, Precision
from .randomness import RngState, capture, replaying
from .protocol import Moment
from .routing import PROBE_BACKWARD_TAG, PROBE_FORWARD_TAG, Router
from .tensors import Activation, as_tuple, detached, in_graph, like
from .wire import WireError, all_gather_json


@dataclass
class StageProbe:
    """What one stage keeps of one probed micro-batch."""

    weights_forward: list[torch.Tensor] | None = None
    weights_backward: list[torch.Tensor] | None = None
    rng: RngState | None = None
    inputs: Activation | None = None  # stage 0 only
    targets: object = None  # last stage only
    gradient: list[torch.Tensor] | None = None
    _before: list[torch.Tensor] | None = None

    def at_forward(self, params: list[nn.Parameter], inputs: Activation, first: bool) -> None:
        self.weights_forward = _copies(params)
        self.rng = capture(as_tuple(inputs)[0].device)
        if first:
            self.inputs = like(inputs, tuple(t.detach().clone() for t in as_tuple(inputs)))

    def before_backward(self, params: list[nn.Parameter]) -> None:
        self.weights_backward = _copies(params)
        self._before = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]

    def after_backward(self, params: list[nn.Parameter], loss_scale: float = 1.0) -> None:
        after = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        self.gradient = [(a - b) / loss_scale for a, b in zip(after, self._before)]
        self._before = None


@dataclass(frozen=True)
class StageFidelity:
    """One stage's gradient for one micro-batch against the two references (cosine similarity and norm ratio,
    the run's gradient in the numerator); `stashed_*` compares the stashed-weight gradient with the true one."""

    micro_batch: int
    stage: int
    cosine_true: float
    norm_ratio_true: float
    cosine_stashed: float
    norm_ratio_stashed: float
    cosine_stashed_true: float
    norm_ratio_stashed_true: float

    def as_dict(self) -> dict:
        return asdict(self)


def compare(micro_batch: int, stage: int, gradient, true, stashed) -> StageFidelity:
    vectors = [torch.cat([g.detach().reshape(-1).double() for g in grads]) for grads in (gradient, true, stashed)]
    mine, true_vector, stashed_vector = vectors
    return StageFidelity(
        micro_batch, stage,
        _cosine(mine, true_vector), _ratio(mine, true_vector),
        _cosine(mine, stashed_vector), _ratio(mine, stashed_vector),
        _cosine(stashed_vector, true_vector), _ratio(stashed_vector, true_vector),
    )


def measure(micro_batch: int, batch: int, probes: dict[int, StageProbe], stages: list[nn.Module], local: range,
            loss_fn, precision: Precision, router: Router, moment: Moment) -> list[StageFidelity]:
    """This rank's stages' fidelity for one probed micro-batch of `batch` samples (both reference passes)."""

    def exchange(direction: str, value, boundary: int):
        forward = direction == "forward"
        tag = PROBE_FORWARD_TAG if forward else PROBE_BACKWARD_TAG
        parts = router.forward_parts(boundary) if forward else router.gradient_parts(boundary)
        if value is None:
            (value,) = router.receive_alone("left" if forward else "right", tag, parts, batch, moment)
            return value
        router.send_alone("right" if forward else "left", tag, [value], parts, batch, moment)

    passes = {which: reference_gradients(stages, local, probes, which, loss_fn, precision, router, exchange)
              for which in ("backward", "forward")}
    return [compare(micro_batch, i, probes[i].gradient, passes["backward"][i], passes["forward"][i]) for i in local]


def reference_gradients(
    stages: list[nn.Module],
    local: range,
    probes: dict[int, StageProbe],
    weights: str,
    loss_fn,
    precision: Precision,
    router: Router,
    exchange,
) -> dict[int, list[torch.Tensor]]:
    """The gradients of every local stage's parameters for the probed micro-batch, by backprop through all stages
    at `weights` ("forward": theta_F, "backward": theta_B). `exchange(direction, value, boundary)` sends a value to
    (or, with `value` None, receives one from) the neighbouring rank: "forward" crosses `boundary` (the stage on
    its left) to the right, "backward" to the left."""
    last = len(stages) - 1
    value = probes[0].inputs if local.start == 0 else exchange("forward", None, local.start - 1)
    graphs = {}
    for index in local:
        probe, stage = probes[index], stages[index]
        leaves = detached(value, requires_grad=index > 0)
        names = [name for name, p in stage.named_parameters() if p.requires_grad]
        copies = [w.clone().requires_grad_(True) for w in getattr(probe, f"weights_{weights}")]
        device = as_tuple(leaves)[0].device
        with torch.enable_grad(), frozen_running_stats(stage), replaying(probe.rng):
            with precision.autocast(device):
                outputs = functional_call(stage, dict(zip(names, copies)), (leaves,))
                if index == last:
                    outputs = loss_fn(outputs, probe.targets)
            outputs = outputs.float() if index == last and outputs.dtype in LOW_PRECISION else outputs
            outputs = outputs if index == last else precision.cast_streams(outputs)
        graphs[index] = (leaves, copies, outputs)
        if index < last:
            value = detached(outputs)
            if index + 1 in local:
                (value,) = round_trip([value], router.forward_parts(index))
    if local.stop <= last:
        exchange("forward", value, local.stop - 1)

    grad = None if last in local else exchange("backward", None, local.stop - 1)
    gradients = {}
    for index in reversed(local):
        leaves, copies, outputs = graphs[index]
        inputs = [t for t in as_tuple(leaves) if t.requires_grad] if index > 0 else []
        wrt = copies + inputs
        tensors, grads = ([outputs], None) if index == last else in_graph(outputs, grad)
        found = torch.autograd.grad(tensors, wrt, grads, allow_unused=True) if tensors and wrt else [None] * len(wrt)
        found = [f if f is not None else torch.zeros_like(w) for f, w in zip(found, wrt)]
        gradients[index] = found[: len(copies)]
        if index > 0:
            found_inputs = iter(found[len(copies):])  # zeros for the inputs that take no gradient, as the worker sends
            grad = like(leaves, tuple(next(found_inputs) if t.requires_grad else torch.zeros_like(t)
                                      for t in as_tuple(leaves)))
            grad = precision.cast_streams(grad)
            if index - 1 in local:
                (grad,) = round_trip([grad], router.gradient_parts(index - 1))
    if local.start > 0:
        exchange("backward", grad, local.start - 1)
    return gradients


def gather(results: list[StageFidelity], group, distributed: bool) -> list[StageFidelity]:
    """Every rank's results, on every rank of `group`, in (micro_batch, stage) order."""
    if distributed:
        gathered = all_gather_json([result.as_dict() for result in results], group)
        try:
            results = [StageFidelity(**_numbers(entry)) for part in gathered for entry in part]
        except (TypeError, ValueError) as error:
            raise WireError(f"a rank sent gradient-fidelity results that are not StageFidelity's: {error}") from None
    return sorted(results, key=lambda r: (r.micro_batch, r.stage))


def _numbers(entry) -> dict:
    """A StageFidelity's fields as a peer sent them (JSON): integers for the indices, numbers for the rest."""
    names = [field.name for field in fields(StageFidelity)]
    if not isinstance(entry, dict) or sorted(entry) != sorted(names):
        raise ValueError(f"fields {sorted(entry) if isinstance(entry, dict) else type(entry).__name__}")
    if any(type(entry[name]) is not int for name in names[:2]) or any(
            type(entry[name]) not in (int, float) for name in names[2:]):
        raise ValueError("a field that is not a number")
    return entry


def _copies(params: list[nn.Parameter]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    denominator = float(a.norm() * b.norm())
    return float(a @ b) / denominator if denominator > 0 else float("nan")


def _ratio(a: torch.Tensor, b: torch.Tensor) -> float:
    denominator = float(b.norm())
    return float(a.norm()) / denominator if denominator > 0 else float("nan")
