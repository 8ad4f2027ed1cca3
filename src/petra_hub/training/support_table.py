"""The support table: for every `TrainingArguments` field, whether PetraTrainer honours it, refuses it or has no
use for it, with a one-line note (see `support.py` for what the statuses mean), and `check_supported`, the check
built on it (which `PetraTrainingArguments` runs when it is built: this module must not import `arguments.py`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from ..engine import Mode

DOCS_PAGE = "docs/training-arguments.md"  # where the table is published (named in the errors)

HONOURED, REFUSED, NOT_APPLICABLE = "honoured", "refused", "not_applicable"
STATUSES = (HONOURED, REFUSED, NOT_APPLICABLE)


@dataclasses.dataclass(frozen=True)
class FieldSupport:
    """How PetraTrainer treats one `TrainingArguments` field; `note` is one line (how, or why not)."""

    status: str
    note: str

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")
        if not self.note or "\n" in self.note:
            raise ValueError(f"a note is one non-empty line, got {self.note!r}")


def _honoured(note: str) -> FieldSupport:
    return FieldSupport(HONOURED, note)


def _refused(note: str) -> FieldSupport:
    return FieldSupport(REFUSED, note)


def _not_applicable(note: str) -> FieldSupport:
    return FieldSupport(NOT_APPLICABLE, note)


_FULL_EVAL = _refused(
    "evaluation runs under the training precision policy; casting the weights for evaluation would need a second "
    "copy of them, which PETRA avoids (use bf16 / fp16, which evaluate under autocast too)"
)
_COMPILE = _honoured(
    "torch.compile of each stage on its rank (reversible stages: their F and G, used by forward, inversion and "
    "the fused backward), with torch_compile_backend (default inductor) and torch_compile_mode"
)
_DDP = _refused(
    "the model is never wrapped in DistributedDataParallel: pipeline replicas (petra_data_parallel) average their "
    "stage gradients in the engine"
)
_TRACKIO = "with report_to trackio (TrackioCallback)"
_SCRIPT_FLAG = _not_applicable(
    "a flag for scripts, not read by the Trainer (as transformers documents); petra_hub's recipe reads it"
)

TRAINING_ARGUMENT_SUPPORT: dict[str, FieldSupport] = {
    # -- output, batch and length of the run ---------------------------------------------------------------------
    "output_dir": _honoured("run folder: checkpoint-N folders and the default folder of save_model()"),
    "per_device_train_batch_size": _honoured("micro-batch size: what each pipeline replica feeds per tick"),
    "num_train_epochs": _honoured("epochs, may be fractional; an epoch of n micro-batches is ceil(n / k) global steps"),
    "max_steps": _honoured("global steps (k micro-batches each); overrides num_train_epochs when > 0"),
    # -- optimizer and schedule (one per stage) ------------------------------------------------------------------
    "learning_rate": _honoured(
        "initial LR of every stage's optimizer (times micro_batch x k / 256 with petra_scale_lr)"
    ),
    "lr_scheduler_type": _honoured(
        "one scheduler per stage through transformers' get_scheduler; refused: reduce_lr_on_plateau and greedy "
        "(stepped by eval metrics), and, together with petra_lr_milestones (which replaces the schedule), any type "
        "but constant, constant_with_warmup and the default linear"
    ),
    "lr_scheduler_kwargs": _honoured(
        "passed to each stage's get_scheduler; refused together with petra_lr_milestones (which replaces the schedule)"
    ),
    "warmup_steps": _honoured(
        "linear warm-up steps (a ratio of the total when < 1), also before the step decay of petra_lr_milestones"
    ),
    "optim": _honoured(
        "one optimizer per stage through the trainer's get_optimizer_cls_and_kwargs (a subclass may override it, as in "
        "Trainer); refused: GaLore, APOLLO, LOMO "
        "(whole-model parameter groups) and schedule-free ones (need optimizer.train()/eval()); a checkpoint records "
        "the optimizer class, and resuming with another is refused"
    ),
    "optim_args": _honoured("extra optimizer arguments, as in transformers (e.g. momentum=0.9,nesterov=True)"),
    "weight_decay": _honoured(
        "weight decay of the parameters get_decay_parameter_names names: by default those with more than one "
        "dimension (none on biases and norm weights, as in the paper; Trainer's rule also decays batch-norm weights); "
        "a subclass may override it, as in Trainer"
    ),
    "adam_beta1": _honoured("beta1 of Adam-family optimizers (get_optimizer_cls_and_kwargs)"),
    "adam_beta2": _honoured("beta2 of Adam-family optimizers (get_optimizer_cls_and_kwargs)"),
    "adam_epsilon": _honoured("epsilon of Adam-family optimizers (get_optimizer_cls_and_kwargs)"),
    "optim_target_modules": _refused(
        "GaLore/APOLLO target modules: those optimizers build parameter groups over the whole model, while each "
        "stage has its own optimizer; choose a per-stage optimizer with optim"
    ),
    "gradient_accumulation_steps": _honoured(
        "k: each stage averages the gradients of k micro-batches before its update (one global step)"
    ),
    "average_tokens_across_devices": _honoured(
        "with compute_loss_func and petra_data_parallel D > 1: num_items_in_batch counts the step's items over all "
        "D replicas and the loss is multiplied by D (the replicas average their gradients), as Trainer does over "
        "its processes; when false, each replica's own count"
    ),
    "max_grad_norm": _honoured(
        "each stage clips its own averaged gradient to this norm before its update: stages update at different "
        "ticks (in every mode: a stage updates as soon as its backward ends), so there is no global norm, and a run "
        "that clips differs from Trainer's, which clips the norm over all parameters; the logged grad_norm is the "
        "norm over all stages' last updates, before clipping"
    ),
    "label_smoothing_factor": _honoured("cross-entropy label smoothing at the last stage"),
    # -- precision, memory and speed -----------------------------------------------------------------------------
    "bf16": _honoured(
        "stages compute under bf16 autocast with float32 master weights; streams between stages float32 unless "
        "petra_streams=bf16 (see docs/precision.md)"
    ),
    "fp16": _honoured(
        "stages compute under fp16 autocast with a dynamic loss scale per stage; an overflow drops that micro-batch's "
        "accumulation group from the overflowing stage down (see docs/precision.md)"
    ),
    "bf16_full_eval": _FULL_EVAL,
    "fp16_full_eval": _FULL_EVAL,
    "tf32": _honoured(
        "TrainingArguments sets torch's global TF32 switch, which the stages' matmuls and convolutions follow "
        "(Ampere or newer GPUs)"
    ),
    "activation_checkpointing": _refused(
        "reversible stages rebuild their inputs by inversion instead of storing activations; the model's own "
        "checkpointing is never enabled (choose petra_mode)"
    ),
    "activation_checkpointing_kwargs": _refused("only read with activation_checkpointing, which is refused"),
    "gradient_checkpointing": _refused(
        "deprecated alias of activation_checkpointing, refused: reversible stages rebuild their inputs by inversion"
    ),
    "gradient_checkpointing_kwargs": _refused("deprecated alias of activation_checkpointing_kwargs, refused with it"),
    "torch_compile": _COMPILE,
    "torch_compile_backend": _COMPILE,
    "torch_compile_mode": _COMPILE,
    "use_liger_kernel": _refused("Liger kernels patch language-model layers, which the RevNet stages do not have"),
    "liger_kernel_config": _refused("only read with use_liger_kernel, which is refused"),
    "use_cache": _not_applicable(
        "key/value cache of generative models; the Trainer copies it onto model.config, which RevNet never reads"
    ),
    "neftune_noise_alpha": _refused("NEFTune adds noise to token embeddings; image models have none"),
    "torch_empty_cache_steps": _refused(
        "the PETRA training loop never empties the device cache, so it would be ignored"
    ),
    "auto_find_batch_size": _refused(
        "retrying with a smaller micro-batch after an out-of-memory error would leave the other ranks waiting in a "
        "collective; set per_device_train_batch_size"
    ),
    # -- logging -------------------------------------------------------------------------------------------------
    "logging_strategy": _honoured("when loss, learning_rate and samples_per_second are logged (DefaultFlowCallback)"),
    "logging_steps": _honoured("log every N global steps (a ratio of the total when < 1)"),
    "logging_first_step": _honoured("also log after global step 1"),
    "log_on_each_node": _honoured("which processes use log_level rather than log_level_replica"),
    "logging_nan_inf_filter": _not_applicable(
        "a NaN or infinite training loss stops every rank (FloatingPointError) before anything is logged or saved, "
        "so there is nothing to filter"
    ),
    "include_num_input_tokens_seen": _refused(
        "token counting for language models: num_input_tokens_seen would be logged as 0"
    ),
    "log_level": _honoured("transformers' log level on the main process"),
    "log_level_replica": _honoured("transformers' log level on the other processes"),
    "disable_tqdm": _honoured("progress bar (ProgressCallback) or printed logs (PrinterCallback)"),
    "report_to": _honoured("reporting integrations, as callbacks that receive every log and evaluation"),
    "run_name": _honoured("run name for the reporting integrations (wandb, trackio, mlflow, ...)"),
    "project": _honoured(f"Trackio project, {_TRACKIO}"),
    "trackio_space_id": _honoured(f"Trackio Space to log to, {_TRACKIO}"),
    "trackio_bucket_id": _honoured(f"Trackio Bucket, {_TRACKIO}"),
    "trackio_static_space_id": _honoured(f"static Trackio Space synced on push, {_TRACKIO}"),
    # -- evaluation ----------------------------------------------------------------------------------------------
    "eval_strategy": _honoured(
        "when to evaluate (steps or epoch), at step ends, after draining the pipeline (so under PETRA, unlike "
        "backprop, how often you evaluate changes the training: the micro-batches in flight finish first)"
    ),
    "eval_steps": _honoured("evaluate every N global steps (a ratio of the total when < 1)"),
    "eval_delay": _honoured("no evaluation before this many steps or epochs (DefaultFlowCallback)"),
    "per_device_eval_batch_size": _honoured("evaluation batch size (every rank reads every eval batch)"),
    "prediction_loss_only": _refused(
        "evaluate() always returns eval_loss and the metrics of compute_metrics; for the loss alone, pass no "
        "compute_metrics"
    ),
    "eval_on_start": _honoured("one evaluation before the first training step (a sanity check)"),
    "eval_do_concat_batches": _refused(
        "evaluate() always concatenates the logits of all eval batches before compute_metrics"
    ),
    "eval_use_gather_object": _not_applicable(
        "nothing is gathered: the last stage's rank computes the metrics over the whole eval set and broadcasts them"
    ),
    "eval_accumulation_steps": _not_applicable(
        "the last stage moves every eval batch's logits to the CPU at once (as with eval_accumulation_steps=1)"
    ),
    "include_for_metrics": _refused("compute_metrics receives predictions and label_ids only (no inputs, no losses)"),
    "batch_eval_metrics": _refused(
        "compute_metrics is called once over the whole eval set, never per batch with compute_result"
    ),
    # -- checkpoints ---------------------------------------------------------------------------------------------
    "save_only_model": _refused(
        "checkpoints always hold every stage's optimizer and scheduler state, which resuming needs; for the "
        "weights alone call save_model()"
    ),
    "save_strategy": _honoured(
        "when to write checkpoints (steps or epoch), after draining the pipeline; refused: best (no checkpoint "
        "would ever be written)"
    ),
    "save_steps": _honoured("checkpoint every N global steps (a ratio of the total when < 1)"),
    "save_on_each_node": _refused(
        "each rank writes the optimizer state of its own stages into the checkpoint, so a checkpoint needs one "
        "output_dir shared by every rank, written once; per-node copies would each be incomplete"
    ),
    "save_total_limit": _honoured("older checkpoint folders are rotated away (the best one is kept)"),
    "enable_jit_checkpoint": _refused(
        "a checkpoint drains the pipeline and gathers the stages, which every rank must do at the same step; a "
        "SIGTERM handled by each process on its own cannot guarantee that"
    ),
    # -- Hub -----------------------------------------------------------------------------------------------------
    "push_to_hub": _honoured("push the saved folder (safetensors, processor, PETRA model card) to the Hub"),
    "hub_token": _honoured("token of the Hub pushes"),
    "hub_private_repo": _honoured("whether a newly created Hub repository is private"),
    "hub_model_id": _honoured("the Hub repository (default: the name of output_dir); also named in the model card"),
    "hub_strategy": _honoured(
        "what is pushed and when: end, every_save, checkpoint or all_checkpoints; every push holds the code files "
        "(trust_remote_code), the image processor and the model card, never the run lock"
    ),
    "hub_always_push": _honoured("push every checkpoint even while the previous upload is still running"),
    "hub_revision": _honoured("the branch or revision the pushes go to"),
    # -- best model ----------------------------------------------------------------------------------------------
    "load_best_model_at_end": _honoured(
        "the best checkpoint is kept by rotation and loaded on every rank at the end"
    ),
    "metric_for_best_model": _honoured("the eval metric that picks the best checkpoint"),
    "greater_is_better": _honoured("whether a higher metric_for_best_model is better"),
    # -- resuming, seeds, devices --------------------------------------------------------------------------------
    "ignore_data_skip": _refused(
        "a resumed run always continues at the exact micro-batch it stopped at (the sampler starts mid-epoch at "
        "no cost), so that it equals the uninterrupted run"
    ),
    "restore_callback_states_from_checkpoint": _honoured(
        "callback states saved in trainer_state.json are restored on resume"
    ),
    "full_determinism": _honoured("enable_full_determinism(seed) instead of set_seed when the Trainer is built"),
    "seed": _honoured("set_seed when the Trainer is built, and the data order when data_seed is unset"),
    "data_seed": _honoured("seed of the data order (a permutation per (seed, epoch), the same on every rank)"),
    "use_cpu": _honoured("run the stages on the CPU (set automatically where there is no GPU)"),
    "accelerator_config": _refused(
        "no data loader or model goes through accelerate (every rank reads the same micro-batches), so none of "
        "its settings would apply"
    ),
    "parallelism_config": _refused(
        "PETRA's parallelism is its pipeline (petra_partition) and replicas (petra_data_parallel); accelerate's "
        "tensor, context and sharded parallelism are not applied"
    ),
    # -- data loading --------------------------------------------------------------------------------------------
    "dataloader_drop_last": _honoured("drop each epoch's last incomplete micro-batch"),
    "dataloader_num_workers": _honoured("worker processes of the train and eval data loaders"),
    "dataloader_pin_memory": _honoured("pinned host memory for the batches (with CUDA only)"),
    "dataloader_persistent_workers": _honoured("keep the data loader workers alive between epochs"),
    "dataloader_prefetch_factor": _honoured("batches each data loader worker loads in advance"),
    "dataloader_multiprocessing_context": _refused(
        "PetraTrainer's data loaders use torch's default start method, so it would be ignored"
    ),
    "dataloader_in_order": _refused(
        "every rank of a pipeline must read the same micro-batches in the same order, so batches are always yielded "
        "in order"
    ),
    "remove_unused_columns": _honoured(
        "what the model's forward does not take is dropped, as in transformers: the columns of a datasets.Dataset, "
        "the keys of any other data set's items (by the collator)"
    ),
    "label_names": _refused(
        "the labels are always the batch's 'labels' (read by the last stage); rename the column to labels"
    ),
    "train_sampling_strategy": _refused(
        "the training order is always a permutation per (data_seed or seed, epoch), the same on every rank of a "
        "pipeline"
    ),
    "length_column_name": _refused("only read by group_by_length or batch_rebalance sampling, which are refused"),
    # -- distributed back ends -----------------------------------------------------------------------------------
    "ddp_find_unused_parameters": _DDP,
    "ddp_bucket_cap_mb": _DDP,
    "ddp_broadcast_buffers": _DDP,
    "ddp_static_graph": _DDP,
    "ddp_backend": _refused("the process group is NCCL with GPUs and gloo without (petra_hub's init_distributed)"),
    "ddp_timeout": _refused("collectives time out after petra_timeout; set that instead"),
    "fsdp": _refused(
        "FSDP shards the whole model over the ranks; PETRA places whole stages on ranks (petra_partition)"
    ),
    "fsdp_config": _refused("only read with fsdp, which is refused"),
    "deepspeed": _refused("DeepSpeed wraps the whole model and one optimizer; PETRA runs one optimizer per stage"),
    "debug": _refused(
        "underflow_overflow counts batches at the model's forward, which the stages bypass; tpu_metrics_debug "
        "needs a TPU"
    ),
    "skip_memory_metrics": _refused(
        "the PETRA training loop reports no memory metrics (the benchmarks measure memory per stage)"
    ),
    # -- for scripts ---------------------------------------------------------------------------------------------
    "do_train": _SCRIPT_FLAG,
    "do_eval": _SCRIPT_FLAG,
    "do_predict": _SCRIPT_FLAG,
    "resume_from_checkpoint": _not_applicable(
        "not read by the Trainer: pass it to train(resume_from_checkpoint=...), as petra_hub's recipe does"
    ),
    "local_rank": _not_applicable(
        "set by the deprecated torch.distributed.launch; ranks come from the launcher's environment "
        "(RANK, LOCAL_RANK, WORLD_SIZE)"
    ),
    # -- PETRA ---------------------------------------------------------------------------------------------------
    "petra_mode": _honoured(
        "training method: petra, or a baseline (" + ", ".join(m.value for m in Mode if m.value != "petra") + ")"
    ),
    "petra_num_stages": _honoured("pipeline stages J (default: the model's own stages, one per block)"),
    "petra_stage_groups": _honoured(
        "pipeline stages as groups of the model's consecutive stages, e.g. '1,2,7' (instead of petra_num_stages)"
    ),
    "petra_partition": _honoured(
        "stages per process, e.g. '5,5', or 'auto' (the fastest split, stages measured on the first micro-batch)"
    ),
    "petra_scale_lr": _honoured("the paper's scaling: lr = learning_rate x micro_batch x k / 256"),
    "petra_lr_milestones": _honoured(
        "epochs at which the LR is multiplied by petra_lr_gamma, after warm-up (replaces lr_scheduler_type)"
    ),
    "petra_lr_gamma": _honoured("LR factor at each of petra_lr_milestones"),
    "petra_data_parallel": _honoured("D pipeline replicas over the W = P x D processes, each reading its own share"),
    "petra_timeout": _honoured("seconds before a dead or stalled peer process becomes an error"),
    "petra_preemption_grace": _honoured(
        "seconds a SIGTERM or first Ctrl-C leaves to save a checkpoint and exit with status 75 (preempted, resumable)"
    ),
    "petra_streams": _honoured("with bf16 or fp16: dtype of the streams between stages (fp32 default, or bf16)"),
    "petra_message_dtype": _honoured(
        "bf16 or fp16: dtype activations and gradients cross stage boundaries in (reconstruction payloads excepted)"
    ),
    "petra_check_reconstruction_every": _honoured(
        "sampled check of the inputs reversible stages rebuild, logged as reconstruction_error (0: off)"
    ),
    "petra_reconstruction_warning": _honoured("a logged reconstruction_error above this relative error warns"),
    "petra_weight_prediction": _honoured(
        "forwards at the weights extrapolated over h times the stage's delay along its last update (0: off)"
    ),
    "petra_synchronous_steps": _honoured(
        "the first N optimizer steps run without delay (reversible_backprop), then petra with the same states (0: off)"
    ),
    "petra_delay_momentum": _honoured(
        "each stage's momentum lowered so that its lag plus the stage's delay is the optimizer's own lag (pipelined)"
    ),
    "petra_delay_lr_warmup": _honoured(
        "each stage starts at lr / (its delay in updates) and reaches lr after this many steps (or fraction; 0: off)"
    ),
    "petra_memory_budget": _honoured(
        "activation bytes per process within which stages keep their forward's graph instead of recomputing it (off)"
    ),
    "petra_gradient_fidelity_steps": _honoured(
        "every N steps, per-stage gradient fidelity against the end-to-end and stashed-weight gradients (0: off)"
    ),
    # -- added back by PetraTrainingArguments (transformers 5 dropped it) ---------------------------------------------
    "overwrite_output_dir": _honoured(
        "true by default: a second run into the same output_dir replaces the earlier run's outputs, as transformers' "
        "Trainer trains into it again (before training, that run's checkpoints, metrics, model files and model card "
        "are removed, named in a log line; other files stay; nothing is removed when resuming from one of the "
        "folder's own checkpoints); false refuses a folder that holds another run"
    ),
}


# -- the checks built on the table -------------------------------------------------------------------------------

# Values a refused field may hold besides its dataclass default, because they mean the same (a disabled
# feature), or because `TrainingArguments.__post_init__` writes them when the arguments are rebuilt
# (`dataclasses.replace`).
_ALSO_DEFAULT: dict[str, tuple] = {
    "activation_checkpointing": (False,),
    "gradient_checkpointing": (False,),
    "activation_checkpointing_kwargs": ({},),
    "gradient_checkpointing_kwargs": ({},),
    "liger_kernel_config": ({},),
    "include_num_input_tokens_seen": (False,),
    "include_for_metrics": (None,),
    "label_names": (["labels"],),
    "debug": (None, []),
    "fsdp": (False, "", []),
    "fsdp_config": ({},),
    "deepspeed": ({},),
}


def _plain(value: Any) -> Any:
    """An enum member as its value (`SchedulerType.LINEAR` -> "linear"); anything else unchanged."""
    return getattr(value, "value", value)


def field_default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _is_default_accelerator_config(value: Any) -> bool:
    if value is None or value == {}:
        return True
    try:
        from transformers.trainer_pt_utils import AcceleratorConfig
    except ImportError:  # pragma: no cover - accelerate missing: TrainingArguments fails on its own
        return False
    if isinstance(value, AcceleratorConfig):
        return value == AcceleratorConfig()
    if isinstance(value, str) and value.lstrip().startswith("{"):
        value = json.loads(value)
    if isinstance(value, dict):
        try:
            return AcceleratorConfig(**value) == AcceleratorConfig()
        except TypeError:
            return False
    return False


def _is_default(name: str, value: Any, default: Any) -> bool:
    """Whether `value` leaves the feature behind field `name` as its default leaves it."""
    if name == "accelerator_config":
        return _is_default_accelerator_config(value)
    value = _plain(value)
    if isinstance(value, (list, tuple)):
        value = [_plain(item) for item in value]
    return value == default or value in _ALSO_DEFAULT.get(name, ())


# -- values of honoured fields that PetraTrainer cannot honour ---------------------------------------------------

_DELAYED_SCHEDULERS = {"reduce_lr_on_plateau", "greedy"}
# linear is the default of lr_scheduler_type: a user who sets petra_lr_milestones cannot be told apart from one who
# asked for linear
_MILESTONE_COMPATIBLE_SCHEDULERS = {"linear", "constant", "constant_with_warmup"}
_WHOLE_MODEL_OPTIMIZERS = ("galore_", "apollo_", "lomo", "adalomo")


def _empty(value: Any) -> bool:
    if isinstance(value, str):
        value = value.strip()
        return value in ("", "{}")
    return not value


def _lr_scheduler_type_problem(args) -> str | None:
    scheduler = str(_plain(args.lr_scheduler_type))
    if scheduler in _DELAYED_SCHEDULERS:
        return (
            "it is stepped with evaluation metrics, while every stage steps its scheduler after its own update; "
            "use another schedule or petra_lr_milestones (step decay)"
        )
    if getattr(args, "petra_lr_milestones", None) and scheduler not in _MILESTONE_COMPATIBLE_SCHEDULERS:
        return (
            "petra_lr_milestones replaces the schedule by the paper's warm-up + step decay, so this one would be "
            "ignored; set lr_scheduler_type='constant' with petra_lr_milestones, or drop petra_lr_milestones"
        )
    return None


def _lr_scheduler_kwargs_problem(args) -> str | None:
    if getattr(args, "petra_lr_milestones", None) and not _empty(args.lr_scheduler_kwargs):
        return (
            "petra_lr_milestones replaces the schedule by the paper's warm-up + step decay, so these would be "
            "ignored; drop them, or drop petra_lr_milestones"
        )
    return None


def _optim_problem(args) -> str | None:
    optim = str(_plain(args.optim))
    if optim.startswith(_WHOLE_MODEL_OPTIMIZERS):
        return (
            "GaLore, APOLLO and LOMO optimizers are built over the whole model (or drive its backward pass), while "
            "each stage has its own optimizer; use a per-stage optimizer such as sgd or adamw_torch"
        )
    if optim.startswith("schedule_free"):
        return (
            "schedule-free optimizers must be switched with optimizer.train()/eval() around evaluation, which the "
            "stages' optimizers are not; use a per-stage optimizer with an lr_scheduler_type"
        )
    return None


def _save_strategy_problem(args) -> str | None:
    if str(_plain(args.save_strategy)) == "best":
        return (
            "PetraTrainer saves at steps or epochs only, so no checkpoint would ever be written; use "
            "save_strategy='steps' or 'epoch' with load_best_model_at_end=True and save_total_limit"
        )
    return None


_VALUE_CHECKS: dict[str, Callable[[Any], str | None]] = {
    "lr_scheduler_type": _lr_scheduler_type_problem,
    "lr_scheduler_kwargs": _lr_scheduler_kwargs_problem,
    "optim": _optim_problem,
    "save_strategy": _save_strategy_problem,
}


def _transformers_defaults() -> dict[str, Any]:
    """The default of every `TrainingArguments` field (a subclass may change its own defaults: what counts is
    transformers', so that no subclass can turn a refused feature on by default)."""
    from transformers import TrainingArguments

    return {field.name: field_default(field) for field in dataclasses.fields(TrainingArguments)}


def check_supported(args) -> None:
    """Raise a ValueError naming the first refused field set to a value other than its `TrainingArguments` default
    (in field order), or the first honoured field set to a value PetraTrainer cannot honour.

    Runs in `PetraTrainingArguments.__post_init__`, before transformers normalises the values, and again on every
    rebuild (`dataclasses.replace`) and in `PetraTrainer.__init__`, `train`, `evaluate` and `predict` (a field set
    after the arguments were built), after it did: both forms of a default value are accepted. A transformers
    field missing from `TRAINING_ARGUMENT_SUPPORT` (a newer release) is refused when set, until it is classified.
    """
    defaults = _transformers_defaults()
    for field in dataclasses.fields(args):
        name, value = field.name, getattr(args, field.name)
        support = TRAINING_ARGUMENT_SUPPORT.get(name)
        if name in defaults and support is None:
            if not _is_default(name, value, defaults[name]):
                raise ValueError(
                    f"{name}={value!r}: PetraTrainer has not been checked against this TrainingArguments field (new "
                    f"in this transformers release), so it may be silently ignored; leave it at its default "
                    f"({defaults[name]!r}) until petra_hub lists it in {DOCS_PAGE}"
                )
            continue
        if support is None:  # a field of a subclass of PetraTrainingArguments: its own business
            continue
        if support.status == REFUSED and name in defaults and not _is_default(name, value, defaults[name]):
            raise ValueError(
                f"{name}={value!r} is not supported by PetraTrainer: {support.note}. Leave {name} at its default "
                f"({defaults[name]!r}); {DOCS_PAGE} lists how PetraTrainer treats every TrainingArguments field"
            )
        check = _VALUE_CHECKS.get(name)
        problem = check(args) if check is not None else None
        if problem:
            raise ValueError(f"{name}={_plain(value)!r} is not supported by PetraTrainer: {problem}")
