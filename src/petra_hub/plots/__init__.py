"""Pictures of PETRA runs (matplotlib: `pip install -e ".[plots]"`)."""

from .timeline import plot_timeline

__all__ = ["plot_timeline"]
