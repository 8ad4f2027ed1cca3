"""The runner: drives the stage workers tick by tick, in one process or over torch.distributed ranks.

One code path serves both. Each rank owns a contiguous group of stages (all of them in a single process); a
message between two stages on the same rank goes through an in-process mailbox, a message between ranks through
`NeighbourTransport`. Every stage therefore runs exactly the same operations on the same values whichever way the
stages are spread, which is what makes the multi-process runner bit-identical to the one-process simulator.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .batchnorm import frozen_running_stats
from .errors import PipelineError, StageMismatchError
from .memory import MemoryStats
from .modes import Mode
from .placement import Placement
from .schedule import Schedule
from .tensors import Activation, as_tuple, to_device
from .transport import ActivationSpec, Incoming, NeighbourTransport, Outgoing, flatten
from .worker import StageCounters, StageWorker, UpdateHook

FORWARD_TAG, BACKWARD_TAG, INFER_TAG = 1, 2, 3

OptimizerFactory = Callable[[int, nn.Module], torch.optim.Optimizer | None]
SchedulerFactory = Callable[[int, torch.optim.Optimizer], Any]


class Pipeline:
    """Train a list of stages with PETRA (or one of the paper's baselines), one micro-batch per `step`.

    Args:
        stages: all J stages, in order, on every rank (only this rank's group is run and moved to `device`).
            A stage is an `nn.Module`; with `reversible = True` it must also offer `inverse(y)` and
            `reconstruct_and_backward(y, grad_y) -> (x, grad_x)`.
        loss_fn: `loss_fn(outputs_of_last_stage, targets) -> scalar`, averaged over the micro-batch.
        mode: one of `Mode` ("petra" by default).
        accumulation_steps: k; each stage averages the gradients of k consecutive micro-batches, then updates.
        optimizer_factory: `(stage_index, stage) -> optimizer` (or None: gradients are computed, never applied).
        scheduler_factory: `(stage_index, optimizer) -> LR scheduler`, stepped after every update.
        on_update: `(stage_index, micro_batches, stage)` called with the averaged gradients in `.grad`, just
            before the optimizer step (tests and gradient-fidelity benchmarks read gradients here).
        distributed: run over the default (or given) process group; defaults to "a group of size > 1 exists".
        partition: number of stages per rank (contiguous); defaults to an even split.
        data_parallel_size: D pipeline replicas over W = P x D ranks (replica d = ranks d*P .. d*P+P-1); each is
            fed its own micro-batches and the D copies of a stage average their gradients before every update.
        timeout: seconds to wait for a neighbour before raising `PeerFailureError`.

    Every rank calls `step` with the same micro-batches in the same order (rank 0 uses the inputs, the rank of
    the last stage uses the targets) and `drain` at the same points.
    """

    def __init__(
        self,
        stages: list[nn.Module],
        loss_fn: Callable[[Any, Any], torch.Tensor],
        *,
        mode: Mode | str = Mode.PETRA,
        accumulation_steps: int = 1,
        optimizer_factory: OptimizerFactory | None = None,
        scheduler_factory: SchedulerFactory | None = None,
        on_update: UpdateHook | None = None,
        distributed: bool | None = None,
        group: dist.ProcessGroup | None = None,
        partition: list[int] | None = None,
        data_parallel_size: int = 1,
        device: torch.device | str | None = None,
        timeout: float = 120.0,
    ):
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps (k) must be >= 1, got {accumulation_steps}")
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.stages = list(stages)
        self.loss_fn = loss_fn
        self.mode = Mode.parse(mode)
        self.accumulation_steps = accumulation_steps
        self.schedule = Schedule(len(self.stages), self.mode.pipelined)
        self.device = torch.device(device) if device is not None else None
        self.timeout = timeout

        if distributed is None:
            distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
        self.distributed = distributed
        self.data_parallel_size = data_parallel_size
        self.replica, self.replica_group = 0, None
        if data_parallel_size != 1:
            group = self._split_replicas(group, data_parallel_size)
        world = dist.get_world_size(group) if distributed else 1
        self.rank = dist.get_rank(group) if distributed else 0
        self.group = group
        self.placement = Placement.from_sizes(partition) if partition else Placement.balanced(len(self.stages), world)
        if self.placement.num_stages != len(self.stages) or len(self.placement.groups) != world:
            raise ValueError(
                f"partition {partition} must give every one of the {world} ranks a group, "
                f"covering all {len(self.stages)} stages"
            )
        self.local = self.placement.groups[self.rank]
        self.transport = None
        if distributed:
            global_ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
            self.transport = NeighbourTransport(
                global_ranks, group, timeout, self.placement.describe, self.device or torch.device("cpu")
            )

        self.workers: dict[int, StageWorker] = {}
        for index in self.local:
            stage = self.stages[index]
            if self.device is not None:
                stage.to(self.device)
            optimizer = optimizer_factory(index, stage) if optimizer_factory is not None else None
            scheduler = scheduler_factory(index, optimizer) if scheduler_factory and optimizer else None
            self.workers[index] = StageWorker(
                index,
                stage,
                mode=self.mode,
                num_stages=len(self.stages),
                accumulation_steps=accumulation_steps,
                optimizer=optimizer,
                scheduler=scheduler,
                on_update=on_update,
                reduce_gradients=self._average_over_replicas if self.replica_group is not None else None,
            )
        self._reconstructs = [self.mode.reconstructs and bool(getattr(s, "reversible", False)) for s in self.stages]

        self.tick = 0  # ticks run so far
        self.fed = 0  # micro-batches fed so far
        self._origin = (0, 0)  # (tick, micro-batch) at which the current schedule started (moves on drain)
        self._inputs: dict[int, Activation] = {}
        self._targets: dict[int, Any] = {}
        self._batch_sizes: dict[int, int] = {}
        self._mail: dict[tuple[int, str], dict[int, Any]] = defaultdict(dict)
        self._input_spec: ActivationSpec | None = None
        self._specs: dict[int, ActivationSpec] = {}  # output spec of stage i, for the boundaries this rank touches

    def _split_replicas(self, group, replicas: int) -> dist.ProcessGroup:
        """W = P x D ranks: replica d holds pipeline ranks d*P .. d*P+P-1. Returns this rank's pipeline group and
        sets the group of the D ranks that run the same stages (their gradients are averaged before each update)."""
        if replicas < 1:
            raise ValueError(f"data_parallel_size must be >= 1, got {replicas}")
        if not self.distributed or group is not None:
            raise ValueError("data parallelism needs the default torch.distributed process group")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % replicas:
            raise ValueError(f"{world} processes cannot form {replicas} equal pipeline replicas")
        size = world // replicas
        self.replica = rank // size
        pipelines = [dist.new_group(list(range(d * size, (d + 1) * size))) for d in range(replicas)]
        peers = [dist.new_group(list(range(p, world, size))) for p in range(size)]
        self.replica_group = peers[rank % size]
        return pipelines[self.replica]

    def _average_over_replicas(self, params: list[nn.Parameter]) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=self.replica_group)
        flat /= self.data_parallel_size
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def _average_buffers_over_replicas(self) -> None:
        """Replicas see different data, so their batch-norm running statistics differ: after a drain (before any
        evaluation or save) every replica takes their average, so all replicas hold the same model."""
        for index in self.local:
            buffers = [b for b in self.stages[index].buffers() if b.is_floating_point()]
            for buffer in buffers:
                dist.all_reduce(buffer, group=self.replica_group)
                buffer /= self.data_parallel_size

    # -- public API ---------------------------------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def undrained(self) -> int:
        """Micro-batches fed since the last drain (some may still be in flight)."""
        return self.fed - self._origin[1]

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.local

    def step(self, inputs: Activation, targets: Any = None) -> list[tuple[int, torch.Tensor]]:
        """Feed one micro-batch and advance the schedule until the next one can enter.

        Returns the (micro_batch, loss) pairs that the last stage finished on this rank during these ticks.
        """
        self._check_inputs(inputs)
        micro_batch = self.fed
        self.fed += 1
        self._batch_sizes[micro_batch] = as_tuple(inputs)[0].shape[0]
        if 0 in self.local:
            self._inputs[micro_batch] = to_device(inputs, self.device)
        if self.has_last_stage:
            self._targets[micro_batch] = to_device(targets, self.device) if torch.is_tensor(targets) else targets
        losses = []
        for _ in range(self.schedule.ticks_per_micro_batch):
            losses.extend(self._run_tick())
        return losses

    def drain(self) -> list[tuple[int, torch.Tensor]]:
        """Run ticks until every micro-batch fed has been backpropagated at every stage; apply partial groups."""
        losses = []
        if self.undrained:
            last_tick = self._origin[0] + self.schedule.backward_tick(self.undrained - 1, 0)
            while self.tick <= last_tick:
                losses.extend(self._run_tick())
        for worker in self.workers.values():
            worker.maybe_update(flush=True)
        if self.replica_group is not None:
            self._average_buffers_over_replicas()
        self._origin = (self.tick, self.fed)
        leftovers = [key for key, box in self._mail.items() if box] + list(self._inputs) + list(self._targets)
        if leftovers or any(w.in_flight for w in self.workers.values()):
            raise PipelineError(f"drain left work behind on {self.placement.describe(self.rank)}: {leftovers}")
        self._batch_sizes.clear()
        return losses

    @torch.no_grad()
    def infer(self, inputs: Activation) -> Any:
        """Forward one batch through all stages in eval mode (running statistics), without touching training
        state. Every rank passes the same `inputs`; the rank of the last stage gets the outputs, others None."""
        self._check_inputs(inputs)
        batch = as_tuple(inputs)[0].shape[0]
        modes = {index: self.stages[index].training for index in self.local}
        try:
            if self.local.start == 0:
                value = to_device(inputs, self.device)
            else:
                source = self.local.start - 1
                message = Incoming(self.rank - 1, INFER_TAG, self._specs[source].numel(batch), self._specs[source].dtype, "activations")
                (buffer,) = self.transport.exchange(self.rank, [], [message], self.tick)
                value = self._specs[source].unflatten(buffer, batch)
            for index in self.local:
                self.stages[index].eval()
                value = self.stages[index](value)
            if self.local.stop < self.num_stages:
                outgoing = Outgoing(self.rank + 1, INFER_TAG, flatten([value]))
                self.transport.exchange(self.rank, [outgoing], [], self.tick)
                return None
            return value
        finally:
            for index, training in modes.items():
                self.stages[index].train(training)

    def gather_stages(self, dst: int = 0) -> None:
        """Copy every stage's trained parameters and buffers onto the stage modules of pipeline rank `dst` (in
        every replica; replicas are identical), for saving."""
        if not self.distributed:
            return
        local = {i: {k: v.detach().cpu() for k, v in self.stages[i].state_dict().items()} for i in self.local}
        gathered = [None] * dist.get_world_size(self.group) if self.rank == dst else None
        dist.gather_object(local, gathered, dst=self._global_rank(dst), group=self.group)
        if self.rank == dst:
            for states in gathered:
                for index, state in states.items():
                    if index not in self.local:
                        self.stages[index].load_state_dict(state)

    def counters(self) -> dict[int, StageCounters]:
        return {index: worker.counters for index, worker in self.workers.items()}

    def memory(self) -> dict[int, MemoryStats]:
        return {index: worker.memory() for index, worker in self.workers.items()}

    def in_flight(self) -> dict[int, list[int]]:
        """Per local stage, the micro-batches between their forward and their backward (the FIFO)."""
        return {index: worker.in_flight for index, worker in self.workers.items()}

    # -- one tick -----------------------------------------------------------------------------------------------------
    def _run_tick(self) -> list[tuple[int, torch.Tensor]]:
        start_tick, start_mb = self._origin
        tick, fed = self.tick - start_tick, self.fed - start_mb
        losses, outgoing = [], []
        for index in self.local:
            worker = self.workers[index]
            forward = self.schedule.forward_at(index, tick, fed)
            backward = self.schedule.backward_at(index, tick, fed)
            if worker.is_last:
                if forward is not None:
                    micro_batch = forward + start_mb
                    inputs = self._forward_input(index, micro_batch)
                    loss, x, grad = worker.forward_backward_last(
                        micro_batch, inputs, self._targets.pop(micro_batch), self.loss_fn
                    )
                    losses.append((micro_batch, loss))
                    self._send_backward(index, micro_batch, x, grad, outgoing)
            else:
                if forward is not None:
                    micro_batch = forward + start_mb
                    outputs = worker.forward(micro_batch, self._forward_input(index, micro_batch))
                    self._send_forward(index, micro_batch, outputs, outgoing)
                if backward is not None:
                    micro_batch = backward + start_mb
                    outputs, grad_outputs = self._mail[(index, "backward")].pop(micro_batch)
                    x, grad = worker.backward(micro_batch, grad_outputs, outputs)
                    self._send_backward(index, micro_batch, x, grad, outgoing)
            worker.maybe_update()
        if self.distributed:
            self._exchange(outgoing, tick, fed, start_mb)
        self.tick += 1
        return losses

    def _forward_input(self, index: int, micro_batch: int) -> Activation:
        if index == 0:
            return self._inputs.pop(micro_batch)
        return self._mail[(index, "forward")].pop(micro_batch)

    def _send_forward(self, index: int, micro_batch: int, outputs: Activation, outgoing: list[Outgoing]) -> None:
        if index + 1 in self.local:
            self._mail[(index + 1, "forward")][micro_batch] = outputs
        else:
            outgoing.append(Outgoing(self.rank + 1, FORWARD_TAG, flatten([outputs])))

    def _send_backward(self, index, micro_batch, inputs, grad_inputs, outgoing: list[Outgoing]) -> None:
        if index == 0:
            return
        # The previous stage gets its output back only if it rebuilds its own input from it.
        returned = inputs if self._reconstructs[index - 1] else None
        if index - 1 in self.local:
            self._mail[(index - 1, "backward")][micro_batch] = (returned, grad_inputs)
        else:
            outgoing.append(Outgoing(self.rank - 1, BACKWARD_TAG, flatten([returned, grad_inputs])))

    def _exchange(self, outgoing: list[Outgoing], tick: int, fed: int, start_mb: int) -> None:
        """Swap this tick's messages with the neighbouring ranks; file what arrives for the next tick."""
        incoming, arrivals = [], []
        if self.local.start > 0:
            source = self.local.start - 1
            forward = self.schedule.forward_at(source, tick, fed)
            if forward is not None:
                micro_batch = forward + start_mb
                spec = self._specs[source]
                batch = self._batch_sizes[micro_batch]
                incoming.append(Incoming(self.rank - 1, FORWARD_TAG, spec.numel(batch), spec.dtype, "activations"))
                arrivals.append(("forward", micro_batch, batch))
        if self.local.stop < self.num_stages:
            source = self.local.stop
            backward = self.schedule.backward_at(source, tick, fed)
            if backward is not None:
                micro_batch = backward + start_mb
                spec = self._specs[source - 1]
                batch = self._batch_sizes[micro_batch]
                copies = 2 if self._reconstructs[source - 1] else 1
                incoming.append(Incoming(self.rank + 1, BACKWARD_TAG, copies * spec.numel(batch), spec.dtype, "gradients"))
                arrivals.append(("backward", micro_batch, batch))
        buffers = self.transport.exchange(self.rank, outgoing, incoming, self.tick)
        for (kind, micro_batch, batch), buffer in zip(arrivals, buffers):
            if kind == "forward":
                self._mail[(self.local.start, "forward")][micro_batch] = self._specs[self.local.start - 1].unflatten(buffer, batch)
            else:
                last = self.local.stop - 1
                spec = self._specs[last]
                if self._reconstructs[last]:
                    half = spec.numel(batch)
                    payload = (spec.unflatten(buffer[:half], batch), spec.unflatten(buffer[half:], batch))
                else:
                    payload = (None, spec.unflatten(buffer, batch))
                self._mail[(last, "backward")][micro_batch] = payload

    # -- start-up checks ----------------------------------------------------------------------------------------------
    def _check_inputs(self, inputs: Activation) -> None:
        tensors = as_tuple(inputs) if isinstance(inputs, (tuple, torch.Tensor)) else ()
        if not tensors or not all(torch.is_tensor(t) for t in tensors):
            raise ValueError(f"pipeline inputs must be a tensor or a tuple of tensors, got {type(inputs).__name__}")
        spec = ActivationSpec.of(inputs)
        if self._input_spec is None:
            self._handshake(spec)
        elif spec != self._input_spec:
            raise ValueError(
                f"micro-batch of shape {spec.describe()} differs from the first micro-batch "
                f"{self._input_spec.describe()}: every micro-batch must have the same per-sample shape and dtype"
            )

    def _handshake(self, input_spec: ActivationSpec) -> None:
        """Learn the shape of every boundary once, checking that each stage accepts its neighbour's output."""
        if self.distributed:
            settings = (self.num_stages, self.mode.value, self.accumulation_steps, [len(g) for g in self.placement.groups])
            everyone = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(everyone, settings, group=self.group)
            if any(other != settings for other in everyone):
                raise StageMismatchError(f"ranks disagree on (stages, mode, k, partition): {everyone}")
        error = None
        spec = input_spec
        if self.local.start > 0:
            received = [None]
            dist.recv_object_list(received, src=self._global_rank(self.rank - 1), group=self.group)
            spec, error = received[0]
            if spec is not None:
                self._specs[self.local.start - 1] = spec
        if error is None:
            spec, error = self._dry_run(spec)
        if self.local.stop < self.num_stages:
            dist.send_object_list([(spec, error)], dst=self._global_rank(self.rank + 1), group=self.group)
        if self.distributed:
            errors = [None] * dist.get_world_size(self.group)
            dist.all_gather_object(errors, error, group=self.group)
            error = next((e for e in errors if e is not None), None)
        if error is not None:
            raise StageMismatchError(error)
        self._input_spec = input_spec

    def _dry_run(self, spec: ActivationSpec) -> tuple[ActivationSpec | None, str | None]:
        """Run this rank's stages on a zero batch of `spec` (no state changes); report the first mismatch."""
        device = self.device or torch.device("cpu")
        value = spec.unflatten(torch.zeros(spec.numel(2), dtype=spec.dtype, device=device), 2)
        for index in self.local:
            stage = self.stages[index]
            dtypes = {p.dtype for p in stage.parameters() if p.is_floating_point()}
            previous = f"stage {index - 1} ({type(self.stages[index - 1]).__name__})" if index else "the input"
            here = f"stage {index} ({type(stage).__name__})"
            if dtypes and spec.dtype not in dtypes:
                return None, f"{here} has {sorted(map(str, dtypes))} parameters but {previous} gives {spec.describe()}"
            try:
                with torch.no_grad(), frozen_running_stats(stage):
                    value = stage(value)
            except Exception as error:  # any failure here is a mismatch between the two stages
                return None, f"{here} cannot take the output of {previous}, {spec.describe()}: {error}"
            if index < self.num_stages - 1:
                spec = ActivationSpec.of(value)
                self._specs[index] = spec
        return spec, None

    def _global_rank(self, position: int) -> int:
        return self.transport.global_ranks[position]
