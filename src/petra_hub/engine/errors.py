"""Errors the engine raises instead of hanging or silently dropping work."""


class PipelineError(RuntimeError):
    """Base class of the engine's errors."""


class PeerFailureError(PipelineError):
    """A neighbouring rank died, stalled past the timeout, or reported an error."""


class StageMismatchError(PipelineError):
    """Two neighbouring stages disagree on the shape or dtype of the activations between them."""
