"""Preemption: SIGTERM (a scheduler's notice, or the launcher passing its own on) or a first Ctrl-C saves a
checkpoint and stops every process with a status that says "preempted, resumable".

A signal only raises a flag in the process that receives it (`PreemptionWatch`). At the next step end the ranks
combine their flags (`Trainer._log_save_evaluate` through `agreed_control`), so a signal that reached one process is
the same event for all: every rank saves the checkpoint of that step (the pipeline drains, as for any save), checks
it on disk, and raises `Preempted`, a `SystemExit` whose status is `PREEMPTED_EXIT_STATUS`. A second Ctrl-C stops at
once (KeyboardInterrupt). If the save has not finished `petra_preemption_grace` seconds after the signal, the
process says which checkpoint a restart will use and exits with that status; the checkpoint being written is left
in its staging folder and never counts as complete.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from transformers.trainer_utils import get_last_checkpoint

logger = logging.getLogger(__name__)

# sysexits.h's EX_TEMPFAIL, "a temporary failure: the user is invited to retry": what a preempted run is.
PREEMPTED_EXIT_STATUS = 75


class Preempted(SystemExit):
    """Training stopped on a preemption signal after saving `checkpoint` (None: nothing could be saved). Uncaught,
    the process exits with `PREEMPTED_EXIT_STATUS`."""

    def __init__(self, message: str, checkpoint: str | None):
        super().__init__(PREEMPTED_EXIT_STATUS)
        self.message, self.checkpoint = message, checkpoint

    def __str__(self) -> str:
        return self.message


class PreemptionWatch:
    """While entered, SIGTERM and a first SIGINT raise `requested` instead of ending the process (only in the main
    thread, where Python delivers signals); a second SIGINT raises KeyboardInterrupt. The previous handlers come back
    on exit. `start_grace(describe_fallback)` starts the deadline of `grace` seconds from the signal."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, grace: float):
        self.grace = grace
        self.received: str | None = None  # the signal's name, once one came
        self.received_at: float | None = None
        self._previous: dict = {}
        self._deadline: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self.received is not None

    def __enter__(self) -> PreemptionWatch:
        if threading.current_thread() is not threading.main_thread():
            logger.warning("training runs outside the main thread, where Python cannot catch signals: SIGTERM and "
                           "Ctrl-C keep their usual effect, without a preemption checkpoint")
            return self
        for number in self.SIGNALS:
            self._previous[number] = signal.signal(number, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous.clear()
        if self._deadline is not None:
            self._deadline.cancel()

    def _on_signal(self, number: int, frame) -> None:
        if number == signal.SIGINT and self.received == signal.Signals.SIGINT.name:
            raise KeyboardInterrupt  # the second Ctrl-C: stop now
        if self.received is None:
            self.received, self.received_at = signal.Signals(number).name, time.monotonic()

    def start_grace(self, fallback: str) -> float:
        """Arm the deadline; past it the process exits with `PREEMPTED_EXIT_STATUS`, saying that a restart resumes
        from `fallback`. Returns the seconds left."""
        left = max(0.0, self.grace - (time.monotonic() - (self.received_at or time.monotonic())))

        def expire() -> None:
            logger.error("the preemption save did not finish within %.0f s (petra_preemption_grace); a restart "
                         "resumes from %s", self.grace, fallback)
            logging.shutdown()
            os._exit(PREEMPTED_EXIT_STATUS)

        self._deadline = threading.Timer(left, expire)
        self._deadline.daemon = True
        self._deadline.start()
        return left


def resume_after_restart(value: str | bool | None, output_dir: str) -> str | bool | None:
    """`resume_from_checkpoint` as a job that torchrun restarted (`--max-restarts`; `TORCHELASTIC_RESTART_COUNT` > 0)
    takes it: the last complete checkpoint of `output_dir` where the user chose nothing (None); the user's choice,
    a folder, True or False, always."""
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
    if value is not None or restarts == 0:
        return value
    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if last is None:
        logger.warning("restart %d of this job: output_dir %s holds no complete checkpoint; training starts afresh",
                       restarts, output_dir)
        return None
    logger.warning("restart %d of this job: resuming from %s, the last complete checkpoint", restarts, last)
    return last


def begin_preemption_save(watch: PreemptionWatch, signalled: dict[int, str], run_dir: str, step: int,
                          control, announce: bool) -> None:
    """Every rank, at the step end where the ranks learnt of a preemption (`signalled`: {rank: signal}): save this
    step's checkpoint, evaluate nothing, stop; arm the grace period; say (where `announce`) what happens."""
    control.should_save, control.should_training_stop, control.should_evaluate = True, True, False
    last = get_last_checkpoint(run_dir) if os.path.isdir(run_dir) else None
    fallback = last or "the start of training (no complete checkpoint yet)"
    left = watch.start_grace(fallback)
    if announce:
        who = ", ".join(f"{name} on process {rank}" for rank, name in sorted(signalled.items()))
        logger.warning("preempted (%s) at global step %d: saving checkpoint-%d within %.0f s; until it is complete, "
                       "a restart resumes from %s", who, step, step, left, fallback)


def preempted(checkpoint: str, announce: bool) -> Preempted:
    """The exception every rank raises once the preemption checkpoint is published and checked (said, where
    `announce`, since a SystemExit's message is not printed)."""
    message = (f"preempted: {checkpoint} is saved and complete; exiting with status {PREEMPTED_EXIT_STATUS} "
               "(preempted, resumable). Train again with resume_from_checkpoint=True, or under torchrun "
               "--max-restarts, which resumes by itself.")
    if announce:
        logger.warning(message)
    return Preempted(message, checkpoint)
