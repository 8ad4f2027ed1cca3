"""`PetraTrainingArguments`: transformers' `TrainingArguments` plus the PETRA knobs. Validation only."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import TrainingArguments

from ..engine import Diagnostics, Layout, MemoryOptions, Mode, Precision, Remedies, pipeline_rank_of
from ..engine.options import check_accumulation_steps, check_max_grad_norm, check_timeout, fields_named
from .distributed import init_distributed, process_rank, world_size
from .support_table import check_supported


PRECISION_FIELDS = {"streams": ("petra_streams", "'fp32' or 'bf16'"),
                    "messages": ("petra_message_dtype", "'bf16', 'fp16' or None (float32)")}
# the engine's name of a knob -> the field that sets it here (how the engine's checks name it in errors), with what
# the field expects where it says it otherwise
ENGINE_FIELDS = {
    "accumulation_steps": "gradient_accumulation_steps",
    "timeout": "petra_timeout",
    "max_grad_norm": "max_grad_norm",
    "partition": "petra_partition",
    "data_parallel_size": "petra_data_parallel",
    "weight_prediction": "petra_weight_prediction",
    "synchronous_updates": "petra_synchronous_steps",
    "delay_momentum": "petra_delay_momentum",
    "memory_budget": "petra_memory_budget",
    "check_reconstruction_every": ("petra_check_reconstruction_every", "a whole number >= 0 (0: off)"),
}

EFFECTIVE_BATCH_SIZE = "per_device_train_batch_size * gradient_accumulation_steps * petra_data_parallel"


def _with_help(name: str, text: str):
    """TrainingArguments' field `name` with its default and the help `text` (for what holds for a pipeline)."""
    base = TrainingArguments.__dataclass_fields__[name]
    return field(default=base.default, metadata={**base.metadata, "help": text})


