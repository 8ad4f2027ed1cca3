"""Errors the engine raises instead of hanging or silently dropping work, and the broken state after one."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator


class PipelineError(RuntimeError):
    """Base class of the engine's errors."""


class PeerFailureError(PipelineError):
    """A neighbouring rank died, stalled past the timeout, reported an error, or is out of step with this one."""


class StageMismatchError(PipelineError):
    """Two neighbouring stages (or ranks) disagree on the shape, dtype or batch size of the activations between them."""


@contextlib.contextmanager
def peer_failure(doing: str, who: str) -> Iterator[None]:
    """Turn the bare error a collective raises when a peer is gone (gloo's RuntimeError or DistBackendError, at once
    or at the process group's timeout) into a PeerFailureError saying who could not do what. Wrap the collective
    calls alone: any RuntimeError inside is taken for a peer's failure."""
    try:
        yield
    except PipelineError:
        raise
    except RuntimeError as error:
        raise PeerFailureError(
            f"{who} could not {doing}: a peer process died, stalled or failed ({type(error).__name__}: {error})"
        ) from error


class Breaker:
    """Remembers the first failure inside a pipeline operation. An operation that fails may stop half-way through
    a tick (some stages ran, some messages went out), so the pipeline cannot go on: every later operation raises a
    PipelineError naming the tick and chaining the original error."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.tick: int | None = None

    def check(self) -> None:
        if self.error is not None:
            raise PipelineError(
                f"the pipeline is broken since tick {self.tick}: {type(self.error).__name__}: {self.error}"
            ) from self.error

    @contextlib.contextmanager
    def guard(self, tick: Callable[[], int]) -> Iterator[None]:
        """Raise if already broken; mark broken at `tick()` if the block raises."""
        self.check()
        try:
            yield
        except BaseException as error:
            if self.error is None:
                self.error, self.tick = error, tick()
            raise
