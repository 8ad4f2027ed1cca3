"""PetraTrainer across processes: every rank sees the trained model, 1 and 2 processes train the same model, and a
run killed after a checkpoint resumes on 2 processes to the uninterrupted result."""

import os

import torch
from transformers import TrainerCallback

from petra_hub.testing.ranks import run_ranks
from tests.training.test_trainer import make_trainer


def as_launched(rank: int, world_size: int) -> None:
    """What `accelerate launch` would set: accelerate reads these to see the processes."""
    os.environ.update(
        WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size)
    )


def checksum(model) -> dict[str, float]:
    return {name: float(t.double().sum()) + float((t.double() ** 2).sum()) for name, t in model.state_dict().items()}


def _train_evaluate_predict(rank, world_size, folder, seed):
    as_launched(rank, world_size)
    trainer = make_trainer(folder, init_seed=seed + rank, max_steps=6)  # a different initial model on every rank
    trainer.train()
    metrics = trainer.evaluate()
    prediction = trainer.predict(trainer.eval_dataset)
    return {
        "state": {k: v.clone() for k, v in trainer.model.state_dict().items()},
        "eval_accuracy": metrics["eval_accuracy"],
        "predicted_accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean()),
        "predictions": torch.as_tensor(prediction.predictions),
    }


def test_every_rank_sees_the_trained_model_and_two_processes_equal_one(tmp_path):
    results, codes, _ = run_ranks(_train_evaluate_predict, 2, str(tmp_path / "two"), 0, deadline=240)
    assert all(r is not None and "value" in r for r in results), [r and r.get("traceback") for r in results]
    ranks = [r["value"] for r in results]
    single = make_trainer(tmp_path / "one", init_seed=0, max_steps=6)
    single.train()
    expected = single.model.state_dict()
    for value in ranks:  # rank 1 started from another model: training began from rank 0's weights everywhere
        assert all(torch.equal(value["state"][name], expected[name]) for name in expected)
        assert value["predicted_accuracy"] == value["eval_accuracy"] == ranks[0]["eval_accuracy"]
        assert torch.equal(value["predictions"], ranks[0]["predictions"])


class Kill(TrainerCallback):
    def __init__(self, at_step):
        self.at_step = at_step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.at_step:
            os._exit(0)  # as if the machine went down right after the checkpoint


def _run(rank, world_size, folder, resume, kill_at):
    as_launched(rank, world_size)
    callbacks = [Kill(kill_at)] if kill_at else None
    trainer = make_trainer(folder, max_steps=8, save_strategy="steps", save_steps=2, callbacks=callbacks)
    trainer.train(resume_from_checkpoint=resume)
    return {k: v.clone() for k, v in trainer.model.state_dict().items()}


def test_a_run_killed_after_a_checkpoint_resumes_on_two_processes_exactly(tmp_path):
    full, _, _ = run_ranks(_run, 2, str(tmp_path / "full"), None, None, deadline=240)
    assert all(r and "value" in r for r in full), [r and r.get("traceback") for r in full]
    killed, codes, _ = run_ranks(_run, 2, str(tmp_path / "killed"), None, 4, deadline=240)
    assert codes == [0, 0] and killed == [None, None]
    assert (tmp_path / "killed" / "checkpoint-4").is_dir() and not (tmp_path / "killed" / "checkpoint-6").exists()
    resumed, _, _ = run_ranks(_run, 2, str(tmp_path / "resumed"), str(tmp_path / "killed" / "checkpoint-4"), None,
                              deadline=240)
    assert all(r and "value" in r for r in resumed), [r and r.get("traceback") for r in resumed]
    expected = full[0]["value"]
    for result in resumed:
        assert all(torch.equal(result["value"][name], expected[name]) for name in expected)


def _train_auto_partition(rank, world_size, folder):
    as_launched(rank, world_size)
    trainer = make_trainer(folder, max_steps=4, petra_partition="auto")
    trainer.train()
    return [len(g) for g in trainer.pipeline.placement.groups], checksum(trainer.model)


