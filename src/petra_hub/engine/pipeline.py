"""The runner: drives the stage workers tick by tick, in one process or over torch.distributed ranks.

One code path serves both. Each rank owns a contiguous group of stages (all of them in a single process); a
message between two stages on the same rank goes through an in-process mailbox, a message between ranks through
`NeighbourTransport` (see `routing`). Every stage therefore runs exactly the same operations on the same values
whichever way the stages are spread, which is what makes the multi-process runner bit-identical to the
one-process simulator.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .collectives import average_buffers, average_gradients, gather_stages
from .compilation import compile_stage
from .errors import Breaker, PipelineError, peer_failure
from .fidelity import StageFidelity, StageProbe, gather, measure
from .graph_budget import kept_graphs
from .handshake import check_same_spec, handshake, input_spec_of
from .inference import evaluating, forward_local
from .modes import Mode
from .options import (Diagnostics, Layout, MemoryOptions, OptionError, Remedies, check_accumulation_steps,
                      check_max_grad_norm, check_timeout)
from .partitioning import auto_partition
from .placement import Placement, pipeline_groups
from .precision import Precision
from .readings import Readings
from .protocol import DRAIN, GATHER, INFER, PROBE, STEP, Moment
from .routing import Router
from .schedule import Schedule
from .snapshot import loaded_targets, saved_targets
from .tensors import Activation, as_tuple, to_device
from .trace import EXCHANGE, Trace
from .transport import ActivationSpec, NeighbourTransport
from .wire import broadcast_tensors
from .worker import StageUpdate, StageWorker, UpdateHook, run_stage

OptimizerFactory = Callable[[int, nn.Module], torch.optim.Optimizer | None]
SchedulerFactory = Callable[[int, torch.optim.Optimizer], Any]


def _option(value, kind: type, name: str):
    """`value`, an option object of class `kind` (None: its defaults)."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__} (or None: its defaults), got {type(value).__name__}")
    return value


