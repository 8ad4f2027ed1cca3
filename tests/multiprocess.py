"""Multi-process helpers for the tests (the implementation lives in petra_hub.engine.spawn)."""

from petra_hub.engine.spawn import free_port, run_ranks

__all__ = ["free_port", "run_ranks"]
