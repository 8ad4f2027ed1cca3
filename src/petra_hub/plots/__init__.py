"""Pictures of PETRA runs (matplotlib: `pip install -e ".[plots]"`)."""

from .memory import plot_stage_memory
from .timeline import plot_timeline

__all__ = ["plot_stage_memory", "plot_timeline"]
