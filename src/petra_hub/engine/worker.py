"""One stage's side of PETRA (the paper's Algorithm 1): forward, delayed backward, accumulation and update."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from .batchnorm import batch_norms, frozen_running_stats
from .errors import PipelineError
from .fidelity import StageProbe
from .accounting import MemoryStats, StageCounters, memory_of, nbytes, recording_saved_tensors, relative_error
from .modes import Mode
from .momentum import DelayMatchedMomentum
from .optim import check_state_shapes, gradient_norm
from .options import Diagnostics, Remedies
from .pending import ParameterSlots, Pending, stashed_weights
from .prediction import WeightPredictor
from .schedule import Schedule
from .precision import LOW_PRECISION, LossScale, Precision
from .randomness import capture, drawn_since, reconstruct_replaying, replaying, units
from .snapshot import loaded_counters, loaded_pending, saved_counters, saved_pending, saved_tensor
from .tensors import Activation, as_tuple, backpropagate, detached, like
from .trace import Trace, timed

UpdateHook = Callable[[int, list[int], nn.Module], None]


@dataclass
class StageUpdate:
    """How a stage turns the gradients of `accumulation_steps` micro-batches into one update: averaged over the
    data-parallel replicas (`reduce_gradients`), clipped to `max_grad_norm`, reported to `on_update`, then applied by
    `optimizer` and `scheduler` (none: the gradients are left to the caller)."""

    accumulation_steps: int = 1
    optimizer: torch.optim.Optimizer | None = None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    reduce_gradients: Callable[[list[nn.Parameter]], None] | None = None
    max_grad_norm: float | None = None
    on_update: UpdateHook | None = None


class StageWorker:
    """Owns one stage: what it keeps for pending backwards, its gradient accumulation, optimizer and counters.

    Batch-norm policy: every training-time evaluation normalises with batch statistics; running statistics are
    updated once per micro-batch, by the evaluation whose graph is backpropagated (the recomputation in the
    backward, or the forward itself in `backprop` mode and at the last stage).

    Randomness: every later evaluation of a micro-batch (recomputation, inversion) replays the RNG state of its
    forward, so it draws the same dropout mask (see `randomness`).

    Precision: every evaluation of the stage runs under the policy's autocast, and what leaves the stage is cast
    to the stream dtype; with fp16, gradients are scaled by the stage's own loss scale (see `precision`).

    Remedies for the delay (`Remedies`, off by default): with weight prediction, forwards run at the weights
    extrapolated to the backward (see `prediction`). `Diagnostics`: sampled reconstruction checks (the pipeline's
    `trace` records the operations).

    Kept graphs (`keep_graph`, off by default): a stage that would recompute its forward in the backward (from its
    stored input, or from the input it rebuilds by inversion) keeps the forward's graph instead. In a pipelined mode
    the graph is built on a copy of the weights (the optimizer updates the stage's own in between), so its gradient
    is that of the forward's weights, as with weight stashing.
    """

    def __init__(
        self,
        index: int,
        stage: nn.Module,
        *,
        mode: Mode,
        num_stages: int,
        update: StageUpdate | None = None,
        precision: Precision | None = None,
        remedies: Remedies | None = None,
        diagnostics: Diagnostics | None = None,
        trace: Trace | None = None,
        keep_graph: bool = False,
        waiting_messages: Callable[[], list[torch.Tensor]] = list,
    ):
        self.index = index
        self.waiting_messages = waiting_messages  # the tensors delivered to this stage for its next tick
        self.trace = trace
        self.stage = stage
        self.mode = mode
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.keeps_graph = mode.keeps_graph or keep_graph
        self.reconstructs = mode.rebuilds_input(stage, self.keeps_graph)
        if self.reconstructs and not (hasattr(stage, "inverse") and hasattr(stage, "reconstruct_and_backward")):
            raise ValueError(f"stage {index} is marked reversible but lacks inverse / reconstruct_and_backward")
        update = update or StageUpdate()
        self.accumulation_steps = update.accumulation_steps
        self.optimizer = update.optimizer
        self.scheduler = update.scheduler
        self.on_update = update.on_update
        self.reduce_gradients = update.reduce_gradients
        self.max_grad_norm = update.max_grad_norm
        self.precision = precision or Precision()
        remedies, diagnostics = remedies or Remedies(), diagnostics or Diagnostics()
        self.check_every = diagnostics.check_reconstruction_every if self.reconstructs else None
        self.measures_grad_norm = diagnostics.grad_norms
        policy = self.precision
        self.loss_scale = LossScale(policy.initial_scale, policy.growth_interval) if policy.scales_loss else None
        named = [(name, p) for name, p in stage.named_parameters() if p.requires_grad]
        self.param_names, self.params = [name for name, _ in named], [p for _, p in named]
        self.units = units(stage) if self.reconstructs else [stage]
        self.batch_norms = batch_norms(stage)
        self._slots = ParameterSlots(stage, self.params)  # where a kept graph's weight copies go (pipelined modes)
        self.counters = StageCounters()
        self.predictor = self._predictor(remedies)
        self.momentum = None
        if remedies.delay_momentum and self.optimizer is not None:
            delay = Schedule(num_stages, pipelined=True).in_flight(index) / self.accumulation_steps
            self.momentum = DelayMatchedMomentum(self.optimizer, self.scheduler, delay, f"stage {index}")
            self.momentum.apply(mode.pipelined)
        self.group: list[int] = []  # micro-batches whose gradients are accumulated and not yet applied
        self._pending: dict[int, Pending] = {}
        self._graph_bytes: dict[tuple, int] = {}  # input shapes -> what a kept graph saves (`_evaluate_keeping_graph`)
        self.probes: dict[int, StageProbe] = {}  # probed micro-batches (see `fidelity`)
        self._group_ends: set[int] = set()  # micro-batches after which a group closes before reaching k
        self._peak = 0
        # running totals for the peak, kept per operation instead of recounting every tensor held (see `_track_peak`)
        self._pending_bytes = 0
        self._grad_bytes = 0

    def _predictor(self, remedies: Remedies) -> WeightPredictor:
        """Weight prediction extrapolates over the delay: none at the last stage or without one."""
        return WeightPredictor(0.0 if self.is_last or not self.mode.pipelined else remedies.weight_prediction)

    def enter_mode(self, mode: Mode, remedies: Remedies) -> None:
        """Run in `mode` from now on (with nothing in flight): the end of a synchronous start, whose mode differs
        from `mode` only in its schedule (the stage keeps, stores and rebuilds the same things)."""
        if self._pending or self.group:
            raise PipelineError(f"stage {self.index} changes mode with work in flight")
        if (mode.reconstructs, mode.stashes_weights, mode.keeps_graph) != (
                self.mode.reconstructs, self.mode.stashes_weights, self.mode.keeps_graph):
            raise PipelineError(f"stage {self.index} cannot go from mode {self.mode.value} to {mode.value}: they "
                                "differ in more than their schedule")
        self.mode = mode
        self.predictor = self._predictor(remedies)
        if self.momentum is not None:
            self.momentum.apply(mode.pipelined)

    # -- the two halves of a tick ---------------------------------------------------------------------------------
    @timed
    def forward(self, micro_batch: int, inputs: Activation) -> Activation:
        """Run the stage on `inputs` without a graph (with its graph in `backprop` mode), at the predicted weights
        with weight prediction; keep what the backward will need."""
        updates_ahead = len(self._pending) / self.accumulation_steps  # their backwards come first
        with stashed_weights(self.params, self.predictor.predicted(self.params, updates_ahead)):
            return self._forward(micro_batch, inputs)

    def _forward(self, micro_batch: int, inputs: Activation) -> Activation:
        probe = self.probes.get(micro_batch)
        if probe is not None:
            probe.at_forward(self.params, inputs, self.is_first)
        pending = Pending()
        if self.mode.stashes_weights and not self.keeps_graph:
            pending.weights = [p.detach().clone() for p in self.params]
        if self.keeps_graph:
            leaves = detached(inputs, requires_grad=not self.is_first)
            weights = None  # a synchronous mode updates after the backward: the graph may use the weights themselves
            if self.mode.pipelined:
                weights = pending.weights = [p.detach().clone().requires_grad_() for p in self.params]
            outputs, pending.graph_bytes = self._evaluate_keeping_graph(leaves, weights)
            pending.inputs, pending.outputs = leaves, outputs
            outputs = detached(outputs)
        else:
            with torch.no_grad(), frozen_running_stats(self.batch_norms), self._autocast(inputs):
                outputs = self.precision.cast_streams(self._forward_recording_rng(inputs, pending))
            if not self.reconstructs:
                pending.inputs = detached(inputs)
            elif self.check_every and micro_batch % self.check_every == 0:
                pending.reference = like(inputs, tuple(t.detach().clone() for t in as_tuple(inputs)))
        self._keep(micro_batch, pending)
        self.counters.forwards += 1
        self._track_peak()
        return outputs

    @timed
    def backward(
        self, micro_batch: int, grad_outputs: Activation, outputs: Activation | None = None
    ) -> tuple[Activation | None, Activation | None]:
        """Backpropagate one micro-batch. `outputs` (this stage's output, sent back by the next stage) is needed
        only when the stage reconstructs its input. Returns (input, gradient of the input); the input is what
        the previous stage receives back, None at the first stage."""
        pending = self._take(micro_batch)
        probe = self.probes.get(micro_batch)
        if probe is not None:
            probe.before_backward(self.params)
        if self.loss_scale is not None:
            grad_outputs = self.loss_scale.scale_incoming(grad_outputs)
        if self.reconstructs:
            if outputs is None:
                raise PipelineError(f"stage {self.index} reconstructs its input but received no output to invert")
            if pending.weights is None:
                with self._autocast(outputs):
                    inputs, grad_inputs = reconstruct_replaying(
                        self.stage, self.units, outputs, grad_outputs, pending.rng, pending.unit_rngs)
            else:
                with torch.no_grad(), frozen_running_stats(self.batch_norms), self._autocast(outputs):
                    inputs = reconstruct_replaying(self.stage, self.units, outputs, None, pending.rng,
                                                   pending.unit_rngs)
                with replaying(pending.rng):
                    grad_inputs = self._recompute_and_backward(inputs, grad_outputs, pending.weights)
            if pending.reference is not None:
                self.counters.reconstruction_error = relative_error(inputs, pending.reference)
                self.counters.reconstruction_checks += 1
        elif self.keeps_graph:
            backpropagate(pending.outputs, grad_outputs)
            for param, copy in zip(self.params, pending.weights or ()):  # the graph's weights were a copy
                if copy.grad is not None:
                    param.grad = copy.grad if param.grad is None else param.grad.add_(copy.grad)
            inputs, grad_inputs = pending.inputs, self._leaf_grads(pending.inputs)
        else:
            inputs = pending.inputs
            with replaying(pending.rng):
                grad_inputs = self._recompute_and_backward(inputs, grad_outputs, pending.weights)
        if probe is not None:
            probe.after_backward(self.params, self._gradient_scale)
        self._count_backward(micro_batch)
        if self.is_first:
            return None, None
        return detached(inputs), self._outgoing(grad_inputs)

    @timed
    def forward_backward_last(
        self, micro_batch: int, inputs: Activation, targets, loss_fn: Callable
    ) -> tuple[torch.Tensor, Activation | None, Activation | None]:
        """The last stage: forward, loss and backward in one tick. Returns (loss, input, gradient of input)."""
        self.counters.forwards += 1
        probe = self.probes.get(micro_batch)
        if probe is not None:
            probe.at_forward(self.params, inputs, self.is_first)
            probe.before_backward(self.params)
            probe.targets = targets
        leaves = detached(inputs, requires_grad=not self.is_first)
        with torch.enable_grad():
            with self._autocast(leaves):
                loss = loss_fn(self.stage(leaves), targets)
            if loss.dtype in LOW_PRECISION:
                loss = loss.float()
            (loss if self.loss_scale is None else loss * self.loss_scale.scale).backward()
        if probe is not None:
            probe.after_backward(self.params, self._gradient_scale)
        self._count_backward(micro_batch)
        if self.is_first:
            return loss.detach(), None, None
        return loss.detach(), detached(leaves), self._outgoing(self._leaf_grads(leaves))

    # -- updates ----------------------------------------------------------------------------------------------------
    def maybe_update(self, flush: bool = False) -> bool:
        """Apply the accumulated gradient when k micro-batches are in, when the group was closed early after the
        last one (`end_group_after`), or, with `flush`, when any are."""
        if not self.group:
            return False
        closed = self.group[-1] in self._group_ends
        if len(self.group) < self.accumulation_steps and not (flush or closed):
            return False
        return self._update()

    @timed
    def _update(self) -> bool:
        """Average the group's gradients and step; False where fp16 drops the group for an overflow."""
        self._group_ends.discard(self.group[-1])
        scale = 1.0 / len(self.group)
        if self.loss_scale is not None:
            scale /= self.loss_scale.scale
        if scale != 1.0:  # k = 1 without loss scaling: nothing to average
            for param in self.params:
                if param.grad is not None:
                    param.grad.mul_(scale)
        if self.loss_scale is not None and self._skip_overflowed_group():
            return False
        if self.reduce_gradients is not None:
            self.reduce_gradients(self.params)
        if self.max_grad_norm or self.measures_grad_norm:
            norm = gradient_norm(self.params, clip_to=self.max_grad_norm)
            self.counters.last_grad_norm = norm if norm is not None else self.counters.last_grad_norm
        if self.on_update is not None:
            self.on_update(self.index, list(self.group), self.stage)
        if self.optimizer is not None:
            self.counters.learning_rate = float(self.optimizer.param_groups[0]["lr"])
            self.predictor.before_update(self.params)
            self.optimizer.step()
            self.predictor.after_update(self.params)
        if self.scheduler is not None:
            self.scheduler.step()
        for param in self.params:
            param.grad = None
        self._grad_bytes = 0
        self.group.clear()
        self.counters.updates += 1
        if self.loss_scale is not None:
            self.loss_scale.updated()
        return True

    def _skip_overflowed_group(self) -> bool:
        """fp16: drop the group (no optimizer or scheduler step) if a gradient of it was not finite, here or above
        (see `precision`)."""
        if not self.loss_scale.group_overflowed(self.params, self._replicas_skip if self.reduce_gradients else None):
            return False
        for param in self.params:
            param.grad = None
        self._grad_bytes = 0
        self.group.clear()
        self.counters.skipped_updates += 1
        return True

    def _replicas_skip(self, skip: bool) -> bool:
        """Whether any replica of this stage skips (one all-reduce of a flag, through `reduce_gradients`)."""
        device = self.params[0].device if self.params else None
        flag = SimpleNamespace(grad=torch.tensor([float(skip)], device=device))  # all `reduce_gradients` reads
        self.reduce_gradients([flag])
        return bool(flag.grad.item() > 0)

    def state_dict(self) -> dict:
        """The optimizer, LR-scheduler, fp16 loss-scale and weight-prediction states (None where the stage has none)."""
        return {name: part.state_dict() if part is not None else None for name, part in self._stateful().items()}

    def load_state_dict(self, state: dict) -> None:
        for name, part in self._stateful().items():
            if part is not None and state.get(name) is not None:
                if part is self.predictor:  # its deltas are cast to, and checked against, the parameters
                    part.load_state_dict(state[name], self.params, f"stage {self.index}")
                else:
                    part.load_state_dict(state[name])
        if self.momentum is not None:  # a saved optimizer brings its own momentum: the mode running decides it
            self.momentum.apply(self.mode.pipelined)
        check_state_shapes(self.optimizer, f"stage {self.index}")

    def _stateful(self) -> dict:
        return {"optimizer": self.optimizer, "scheduler": self.scheduler, "loss_scale": self.loss_scale,
                "weight_prediction": self.predictor if self.predictor.active else None}

    def in_flight_state(self) -> dict:
        """What the stage holds between ticks besides its weights and `state_dict`: the micro-batches between their
        forward and backward, the gradients of its open accumulation group and the group itself, its counters (CPU
        copies; see `snapshot`). A stage that keeps its forward's graph cannot give it."""
        return {
            "pending": {micro_batch: saved_pending(pending) for micro_batch, pending in self._pending.items()},
            "grads": [saved_tensor(param.grad) for param in self.params],
            "group": list(self.group),
            "group_ends": sorted(self._group_ends),
            "overflow": None if self.loss_scale is None else self.loss_scale.group_state(),
            "counters": saved_counters(self.counters),
        }

    def load_in_flight_state(self, state: dict, device: torch.device | None) -> None:
        """Restore what `in_flight_state` gave, onto `device` (None: the CPU)."""
        if self._pending or self.group:
            raise PipelineError(f"stage {self.index} already has work in flight")
        grads = state["grads"]
        if len(grads) != len(self.params):
            raise ValueError(f"stage {self.index}: {len(grads)} saved gradients for {len(self.params)} parameters")
        for name, param, grad in zip(self.param_names, self.params, grads):
            if grad is not None and grad.shape != param.shape:
                raise ValueError(f"stage {self.index}: the saved gradient of {name} has shape {tuple(grad.shape)}, "
                                 f"the parameter {tuple(param.shape)}")
        for micro_batch, saved in sorted(state["pending"].items()):
            self._keep(int(micro_batch), loaded_pending(saved, device))
        for param, grad in zip(self.params, grads):
            param.grad = None if grad is None else grad.to(param)
        self._grad_bytes = nbytes(self._grads())
        self.group = [int(m) for m in state["group"]]
        self._group_ends = {int(m) for m in state["group_ends"]}
        if self.loss_scale is not None and state["overflow"] is not None:
            self.loss_scale.load_group_state(state["overflow"])
        self.counters = loaded_counters(state["counters"], device)

    def end_group_after(self, micro_batch: int) -> None:
        """Close the current accumulation group once `micro_batch` has been backpropagated here."""
        self._group_ends.add(micro_batch)

    # -- accounting -------------------------------------------------------------------------------------------------
    @property
    def in_flight(self) -> list[int]:
        """Micro-batches forwarded here and not yet backpropagated (the FIFO)."""
        return list(self._pending)

    def held(self) -> dict[str, list[torch.Tensor]]:
        """The tensors this stage's device holds for training, by kind (`MemoryStats`' fields), but for those kept
        graphs saved (`kept_graph_bytes`)."""
        return {
            "activation": [t for p in self._pending.values() for t in p.tensors()],
            "stash": [w for p in self._pending.values() if p.weights is not None for w in p.weights],
            "message": self.waiting_messages(),
            "gradient": self._grads(),
            "remedy": self.predictor.held(),
        }

    def kept_graph_bytes(self) -> int:
        """What the kept graphs of the micro-batches in flight saved besides their inputs and outputs (which `held`
        lists): activation bytes that are not in `held`."""
        return sum(pending.graph_bytes for pending in self._pending.values())

    def memory(self) -> MemoryStats:
        """What `held` holds now, by kind, and the kept graphs; `peak_bytes`: the largest total after any forward or
        backward, or now. Reading it changes nothing."""
        stats = memory_of(self.held())
        stats.activation_bytes += self.kept_graph_bytes()
        stats.peak_bytes = max(self._peak, stats.total_bytes)
        return stats

    # -- helpers ----------------------------------------------------------------------------------------------------
    def _keep(self, micro_batch: int, pending: Pending) -> None:
        self._pending[micro_batch] = pending
        pending.nbytes = nbytes(pending.tensors() + (pending.weights or [])) + pending.graph_bytes
        self._pending_bytes += pending.nbytes

    def _grads(self) -> list[torch.Tensor]:
        """The gradients the stage's parameters hold now (an accumulation group's, until its update)."""
        return [p.grad for p in self.params if p.grad is not None]

    def _take(self, micro_batch: int) -> Pending:
        if micro_batch not in self._pending:
            raise PipelineError(f"stage {self.index} has no forward record of micro-batch {micro_batch}")
        pending = self._pending.pop(micro_batch)
        self._pending_bytes -= pending.nbytes
        return pending

    def _count_backward(self, micro_batch: int) -> None:
        if micro_batch != self.counters.last_backward + 1:
            raise PipelineError(
                f"stage {self.index} backpropagated micro-batch {micro_batch} after {self.counters.last_backward}"
            )
        self.counters.last_backward = micro_batch
        self.counters.backwards += 1
        self.group.append(micro_batch)
        if len(self.group) == 1:  # the group's gradients now exist; they keep their storage until the update
            self._grad_bytes = nbytes(self._grads())
        self._track_peak()

    @property
    def _gradient_scale(self) -> float:
        """What the gradients accumulated in `.grad` are multiplied by (the fp16 loss scale)."""
        return self.loss_scale.scale if self.loss_scale is not None else 1.0

    def _autocast(self, value: Activation):
        return self.precision.autocast(as_tuple(value)[0].device)

    def _evaluate(self, inputs: Activation, weights: list[torch.Tensor] | None = None) -> Activation:
        """The stage (with `weights` in place of its parameters, if given) under the policy's autocast, its outputs in
        the stream dtype (part of the graph)."""
        with self._autocast(inputs), self._slots.holding(weights) if weights is not None else contextlib.nullcontext():
            outputs = self.stage(inputs)
        return self.precision.cast_streams(outputs)

    def _evaluate_keeping_graph(self, leaves: Activation, weights: list[torch.Tensor] | None) -> tuple[Activation, int]:
        """`_evaluate` with its graph, and the bytes that graph saved besides its inputs and outputs (and the weights
        and buffers, which are the model's). Counted by a saved-tensor hook on the first forward of each input shape
        only, and reused: what a graph saves follows from the shapes it runs on, and a hook on every forward would
        cost two Python calls per saved tensor (the pack, and the unpack in the backward). The hook's list is dropped
        at once, so that autograd frees each saved tensor as soon as its node has run in the backward."""
        key = tuple((t.shape, t.dtype, t.device) for t in as_tuple(leaves))
        counted = self._graph_bytes.get(key)
        with torch.enable_grad():
            if counted is not None:
                return self._evaluate(leaves, weights), counted
            model_state = [*(weights if weights is not None else self.params), *self.stage.buffers()]
            with recording_saved_tensors(exclude=model_state) as saved:
                outputs = self._evaluate(leaves, weights)
        counted = self._graph_bytes[key] = nbytes(saved, exclude=[*as_tuple(leaves), *as_tuple(outputs)])
        return outputs, counted

    def _outgoing(self, grad_inputs: Activation) -> Activation:
        return grad_inputs if self.loss_scale is None else self.loss_scale.unscale_outgoing(grad_inputs)

    def _forward_recording_rng(self, inputs: Activation, pending: Pending) -> Activation:
        """The forward, keeping in `pending` the RNG state it started from if it drew random numbers (per unit of
        a reversible StageGroup, whose reconstruction runs the units last to first)."""
        device = as_tuple(inputs)[0].device
        before = capture(device)
        if len(self.units) == 1:
            outputs = self.stage(inputs)
        else:
            outputs, states = inputs, []
            for unit in self.units:
                unit_before = capture(device)
                outputs = unit(outputs)
                states.append(drawn_since(unit_before))
            pending.unit_rngs = states if any(state is not None for state in states) else None
        pending.rng = drawn_since(before)
        return outputs

    def _recompute_and_backward(self, inputs, grad_outputs, weights) -> Activation | None:
        leaves = detached(inputs, requires_grad=not self.is_first)
        with stashed_weights(self.params, weights), torch.enable_grad():
            outputs = self._evaluate(leaves)
            backpropagate(outputs, grad_outputs)
        return None if self.is_first else self._leaf_grads(leaves)

    @staticmethod
    def _leaf_grads(leaves: Activation) -> Activation:
        return like(leaves, tuple(t.grad if t.grad is not None else torch.zeros_like(t) for t in as_tuple(leaves)))

    def _track_peak(self) -> None:
        """The peak after an operation, from running totals: each micro-batch's record counted once when it is made,
        the gradients once per group (they accumulate in place), the few messages waiting, and weight prediction's
        copy. Recounting every tensor held, as `memory()` does, would cost more than a small stage's operations."""
        waiting, remedy = nbytes(self.waiting_messages()), nbytes(self.predictor.held())
        self._peak = max(self._peak, self._pending_bytes + self._grad_bytes + waiting + remedy)


def run_stage(worker: StageWorker, router, forward: int | None, backward: int | None, targets: dict, loss_fn,
              outgoing: list) -> list[tuple[int, torch.Tensor]]:
    """One stage's share of a tick: the forward of micro-batch `forward` and the backward of `backward` (either
    may be None), taking inputs from and sending results through `router` (a `routing.Router`); then the update
    if its accumulation group is complete. The last stage does forward, loss and backward at once, popping the
    micro-batch's targets. Returns the (micro_batch, loss) pairs it finished."""
    index, losses = worker.index, []
    if worker.is_last:
        if forward is not None:
            inputs = router.forward_input(index, forward)
            loss, x, grad = worker.forward_backward_last(forward, inputs, targets.pop(forward), loss_fn)
            losses.append((forward, loss))
            router.send_backward(index, forward, x, grad, outgoing)
    else:
        if forward is not None:
            outputs = worker.forward(forward, router.forward_input(index, forward))
            router.send_forward(index, forward, outputs, outgoing)
        if backward is not None:
            outputs, grad_outputs = router.backward_input(index, backward)
            x, grad = worker.backward(backward, grad_outputs, outputs)
            router.send_backward(index, backward, x, grad, outgoing)
    worker.maybe_update()
    return losses