@dataclass
class PetraTrainingArguments(TrainingArguments):
    """`TrainingArguments` plus the PETRA knobs.

    `per_device_train_batch_size` is the micro-batch size and `gradient_accumulation_steps` is k: every stage
    averages the gradients of k consecutive micro-batches before its optimizer steps (one global step).
    """

    # transformers' help gives per_device_train_batch_size * num_devices * gradient_accumulation_steps; every process
    # of a pipeline reads the same micro-batches, so only the replicas multiply the batch
    per_device_train_batch_size: int = _with_help(
        "per_device_train_batch_size",
        "The micro-batch size: what each pipeline replica feeds per tick. Every process of a pipeline reads the same "
        f"micro-batches, so the effective batch size = {EFFECTIVE_BATCH_SIZE} (not times the number of processes).",
    )
    gradient_accumulation_steps: int = _with_help(
        "gradient_accumulation_steps",
        "k: every stage averages the gradients of k consecutive micro-batches before its optimizer steps (one global "
        f"step). Effective batch size = {EFFECTIVE_BATCH_SIZE}: every process of a pipeline reads the same "
        "micro-batches.",
    )
    petra_mode: str = field(
        default="petra",
        # each description is a sentence (its own ';' included): the modes are joined by spaces
        metadata={"help": "Training method, one of: " + " ".join(f"{mode.value}: {mode.description}" for mode in Mode)},
    )
    petra_num_stages: int | None = field(
        default=None, metadata={"help": "Pipeline stages J; default: the model's own stages (one per block)."}
    )
    petra_stage_groups: str | None = field(
        default=None, metadata={"help": "Pipeline stages as groups of the model's consecutive stages, e.g. '1,2,7' "
                                        "(RevNet18: the stem, two reversible blocks as one stage, the rest); instead "
                                        "of petra_num_stages."}
    )
    petra_partition: str | None = field(
        default=None, metadata={"help": "Stages per process, e.g. '5,5'; 'auto': the fastest split, measured on the "
                                        "first micro-batch; default: an even split."}
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
        default=True,
        metadata={
            "help": "A second run into the same output_dir replaces the earlier run's outputs, as transformers' "
                    "Trainer trains into it again: its checkpoints, metrics, model files and model card are removed "
                    "first (logged by name); other files stay, and nothing is removed when resuming from one of the "
                    "folder's own checkpoints. False refuses a folder that holds another run instead."
        },
    )
    petra_timeout: float = field(
        default=120.0, metadata={"help": "Seconds before a dead or stalled peer process becomes an error."}
    )
    petra_preemption_grace: float = field(
        default=30.0,
        metadata={"help": "Seconds a preemption (SIGTERM, or a first Ctrl-C) leaves to save a checkpoint at the next "
                          "step end and exit with status 75 (preempted, resumable); past them the process exits "
                          "without that checkpoint. 30 is Kubernetes' and torchrun's grace."},
    )
    petra_streams: str = field(
        default="fp32",
        metadata={"help": "With bf16 or fp16: dtype of the streams between stages, fp32 (the coupling and the "
                          "reconstruction round in float32) or bf16."},
    )
    petra_message_dtype: str | None = field(
        default=None,
        metadata={"help": "bf16 or fp16: activations and gradients cross stage boundaries in this dtype (what a "
                          "stage sends back for reconstruction keeps the stream dtype); default: the stream dtype."},
    )
    petra_check_reconstruction_every: int = field(
        default=0,
        metadata={"help": "Every N micro-batches, each reversible stage measures the relative error of the input "
                          "it rebuilds; logged as reconstruction_error (0: off)."},
    )
    petra_reconstruction_warning: float = field(
        default=0.05,
        metadata={"help": "Warn when the logged reconstruction_error exceeds this relative error."},
    )
    petra_weight_prediction: float = field(
        default=0.0,
        metadata={"help": "h > 0: each stage runs its forwards at its weights extrapolated along its last update "
                          "over h times its delay (weight prediction; 0: off)."},
    )
    petra_synchronous_steps: int = field(
        default=0,
        metadata={"help": "A synchronous start: the first N optimizer steps run without delay (reversible_backprop: "
                          "PETRA's memory, exact gradients), then the pipeline drains and trains on in petra mode "
                          "with the same weights and optimizer states (0: off)."},
    )
    petra_delay_momentum: bool = field(
        default=False,
        metadata={"help": "Delay-matched momentum: each stage's optimizer momentum (SGD's momentum, Adam's beta1) is "
                          "lowered so that its lag plus the stage's delay in updates is the optimizer's own lag, "
                          "beta / (1 - beta); stages whose delay alone is longer get none (pipelined modes)."},
    )
    petra_delay_lr_warmup: float = field(
        default=0.0,
        metadata={"help": "Delay-aware warm-up (PipeMare): each stage starts at lr / tau, tau = its delay in "
                          "updates, and reaches lr after this many steps (a fraction of the run if below 1; 0: off)."},
    )
    petra_memory_budget: str | None = field(
        default=None,
        metadata={"help": "Activation memory per process (bytes, or with a unit: 512MB, 2GiB) within which stages keep "
                          "their forward's graph instead of recomputing it or rebuilding their input, smallest first "
                          "(off by default)."},
    )
    petra_gradient_fidelity_steps: int = field(
        default=0,
        metadata={"help": "Every N steps, compare each stage's gradient with the end-to-end and the stashed-weight "
                          "gradients (GradientFidelityCallback; logged as fidelity/stage_<i>/<metric>; 0: off)."},
    )

    def __post_init__(self):
        if Mode.parse(self.petra_mode) is not Mode.PETRA and self.petra_synchronous_steps:
            raise ValueError(f"petra_synchronous_steps={self.petra_synchronous_steps} applies to petra_mode='petra' "
                             f"(a synchronous start ends in PETRA's pipelined schedule), not {self.petra_mode!r}")
        self.check_run_length()
        if self.petra_num_stages is not None and self.petra_num_stages < 1:
            raise ValueError(f"petra_num_stages must be >= 1, got {self.petra_num_stages}")
        self.stage_groups(None)  # validates the format
        self.precision()
        self.check_engine_options()
        if not (isinstance(self.petra_preemption_grace, (int, float)) and self.petra_preemption_grace > 0):
            raise ValueError(f"petra_preemption_grace must be a positive number of seconds, got "
                             f"{self.petra_preemption_grace!r}")
        if self.petra_delay_lr_warmup < 0:
            raise ValueError(f"petra_delay_lr_warmup must be >= 0 (0: off), got {self.petra_delay_lr_warmup}")
        if self.petra_gradient_fidelity_steps < 0:
            raise ValueError(
                f"petra_gradient_fidelity_steps must be >= 0 (0: off), got {self.petra_gradient_fidelity_steps}"
            )
        self.milestones()
        if self.optim_args and any(pair.count("=") != 1 for pair in self.optim_args.replace(" ", "").split(",")):
            raise ValueError(f"optim_args={self.optim_args!r}: expected comma-separated key=value pairs (e.g. "
                             "'momentum=0.9,nesterov=True'), or empty for the optimizer's defaults")
        check_supported(self)
        if not torch.cuda.is_available():
            self.use_cpu = True
        super().__post_init__()

    def check_engine_options(self) -> None:
        """Build what the engine takes from these arguments, so that its own checks (`petra_hub.engine.options`)
        refuse a wrong value before anything runs, under the field's name here."""
        with fields_named(ENGINE_FIELDS):
            check_accumulation_steps(self.gradient_accumulation_steps)
            check_timeout(self.petra_timeout)
            check_max_grad_norm(self.max_grad_norm)
            self.layout()
            self.remedies()
            self.memory()
            self.diagnostics()

    def layout(self, device: torch.device | None = None, training: bool = True) -> Layout:
        """Where the stages run: petra_partition (without "auto" for inference alone, which has nothing to
        measure), petra_data_parallel, and `device`."""
        partition = self.partition_sizes() if training or self.petra_partition != "auto" else None
        return Layout(partition=partition, data_parallel_size=self.petra_data_parallel, device=device)

    def remedies(self) -> Remedies:
        """The remedies for the gradients' delay the engine applies (petra_weight_prediction,
        petra_synchronous_steps, petra_delay_momentum)."""
        return Remedies(weight_prediction=self.petra_weight_prediction,
                        synchronous_updates=self.petra_synchronous_steps, delay_momentum=self.petra_delay_momentum)

    def memory(self, training: bool = True) -> MemoryOptions:
        """The stages that keep their graph: those that fit petra_memory_budget (training only)."""
        return MemoryOptions(memory_budget=self.memory_budget_bytes() if training else None)

    def diagnostics(self) -> Diagnostics:
        """What the engine records beside training (petra_check_reconstruction_every; 0: off), and each update's
        gradient norm, which Trainer logs clipping or not."""
        return Diagnostics(check_reconstruction_every=self.petra_check_reconstruction_every or None, grad_norms=True)

    def check_run_length(self) -> None:
        """Refuse a run of no steps before anything runs (it would train nothing, then evaluate and save the
        untrained model): max_steps is -1 (transformers' convention: num_train_epochs decides) or a positive number
        of global steps, and num_train_epochs is positive when it decides."""
        if self.max_steps != -1 and self.max_steps <= 0:
            raise ValueError(f"max_steps={self.max_steps}: expected -1 (train for num_train_epochs) or a positive "
                             "number of global steps")
        if self.max_steps == -1 and not self.num_train_epochs > 0:
            raise ValueError(f"num_train_epochs={self.num_train_epochs!r}: expected a positive number of epochs (it "
                             "decides the length of the run while max_steps is -1); or set max_steps to a positive "
                             "number of global steps")

    @cached_property
    def _setup_devices(self) -> torch.device:
        # TrainingArguments sets up devices (and accelerate's view of the processes) as soon as it is built. Join
        # the launcher's process group first, with PETRA's timeout, so that accelerate adopts it (on a CPU-only
        # machine it would otherwise see one process).
        init_distributed(self.petra_timeout)
        return TrainingArguments._setup_devices.func(self)

    def runs_first_stage(self) -> bool:
        """Whether this process runs the first stage of its pipeline, and so reads the images of the data (the
        others read its labels, or nothing): the first of each replica's processes."""
        return pipeline_rank_of(process_rank(), world_size(), self.petra_data_parallel) == 0

    def partition_sizes(self) -> list[int] | str | None:
        if not self.petra_partition or self.petra_partition == "auto":
            return self.petra_partition or None
        try:
            return [int(part) for part in str(self.petra_partition).split(",")]
        except ValueError:
            raise ValueError(
                "petra_partition must be 'auto' or comma-separated stage counts like '5,5', "
                f"got {self.petra_partition!r}"
            ) from None

    def stage_groups(self, model_stages: int | None) -> int | list[int]:
        """What `merge_stages` groups the model's `model_stages` stages by: petra_stage_groups' sizes,
        petra_num_stages, or one pipeline stage per model stage (None: only check the format)."""
        if not self.petra_stage_groups:
            return self.petra_num_stages or model_stages
        if self.petra_num_stages is not None:
            raise ValueError("give petra_stage_groups or petra_num_stages, not both")
        try:
            sizes = [int(size) for size in str(self.petra_stage_groups).split(",")]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1 or (model_stages is not None and sum(sizes) != model_stages):
            stages = "" if model_stages is None else f" adding up to the model's {model_stages} stages"
            raise ValueError(f"petra_stage_groups must be comma-separated positive group sizes{stages}, e.g. "
                             f"'1,2,7', got {self.petra_stage_groups!r}")  # fmt: skip
        return sizes

    def memory_budget_bytes(self) -> int | None:
        """`petra_memory_budget` in bytes (None: off)."""
        if self.petra_memory_budget in (None, ""):
            return None
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B)?\s*", str(self.petra_memory_budget), re.IGNORECASE)
        if found is None:
            raise ValueError(f"petra_memory_budget={self.petra_memory_budget!r}: expected bytes, or a number with "
                             "a unit (KB, MB, GB, TB or KiB, MiB, GiB, TiB), e.g. 512MB")
        unit = (found.group(2) or "B").upper()
        scale = 1 if unit == "B" else (1024 if "I" in unit else 1000) ** ("KMGT".index(unit[0]) + 1)
        return int(float(found.group(1)) * scale)

    def milestones(self) -> list[float]:
        if not self.petra_lr_milestones:
            return []
        try:
            return sorted(float(part) for part in str(self.petra_lr_milestones).split(","))
        except ValueError:
            raise ValueError(
                f"petra_lr_milestones must be comma-separated epochs like '150,225', got {self.petra_lr_milestones!r}"
            ) from None

    def precision(self) -> Precision:
        """The engine's precision policy from bf16 / fp16 (or, as for transformers' Trainer, `accelerate launch
        --mixed_precision`), petra_streams and petra_message_dtype."""
        launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        if launched not in ("no", "bf16", "fp16"):
            raise ValueError(f"accelerate's mixed_precision={launched!r} is not supported by PetraTrainer: use "
                             "'bf16', 'fp16' or 'no' (ACCELERATE_MIXED_PRECISION, set by accelerate launch)")
        compute = "bf16" if self.bf16 else "fp16" if self.fp16 else None if launched == "no" else launched
        with fields_named(PRECISION_FIELDS):  # the engine's checks, under this class's names
            streams = Precision.of("bf16", streams=self.petra_streams).streams
            if compute is None and streams != torch.float32:
                raise ValueError(f"petra_streams={self.petra_streams!r} needs bf16=True or fp16=True (stages without "
                                 "autocast compute in their parameters' float32 and cannot take bf16 streams)")
            return Precision.of(compute, streams=streams if compute else None, messages=self.petra_message_dtype)

    def compile_options(self) -> dict | None:
        """torch.compile options for the stages (torch_compile, torch_compile_backend, torch_compile_mode)."""
        if not self.torch_compile:
            return None
        options = {"backend": self.torch_compile_backend or "inductor"}
        if self.torch_compile_mode:
            options["mode"] = self.torch_compile_mode
        return options

    def micro_batch_learning_rate(self) -> float:
        """The learning rate the stages' optimizers start from (after the paper's scaling, if asked)."""
        if not self.petra_scale_lr:
            return self.learning_rate
        return self.learning_rate * self.per_device_train_batch_size * self.gradient_accumulation_steps / 256
