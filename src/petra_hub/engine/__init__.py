"""The PETRA runtime: pure torch and torch.distributed, no transformers.

    pipeline = Pipeline(model.get_stages(), loss_fn, mode="petra", accumulation_steps=2,
                        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.1))
    for images, labels in loader:
        losses = pipeline.step(images, labels)
    pipeline.drain()
"""

from .errors import PeerFailureError, PipelineError, StageMismatchError
from .grouping import StageGroup, merge_stages
from .memory import MemoryStats
from .modes import Mode
from .optim import paper_sgd
from .pipeline import Pipeline
from .placement import Placement
from .schedule import Schedule
from .worker import StageCounters, StageWorker

__all__ = [
    "MemoryStats",
    "Mode",
    "PeerFailureError",
    "Pipeline",
    "PipelineError",
    "Placement",
    "Schedule",
    "StageCounters",
    "StageMismatchError",
    "StageGroup",
    "StageWorker",
    "merge_stages",
    "paper_sgd",
]
