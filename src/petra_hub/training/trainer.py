"""`PetraTrainer`: a `transformers.Trainer` whose training loop is the PETRA engine's decoupled stage schedule.

Every rank builds the whole model and reads the same micro-batches in the same order; the engine runs only that
rank's stages. What the stock Trainer would do for data parallelism (shard the data, wrap in DDP, average the loss
over ranks, save from rank 0's copy) is replaced accordingly; callbacks, logging, the progress bar, evaluation,
checkpoints and `push_to_hub` keep their usual behaviour.

A global step is k micro-batches fed (one accumulation group), or fewer at the end of an epoch, as in
transformers' Trainer. Consistent points: the pipeline is drained (every micro-batch fed is backpropagated
everywhere) before evaluating and at the end of training; these happen only at step ends, so a resumed run continues
exactly as the uninterrupted run, which drained at the same point. A checkpoint keeps the micro-batches in flight
instead of draining (`Pipeline.state_dict`), so that saving changes nothing in the training, and a run resumed from it
continues as if it had not stopped. After each of them every rank holds the whole model (`trainer.model`,
`prediction_step`): trained, or, after a checkpoint, with each stage's weights as they stand.
"""

from __future__ import annotations

import math
import time

import torch
from torch.utils.data import DataLoader, IterableDataset
from transformers import Trainer
from transformers.trainer_callback import ExportableState, TrainerState
from transformers.trainer_utils import PredictionOutput, TrainOutput, speed_metrics
from transformers.utils import logging

from ..engine import Pipeline, PipelineError, group_sizes, merge_stages, replica_of
from ..engine.optim import decayed_by_the_paper
from .arguments import PetraTrainingArguments
from .agreement import agreed_control, check_ranks_agree, from_rank_zero
from .batches import check_all_labels, check_first_batch, data_seed, dataset_label, make_loader
from .batches import first_items, labels_digest, plan_steps, repeated_first_batch, split_batch
from .card import name_labels, save_run_folder, write_run_card
from .card_data import record_evaluation
from .checkpoint import PetraState, checkpoint_folder, checkpoint_to_resume, end_with_the_best, load_stage_states
from .checkpoint import load_trainer_state, validate_checkpoint
from .checkpoint_checks import check_model_tensors, check_positions
from .checkpoint import copy_repository_files, pushes_now, write_checkpoint
from .distributed import broadcast_module, check_same_run, check_shared_output_dir, process_rank
from .distributed import raise_on_every_rank, world_size
from .evaluation import eval_set_named, run_inference
from .feeding import MicroBatch, Reading, inference_batches, is_stream, log_reading, rank_batches, reading_for
from .fidelity import GradientFidelityCallback
from .guards import RunLock, check_and_lock_output_dir, check_finite
from .losses import LossWindow, PendingLosses, collect, training_logs
from .optimization import optimizer_factory, scheduler_factory, stage_optimizer
from .plug_ins import check_plug_ins, check_trainable, loss_function, with_step_labels
from .preemption import PreemptionWatch, begin_preemption_save, preempted, resume_after_restart
from .rng_state import restore_rng_state
from .sampler import EpochSampler
from .support import check_supported


logger = logging.get_logger(__name__)


