"""The multi-process runner against the one-process simulator, and failure handling (gloo, CPU)."""

import os
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from petra_hub.engine import Layout, MemoryOptions, Pipeline, StageMismatchError
from petra_hub.testing.models import random_images, small_model
from petra_hub.testing.ranks import run_ranks

NUM_MICRO_BATCHES = 7


def micro_batches(config, count=NUM_MICRO_BATCHES):
    batches = []
    for index in range(count):
        images = random_images(config, batch=4, dtype=torch.float32, seed=100 + index)
        labels = torch.randint(0, config.num_labels, (4,), generator=torch.Generator().manual_seed(index))
        batches.append((images, labels))
    return batches


def sgd(index, stage):
    return torch.optim.SGD(stage.parameters(), lr=0.05, momentum=0.9, nesterov=True)


def train(mode, accumulation_steps, partition=None, model=None, only_what_it_needs=False, shift_ids=0):
    """Train the reference small RevNet18 for NUM_MICRO_BATCHES micro-batches; returns the pipeline and model.
    `only_what_it_needs`: each rank feeds the inputs only if it runs stage 0 and the targets only if it runs the
    last stage, with every micro-batch's size and sample indices (moved by `shift_ids` on a rank that misreads)."""
    model = model or small_model("revnet18", dtype=torch.float32, seed=0)
    model.train()
    pipeline = Pipeline(
        model.get_stages(),
        lambda logits, labels: F.cross_entropy(logits, labels),
        mode=mode,
        accumulation_steps=accumulation_steps,
        optimizer_factory=sgd,
        timeout=30,
        layout=Layout(partition=partition),
    )
    losses = []
    for index, (images, labels) in enumerate(micro_batches(model.config)):
        if not only_what_it_needs:
            losses += pipeline.step(images, labels)
            continue
        ids = torch.arange(4) + 4 * index + shift_ids
        losses += pipeline.step(images if pipeline.has_first_stage else None,
                                labels if pipeline.has_last_stage else None, batch_size=4, sample_ids=ids)
    losses += pipeline.drain()
    return pipeline, model, losses


def _distributed_training(rank, world_size, mode, accumulation_steps, partition, only_what_it_needs=False):
    pipeline, model, losses = train(mode, accumulation_steps, partition, only_what_it_needs=only_what_it_needs)
    pipeline.gather_stages(dst=0)
    counters = {i: (c.forwards, c.backwards, c.updates) for i, c in pipeline.counters().items()}
    return {
        "state": {k: v.clone() for k, v in model.state_dict().items()} if rank == 0 else None,
        "losses": [(b, float(loss)) for b, loss in losses],
        "counters": counters,
    }


CASES = [
    pytest.param(2, "petra", 2, None, False, id="2ranks-petra-k2"),
    pytest.param(3, "petra", 1, [2, 5, 3], False, id="3ranks-petra-grouped"),
    pytest.param(2, "delayed", 3, [6, 4], False, id="2ranks-delayed-k3"),
    pytest.param(5, "petra", 1, [2, 2, 2, 2, 2], False, id="5ranks-petra"),
    pytest.param(10, "petra", 2, [1] * 10, False, id="10ranks-petra-k2-one-stage-each"),
]


@pytest.mark.parametrize("world_size,mode,k,partition,only_what_it_needs", [
    *CASES, pytest.param(3, "petra", 1, [2, 5, 3], True, id="3ranks-petra-each-rank-fed-only-what-it-needs")])