def test_auto_partition_measures_once_and_trains_the_same_model(tmp_path):
    """petra_partition="auto": rank 0 measures the stages on a micro-batch of the first items and every rank uses
    its split; results do not depend on the split, so the model is the one process's."""
    results, codes, _ = run_ranks(_train_auto_partition, 2, str(tmp_path / "two"), deadline=240)
    assert codes == [0, 0], [r and r.get("traceback") for r in results]
    (sizes, model), (other_sizes, other_model) = (r["value"] for r in results)
    assert sizes == other_sizes and sum(sizes) == 10 and len(sizes) == 2
    single = make_trainer(tmp_path / "one", max_steps=4)
    single.train()
    assert model == other_model == checksum(single.model)


def _train_with_rank_overrides(rank, world_size, folder, overrides):
    as_launched(rank, world_size)
    trainer = make_trainer(folder, max_steps=2, **overrides.get(rank, {}))
    try:
        trainer.train()
    except ValueError as error:
        return str(error)
    return "trained"


def test_processes_given_different_arguments_are_refused_naming_them(tmp_path):
    """Another seed on one rank once trained silently on images paired with other images' labels (17.5 % instead of
    97.8 %); other learning rates or clipping stalled until the timeout. Every rank now refuses, with one text."""
    results, _, _ = run_ranks(_train_with_rank_overrides, 2, str(tmp_path), {1: {"seed": 1, "max_grad_norm": 1.0}},
                              deadline=120)
    messages = [r["value"] for r in results]
    assert messages[0] == messages[1] and "disagree on max_grad_norm, seed" in messages[0]
    assert "seed: rank 0 0, rank 1 1" in messages[0]
    # where each process writes may differ
    results, _, _ = run_ranks(_train_with_rank_overrides, 2, str(tmp_path / "a"),
                              {1: {"output_dir": str(tmp_path / "b"), "dataloader_num_workers": 1}}, deadline=120)
    assert [r["value"] for r in results] == ["trained", "trained"]


def _stream_with_replicas(rank, world_size, folder):
    from petra_hub.data import load_image_dataset, take
    from tests.training.test_drop_in import Streamed

    as_launched(rank, world_size)
    stream = Streamed(take(load_image_dataset("digits", "train"), 72))  # 9 micro-batches of 8 a pass
    trainer = make_trainer(folder, train=stream, max_steps=10, gradient_accumulation_steps=1, eval_strategy="epoch",
                           petra_data_parallel=2, petra_timeout=20)
    trainer.train()
    return trainer.state.global_step, [log["epoch"] for log in trainer.state.log_history if "eval_loss" in log]


def test_replicas_of_a_stream_take_whole_rounds_of_batches(tmp_path):
    """9 batches over 2 replicas: replica 0 once read 5 a pass and replica 1 4, their epochs ended at different
    steps and their collectives stalled into a gloo timeout. Each now reads 4 (the last, odd batch is dropped)."""
    results, _, _ = run_ranks(_stream_with_replicas, 2, str(tmp_path), deadline=180)
    assert all(result and "value" in result for result in results), [r and r.get("traceback") for r in results]
    # 4 steps an epoch on both replicas: evaluated at the ends of epochs 1 and 2, and where max_steps leaves epoch 3
    assert [result["value"] for result in results] == [(10, [1.0, 2.0, 2.0])] * 2


def test_checkpoints_across_machines_need_one_shared_output_dir(tmp_path):
    """Two "machines" with their own disks: each process writes its stages' files into its own output_dir, and the
    first save failed with a raw gloo error. Refused before the first step, on every rank."""
    overrides = {rank: {"output_dir": str(tmp_path / f"disk-{rank}"), "save_strategy": "steps", "save_steps": 1}
                 for rank in (0, 1)}
    results, _, _ = run_ranks(_train_with_rank_overrides, 2, str(tmp_path), overrides, deadline=120)
    messages = [result["value"] for result in results]
    assert "rank 0 cannot see the files of ranks [1]" in messages[0] and "shared storage" in messages[1]
    assert not list((tmp_path / "disk-0").glob("checkpoint-*"))
