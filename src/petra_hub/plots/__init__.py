"""Pictures of PETRA runs (matplotlib: `pip install -e ".[plots]"`)."""

from .fidelity import plot_fidelity_by_stage, plot_fidelity_history
from .memory import plot_stage_memory
from .timeline import plot_timeline, plot_timelines

__all__ = ["plot_fidelity_by_stage", "plot_fidelity_history", "plot_stage_memory", "plot_timeline",
           "plot_timelines"]
