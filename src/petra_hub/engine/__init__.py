"""The PETRA runtime: pure torch and torch.distributed, no transformers.

    pipeline = Pipeline(model.get_stages(), loss_fn, mode="petra", accumulation_steps=2,
                        optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.1))
    for images, labels in loader:
        losses = pipeline.step(images, labels)
    pipeline.drain()
"""

from .errors import PeerFailureError, PipelineError, StageMismatchError, peer_failure
from .stages import StageGroup, group_sizes, merge_stages, stage_layout
from .accounting import MemoryStats, StageCounters
from .modes import Mode
from .optim import paper_sgd
from .options import Diagnostics, Layout, MemoryOptions, OptionError, Remedies
from .pipeline import Pipeline
from .precision import Precision
from .compilation import compile_stage
from .fidelity import StageFidelity
from .placement import Placement, pipeline_rank_of, replica_of
from .collectives import disagreements
from .partitioning import StageCost
from .schedule import Schedule
from .worker import StageUpdate, StageWorker
from .wire import (WireError, all_gather_json, broadcast_json, broadcast_tensors, collective_device, gather_tensors,
                   recv_json, send_json)

__all__ = [
    "Diagnostics",
    "Layout",
    "MemoryOptions",
    "MemoryStats",
    "Mode",
    "OptionError",
    "PeerFailureError",
    "Pipeline",
    "PipelineError",
    "Placement",
    "Precision",
    "Remedies",
    "Schedule",
    "StageCost",
    "StageCounters",
    "StageFidelity",
    "StageMismatchError",
    "StageGroup",
    "StageUpdate",
    "StageWorker",
    "WireError",
    "all_gather_json",
    "broadcast_json",
    "collective_device",
    "broadcast_tensors",
    "compile_stage",
    "disagreements",
    "gather_tensors",
    "group_sizes",
    "merge_stages",
    "stage_layout",
    "paper_sgd",
    "peer_failure",
    "recv_json",
    "pipeline_rank_of",
    "replica_of",
    "send_json",
]
