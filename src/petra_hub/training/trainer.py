"""`PetraTrainer`: a `transformers.Trainer` whose training loop is the PETRA engine's decoupled stage schedule.

Every rank builds the whole model and reads the same micro-batches in the same order; the engine runs only that
rank's stages. What the stock Trainer would do for data parallelism (shard the data, wrap in DDP, average the loss
over ranks, save from rank 0's copy) is replaced accordingly; callbacks, logging, the progress bar, evaluation,
checkpoints and `push_to_hub` keep their usual behaviour.

A global step is k micro-batches fed (one accumulation group), or fewer at the end of an epoch, as in
transformers' Trainer. Consistent points: the pipeline is drained (every micro-batch fed is backpropagated
everywhere) before evaluating, saving a checkpoint and at the end of training; these happen only at step ends, so
a resumed run continues exactly as the uninterrupted run, which drained at the same point.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler
from transformers import Trainer
from transformers.trainer_callback import ExportableState, TrainerState
from transformers.trainer_utils import EvalPrediction, TrainOutput, rotate_checkpoints, speed_metrics

from ..engine import Pipeline, merge_stages, replica_of
from .arguments import PetraTrainingArguments
from .card import write_run_card
from .checkpoint import PetraState, load_stage_states, save_stage_states
from .distributed import all_reduce_sum, world_size
from .optimization import optimizer_factory, scheduler_factory
from .sampler import EpochSampler


@dataclass
class LossWindow:
    """Losses the last stage finished and samples fed since the window opened."""

    loss_sum: float = 0.0
    losses: int = 0
    samples: int = 0
    opened: float = field(default_factory=time.time)

    def add(self, losses: list, samples: int = 0) -> None:
        for _, loss in losses:
            self.loss_sum += float(loss)
            self.losses += 1
        self.samples += samples


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
        world, replicas = world_size(), args.petra_data_parallel
        if world // replicas > len(self.stages):
            raise ValueError(
                f"{world // replicas} processes for {len(self.stages)} pipeline stages: launch at most "
                f"{len(self.stages) * replicas} processes (accelerate launch --num_processes), raise "
                "petra_num_stages or petra_data_parallel"
            )
        self.replica = replica_of(dist.get_rank() if world > 1 else 0, world, replicas)
        self.pipeline: Pipeline | None = None
        self._inference: Pipeline | None = None
        self._micro_batches_fed = 0
        self._pending = LossWindow()  # this rank's losses since the last collection (a collective)
        self._unlogged = LossWindow()  # collected on every rank, not logged yet
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
        pixel_values, labels = self._split_batch(self.data_collator([sample]))
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

    def _build_pipeline(self, max_steps: int = 0, steps_per_epoch: float = 1.0, training: bool = True) -> Pipeline:
        args = self.args
        return Pipeline(
            self.stages,
            self._loss,
            mode=args.petra_mode,
            accumulation_steps=args.gradient_accumulation_steps if training else 1,
            optimizer_factory=optimizer_factory(args, self.model) if training else None,
            scheduler_factory=scheduler_factory(args, max_steps, steps_per_epoch) if training else None,
            partition=args.partition_sizes(),
            data_parallel_size=args.petra_data_parallel,
            device=args.device,
            timeout=args.petra_timeout,
        )

    def _pipeline_for_inference(self) -> Pipeline:
        if self.pipeline is not None:
            return self.pipeline
        if self._inference is None:
            self._inference = self._build_pipeline(training=False)
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
        # As in transformers' Trainer, the partial group at the end of an epoch is a step of its own.
        steps_per_epoch = math.ceil(per_epoch / args.gradient_accumulation_steps)
        max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * steps_per_epoch)
        num_epochs = math.ceil(max_steps / steps_per_epoch)

        self.state = TrainerState(stateful_callbacks=self._exportable_callbacks())
        self.state.train_batch_size = args.per_device_train_batch_size
        self.state.compute_steps(args, max_steps)
        self._micro_batches_fed = 0
        if resume_from_checkpoint is not None:
            self.state = TrainerState.load_from_json(os.path.join(resume_from_checkpoint, "trainer_state.json"))
            self._load_callback_state()
            self._micro_batches_fed = PetraState.load(resume_from_checkpoint).micro_batches_fed
        self.state.init_training_references(self, max_steps, num_epochs, trial)

        self.pipeline = self._build_pipeline(max_steps, steps_per_epoch)
        self._inference = None
        if resume_from_checkpoint is not None:
            load_stage_states(resume_from_checkpoint, self.pipeline)
        self.model.train()
        self._pending, self._unlogged = LossWindow(), LossWindow()
        self._initial_global_step = self.state.global_step
        self._total_loss_scalar = 0.0  # sum and count of the losses logged by this train() call
        self._losses_logged = 0
        self._tr_loss = torch.tensor(0.0)
        self._globalstep_last_logged = self.state.global_step
        start_time = time.time()
        fed_at_start = self._micro_batches_fed

        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        sampler: EpochSampler = loader.sampler
        while self.state.global_step < max_steps and not self.control.should_training_stop:
            epoch, offset = divmod(self._micro_batches_fed, per_epoch)
            sampler.set_epoch(epoch, start=offset * loader.batch_size)
            if hasattr(self.train_dataset, "set_epoch"):
                self.train_dataset.set_epoch(epoch)
            if offset == 0:
                self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            for batch in loader:
                if self.pipeline.fed_in_group == 0:
                    self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                self._feed(batch)
                self.state.epoch = self._micro_batches_fed / per_epoch
                if self._micro_batches_fed % per_epoch == 0:
                    self.pipeline.end_group()
                if self.pipeline.fed_in_group == 0:
                    self._end_step(trial, ignore_keys_for_eval, last=self.state.global_step + 1 >= max_steps)
                if self.control.should_training_stop or self.control.should_epoch_stop or self.state.global_step >= max_steps:
                    break
            if self._micro_batches_fed % per_epoch == 0:
                self.control = self.callback_handler.on_epoch_end(args, self.state, self.control)
                self._log_save_evaluate(trial, ignore_keys_for_eval)

        if self.pipeline.fed_in_group:  # a callback stopped training inside a group: it still counts as a step
            self.pipeline.end_group()
            self._end_step(trial, ignore_keys_for_eval, last=True)
        self._drain()
        if self._globalstep_last_logged < self.state.global_step or self._unlogged.losses:
            self._log_training(force=True)
        num_steps = self.state.global_step - self._initial_global_step
        samples = (self._micro_batches_fed - fed_at_start) * args.per_device_train_batch_size
        metrics = speed_metrics("train", start_time, num_samples=samples, num_steps=num_steps)
        metrics["train_loss"] = self._total_loss_scalar / max(1, self._losses_logged)
        metrics["train_runtime"] = round(time.time() - start_time, 4)
        self.log(metrics)
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    def _feed(self, batch) -> None:
        pixel_values, labels = self._split_batch(batch)
        losses = self.pipeline.step(pixel_values, labels)
        self._pending.add(losses, len(labels) * self.args.petra_data_parallel)
        self._micro_batches_fed += 1

    def _end_step(self, trial, ignore_keys_for_eval, last: bool) -> None:
        """A global step ends: its accumulation group is closed (every stage applies it at its own tick)."""
        if last:  # drain first, so that the last step's log holds the last losses
            self._pending.add(self.pipeline.drain())
        self.state.global_step += 1
        self._collect_losses()
        self.control = self.callback_handler.on_step_end(self.args, self.state, self.control)
        self._log_save_evaluate(trial, ignore_keys_for_eval)

    def _collect_losses(self) -> None:
        """Bring the losses the last stage produced since the last call to every rank (one small collective, at
        the same points on every rank); stop on a NaN before anything else is saved."""
        pending, self._pending = self._pending, LossWindow()
        bad = not math.isfinite(pending.loss_sum)
        values = torch.tensor([0.0 if bad else pending.loss_sum, float(pending.losses), float(bad)], dtype=torch.float64)
        loss_sum, count, bad = all_reduce_sum(values, self.args.device).tolist()
        if bad:
            raise FloatingPointError(
                f"loss is NaN or infinite at global step {self.state.global_step} (computed by the last stage, "
                f"stage {len(self.stages) - 1}); stopping before anything else is saved"
            )
        self._unlogged.loss_sum += loss_sum
        self._unlogged.losses += int(count)
        self._unlogged.samples += pending.samples

    def _drain(self) -> None:
        """Bring every stage to the same point: all micro-batches fed backpropagated everywhere."""
        if self.pipeline is None or not self.pipeline.undrained:
            return
        self._pending.add(self.pipeline.drain())
        self._collect_losses()

    def _log_save_evaluate(self, trial=None, ignore_keys_for_eval=None) -> None:
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            self._log_training()
        if self.control.should_evaluate:
            metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
            self._determine_best_metric(metrics=metrics, trial=trial)
        if self.control.should_save:
            self._save_checkpoint(self.model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def _log_training(self, force: bool = False) -> None:
        window, self._unlogged = self._unlogged, LossWindow()
        logs = {}
        if window.losses:
            logs["loss"] = window.loss_sum / window.losses
            self._total_loss_scalar += window.loss_sum
            self._losses_logged += window.losses
        learning_rate = self.pipeline.last_lr()
        if learning_rate is not None:
            logs["learning_rate"] = learning_rate
        elapsed = time.time() - window.opened
        if elapsed > 0 and window.samples:
            logs["samples_per_second"] = round(window.samples / elapsed, 3)
        self._globalstep_last_logged = self.state.global_step
        if logs or force:
            self.log(logs)

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
        if world_size() > 1:
            holder = [metrics]
            dist.broadcast_object_list(holder, src=pipeline.last_stage_rank)
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
        if self.pipeline.replica == 0:
            save_stage_states(output_dir, self.pipeline)
        if self.args.should_save:
            args = self.args
            PetraState(self._micro_batches_fed, len(self.stages), args.petra_mode, args.gradient_accumulation_steps).save(output_dir)
            for callback in self._exportable_callbacks():
                name = callback.__class__.__name__
                if isinstance(self.state.stateful_callbacks.get(name), list):
                    self.state.stateful_callbacks[name].append(callback.state())
                else:
                    self.state.stateful_callbacks[name] = callback.state()
            self.state.save_to_json(os.path.join(output_dir, "trainer_state.json"))
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )
        if dist.is_initialized():
            dist.barrier()

    def _exportable_callbacks(self) -> list:
        return [cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]

    def _write_model_card(self, output_dir: str, **card_kwargs) -> None:
        write_run_card(self, output_dir, **card_kwargs)

    def create_model_card(self, **kwargs) -> None:
        """`push_to_hub` calls this: the PETRA card replaces the generic one (the keyword arguments of
        `Trainer.create_model_card` are honoured)."""
        if self.args.should_save:
            self._write_model_card(self.args.output_dir, **kwargs)
