"""What can be read off a running pipeline: counters, memory, time and bytes exchanged, traces, the learning rate.
None of it changes the pipeline's state; `trace_events` alone is a collective."""

from __future__ import annotations

from .accounting import MemoryStats, StageCounters, memory_of
from .errors import PipelineError
from .trace import Event, gather_events


class Readings:
    """Mixed into `Pipeline` (which sets `workers`, `transport`, `trace`, `distributed`, `local`, `replicas`,
    `job_group`)."""

    @property
    def has_first_stage(self) -> bool:
        """Whether this rank runs stage 0: the one that needs a micro-batch's inputs."""
        return 0 in self.local

    @property
    def has_last_stage(self) -> bool:
        """Whether this rank runs the last stage: the one that needs a micro-batch's targets."""
        return self.num_stages - 1 in self.local

    @property
    def replica(self) -> int:
        """Which pipeline replica this rank belongs to (0 without data parallelism)."""
        return self.replicas.index if self.replicas is not None else 0

    @property
    def last_stage_rank(self) -> int:
        """The global rank that runs the last stage of replica 0 (where losses and outputs are known)."""
        if not self.distributed:
            return 0
        if self.replicas is not None:
            return len(self.replicas.pipeline_ranks) - 1  # replica 0 is ranks 0 .. P-1
        return self._global_ranks[-1]

    @property
    def exchange_seconds(self) -> float:
        """Wall time this rank has spent exchanging messages with its neighbours (waiting included)."""
        return self.transport.seconds if self.transport is not None else 0.0

    @property
    def exchange_bytes(self) -> int:
        """Bytes this rank has sent to its neighbours (messages and headers)."""
        return self.transport.bytes_sent if self.transport is not None else 0

    def last_lr(self) -> float | None:
        """The learning rate the last update of this rank's first stage with an optimizer used (every stage follows
        the same schedule; a stage without parameters has no optimizer; Trainer logs the rate its step used); before
        any update, the one the first will use; None where no local stage has an optimizer."""
        worker = next((self.workers[index] for index in self.local if self.workers[index].optimizer is not None), None)
        if worker is None:
            return None
        if worker.counters.learning_rate is not None:
            return worker.counters.learning_rate
        if worker.scheduler is not None:
            return float(worker.scheduler.get_last_lr()[0])
        return float(worker.optimizer.param_groups[0]["lr"])

    def trace_events(self) -> list[Event]:
        """Every rank's recorded events (`trace=True`), gathered on every rank of the run (a collective over the
        pipeline's group, or over all replicas, when distributed)."""
        if self.trace is None:
            raise PipelineError("trace_events() needs Pipeline(trace=True)")
        return gather_events(self.trace, self.distributed, self.job_group)

    def counters(self) -> dict[int, StageCounters]:
        return {index: worker.counters for index, worker in self.workers.items()}

    def memory(self) -> dict[int, MemoryStats]:
        """Per local stage, the bytes its own device would hold: what `StageWorker.held` lists, each storage once."""
        return {index: worker.memory() for index, worker in self.workers.items()}

    def process_memory(self) -> MemoryStats:
        """The bytes this process holds for all its stages now, each storage counted once even where stages of the
        process share it (one stage's output stream can be the next one's stored input). `peak_bytes` is this
        reading. Compare it with the process's own allocator (`petra_hub.testing.malloc.malloc_in_use`)."""
        kinds: dict[str, list] = {}
        for worker in self.workers.values():
            for kind, tensors in worker.held().items():
                kinds.setdefault(kind, []).extend(tensors)
        stats = memory_of(kinds)
        stats.activation_bytes += sum(worker.kept_graph_bytes() for worker in self.workers.values())
        stats.peak_bytes = stats.total_bytes
        return stats

    def in_flight(self) -> dict[int, list[int]]:
        """Per local stage, the micro-batches between their forward and their backward (the FIFO)."""
        return {index: worker.in_flight for index, worker in self.workers.items()}
