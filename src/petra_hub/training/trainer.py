"""`PetraTrainer`: a `transformers.Trainer` whose training loop is the PETRA engine's decoupled stage schedule.

Every rank builds the whole model and reads the same micro-batches in the same order; the engine runs only that
rank's stages. What the stock Trainer would do for data parallelism (shard the data, wrap in DDP, average the loss
over ranks, save from rank 0's copy) is replaced accordingly; callbacks, logging, the progress bar, evaluation,
checkpoints and `push_to_hub` keep their usual behaviour.

Consistent points: the pipeline is drained (every micro-batch fed is backpropagated everywhere, partial
accumulation groups applied) before evaluating, saving a checkpoint and at the end of training. A run resumed from
a checkpoint therefore continues exactly as the uninterrupted run, which drained at the same point.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler
from transformers import Trainer, TrainingArguments, get_scheduler
from transformers.trainer_callback import ExportableState, TrainerState
from transformers.trainer_utils import EvalPrediction, TrainOutput, rotate_checkpoints, speed_metrics

from ..data import DATASETS
from .distributed import init_distributed
from ..engine import Mode, Pipeline, merge_stages
from ..engine.optim import weight_decay_groups
from ..integrations.hub import TrainingSummary, write_model_card

HUB_DATASET_IDS = {"cifar10": "uoft-cs/cifar10", "cifar100": "uoft-cs/cifar100", "imagenet": "ILSVRC/imagenet-1k"}

PETRA_STATE_NAME = "petra_state.json"
STAGE_STATE_PATTERN = "petra_stage_{:03d}.pt"


@dataclass
class PetraTrainingArguments(TrainingArguments):
    """`TrainingArguments` plus the PETRA knobs.

    `per_device_train_batch_size` is the micro-batch size and `gradient_accumulation_steps` is k: every stage
    averages the gradients of k consecutive micro-batches before its optimizer steps (one global step).
    """

    petra_mode: str = field(
        default="petra",
        metadata={"help": "backprop, reversible_backprop, delayed, input_buffer, weight_stash or petra"},
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
        if not torch.cuda.is_available():
            self.use_cpu = True
        init_distributed(self.petra_timeout)
        super().__post_init__()

    def partition_sizes(self) -> list[int] | None:
        if not self.petra_partition:
            return None
        try:
            return [int(part) for part in str(self.petra_partition).split(",")]
        except ValueError:
            raise ValueError(f"petra_partition must be comma-separated stage counts like '5,5', got {self.petra_partition!r}") from None

    def milestones(self) -> list[float]:
        if not self.petra_lr_milestones:
            return []
        try:
            return sorted(float(part) for part in str(self.petra_lr_milestones).split(","))
        except ValueError:
            raise ValueError(f"petra_lr_milestones must be comma-separated epochs like '150,225', got {self.petra_lr_milestones!r}") from None


class EpochSampler(Sampler[int]):
    """The same order on every rank of a pipeline: a permutation seeded by (seed, epoch), optionally starting
    mid-epoch. With several pipeline replicas, replica d reads every D-th index of it (equal shares)."""

    def __init__(self, size: int, seed: int, shuffle: bool = True, replica: int = 0, replicas: int = 1):
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self.replica, self.replicas = replica, replicas
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self):
        if self.shuffle:
            order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch))
        else:
            order = torch.arange(self.size)
        share = order[self.replica :: self.replicas][: self.size // self.replicas]
        return iter(share[self.start :].tolist())

    def __len__(self) -> int:
        return self.size // self.replicas - self.start


class PetraTrainer(Trainer):
    """Train a model whose `get_stages()` returns its pipeline stages (e.g. `RevNetForImageClassification`)
    with PETRA, in one process or over the processes of `accelerate launch`."""

    def __init__(self, model=None, args: PetraTrainingArguments | None = None, *positional, **kwargs):
        if args is None:
            raise ValueError("PetraTrainer needs PetraTrainingArguments (output_dir, PETRA mode, ...)")
        if not isinstance(args, PetraTrainingArguments):
            raise TypeError(f"PetraTrainer needs PetraTrainingArguments, got {type(args).__name__}")
        if model is None or not hasattr(model, "get_stages"):
            raise ValueError("PetraTrainer needs a model with get_stages(), such as RevNetForImageClassification")
        super().__init__(model, args, *positional, **kwargs)
        self.stages = merge_stages(model.get_stages(), args.petra_num_stages or len(model.get_stages()))
        world = dist.get_world_size() if dist.is_initialized() else 1
        replicas = args.petra_data_parallel
        if world % replicas:
            raise ValueError(f"{world} processes cannot form petra_data_parallel={replicas} equal pipeline replicas")
        if world // replicas > len(self.stages):
            raise ValueError(
                f"{world // replicas} processes for {len(self.stages)} pipeline stages: launch at most "
                f"{len(self.stages) * replicas} processes (accelerate launch --num_processes), raise "
                "petra_num_stages or petra_data_parallel"
            )
        self.replica = (dist.get_rank() if dist.is_initialized() else 0) // (world // replicas)
        self.pipeline: Pipeline | None = None
        self._inference: Pipeline | None = None
        self._micro_batches_fed = 0
        self._group_fill = 0  # micro-batches fed into the current accumulation group
        self._window = [0.0, 0, 0]  # loss sum, losses, samples since the last global step (this rank)
        self._log_window = [0.0, 0, 0, time.time()]  # loss sum, count, samples, start, since the last log
        self._last_eval_metrics: dict | None = None

    # -- data ---------------------------------------------------------------------------------------------------------
    def get_train_dataloader(self) -> DataLoader:
        """Not sharded per rank: every pipeline stage must see the same micro-batches in the same order."""
        if self.train_dataset is None:
            raise ValueError("PetraTrainer.train() needs a train_dataset")
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        sampler = EpochSampler(len(self.train_dataset), seed, replica=self.replica, replicas=self.args.petra_data_parallel)
        return self._plain_loader(self.train_dataset, self.args.per_device_train_batch_size, sampler)

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset")
        return self._plain_loader(dataset, self.args.per_device_eval_batch_size, EpochSampler(len(dataset), 0, shuffle=False))

    def _plain_loader(self, dataset, batch_size: int, sampler: Sampler) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=self.data_collator,
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory and torch.cuda.is_available(),
            drop_last=self.args.dataloader_drop_last,
        )

    def _split_batch(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(batch, dict) or "pixel_values" not in batch or "labels" not in batch:
            keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise ValueError(f"each batch must be a dict with 'pixel_values' and 'labels', got {keys}")
        return batch["pixel_values"], batch["labels"]

    def _check_first_batch(self, loader: DataLoader) -> None:
        """Fail before any work if the data does not fit the model (shape, channels, labels)."""
        sample = loader.dataset[0]
        if not isinstance(sample, dict) or not {"pixel_values", "labels"} <= set(sample):
            keys = sorted(sample) if isinstance(sample, dict) else type(sample).__name__
            raise ValueError(f"each sample must be a dict with 'pixel_values' and 'labels', got {keys}")
        if not torch.is_tensor(sample["pixel_values"]) or sample["pixel_values"].dim() != 3:
            raise ValueError("'pixel_values' must be an image tensor [channels, height, width] (apply the data set's transform)")
        batch = self.data_collator([sample])
        pixel_values, labels = self._split_batch(batch)
        check = getattr(getattr(self.model, "revnet", None), "check_pixel_values", None)
        if check is not None:
            check(pixel_values)
        num_labels = getattr(self.model.config, "num_labels", None)
        if num_labels and not labels.is_floating_point() and not 0 <= int(labels.min()) <= int(labels.max()) < num_labels:
            raise ValueError(f"labels must lie in [0, {num_labels - 1}], got {labels.tolist()} in the first sample")

    # -- the engine ---------------------------------------------------------------------------------------------------
    def _loss(self, logits, labels):
        if hasattr(self.model, "compute_loss"):
            return self.model.compute_loss(logits, labels)
        return torch.nn.functional.cross_entropy(logits, labels)

    def _learning_rate(self) -> float:
        args = self.args
        if not args.petra_scale_lr:
            return args.learning_rate
        return args.learning_rate * args.per_device_train_batch_size * args.gradient_accumulation_steps / 256

    def _make_optimizer(self, index: int, stage: torch.nn.Module) -> torch.optim.Optimizer:
        """The Trainer's optimizer choice (args.optim), one per stage; no weight decay on biases and norms."""
        optimizer_cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(self.args, self.model)
        kwargs = {**kwargs, "lr": self._learning_rate()}
        return optimizer_cls(weight_decay_groups(stage, self.args.weight_decay), **kwargs)

    def _make_scheduler(self, max_steps: int, steps_per_epoch: float):
        args = self.args
        warmup = args.get_warmup_steps(max_steps)
        milestones = [round(epoch * steps_per_epoch) for epoch in args.milestones()]
        if milestones:
            gamma = args.petra_lr_gamma

            def factor(step: int) -> float:
                if step < warmup:
                    return step / max(1, warmup)
                return gamma ** sum(step >= m for m in milestones)

            return lambda index, optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return lambda index, optimizer: get_scheduler(
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=warmup,
            num_training_steps=max_steps,
            scheduler_specific_kwargs=args.lr_scheduler_kwargs or {},
        )

    def _build_pipeline(self, max_steps: int, steps_per_epoch: float) -> Pipeline:
        return Pipeline(
            self.stages,
            self._loss,
            mode=self.args.petra_mode,
            accumulation_steps=self.args.gradient_accumulation_steps,
            optimizer_factory=self._make_optimizer,
            scheduler_factory=self._make_scheduler(max_steps, steps_per_epoch),
            partition=self.args.partition_sizes(),
            data_parallel_size=self.args.petra_data_parallel,
            device=self.args.device,
            timeout=self.args.petra_timeout,
        )

    def _pipeline_for_inference(self) -> Pipeline:
        if self.pipeline is not None:
            return self.pipeline
        if self._inference is None:
            self._inference = Pipeline(
                self.stages,
                self._loss,
                mode=self.args.petra_mode,
                partition=self.args.partition_sizes(),
                data_parallel_size=self.args.petra_data_parallel,
                device=self.args.device,
                timeout=self.args.petra_timeout,
            )
        return self._inference

    # -- training loop ------------------------------------------------------------------------------------------------
    def _inner_training_loop(
        self, batch_size=None, args=None, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None
    ) -> TrainOutput:
        args = self.args
        loader = self.get_train_dataloader()
        self._check_first_batch(loader)
        per_epoch = len(loader)
        if per_epoch == 0:
            raise ValueError("the train dataset yields no micro-batch (empty, or drop_last with too few samples)")
        k = args.gradient_accumulation_steps
        steps_per_epoch = per_epoch / k
        if args.max_steps > 0:
            max_steps = args.max_steps
            total = max_steps * k
        else:
            total = math.ceil(args.num_train_epochs * per_epoch)
            max_steps = math.ceil(total / k)
        num_epochs = math.ceil(total / per_epoch)

        self.state = TrainerState(
            stateful_callbacks=[cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]
        )
        self.state.train_batch_size = args.per_device_train_batch_size
        self.state.compute_steps(args, max_steps)
        self._micro_batches_fed = 0
        if resume_from_checkpoint is not None:
            self.state = TrainerState.load_from_json(os.path.join(resume_from_checkpoint, "trainer_state.json"))
            self._load_callback_state()
            petra_state = json.loads(Path(resume_from_checkpoint, PETRA_STATE_NAME).read_text())
            self._micro_batches_fed = petra_state["micro_batches_fed"]
        self.state.init_training_references(self, max_steps, num_epochs, trial)

        self.pipeline = self._build_pipeline(max_steps, steps_per_epoch)
        self._inference = None
        if resume_from_checkpoint is not None:
            self._load_stage_states(resume_from_checkpoint)
        self.model.train()
        self._group_fill = 0
        self._window = [0.0, 0, 0]
        self._log_window = [0.0, 0, 0, time.time()]
        self._initial_global_step = self.state.global_step
        self._total_loss_scalar = 0.0  # sum and count of the losses logged by this train() call
        self._losses_logged = 0
        self._tr_loss = torch.tensor(0.0)
        self._globalstep_last_logged = self.state.global_step
        start_time = time.time()
        fed_at_start = self._micro_batches_fed

        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        sampler: EpochSampler = loader.sampler
        while self._micro_batches_fed < total and not self.control.should_training_stop:
            epoch, offset = divmod(self._micro_batches_fed, per_epoch)
            sampler.set_epoch(epoch, start=offset * loader.batch_size)
            if hasattr(self.train_dataset, "set_epoch"):
                self.train_dataset.set_epoch(epoch)
            if offset == 0:
                self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            for batch in loader:
                if self._group_fill == 0:
                    self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                pixel_values, labels = self._split_batch(batch)
                self._record(self.pipeline.step(pixel_values, labels), len(labels))
                self._micro_batches_fed += 1
                self._group_fill += 1
                self.state.epoch = self._micro_batches_fed / per_epoch
                if self._micro_batches_fed >= total:
                    # Drain before the last step's callbacks so its log holds the last losses.
                    self._record(self.pipeline.drain(), 0)
                if self._group_fill == k or self._micro_batches_fed >= total:
                    self._finish_step(trial, ignore_keys_for_eval)
                if self.control.should_training_stop or self.control.should_epoch_stop or self._micro_batches_fed >= total:
                    break
            if self._micro_batches_fed % per_epoch == 0 or self._micro_batches_fed >= total:
                self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
                self._log_save_evaluate(trial, ignore_keys_for_eval)

        self._drain()
        if self._globalstep_last_logged < self.state.global_step or self._log_window[1]:
            self._log_training(force=True)
        seconds = time.time() - start_time
        num_steps = self.state.global_step - self._initial_global_step
        samples = (self._micro_batches_fed - fed_at_start) * args.per_device_train_batch_size
        metrics = speed_metrics("train", start_time, num_samples=samples, num_steps=num_steps)
        metrics["train_loss"] = self._total_loss_scalar / max(1, self._losses_logged)
        metrics["train_runtime"] = round(seconds, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    def _record(self, losses, batch_size: int) -> None:
        for _, loss in losses:
            value = float(loss)
            self._window[0] += value
            self._window[1] += 1
        self._window[2] += batch_size * self.args.petra_data_parallel

    def _finish_step(self, trial=None, ignore_keys_for_eval=None) -> None:
        """A global step: k more micro-batches fed (or a partial group applied by a drain)."""
        self._group_fill = 0
        self.state.global_step += 1
        self._close_window()
        self.control = self.callback_handler.on_step_end(self.args, self.state, self.control)
        self._log_save_evaluate(trial, ignore_keys_for_eval)

    def _close_window(self) -> None:
        """Move the losses the last stage produced since the last call into the log window, on every rank;
        stop on a NaN. Called at the same points on every rank (it is a collective)."""
        loss_sum, count, bad = self._reduce_step_losses()
        if bad:
            raise FloatingPointError(
                f"loss is NaN or infinite at global step {self.state.global_step} (computed by the last stage, "
                f"stage {len(self.stages) - 1}); stopping before anything else is saved"
            )
        self._log_window[0] += loss_sum
        self._log_window[1] += count
        self._log_window[2] += self._window[2]
        self._window = [0.0, 0, 0]

    def _reduce_step_losses(self) -> tuple[float, int, int]:
        """The last stage's losses of this step, known to every rank (one small collective per step)."""
        loss_sum, count = self._window[0], self._window[1]
        bad = int(not math.isfinite(loss_sum))
        values = torch.tensor([0.0 if bad else loss_sum, float(count), float(bad)], dtype=torch.float64)
        if dist.is_initialized() and dist.get_world_size() > 1:
            device = self.args.device if dist.get_backend() == "nccl" else torch.device("cpu")
            values = values.to(device)
            dist.all_reduce(values)
            values = values.cpu()
        return float(values[0]), int(values[1]), int(values[2])

    def _log_save_evaluate(self, trial=None, ignore_keys_for_eval=None) -> None:
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            self._log_training()
        if self.control.should_evaluate:
            self._drain()
            metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
            self._determine_best_metric(metrics=metrics, trial=trial)
        if self.control.should_save:
            self._drain()
            self._save_checkpoint(self.model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _log_training(self, force: bool = False) -> None:
        loss_sum, count, samples, start = self._log_window
        logs = {}
        if count:
            logs["loss"] = loss_sum / count
            self._total_loss_scalar += loss_sum
            self._losses_logged += count
        scheduler = next((w.scheduler for w in self.pipeline.workers.values() if w.scheduler is not None), None)
        if scheduler is not None:
            logs["learning_rate"] = scheduler.get_last_lr()[0]
        elapsed = time.time() - start
        if elapsed > 0 and samples:
            logs["samples_per_second"] = round(samples / elapsed, 3)
        self._log_window = [0.0, 0, 0, time.time()]
        self._globalstep_last_logged = self.state.global_step
        if logs or force:
            self.log(logs)

    def _drain(self) -> None:
        """Bring every stage to the same point: all micro-batches backpropagated, partial groups applied."""
        if self.pipeline is None or not self.pipeline.undrained:
            return
        self._record(self.pipeline.drain(), 0)
        if self._group_fill:
            self._finish_step()
        else:
            self._close_window()

    # -- evaluation ---------------------------------------------------------------------------------------------------
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Drain, then run every batch forward through the stages with running batch-norm statistics."""
        self._drain()
        loader = self.get_eval_dataloader(eval_dataset)
        pipeline = self._pipeline_for_inference()
        start = time.time()
        logits, labels, loss_sum, seen = [], [], 0.0, 0
        for batch in loader:
            pixel_values, batch_labels = self._split_batch(batch)
            outputs = pipeline.infer(pixel_values)
            seen += len(batch_labels)
            if outputs is not None:
                outputs = outputs.detach().cpu()
                loss_sum += float(self._loss(outputs, batch_labels)) * len(batch_labels)
                logits.append(outputs)
                labels.append(batch_labels)
        metrics = None
        if pipeline.has_last_stage:
            metrics = {f"{metric_key_prefix}_loss": loss_sum / max(1, seen)}
            if self.compute_metrics is not None:
                prediction = EvalPrediction(predictions=torch.cat(logits).numpy(), label_ids=torch.cat(labels).numpy())
                for key, value in self.compute_metrics(prediction).items():
                    metrics[key if key.startswith(f"{metric_key_prefix}_") else f"{metric_key_prefix}_{key}"] = value
        if dist.is_initialized() and dist.get_world_size() > 1:
            holder = [metrics]
            # The last stage of replica 0 sits on global rank P - 1.
            dist.broadcast_object_list(holder, src=len(pipeline.placement.groups) - 1)
            metrics = holder[0]
        metrics.update(speed_metrics(metric_key_prefix, start, num_samples=seen, num_steps=len(loader)))
        metrics = {k: (float(v) if isinstance(v, (np.floating, np.integer)) else v) for k, v in metrics.items()}
        self._last_eval_metrics = metrics
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    # -- saving -------------------------------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Gather every stage onto rank 0 and save one `from_pretrained`-loadable folder (safetensors), with the
        processor and a model card. Call it on every rank."""
        output_dir = output_dir or self.args.output_dir
        self._drain()
        if self.pipeline is not None:
            self.pipeline.gather_stages(dst=0)
        if self.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
            self.model.save_pretrained(output_dir)
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            torch.save(self.args, os.path.join(output_dir, "training_args.bin"))
            self._write_model_card(output_dir)
        if dist.is_initialized():
            dist.barrier()

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = self._get_output_dir(trial=trial)
        output_dir = os.path.join(run_dir, f"checkpoint-{self.state.global_step}")
        self.save_model(output_dir, _internal_call=True)
        os.makedirs(output_dir, exist_ok=True)
        for index, worker in self.pipeline.workers.items() if self.replica == 0 else ():
            state = {
                "optimizer": worker.optimizer.state_dict() if worker.optimizer else None,
                "scheduler": worker.scheduler.state_dict() if worker.scheduler else None,
            }
            torch.save(state, os.path.join(output_dir, STAGE_STATE_PATTERN.format(index)))
        if self.args.should_save:
            petra_state = {
                "micro_batches_fed": self._micro_batches_fed,
                "num_stages": len(self.stages),
                "mode": self.args.petra_mode,
                "accumulation_steps": self.args.gradient_accumulation_steps,
            }
            Path(output_dir, PETRA_STATE_NAME).write_text(json.dumps(petra_state, indent=2))
            for callback in [cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]:
                name = callback.__class__.__name__
                if isinstance(self.state.stateful_callbacks.get(name), list):
                    self.state.stateful_callbacks[name].append(callback.state())
                else:
                    self.state.stateful_callbacks[name] = callback.state()
            self.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )
        if dist.is_initialized():
            dist.barrier()

    def _load_stage_states(self, checkpoint: str) -> None:
        saved = json.loads(Path(checkpoint, PETRA_STATE_NAME).read_text())
        if saved["num_stages"] != len(self.stages):
            raise ValueError(
                f"checkpoint {checkpoint} was trained with {saved['num_stages']} stages, this run has {len(self.stages)}"
            )
        for index, worker in self.pipeline.workers.items():
            path = Path(checkpoint, STAGE_STATE_PATTERN.format(index))
            if not path.exists():
                raise FileNotFoundError(f"checkpoint {checkpoint} lacks {path.name} (optimizer state of stage {index})")
            try:  # never unpickle code: a checkpoint may come from someone else
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as error:
                raise ValueError(
                    f"cannot resume from {path}: not a readable stage state (optimizer and scheduler tensors only); "
                    f"the checkpoint is incomplete, corrupt or unsafe ({type(error).__name__}: {error})"
                ) from error
            if worker.optimizer is not None and state["optimizer"] is not None:
                worker.optimizer.load_state_dict(state["optimizer"])
            if worker.scheduler is not None and state["scheduler"] is not None:
                worker.scheduler.load_state_dict(state["scheduler"])

    def training_summary(self) -> TrainingSummary:
        """What the model card says about this run."""
        args, config = self.args, self.model.config
        info = getattr(self.train_dataset, "info", None) or getattr(self.eval_dataset, "info", None)
        metrics = self._last_eval_metrics or {}
        world = dist.get_world_size() if dist.is_initialized() else 1
        device = f"{world} x {torch.cuda.get_device_name()}" if torch.cuda.is_available() else f"{os.cpu_count()} CPU cores"
        return TrainingSummary(
            model_name=Path(args.hub_model_id or args.output_dir).name,
            preset=getattr(config, "preset", None),
            dataset=info.name if info is not None else "unknown",
            dataset_id=HUB_DATASET_IDS.get(info.name) if info is not None else None,
            mode=args.petra_mode,
            num_stages=len(self.stages),
            accumulation_steps=args.gradient_accumulation_steps,
            num_processes=world,
            epochs=round(self.state.epoch, 2) if self.state.epoch else None,
            micro_batch_size=args.per_device_train_batch_size,
            learning_rate=self._learning_rate(),
            hardware=f"{device}, {'NCCL' if torch.cuda.is_available() else 'gloo'}" if world > 1 else device,
            eval_accuracy=metrics.get("eval_accuracy"),
            eval_loss=metrics.get("eval_loss"),
            num_parameters=sum(p.numel() for p in self.model.parameters()),
        )

    def _write_model_card(self, output_dir: str) -> None:
        summary = self.training_summary()
        if summary.dataset == "unknown" or summary.dataset not in DATASETS:
            return
        write_model_card(output_dir, summary, repo_id=self.args.hub_model_id, config=self.model.config)

    def create_model_card(self, *args, **kwargs) -> None:
        """`push_to_hub` calls this: the PETRA card (written by `save_model`) replaces the generic one."""
        if self.args.should_save:
            self._write_model_card(self.args.output_dir)