class Pipeline(Readings):
    """Train a list of stages with PETRA (or one of the paper's baselines), one micro-batch per `step`.

    Args:
        stages: all J stages, in order, on every rank (only this rank's group is run and moved to the device).
            A stage is an `nn.Module`; with `reversible = True` it must also offer `inverse(y)` and
            `reconstruct_and_backward(y, grad_y) -> (x, grad_x)` (see `petra_hub.engine.stages`).
        loss_fn: `loss_fn(outputs_of_last_stage, targets) -> scalar`, averaged over the micro-batch.
        mode: one of `Mode` ("petra" by default).
        accumulation_steps: k; each stage averages the gradients of k consecutive micro-batches, then updates
            (`end_group` closes a group early).
        optimizer_factory: `(stage_index, stage) -> optimizer` (or None: gradients are computed, never applied).
        scheduler_factory: `(stage_index, optimizer) -> LR scheduler`, stepped after every update.
        on_update: `(stage_index, micro_batches, stage)` called with the averaged gradients in `.grad`, just
            before the optimizer step.
        distributed: run over the default (or given) process group; defaults to "a group of size > 1 exists".
        group: the process group of the pipeline ranks (default: all ranks).
        timeout: seconds to wait for a neighbour before raising `PeerFailureError`.
        max_grad_norm: clip each stage's averaged gradient to this norm before its update (None or 0: off); each
            stage clips its own: stages update at different ticks, so there is no global norm.
        precision: a `Precision` or "bf16" / "fp16" (see `petra_hub.engine.precision`); default: stages' own dtype.
        compile_options: compile this rank's stages with `torch.compile(**compile_options)` (see `compilation`).
        profile_batch: (inputs, targets), a micro-batch to measure the stages on, for `Layout(partition="auto")`
            and `MemoryOptions(memory_budget=...)`.
        layout: a `Layout`: the partition of the stages over the ranks, data-parallel replicas, the device.
        remedies: a `Remedies`: what counters the delay of the gradients (weight prediction).
        memory: a `MemoryOptions`: the stages that keep their forward's graph (`keep_graphs`, `memory_budget`).
        diagnostics: a `Diagnostics`: tracing, sampled reconstruction checks.
        (See `petra_hub.engine.options`; each defaults to its class's defaults: all off, an even split.)

    Every rank calls `step` with the same micro-batches in the same order (rank 0 uses the inputs, the rank of
    the last stage uses the targets), and `end_group` and `drain` at the same points. An exception inside an
    operation (a loss that raises, a peer that fails) breaks the pipeline: later operations raise a PipelineError
    chaining it.
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
        timeout: float = 120.0,
        max_grad_norm: float | None = None,
        precision: Precision | str | None = None,
        compile_options: dict[str, Any] | None = None,
        profile_batch: tuple | None = None,
        layout: Layout | None = None,
        remedies: Remedies | None = None,
        memory: MemoryOptions | None = None,
        diagnostics: Diagnostics | None = None,
    ):
        if not stages:
            raise ValueError("a pipeline needs at least one stage")
        check_accumulation_steps(accumulation_steps)
        check_timeout(timeout)
        check_max_grad_norm(max_grad_norm)
        self.layout = _option(layout, Layout, "layout")
        self.remedies = _option(remedies, Remedies, "remedies")
        self.memory_options = _option(memory, MemoryOptions, "memory")
        self.diagnostics = _option(diagnostics, Diagnostics, "diagnostics")
        self.precision = precision if isinstance(precision, Precision) else Precision.of(precision)
        self.stages = list(stages)
        self.loss_fn = loss_fn
        self.mode = Mode.parse(mode)
        if self.remedies.synchronous_updates and self.mode is not Mode.PETRA:
            raise OptionError("synchronous_updates", f"0 in mode {self.mode.value} (a synchronous start is PETRA's: "
                              "it begins in reversible_backprop, the same stages without delay)",
                              self.remedies.synchronous_updates)
        # the mode the stages run in now: reversible_backprop during a synchronous start, else `mode`
        self.running_mode = Mode.REVERSIBLE_BACKPROP if self.remedies.synchronous_updates else self.mode
        self.updates = 0  # accumulation groups closed so far: each stage's optimizer updates, once applied
        self.accumulation_steps = accumulation_steps
        self.weight_prediction = self.remedies.weight_prediction
        self.schedule = Schedule(len(self.stages), self.running_mode.pipelined)
        self.device = self.layout.device
        self.timeout = timeout
        self._max_grad_norm = max_grad_norm or 0.0

        if distributed is None:
            distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1
        self.distributed = distributed
        self.data_parallel_size = data_parallel_size = self.layout.data_parallel_size
        # job_group: every rank of the run (this pipeline's, or with replicas all of theirs: the default group)
        self.group, self.job_group, self.replicas = pipeline_groups(group, data_parallel_size, distributed)
        group = self.group
        world = dist.get_world_size(group) if distributed else 1
        self.rank = dist.get_rank(group) if distributed else 0
        partition = self.layout.partition
        if partition == "auto":  # one split for the whole run (every replica), measured with the options that change
            # what a stage costs (not the scheduler, which could move the profile's weights from learning rate 0, nor
            # on_update, which would see its gradients; nor the tracing, which the profile does itself)
            partition = auto_partition(
                Pipeline, self.stages, loss_fn, profile_batch, world, self.mode, self.job_group, distributed,
                layout=Layout(device=self.device), precision=self.precision, optimizer_factory=optimizer_factory,
                accumulation_steps=accumulation_steps, max_grad_norm=max_grad_norm, compile_options=compile_options,
                remedies=self.remedies, memory=self.memory_options,
                diagnostics=Diagnostics(check_reconstruction_every=self.diagnostics.check_reconstruction_every,
                                        grad_norms=self.diagnostics.grad_norms))
        self.placement = Placement.for_pipeline(partition, len(self.stages), world)
        self.local = self.placement.groups[self.rank]
        self._global_ranks: list[int] | None = None
        if distributed:
            self._global_ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
        self.describe_rank = functools.partial(self.placement.describe, global_ranks=self._global_ranks)  # for errors
        self.transport = NeighbourTransport(self._global_ranks, group, timeout, self.describe_rank,
                                            self.device or torch.device("cpu")) if distributed else None

        self.trace = Trace(dist.get_rank() if distributed else 0) if self.diagnostics.trace else None
        self.kept_graphs = kept_graphs(self.stages, self.mode, self.placement.groups, self.memory_options,
                                       profile_batch[0] if profile_batch is not None else None)
        reconstructs = [self.mode.rebuilds_input(stage, index in self.kept_graphs)
                        for index, stage in enumerate(self.stages)]
        self.router = Router(
            self.rank, self.local, len(self.stages), reconstructs, self.schedule, self.transport,
            self.precision.messages
        )
        self.workers: dict[int, StageWorker] = {}
        reduce = None if self.replicas is None else functools.partial(  # replicas average gradients before updates
            average_gradients, group=self.replicas.peer_group, size=data_parallel_size)
        for index in self.local:
            stage = self.stages[index]
            if self.device is not None:
                stage.to(self.device)
            if compile_options is not None:
                compile_stage(stage, **compile_options)
            optimizer = optimizer_factory(index, stage) if optimizer_factory is not None else None
            scheduler = scheduler_factory(index, optimizer) if scheduler_factory and optimizer else None
            self.workers[index] = StageWorker(
                index,
                stage,
                mode=self.running_mode,
                num_stages=len(self.stages),
                update=StageUpdate(accumulation_steps, optimizer, scheduler, reduce, max_grad_norm, on_update),
                precision=self.precision,
                remedies=self.remedies,
                diagnostics=self.diagnostics,
                trace=self.trace,
                keep_graph=index in self.kept_graphs,
                waiting_messages=functools.partial(self.router.waiting, index),
            )

        self.tick = 0  # ticks run so far
        self.fed = 0  # micro-batches fed so far
        self._origin = (0, 0)  # (tick, micro-batch) at which the current schedule started (moves on drain)
        self._remembered_from = 0  # the oldest micro-batch whose size the router still keeps
        self._fed_in_group = 0
        self._targets: dict[int, Any] = {}
        self._probes: dict[int, int | None] = {}  # probed micro-batch -> its size once fed
        self._input_spec: ActivationSpec | None = None
        self._handshaken = False
        self._breaker = Breaker()

    # -- public API ---------------------------------------------------------------------------------------------------
    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def undrained(self) -> int:
        """Micro-batches fed since the last drain (some may still be in flight)."""
        return self.fed - self._origin[1]

    @property
    def fed_in_group(self) -> int:
        """Micro-batches fed into the accumulation group still open (0: the last `step` or `end_group` closed one)."""
        return self._fed_in_group

    def step(self, inputs: Activation | None = None, targets: Any = None, *, batch_size: int | None = None,
             sample_ids: torch.Tensor | None = None) -> list[tuple[int, torch.Tensor]]:
        """Feed one micro-batch and advance the schedule until the next one can enter.

        Only the rank of stage 0 needs the `inputs`, and only the rank of the last stage the `targets`; a rank
        without inputs gives the micro-batch's `batch_size`. `sample_ids` (the indices of its samples, a CPU tensor)
        is what neighbouring ranks compare to check that they feed the same micro-batches, where every rank has
        them; else they compare the digests of the targets where both have them.

        Returns the (micro_batch, loss) pairs that the last stage finished on this rank during these ticks.
        """
        size = self._batch_size(inputs, batch_size)
        with self._guard_and_handshake(inputs, feeding=True):
            return self._step(inputs, targets, size, sample_ids)

    def _batch_size(self, inputs: Activation | None, batch_size: int | None) -> int:
        if inputs is None:
            if self.has_first_stage:
                raise ValueError(f"{self.describe_rank(self.rank)} runs stage 0 and needs the micro-batch's inputs")
            if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
                raise ValueError(f"a micro-batch fed without inputs needs its batch_size (a positive int), got "
                                 f"{batch_size!r}")
            return batch_size
        tensors = as_tuple(inputs)
        size = tensors[0].shape[0] if tensors and torch.is_tensor(tensors[0]) and tensors[0].dim() else None
        if batch_size is not None and size is not None and batch_size != size:
            raise ValueError(f"batch_size={batch_size} but the inputs hold {size} samples")
        return size

    def _step(self, inputs: Activation | None, targets: Any, batch_size: int,
              sample_ids: torch.Tensor | None) -> list[tuple[int, torch.Tensor]]:
        micro_batch = self.fed
        self.fed += 1
        self.router.note_fed(micro_batch, batch_size, targets if sample_ids is None else sample_ids)
        if micro_batch in self._probes:
            self._probes[micro_batch] = self.router.batch_sizes[micro_batch]
        if 0 in self.local:
            self.router.put_input(micro_batch, to_device(inputs, self.device))
        if self.has_last_stage:
            self._targets[micro_batch] = to_device(targets, self.device) if torch.is_tensor(targets) else targets
        self._fed_in_group += 1
        if self._fed_in_group == self.accumulation_steps:
            self._fed_in_group = 0
            self.updates += 1
        losses = []
        for _ in range(self.schedule.ticks_per_micro_batch):
            losses.extend(self._run_tick(STEP))
        self._forget_finished()
        if self._synchronous_start_done():
            losses.extend(self._leave_synchronous_start())
        return losses

    def _forget_finished(self) -> None:
        """Forget the size and digest of each micro-batch that has finished at every stage, all but the last one fed
        (the headers name it), so that a long run between drains keeps only those of the micro-batches in flight."""
        start_tick, first = self._origin
        while self._remembered_from < self.fed - 1 and \
                start_tick + self.schedule.backward_tick(self._remembered_from - first, 0) < self.tick:
            self.router.forget(self._remembered_from)
            self._remembered_from += 1

    def _synchronous_start_done(self) -> bool:
        return self.running_mode is not self.mode and self.updates >= self.remedies.synchronous_updates

    def _leave_synchronous_start(self) -> list[tuple[int, torch.Tensor]]:
        """Drain (in a synchronous mode every micro-batch fed has finished already), then run in `mode`: the same
        stages, weights and optimizer states, now pipelined."""
        losses = self._drain()
        self._enter_mode(self.mode)
        return losses

    def _enter_mode(self, mode: Mode) -> None:
        self.running_mode = mode
        self.schedule = self.router.schedule = Schedule(len(self.stages), mode.pipelined)
        for worker in self.workers.values():
            worker.enter_mode(mode, self.remedies)

    def resume_after(self, updates: int) -> None:
        """Tell a new pipeline that the run it continues made `updates` updates per stage already (a resumed run):
        a synchronous start that those updates completed is over. Call it before the first `step`."""
        if self.fed:
            raise PipelineError("resume_after() is for a pipeline that has fed nothing yet")
        self.updates = updates
        if self._synchronous_start_done():
            self._leave_synchronous_start()

    def end_group(self) -> None:
        """Close the open accumulation group after the last micro-batch fed: every stage applies it (averaged over
        its size) right after that micro-batch's backward, without waiting for k. Nothing to do if none is open."""
        self._breaker.check()
        if not self._fed_in_group:
            return
        with self._breaker.guard(lambda: self.tick):
            for worker in self.workers.values():
                worker.end_group_after(self.fed - 1)
                # a stage that has backpropagated it already (synchronous modes; a one-stage pipeline) applies the
                # group now, before its next forward
                worker.maybe_update()
            self._fed_in_group = 0
            self.updates += 1
            if self._synchronous_start_done():
                self._leave_synchronous_start()

    def drain(self) -> list[tuple[int, torch.Tensor]]:
        """Run ticks until every micro-batch fed has been backpropagated at every stage; apply partial groups."""
        with self._guard_and_handshake():
            return self._drain()

    def _drain(self) -> list[tuple[int, torch.Tensor]]:
        losses = []
        if self.undrained:
            last_tick = self._origin[0] + self.schedule.backward_tick(self.undrained - 1, 0)
            while self.tick <= last_tick:
                losses.extend(self._run_tick(DRAIN))
        for worker in self.workers.values():
            worker.maybe_update(flush=True)
        if self.replicas is not None:
            average_buffers([self.stages[i] for i in self.local], self.replicas.peer_group, self.data_parallel_size)
        self._origin = (self.tick, self.fed)
        self._remembered_from = self.fed
        self._fed_in_group = 0
        leftovers = self.router.leftovers() + list(self._targets)
        if leftovers or any(w.in_flight for w in self.workers.values()):
            raise PipelineError(f"drain left work behind on {self.describe_rank(self.rank)}: {leftovers}")
        self.router.forget_fed()
        return losses

    @torch.no_grad()
    def infer(self, inputs: Activation | None = None, *, batch_size: int | None = None) -> Any:
        """Forward one batch through all stages in eval mode (running statistics), without touching training
        state. Only the rank of stage 0 needs the `inputs` (the same on every rank that passes them); a rank without
        them gives the `batch_size`. The rank of the last stage gets the outputs, others None."""
        batch = self._batch_size(inputs, batch_size)
        with self._guard_and_handshake(inputs, feeding=True), \
                evaluating([self.stages[index] for index in self.local]):
            if self.local.start == 0:
                value = to_device(inputs, self.device)
            else:
                value = self.router.receive_for_inference(batch, self._moment(INFER))
            value = forward_local(self.stages, self.local, value, self.precision, self.router)
            if self.local.stop < self.num_stages:
                self.router.send_for_inference(value, batch, self._moment(INFER))
                return None
            return value

    def share_from_first_stage(self, tensors: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
        """The `tensors` (name -> CPU tensor, or None for nothing) that the rank of stage 0 passes, on every rank of
        this pipeline (the others pass None; an empty dict arrives as None). How the one rank that reads the data
        tells the others whether a micro-batch comes, its size and its targets, where they cannot read them
        themselves (a stream cannot be read twice in the same order). A collective: every rank calls it at the same
        points."""
        with self._guard_and_handshake():
            if not self.distributed:
                return tensors or None
            with peer_failure("hear from the first stage whether a micro-batch comes", self.describe_rank(self.rank)):
                shared = broadcast_tensors(tensors or {} if self.has_first_stage else None, self._global_ranks[0],
                                           self.group)
            return shared or None

    def gather_stages(self, dst: int | None = 0) -> None:
        """Copy every stage's trained parameters and buffers onto the stage modules of pipeline rank `dst` (in
        every replica; replicas are identical), for saving; with `dst=None`, onto every rank (so that each rank
        holds the whole trained model). The ranks first confirm to each other that they all gather here."""
        with self._guard_and_handshake():
            if self.distributed:
                self.router.agree(self._moment(GATHER, extra=-1 if dst is None else dst))
                gather_stages(self.stages, self.local, self.rank, dst, self.group, self._global_ranks,
                              self.describe_rank)

    def snapshot_blocker(self) -> str | None:
        """Why the work in flight cannot be saved as it is (None: it can), so that `state_dict` needs a drain first.
        Decided from the run's settings only, so every rank decides the same."""
        if self.mode.pipelined and (self.kept_graphs or self.mode.keeps_graph):
            return f"stages {sorted(self.kept_graphs)} keep their forward's autograd graph, which cannot be saved"
        if self.replicas is not None:
            return "data-parallel replicas average their batch-norm statistics only when drained"
        if self._probes:
            return "a gradient-fidelity probe is in flight"
        return None

    def state_dict(self) -> dict[int, dict[str, Any]]:
        """This rank's state beside the stages' weights, keyed by stage index: each stage's optimizer,
        LR-scheduler, loss-scale and weight-prediction states, and under "in_flight" what it holds between ticks
        (the micro-batches between forward and backward, their messages and targets, its open accumulation group,
        its counters) with the pipeline's position. Keyed by stage, so a run may resume on a different number of
        processes with the same stages. It may be taken between any two `step`s, without a drain, unless
        `snapshot_blocker` says why not; a pipeline loaded from it continues exactly as this one does."""
        self._breaker.check()
        blocker = self.snapshot_blocker() if self.undrained else None
        if blocker:
            raise PipelineError(f"state_dict() needs a drained pipeline here ({blocker}): call drain() first")
        position = self._position()
        states = {}
        for index, worker in self.workers.items():
            in_flight = {**worker.in_flight_state(), "mail": self.router.mail_for(index), "position": position}
            if worker.is_last:
                in_flight["targets"] = {m: saved_targets(t, f"micro-batch {m}") for m, t in self._targets.items()}
            states[index] = {**worker.state_dict(), "in_flight": in_flight}
        return states

    def _position(self) -> dict[str, Any]:
        """Where the schedule stands, the same on every rank: ticks run, micro-batches fed, the origin of the
        schedule, the open group, the updates, the mode running now and the sizes the router keeps (those of the
        micro-batches in flight and of the last one fed: `_forget_finished`)."""
        return {"tick": self.tick, "fed": self.fed, "origin": list(self._origin), "fed_in_group": self._fed_in_group,
                "updates": self.updates, "running_mode": self.running_mode.value,
                "batch_sizes": dict(self.router.batch_sizes)}

    def load_state_dict(self, state: dict[int, dict[str, Any]]) -> None:
        """Restore what `state_dict` returned (entries of stages on other ranks are ignored). With the work in
        flight, before the first `step`: the pipeline then continues where the saved one stood."""
        missing = [index for index in self.workers if index not in state]
        if missing:
            raise KeyError(f"no saved optimizer state for stage(s) {missing} of {self.describe_rank(self.rank)}")
        in_flight = {index: state[index].get("in_flight") for index in self.workers}
        position = self._saved_position(in_flight)
        if position is not None and Mode.parse(position["running_mode"]) is not self.running_mode:
            self._enter_mode(Mode.parse(position["running_mode"]))  # a synchronous start was over
        for index, worker in self.workers.items():
            worker.load_state_dict(state[index])
        if position is not None:
            self._load_in_flight(in_flight, position)

    def _saved_position(self, in_flight: dict[int, dict | None]) -> dict | None:
        """The position the saved stages stand at (None: saved without one), the same for all of them."""
        if all(value is None for value in in_flight.values()):
            return None
        if self.fed or self.tick:
            raise PipelineError("a pipeline loads the work in flight before its first step")
        lacking = [index for index, value in in_flight.items() if value is None]
        if lacking:
            raise ValueError(f"the saved states of stages {lacking} lack the work in flight the others hold")
        positions = [value["position"] for value in in_flight.values()]
        if any(position != positions[0] for position in positions):
            raise ValueError(f"the saved stages {sorted(in_flight)} stand at different positions: they come from "
                             "different moments of a run")
        return positions[0]

    def _load_in_flight(self, in_flight: dict[int, dict], position: dict) -> None:
        self.tick, self.fed = int(position["tick"]), int(position["fed"])
        self._origin = (int(position["origin"][0]), int(position["origin"][1]))
        self._fed_in_group, self.updates = int(position["fed_in_group"]), int(position["updates"])
        self.router.batch_sizes.update((int(m), int(size)) for m, size in position["batch_sizes"].items())
        self._remembered_from = min(self.router.batch_sizes, default=self.fed)
        for index, worker in self.workers.items():
            device = self.device or next((p.device for p in worker.params), None)  # where the stage runs
            worker.load_in_flight_state(in_flight[index], device)
            self._check_in_flight(worker)
            self.router.load_mail(index, in_flight[index]["mail"], device)
            if worker.is_last:
                self._targets = {int(m): loaded_targets(t, device) for m, t in in_flight[index]["targets"].items()}

    def _check_in_flight(self, worker: StageWorker) -> None:
        """The micro-batches a loaded stage holds are those the schedule has in flight at it now."""
        start_tick, first = self._origin
        recent = range(max(first, self.fed - self.schedule.latency), self.fed)  # none older can be in flight
        expected = [] if worker.is_last else [
            m for m in recent
            if start_tick + self.schedule.forward_tick(m - first, worker.index) < self.tick
            <= start_tick + self.schedule.backward_tick(m - first, worker.index)]
        if worker.in_flight != expected:
            raise ValueError(f"the saved stage {worker.index} holds micro-batches {worker.in_flight} in flight, where "
                             f"the schedule has {expected} at tick {self.tick}")

    def probe(self) -> int:
        """Keep what `gradient_fidelity` needs of the next micro-batch fed (it trains as usual); returns its
        number. Every rank calls it at the same point."""
        self._breaker.check()
        for worker in self.workers.values():
            worker.probes[self.fed] = StageProbe()
        self._probes[self.fed] = None
        return self.fed

    def gradient_fidelity(self) -> list[StageFidelity]:
        """For each probed micro-batch whose backward has reached stage 0: every stage's gradient against the
        end-to-end gradient and the stashed-weight delayed gradient (see `fidelity`), for all stages, on every rank.
        Training state is untouched. A collective when a probe is ready: every rank calls it at the same points."""
        with self._guard_and_handshake():
            start_tick, first = self._origin
            ready = [m for m, batch in self._probes.items() if batch is not None and (
                m < first or self.tick > start_tick + self.schedule.backward_tick(m - first, 0))]
            results = []
            for micro_batch in ready:
                batch = self._probes.pop(micro_batch)
                probes = {index: worker.probes.pop(micro_batch) for index, worker in self.workers.items()}
                results += measure(micro_batch, batch, probes, self.stages, self.local, self.loss_fn, self.precision,
                                   self.router, self._moment(PROBE, extra=micro_batch))
            return gather(results, self.group, self.distributed) if ready else []

    # -- one tick -----------------------------------------------------------------------------------------------------
    def _run_tick(self, kind: int) -> list[tuple[int, torch.Tensor]]:
        moment = self._moment(kind)
        headers = self.router.post_headers(moment) if self.distributed else None  # they travel during the work
        losses, outgoing = [], []
        for index, forward, backward in self.schedule.work_at(self.local, moment.tick, moment.fed):
            forward, backward = (None if b is None else b + moment.first for b in (forward, backward))
            losses.extend(run_stage(self.workers[index], self.router, forward, backward, self._targets, self.loss_fn,
                                    outgoing))
        if self.distributed:
            with self.trace.record("exchange", EXCHANGE) if self.trace else contextlib.nullcontext():
                self.router.exchange(outgoing, moment, headers)
        self.tick += 1
        return losses

    def _moment(self, kind: int, extra: int = 0) -> Moment:
        start_tick, first = self._origin
        return Moment(kind, self.tick, self.tick - start_tick, self.fed - first, first, self._fed_in_group, extra)

    @contextlib.contextmanager
    def _guard_and_handshake(self, inputs: Activation | None = None, feeding: bool = False) -> Iterator[None]:
        """Check `inputs` (a ValueError changes nothing), run the start-up handshake on the first micro-batch fed
        (`feeding`; only the rank of stage 0 needs its inputs), then the block; any exception from the handshake on
        marks the pipeline broken."""
        self._breaker.check()
        spec = input_spec_of(inputs) if inputs is not None else None
        if spec is not None and self._input_spec is not None:
            check_same_spec(spec, self._input_spec)
        with self._breaker.guard(lambda: self.tick):
            if (spec is not None or feeding) and not self._handshaken:  # learn every boundary's shape
                settings = self._settings()
                handshake(spec, self.stages, self.router, settings, self.group, self.job_group, self._global_ranks,
                          self.device, self.precision)
                self._handshaken = True
            if spec is not None and self._input_spec is None:
                self._input_spec = spec
            yield

    def _settings(self) -> dict:
        """What every rank of the run must agree on (kept graphs set the messages' sizes, clipping the updates)."""
        return {"stages": self.num_stages, "mode": self.mode.value, "accumulation_steps": self.accumulation_steps,
                "partition": [len(g) for g in self.placement.groups], "precision": self.precision.describe(),
                "weight_prediction": self.weight_prediction, "kept_graphs": sorted(self.kept_graphs),
                "max_grad_norm": self._max_grad_norm, "data_parallel_size": self.data_parallel_size}