class PetraTrainer(Trainer):
    """Train a model whose `get_stages()` returns its pipeline stages (e.g. `RevNetForImageClassification`)
    with PETRA, in one process or over the processes of `accelerate launch`."""

    def __init__(self, model=None, args: PetraTrainingArguments | None = None, *positional, **kwargs):
        if args is None:
            raise ValueError("PetraTrainer needs PetraTrainingArguments (output_dir, PETRA mode, ...)")
        if not isinstance(args, PetraTrainingArguments):
            raise TypeError(f"PetraTrainer needs PetraTrainingArguments, got {type(args).__name__}")
        super().__init__(model, args, *positional, **kwargs)
        check_supported(self.args)  # and at each entry below: a field may be set after the arguments were built
        check_trainable(self.model)
        check_plug_ins(self)
        self.stages = self._make_stages()
        if args.petra_gradient_fidelity_steps:
            self.add_callback(GradientFidelityCallback(args.petra_gradient_fidelity_steps))
        self.replica = replica_of(process_rank(), world_size(), args.petra_data_parallel)
        self.pipeline: Pipeline | None = None
        self._inference: Pipeline | None = None
        self._micro_batches_fed = 0
        self._train_labels: str | None = None  # `labels_digest` of the train set, taken when training starts
        self._position = (0, 0)  # (epoch, micro-batches of it fed) of the next micro-batch
        self._pending = PendingLosses()  # this rank's losses not collected yet (a collective)
        self._unlogged = LossWindow()  # collected on every rank, not logged yet
        self._trained = LossWindow()  # every loss collected by this train() call, logged or not: train_loss
        self._model_synced = True  # every rank's `self.model` holds every stage's current weights
        self._saving_in_flight = False  # a checkpoint is being written with micro-batches in flight (no drain)
        self._last_eval_metrics: dict | None = None
        self.model_card_kwargs: dict = {}  # create_model_card's arguments for every card (the recipe names its data)
        self._lock = RunLock(args.output_dir)
        self._profile_batch = None  # with petra_partition="auto": the micro-batch the stages are measured on
        self._schedules = None  # the training pipeline's LR schedules (`StageSchedules`)
        self._preemption = PreemptionWatch(args.petra_preemption_grace)  # entered while `train` runs

    def _make_stages(self) -> list:
        model_stages = self.model.get_stages()
        stages = merge_stages(model_stages, self.args.stage_groups(len(model_stages)))
        processes = world_size() // self.args.petra_data_parallel
        if processes > len(stages):
            raise ValueError(
                f"{processes} processes for {len(stages)} pipeline stages: launch at most "
                f"{len(stages) * self.args.petra_data_parallel} processes (accelerate launch --num_processes), raise "
                "petra_num_stages or petra_data_parallel"
            )
        return stages

    # -- data ---------------------------------------------------------------------------------------------------------
    def get_train_dataloader(self) -> DataLoader:
        """Not sharded per rank: every pipeline stage must see the same micro-batches in the same order."""
        if self.train_dataset is None:
            raise ValueError("PetraTrainer.train() needs a train_dataset")
        dataset, collator = self._prepared(self.train_dataset, "training")
        if isinstance(dataset, IterableDataset):
            return make_loader(self.args, collator, dataset, self.args.per_device_train_batch_size)
        sampler = EpochSampler(len(dataset), data_seed(self.args), replica=self.replica,
                               replicas=self.args.petra_data_parallel)
        return make_loader(self.args, collator, dataset, self.args.per_device_train_batch_size, sampler)

    def get_eval_dataloader(self, eval_dataset=None) -> DataLoader:
        """`eval_dataset` may name one of a dict of eval data sets, as in Trainer."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str):
            dataset = eval_set_named(self.eval_dataset, dataset)
        if dataset is None:
            raise ValueError("evaluate() needs an eval_dataset")
        return self.get_test_dataloader(dataset)

    def get_test_dataloader(self, test_dataset) -> DataLoader:
        dataset, collator = self._prepared(test_dataset, "evaluation")
        sampler = None if isinstance(dataset, IterableDataset) else EpochSampler(len(dataset), 0, shuffle=False)
        return make_loader(self.args, collator, dataset, self.args.per_device_eval_batch_size, sampler)

    def _prepared(self, dataset, description: str):
        """(data set, collator) as Trainer prepares them under `remove_unused_columns`: the columns the model does
        not take are dropped from a `datasets.Dataset`, from the items of any other data set by the collator."""
        import datasets

        if not isinstance(dataset, datasets.Dataset):
            return dataset, self._get_collator_with_removed_columns(self.data_collator, description=description)
        if self.args.remove_unused_columns:
            dataset = self._remove_unused_columns(dataset, description=description)
        return dataset, self.data_collator

    # -- the engine ---------------------------------------------------------------------------------------------------
    def _build_pipeline(self, max_steps: int = 0, steps_per_epoch: float = 1.0, training: bool = True) -> Pipeline:
        args = self.args
        schedules = None
        if training:
            schedules = self._schedules = scheduler_factory(args, max_steps, steps_per_epoch, len(self.stages))
        return Pipeline(
            self.stages,
            loss_function(self),
            mode=args.petra_mode,
            accumulation_steps=args.gradient_accumulation_steps if training else 1,
            optimizer_factory=optimizer_factory(self) if training else None,
            scheduler_factory=schedules,
            timeout=args.petra_timeout,
            max_grad_norm=args.max_grad_norm or None,
            precision=args.precision(),
            compile_options=args.compile_options(),
            profile_batch=self._profile_batch if training else None,
            layout=args.layout(args.device, training),
            remedies=args.remedies(),
            memory=args.memory(training),
            diagnostics=args.diagnostics(),
        )

    def get_decay_parameter_names(self, model) -> list[str]:
        """The parameters weight decay applies to: those with more than one dimension (the paper's rule and timm's:
        none on biases nor on batch-norm and layer-norm weights; Trainer's own rule decays batch-norm weights).
        Override it as in Trainer."""
        return [name for name, param in model.named_parameters() if decayed_by_the_paper(param)]

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
        self.stages = self._make_stages()  # model_init may have built a new model
        loader = self.get_train_dataloader()
        first_pixels, first_labels = split_batch(check_first_batch(self.model, loader.collate_fn, loader.dataset))
        self._sample_shape = tuple(first_pixels.shape[1:])
        if args.petra_partition == "auto" or args.memory_budget_bytes() is not None:  # measured on it
            micro_batch = args.per_device_train_batch_size
            self._profile_batch = repeated_first_batch(loader.collate_fn, loader.dataset, micro_batch)
        labels = check_all_labels(self.train_dataset, self.model.config.num_labels, collator=self.data_collator,
                                  problem_type=self.model.config.problem_type)
        per_epoch, steps_per_epoch, max_steps = plan_steps(loader, args)

        self._train_labels = labels_digest(labels)
        check_same_run(args, dataset_label(self.train_dataset), self._train_labels)  # before any rank writes or trains
        check_shared_output_dir(args)
        with raise_on_every_rank():
            self._lock = check_and_lock_output_dir(self.args, self.model, self.replica, resume_from_checkpoint)

        self.state = TrainerState(stateful_callbacks=self._exportable_callbacks())
        self.state.train_batch_size = args.per_device_train_batch_size
        self.state.compute_steps(args, max_steps)
        self._micro_batches_fed, self._position = 0, (0, 0)
        if resume_from_checkpoint is not None:
            self.state = load_trainer_state(resume_from_checkpoint, self._get_output_dir(trial=trial))
            self._load_callback_state()
            saved = PetraState.load(resume_from_checkpoint)
            saved.check_compatible(self._run_state(), resume_from_checkpoint)
            check_positions(saved, self.state.global_step, per_epoch, args.gradient_accumulation_steps,
                            resume_from_checkpoint, strict=False)
            self._micro_batches_fed = saved.micro_batches_fed
            if saved.epoch is not None:
                self._position = (saved.epoch, saved.epoch_offset)
            elif per_epoch:
                self._position = divmod(saved.micro_batches_fed, per_epoch)
        else:
            broadcast_module(self.model, src=0)  # every rank starts from rank 0's weights, seeded or not
        self.state.init_training_references(self, max_steps, math.ceil(max_steps / steps_per_epoch), trial)

        self.pipeline = self._build_pipeline(max_steps, steps_per_epoch)
        self._inference = None
        for callback in self.callback_handler.callbacks:  # those that read the pipeline (GradientFidelityCallback)
            if hasattr(callback, "bind_trainer"):
                callback.bind_trainer(self)
        self._reading = reading_for(self.pipeline.has_first_stage, self.pipeline.has_last_stage, loader, labels,
                                    first_labels)
        log_reading(self._reading, process_rank())
        self._pending, self._unlogged, self._trained = PendingLosses(), LossWindow(), LossWindow()
        if resume_from_checkpoint is not None:
            load_stage_states(resume_from_checkpoint, self.pipeline)  # with the work in flight, if it was kept
            if not self.pipeline.fed:  # a checkpoint without the pipeline's position
                self.pipeline.resume_after(self.state.global_step)  # a synchronous start those steps made is over
            self._pending.resume(saved.loss_steps or [], self.pipeline.fed)
        self.model.train()
        self._initial_global_step = self.state.global_step
        self._tr_loss = torch.tensor(0.0)
        self._globalstep_last_logged = self.state.global_step
        start_time = time.time()
        fed_at_start = self._micro_batches_fed

        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if args.eval_on_start:  # as in Trainer, not a candidate for the best model (no checkpoint holds it)
            self.evaluate(ignore_keys=ignore_keys_for_eval)
        if resume_from_checkpoint is not None:  # the draws the uninterrupted run would make next
            restore_rng_state(resume_from_checkpoint, process_rank(), world_size())
        while self.state.global_step < max_steps and not self.control.should_training_stop:
            epoch, offset = self._position
            if offset == 0:
                self.control = self.callback_handler.on_epoch_begin(args, self.state, self.control)
            fed_this_epoch, stopped = offset, False
            batches = rank_batches(loader, self.train_dataset, self._reading, epoch, offset, self.replica,
                                   args.petra_data_parallel, data_seed(args), self.pipeline.share_from_first_stage,
                                   self.pipeline.device)
            if self.compute_loss_func is not None:  # its num_items_in_batch counts the whole step's items
                batches = with_step_labels(batches, args, counts=self.pipeline.has_last_stage)
            for batch in batches:
                if self.pipeline.fed_in_group == 0:
                    self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                self._feed(batch)
                if self.pipeline.fed_in_group:  # a micro-batch that does not end the step
                    self.control = self.callback_handler.on_substep_end(args, self.state, self.control)
                fed_this_epoch += 1
                self._position = (epoch, fed_this_epoch)
                self.state.epoch = epoch + fed_this_epoch / per_epoch if per_epoch else float(epoch)
                if self.pipeline.fed_in_group == 0:
                    self._end_step(trial, ignore_keys_for_eval, last=self.state.global_step + 1 >= max_steps)
                stopped = self.control.should_training_stop or self.control.should_epoch_stop
                if stopped or self.state.global_step >= max_steps:
                    stopped = True
                    break
            if not stopped and fed_this_epoch == 0:
                raise ValueError(f"the train dataset yielded no micro-batch in epoch {epoch}")
            # The epoch ends when its data is exhausted or a callback ends it; else training left it inside.
            finished = not stopped or (per_epoch is not None and fed_this_epoch >= per_epoch) or \
                self.control.should_epoch_stop
            last = not finished or self.state.global_step + 1 >= max_steps
            self._leave_epoch(epoch, trial, ignore_keys_for_eval, last=last, finished=finished)
        self._sync_model()
        unlogged, self._unlogged = self._unlogged, LossWindow()  # as in Trainer: counted in train_loss, not logged
        self._trained.merge(unlogged)
        num_steps = self.state.global_step - self._initial_global_step
        samples = (self._micro_batches_fed - fed_at_start) * args.per_device_train_batch_size
        metrics = speed_metrics("train", start_time, num_samples=samples, num_steps=num_steps)
        metrics["train_loss"] = self._trained.mean()
        metrics["train_runtime"] = round(time.time() - start_time, 4)
        self.store_flos()
        metrics["total_flos"] = self.state.total_flos
        self.log(metrics)
        run_dir = self._get_output_dir(trial=trial)
        end_with_the_best(self, run_dir)
        check_ranks_agree(self.state, run_dir, "at the end of training")
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        return TrainOutput(self.state.global_step, metrics["train_loss"], metrics)

    def _run_state(self) -> PetraState:
        args = self.args
        return PetraState(self._micro_batches_fed, len(self.stages), args.petra_mode, args.gradient_accumulation_steps,
                          *self._position, args.per_device_train_batch_size, dataset_label(self.train_dataset),
                          group_sizes(self.stages), args.petra_data_parallel, self._optimizer_name(),
                          self._train_labels, self._pending.open_steps())

    def _optimizer_name(self) -> str:
        """The class of the stages' optimizers (a checkpoint records it: another class cannot load their states)."""
        optimizer_cls = stage_optimizer(self)[0]
        return getattr(optimizer_cls, "__name__", type(optimizer_cls).__name__)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        """Trainer's `train`, resuming by itself after a torchrun restart (`preemption.resume_after_restart`) and
        ending on SIGTERM or a first Ctrl-C with a checkpoint and `Preempted` (exit status 75)."""
        check_supported(self.args)
        resume_from_checkpoint = resume_after_restart(resume_from_checkpoint, self.args.output_dir)
        resume_from_checkpoint = checkpoint_to_resume(resume_from_checkpoint, self.args.output_dir, len(self.stages))
        if resume_from_checkpoint is not None:  # before transformers loads it, which accepts missing weights
            check_model_tensors(resume_from_checkpoint, self.model)
        self._preemption = PreemptionWatch(self.args.petra_preemption_grace)
        try:
            with self._preemption:
                return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            self._lock.release()

    def _feed(self, micro: MicroBatch) -> None:
        """One micro-batch into the pipeline, with what this rank read of it (`feeding`)."""
        losses = self.pipeline.step(micro.pixel_values if self.pipeline.has_first_stage else None, micro.labels,
                                    batch_size=micro.size, sample_ids=micro.sample_ids)
        self._pending.add(losses, micro.size * self.args.petra_data_parallel)
        # the same count on every rank: a rank that read no images counts images of the shape the first rank reads
        images = micro.batch if micro.batch is not None else {
            "pixel_values": torch.empty((micro.size, *self._sample_shape), device="meta")}
        self.current_flos += float(self.floating_point_ops(images))
        self._micro_batches_fed += 1
        self._model_synced = False

    def _leave_epoch(self, epoch: int, trial, ignore_keys_for_eval, last: bool, finished: bool) -> None:
        """A group left open is a step of its own; then the epoch's end events, as in Trainer, also where training
        leaves it inside (max_steps, a fraction of an epoch, a callback), whose position stays, for resuming."""
        if self.pipeline.fed_in_group:
            self.pipeline.end_group()
            self._end_step(trial, ignore_keys_for_eval, last=last)
        if finished:
            self._position = (epoch + 1, 0)
            self.state.epoch = float(epoch + 1)
        self.control = self.callback_handler.on_epoch_end(self.args, self.state, self.control)
        self._log_save_evaluate(trial, ignore_keys_for_eval)

    def _end_step(self, trial, ignore_keys_for_eval, last: bool) -> None:
        """A global step ends: its accumulation group is closed (every stage applies it at its own tick, so the
        optimizer events mark the step's close, not a moment when gradients can be read)."""
        for event in (self.callback_handler.on_pre_optimizer_step, self.callback_handler.on_optimizer_step):
            self.control = event(self.args, self.state, self.control)
        self._pending.close_step(self.pipeline.fed)
        if last:  # drain first, so that the last step's log holds the last losses
            self._pending.add(self.pipeline.drain())
        self.state.global_step += 1
        self._collect_losses()
        self.control = self.callback_handler.on_step_end(self.args, self.state, self.control)
        self._log_save_evaluate(trial, ignore_keys_for_eval)

    def _collect_losses(self) -> None:
        """Bring the losses the last stage produced since the last call to every rank (at the same points on every
        rank); stop on a NaN before anything else is saved."""
        self._unlogged.merge(collect(self._pending.take(), self.state.global_step, len(self.stages) - 1))

    def _sync_model(self, drain: bool = True) -> None:
        """Drain (with `drain`), then give every rank every stage's current weights."""
        if drain and self.pipeline is not None and self.pipeline.undrained:
            self._pending.add(self.pipeline.drain())
            self._model_synced = False
            self._collect_losses()
            check_finite(self.pipeline, f"at global step {self.state.global_step}")
        if self.pipeline is not None and not self._model_synced:
            self.pipeline.gather_stages(dst=None)
        self._model_synced = True

    def _log_save_evaluate(self, trial=None, ignore_keys_for_eval=None) -> None:
        """What the callbacks decided at a step or epoch end, as rank 0's callbacks decided it (`agreed_control`), so
        that every rank evaluates, saves and stops at the same steps; after an evaluation or a save, the ranks'
        trainer states and checkpoints are compared (`check_ranks_agree`)."""
        self.control, signalled = agreed_control(self.control, "decision at step end", self._preemption.received)
        run_dir = self._get_output_dir(trial=trial)
        if signalled:
            begin_preemption_save(self._preemption, signalled, run_dir, self.state.global_step, self.control,
                                  announce=self.is_world_process_zero())
        if self.control.should_log and self.state.global_step > self._globalstep_last_logged:
            self._log_training()
        drained = self.control.should_evaluate or self.control.should_save
        if self.control.should_evaluate:
            self._evaluate_and_track(trial, ignore_keys_for_eval)
            self.control, _ = agreed_control(self.control, "decision after evaluating")
        if self.control.should_save:
            self._save_checkpoint(self.model, trial)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)
            self.control, _ = agreed_control(self.control, "decision after saving")
        if drained:
            check_ranks_agree(self.state, run_dir, f"at global step {self.state.global_step}")
        if signalled:
            final = checkpoint_folder(run_dir, self.state.global_step)
            validate_checkpoint(final, len(self.stages))
            raise preempted(final, announce=self.is_world_process_zero())

    def _evaluate_and_track(self, trial, ignore_keys_for_eval) -> None:
        metrics = self.evaluate(ignore_keys=ignore_keys_for_eval)
        self._determine_best_metric(metrics=metrics, trial=trial)

    def _determine_best_metric(self, metrics: dict[str, float], trial) -> bool:
        """Trainer's choice of the best metric and step, made by rank 0 (from the metrics every rank holds) and the
        same on every rank."""
        is_new_best = super()._determine_best_metric(metrics=metrics, trial=trial)
        best = from_rank_zero([self.state.best_metric, self.state.best_global_step, is_new_best], "the best metric")
        self.state.best_metric, self.state.best_global_step, is_new_best = best
        return is_new_best

    def _log_training(self) -> None:
        window, self._unlogged = self._unlogged, LossWindow()
        self._trained.merge(window)
        learning_rate = self._schedules.learning_rate(self.state.global_step)  # the logged step's, as Trainer's
        logs = training_logs(window, self.pipeline, self.args, learning_rate)
        self._globalstep_last_logged = self.state.global_step
        self.store_flos()
        if logs:
            self.log(logs)

    def store_flos(self) -> None:
        """Trainer's `total_flos`: `floating_point_ops` of each micro-batch fed, by every one of the D replicas."""
        self.state.total_flos += self.current_flos * self.args.petra_data_parallel
        self.current_flos = 0

    # -- evaluation and prediction ------------------------------------------------------------------------------------
    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Drain, then run every batch forward through the stages with running batch-norm statistics. A dict of
        data sets is evaluated set by set, with prefixes `eval_<name>`."""
        check_supported(self.args)
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, str):  # the name of one of a dict of eval data sets (the prefix stays, as in Trainer)
            dataset = eval_set_named(self.eval_dataset, dataset)
        if isinstance(dataset, dict):
            metrics = {}
            for name, subset in dataset.items():
                metrics.update(self._evaluate_set(subset, f"{metric_key_prefix}_{name}"))
            return metrics
        return self._evaluate_set(dataset, metric_key_prefix)

    def _evaluate_set(self, dataset, metric_key_prefix: str) -> dict[str, float]:
        result = self._infer(self.get_eval_dataloader(dataset), metric_key_prefix, keep_outputs=False)
        record_evaluation(self, dataset, result.metrics)  # the card's: the first set of a dict
        self.log(result.metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, result.metrics)
        return result.metrics

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test") -> PredictionOutput:
        """Predictions of the trained stages, the same on every rank (call it on every rank)."""
        check_supported(self.args)
        result = self._infer(self.get_test_dataloader(test_dataset), metric_key_prefix, keep_outputs=True)
        self.control = self.callback_handler.on_predict(self.args, self.state, self.control, result.metrics)
        return PredictionOutput(predictions=result.logits, label_ids=result.label_ids, metrics=result.metrics)

    def _infer(self, loader, prefix: str, keep_outputs: bool):
        self._sync_model()
        pipeline = self._pipeline_for_inference()
        batches = inference_batches(loader, self._inference_reading(loader, pipeline, prefix),
                                    pipeline.share_from_first_stage, pipeline.device)
        return run_inference(pipeline, batches, loss_function(self), self.compute_metrics, prefix,
                             self.preprocess_logits_for_metrics, keep_outputs)

    def _inference_reading(self, loader, pipeline: Pipeline, prefix: str) -> Reading:
        """What this rank reads of an evaluated or predicted set (`feeding`): its labels column, and whether its
        batches carry labels, are read from the set and its first items, never from all of them."""
        if pipeline.has_first_stage or not pipeline.has_last_stage or is_stream(loader):
            return reading_for(pipeline.has_first_stage, pipeline.has_last_stage, loader, None, None)
        items = first_items(loader.dataset)
        first_labels = split_batch(loader.collate_fn(items))[1] if items else None
        try:
            labels = check_all_labels(loader.dataset, self.model.config.num_labels, f"the {prefix} set",
                                      collator=self.data_collator, problem_type=self.model.config.problem_type) \
                if first_labels is not None else None
        except ValueError as error:  # the labels as loaded are what the metrics have always seen
            reading = Reading(images=True, why=f"its label column cannot stand in for its items ({error})")
        else:
            reading = reading_for(False, True, loader, labels, first_labels)
        log_reading(reading, process_rank(), f"the {prefix} set")
        return reading

    # -- saving -------------------------------------------------------------------------------------------------------
    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Gather every stage and save one `from_pretrained`-loadable folder (safetensors), with the processor and
        a model card, then push it with `push_to_hub=True`. While training is under way, call it on every rank (it
        gathers the stages); afterwards every rank holds the whole model, and process 0 may save alone, as in
        `if trainer.is_world_process_zero(): trainer.save_model()`."""
        output_dir = output_dir or self.args.output_dir
        try:
            self._sync_model(drain=not self._saving_in_flight)
        except PipelineError as error:
            raise type(error)(f"{error}. save_model gathers the stages while training is under way: call it on every "
                              "process (after training, every process holds the whole model and process 0 may save "
                              "alone)") from error
        name_labels(self)  # LABEL_i become the data set's class names
        if self.args.should_save:
            save_run_folder(self, output_dir)
        if self.args.push_to_hub and not _internal_call:  # as Trainer.save_model does
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save_checkpoint(self, model, trial) -> None:
        """A checkpoint of the pipeline as it stands, with the micro-batches in flight, so that saving leaves the
        training unchanged; where they cannot be kept (`Pipeline.snapshot_blocker`), of the drained pipeline."""
        self.store_flos()
        blocker = self.pipeline.snapshot_blocker()
        if blocker and self.pipeline.undrained:
            logger.info("checkpoint-%d drains the pipeline first: %s", self.state.global_step, blocker)
            self._sync_model()
        else:  # what a drain would check before anything is written
            check_finite(self.pipeline, f"at global step {self.state.global_step}")
        self._saving_in_flight = True
        try:
            write_checkpoint(self, self._get_output_dir(trial=trial), self._run_state())
        finally:
            self._saving_in_flight = False

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """Trainer's push of a new checkpoint's model, with its code files, image processor and model card: every
        push of the repository loads with trust_remote_code and pipeline and has its card, not only the last one."""
        if pushes_now(self):
            copy_repository_files(checkpoint_folder, self.args.output_dir)
        super()._push_from_checkpoint(checkpoint_folder)

    def _exportable_callbacks(self) -> list:
        return [cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)]

    def create_model_card(self, **kwargs) -> None:
        """`push_to_hub` calls this: the PETRA card replaces the generic one (the keyword arguments of
        `Trainer.create_model_card` are honoured)."""
        if self.args.should_save:
            write_run_card(self, self.args.output_dir, **kwargs)
