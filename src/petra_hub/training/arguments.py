"""`PetraTrainingArguments`: transformers' `TrainingArguments` plus the PETRA knobs. Validation only."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import TrainingArguments

from ..engine import Mode
from .distributed import init_distributed
from .support import check_supported


@dataclass
class PetraTrainingArguments(TrainingArguments):
    """`TrainingArguments` plus the PETRA knobs.

    `per_device_train_batch_size` is the micro-batch size and `gradient_accumulation_steps` is k: every stage
    averages the gradients of k consecutive micro-batches before its optimizer steps (one global step).
    """

    petra_mode: str = field(
        default="petra",
        metadata={"help": "; ".join(f"{mode.value}: {mode.description}" for mode in Mode)},
    )
    petra_num_stages: int | None = field(
        default=None, metadata={"help": "Pipeline stages J; default: the model's own stages (one per block)."}
    )
    petra_partition: str | None = field(
        default=None, metadata={"help": "Stages per process, e.g. '5,5'; default: an even split."}
    )
    petra_scale_lr: bool = field(
        default=False, metadata={"help": "Paper scaling: lr = learning_rate * micro_batch * k / 256."}
    )
    petra_lr_milestones: str | None = field(
        default=None,
        metadata={"help": "Epochs at which the LR is multiplied by petra_lr_gamma, e.g. '150,225' (after warm-up)."},
    )
    petra_lr_gamma: float = field(default=0.1, metadata={"help": "LR factor at each milestone."})
    petra_data_parallel: int = field(
        default=1,
        metadata={"help": "D pipeline replicas over the W = P x D processes; each replica reads its own share."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Train into an output_dir that holds another run's checkpoints or model (refused otherwise)."},
    )
    petra_timeout: float = field(
        default=120.0, metadata={"help": "Seconds before a dead or stalled peer process becomes an error."}
    )

    def __post_init__(self):
        Mode.parse(self.petra_mode)
        if self.gradient_accumulation_steps < 1:
            raise ValueError(f"gradient_accumulation_steps (k) must be >= 1, got {self.gradient_accumulation_steps}")
        if self.petra_timeout <= 0:
            raise ValueError(f"petra_timeout must be positive, got {self.petra_timeout}")
        if self.petra_data_parallel < 1:
            raise ValueError(f"petra_data_parallel must be >= 1, got {self.petra_data_parallel}")
        if self.petra_num_stages is not None and self.petra_num_stages < 1:
            raise ValueError(f"petra_num_stages must be >= 1, got {self.petra_num_stages}")
        self.partition_sizes()  # validates the format
        self.milestones()
        check_supported(self)
        if not torch.cuda.is_available():
            self.use_cpu = True
        super().__post_init__()

    @cached_property
    def _setup_devices(self) -> torch.device:
        # TrainingArguments sets up devices (and accelerate's view of the processes) as soon as it is built. Join
        # the launcher's process group first, with PETRA's timeout, so that accelerate adopts it (on a CPU-only
        # machine it would otherwise see one process).
        init_distributed(self.petra_timeout)
        return TrainingArguments._setup_devices.func(self)

    def partition_sizes(self) -> list[int] | None:
        if not self.petra_partition:
            return None
        try:
            return [int(part) for part in str(self.petra_partition).split(",")]
        except ValueError:
            raise ValueError(
                f"petra_partition must be comma-separated stage counts like '5,5', got {self.petra_partition!r}"
            ) from None

    def milestones(self) -> list[float]:
        if not self.petra_lr_milestones:
            return []
        try:
            return sorted(float(part) for part in str(self.petra_lr_milestones).split(","))
        except ValueError:
            raise ValueError(
                f"petra_lr_milestones must be comma-separated epochs like '150,225', got {self.petra_lr_milestones!r}"
            ) from None

    def micro_batch_learning_rate(self) -> float:
        """The learning rate the stages' optimizers start from (after the paper's scaling, if asked)."""
        if not self.petra_scale_lr:
            return self.learning_rate
        return self.learning_rate * self.per_device_train_batch_size * self.gradient_accumulation_steps / 256