def test_multiprocess_is_bit_identical_to_one_process(tmp_path, world_size, mode, k, partition, only_what_it_needs):
    """Also where the first rank alone is given the images, the last alone the labels, and the middle rank only
    each micro-batch's size and sample indices."""
    torch.set_num_threads(1)
    _, reference, reference_losses = train(mode, k)
    results, codes, _started = run_ranks(
        _distributed_training, world_size, mode, k, partition, only_what_it_needs, out_dir=tmp_path, deadline=150
    )
    for rank, result in enumerate(results):
        assert result is not None and "error" not in result, (rank, result and result.get("traceback"))
    assert codes == [0] * world_size
    state = results[0]["value"]["state"]
    expected = reference.state_dict()
    assert state.keys() == expected.keys()
    for name, value in expected.items():
        assert torch.equal(state[name], value), name
    losses = [loss for result in results for loss in result["value"]["losses"]]
    assert losses == [(b, float(loss)) for b, loss in reference_losses]
    counters = {}
    for result in results:
        counters.update(result["value"]["counters"])
    j = len(reference.get_stages())
    updates = -(-NUM_MICRO_BATCHES // k)
    assert counters == {i: (NUM_MICRO_BATCHES, NUM_MICRO_BATCHES, updates) for i in range(j)}


class _Saboteur(torch.nn.Module):
    """Wraps a stage; at its `after`-th forward the process dies (or stalls)."""

    reversible = False

    def __init__(self, stage, after, action, clock_file):
        super().__init__()
        self.stage, self.after, self.action, self.calls, self.clock_file = stage, after, action, 0, clock_file

    def forward(self, x):
        self.calls += 1
        if self.calls > self.after:
            with open(self.clock_file, "w") as handle:
                handle.write(repr(time.time()))
            if self.action == "die":
                os._exit(3)
            time.sleep(600)
        return self.stage(x)


def _training_with_failure(rank, world_size, victim_stage, action, timeout, clock_file):
    model = small_model("revnet18", dtype=torch.float32, seed=0)
    model.train()
    stages = model.get_stages()
    # The handshake runs one dry forward; the failure happens a few ticks into training.
    stages[victim_stage] = _Saboteur(stages[victim_stage], after=4, action=action, clock_file=clock_file)
    pipeline = Pipeline(
        stages, lambda o, t: F.cross_entropy(o, t), mode="petra", optimizer_factory=sgd, timeout=timeout
    )
    for images, labels in micro_batches(model.config, count=40):
        pipeline.step(images, labels)
    pipeline.drain()


@pytest.mark.parametrize("action", ["die", "stall"])
def test_dead_or_stalled_peer_becomes_a_clear_error_on_every_rank(tmp_path, action):
    timeout = 4.0
    clock_file = str(tmp_path / "failed_at")
    results, codes, _ = run_ranks(
        _training_with_failure, 3, 9, action, timeout, clock_file, out_dir=tmp_path, deadline=90, expendable=(2,)
    )
    # Stage 9 (the head) lives on rank 2 of 3 (stages 0-3, 4-6, 7-9).
    assert results[2] is None  # the victim never reports
    for rank in (0, 1):
        assert results[rank] is not None, f"rank {rank} hung"
        error = results[rank]["error"]
        assert error.startswith("PeerFailureError"), results[rank]["traceback"]
        assert "rank" in error and "stage" in error
    assert "rank 2 (stages 7-9)" in results[1]["error"]
    assert codes[0] == 0 and codes[1] == 0
    # Each hop detects the failure within one timeout (a death is usually seen at once: the connection closes).
    failed_at = float(open(clock_file).read())
    assert max(results[rank]["ended"] for rank in (0, 1)) - failed_at < 3 * timeout + 5


def _data_parallel_training(rank, world_size):
    """Two pipeline replicas of two ranks each (W = P x D = 2 x 2)."""
    import torch.distributed as dist

    results = {}
    for name, shift in (("same_data", 0), ("own_data", rank // 2)):
        model = small_model("revnet18", dtype=torch.float32, seed=0)
        model.train()
        pipeline = Pipeline(model.get_stages(), lambda o, t: F.cross_entropy(o, t), mode="petra",
                            accumulation_steps=2, optimizer_factory=sgd, timeout=30,
                            layout=Layout(data_parallel_size=2))
        for images, labels in micro_batches(model.config, count=NUM_MICRO_BATCHES + shift)[shift:]:
            pipeline.step(images, labels)
        pipeline.drain()
        pipeline.gather_stages(dst=0)
        results[name] = {k: v.clone() for k, v in model.state_dict().items()} if pipeline.rank == 0 else None
        results[name + "_replica"] = pipeline.replica
    dist.barrier()
    return results


def test_data_parallel_replicas_average_their_gradients(tmp_path):
    torch.set_num_threads(1)
    _, reference, _ = train("petra", 2)
    results, codes, _ = run_ranks(_data_parallel_training, 4, out_dir=tmp_path, deadline=200)
    for rank, result in enumerate(results):
        assert result is not None and "error" not in result, (rank, result and result.get("traceback"))
    first, second = results[0]["value"], results[2]["value"]
    assert (first["same_data_replica"], second["same_data_replica"]) == (0, 1)
    # Identical micro-batches on both replicas: averaging identical gradients changes nothing.
    for name, value in reference.state_dict().items():
        assert torch.equal(first["same_data"][name], value), name
        assert torch.equal(second["same_data"][name], value), name
    # Different micro-batches: the replicas stay identical to each other (parameters by gradient averaging, running
    # statistics averaged at the drain) and differ from one replica alone.
    assert all(torch.equal(first["own_data"][k], second["own_data"][k]) for k in first["own_data"])
    weight = "revnet.embedder.layers.0.weight"
    assert not torch.equal(first["own_data"][weight], reference.state_dict()[weight])


class _SlowOnReplica(torch.nn.Module):
    """A linear stage that is slow on the processes of replica `replica` only (as noisy timings or unequal machines
    would make it)."""

    def __init__(self, replica):
        super().__init__()
        self.linear, self.replica = torch.nn.Linear(8, 8), replica

    def forward(self, x):
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_rank() // 2 == self.replica:
            time.sleep(0.03)
        return torch.tanh(self.linear(x))


def _replicas_partitioned(rank, world_size):
    from petra_hub.engine import StageMismatchError

    torch.manual_seed(0)
    stages = [_SlowOnReplica(0), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), _SlowOnReplica(1),
              torch.nn.Linear(8, 3)]
    batch = (torch.randn(4, 8), torch.randint(0, 3, (4,)))
    pipeline = Pipeline(stages, F.cross_entropy, profile_batch=batch,
                        optimizer_factory=lambda i, s: torch.optim.SGD(s.parameters(), lr=0.1), timeout=20,
                        layout=Layout(partition="auto", data_parallel_size=2))
    for _ in range(6):
        pipeline.step(*batch)
    pipeline.drain()
    trained = {index: [p.detach().clone() for p in stages[index].parameters()] for index in pipeline.local}
    # partitions given by hand that differ between replicas: refused at the start-up handshake on every rank
    mismatched = Pipeline(stages, F.cross_entropy, timeout=20,
                          layout=Layout(partition=[1, 4] if rank < 2 else [2, 3], data_parallel_size=2))
    try:
        mismatched.step(*batch)
        refused = None
    except StageMismatchError as error:
        refused = str(error)
    return [len(group) for group in pipeline.placement.groups], trained, refused, pipeline.describe_rank(pipeline.rank)


def test_data_parallel_replicas_share_one_automatic_partition(tmp_path):
    """Replica 0 finds stage 0 slow, replica 1 stage 3: profiled on their own, they picked different splits and gloo
    aborted at the first gradient average. One profile (global rank 0, replica 0's pipeline rank 0) decides for
    every replica, and the settings check spans the replicas."""
    torch.set_num_threads(1)
    results, codes, _ = run_ranks(_replicas_partitioned, 4, out_dir=tmp_path, deadline=150, pg_timeout=30)
    for rank, result in enumerate(results):
        assert result is not None and "error" not in result, (rank, result and result.get("traceback"))
    assert codes == [0] * 4
    splits = [result["value"][0] for result in results]
    assert splits == [[1, 4]] * 4  # what replica 0 measured: its slow stage 0 on a rank of its own
    first, second = results[0]["value"][1], results[2]["value"][1]  # the same stages in both replicas
    assert first.keys() == second.keys() == {0}
    assert all(torch.equal(a, b) for a, b in zip(first[0], second[0]))
    assert all("ranks disagree" in (result["value"][2] or "not refused") for result in results)
    # errors name a process by its global rank, the launcher's, not by its position in its replica's pipeline
    assert [result["value"][3] for result in results] == [
        "rank 0 (stage 0)", "rank 1 (stages 1-4)", "rank 2 (pipeline rank 0, stage 0)",
        "rank 3 (pipeline rank 1, stages 1-4)"]


def _kept_on_rank_0_only(rank, world_size):
    torch.manual_seed(0)
    stages = [nn.Sequential(nn.Linear(4, 8), nn.Tanh()), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 2)]
    pipeline = Pipeline(stages, nn.functional.cross_entropy, timeout=20,
                        memory=MemoryOptions(keep_graphs=[0] if rank == 0 else None))
    try:
        pipeline.step(torch.randn(4, 4), torch.tensor([0, 1, 0, 1]))
    except StageMismatchError as error:
        return str(error)
    return "ran"


def test_ranks_that_keep_other_graphs_are_refused_at_start():
    """Kept graphs set the size of every message: ranks that disagreed once posted payloads of the wrong size (gloo
    aborted the process, or the tail of a buffer went unwritten and the losses turned NaN)."""
    results, _, _ = run_ranks(_kept_on_rank_0_only, 2, deadline=60)
    messages = [result["value"] for result in results]
    assert messages[0] == messages[1] == "ranks disagree on kept_graphs (rank 0: [0], rank 1: [])"


def _misread_sample_ids(rank, world_size):
    train("petra", 1, [5, 5], only_what_it_needs=True, shift_ids=rank)


def test_ranks_that_feed_other_samples_are_stopped_by_their_sample_indices(tmp_path):
    """Without the labels on every rank, the sample indices are what neighbours compare: a rank that reads other
    samples (another order, another split) is refused at the first micro-batch, on both ranks."""
    results, _, _ = run_ranks(_misread_sample_ids, 2, out_dir=tmp_path, deadline=60)
    for result in results:
        assert result is not None and "error" in result
        assert "micro-batch" in result["error"] and "same" in result["error"], result["error"]
