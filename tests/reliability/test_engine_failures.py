"""The engine fails loudly and consistently: ranks fed differently, exceptions inside a step, stalled peers.

The multi-process tests use tiny linear stages (no model import), so that each costs little more than the start of
its processes.
"""

import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from petra_hub.engine import Pipeline, PipelineError
from petra_hub.testing.ranks import run_ranks


def linear_stages(count=4, width=6, seed=0):
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(count - 1)] + [nn.Linear(width, 3)]


def batch(size, seed, width=6):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(size, width, generator=generator), torch.randint(0, 3, (size,), generator=generator)


def pipeline(stages=None, loss=F.cross_entropy, timeout=10.0, **kwargs):
    return Pipeline(stages or linear_stages(), loss, mode="petra", timeout=timeout,
                    optimizer_factory=lambda i, stage: torch.optim.SGD(stage.parameters(), lr=0.1), **kwargs)


# -- ranks fed differently (2 processes, one scenario after the other in the same process group) -------------------
def _sizes(rank, own):  # micro-batch 2 has `own` samples on this rank, the others 4 everywhere
    run = pipeline()
    for index in range(4):
        run.step(*batch(own if index == 2 else 4, index))
    run.drain()


def _counts(rank):  # rank 0 is fed 5 micro-batches, rank 1 six
    run = pipeline()
    for index in range(5 + rank):
        run.step(*batch(4, index))
    run.drain()


def _one_sided_drain(rank):  # rank 0 drains before saving, rank 1 does not
    run = pipeline()
    for index in range(3):
        run.step(*batch(4, index))
    if rank == 0:
        run.drain()
    run.gather_stages(dst=0)


def _one_sided_end_group(rank):  # rank 0 closes an accumulation group early, rank 1 does not
    run = pipeline(accumulation_steps=3)
    for index in range(4):
        run.step(*batch(4, index))
        if index == 1 and rank == 0:
            run.end_group()
    run.drain()


def _peer_left(rank):  # rank 1 leaves (its process ends) while rank 0 gathers the stages onto itself
    run = pipeline(timeout=5.0)
    run.step(*batch(4, 0))
    run.drain()
    if rank == 0:
        run.gather_stages(dst=0)


def _own_order(rank):  # each rank's loader shuffles alike only from micro-batch 2 on
    run = pipeline()
    for index in range(4):
        run.step(*batch(4, index if index >= 2 or rank == 0 else 1 - index))
    run.drain()


def _own_augmentation(rank):  # the same targets, the inputs augmented differently: only rank 0 reads them
    run = pipeline()
    for index in range(4):
        inputs, targets = batch(4, index)
        run.step(inputs + 0.1 * rank * torch.randn_like(inputs), targets)
    run.drain()


SCENARIOS = {
    "own_order": _own_order,
    "own_augmentation": _own_augmentation,
    "longer": lambda rank: _sizes(rank, 4 if rank == 0 else 3),  # rank 0 would send more than rank 1 expects
    "shorter": lambda rank: _sizes(rank, 3 if rank == 0 else 4),  # ... or less
    "counts": _counts,
    "one_sided_drain": _one_sided_drain,
    "one_sided_end_group": _one_sided_end_group,
    "peer_left": _peer_left,
}


def _fed_differently(rank, world_size, names):
    outcomes = {}
    for name in names:
        try:
            SCENARIOS[name](rank)
            outcomes[name] = None
        except Exception as error:
            outcomes[name] = f"{type(error).__name__}: {error}"
    return outcomes


def run_scenarios(tmp_path, names):
    results, codes, _ = run_ranks(_fed_differently, 2, names, out_dir=tmp_path, deadline=60)
    for rank, result in enumerate(results):
        assert result is not None, f"rank {rank} died (gloo aborts on a longer message than expected)"
        assert "error" not in result, result.get("traceback")
    assert codes == [0, 0]
    return results[0]["value"], results[1]["value"]


def test_micro_batches_of_different_sizes_are_a_stage_mismatch_on_both_ranks(tmp_path):
    first, second = run_scenarios(tmp_path, ["longer", "shorter"])
    assert first == second  # the same error on both ranks
    assert first["longer"] == (
        "StageMismatchError: micro-batch 2 has 4 samples on rank 0 (stages 0-1) but 3 samples on rank 1 (stages 2-3): "
        "every rank must be fed the same micro-batches, of the same size"
    )
    assert first["shorter"].startswith("StageMismatchError: micro-batch 2 has 3 samples on rank 0 (stages 0-1) "
                                       "but 4 samples on rank 1 (stages 2-3)")


def test_ranks_fed_in_their_own_order_are_refused_at_the_first_micro_batch(tmp_path):
    """Data loaders shuffling in their own order on each rank paired rank 0's images with other images' labels and
    trained on noise without an error (15% instead of 81% on digits); the targets' digest in the headers stops it at
    once. Inputs may differ (augmentations drawn per rank): only the first stage reads them."""
    first, second = run_scenarios(tmp_path, ["own_order", "own_augmentation"])
    assert first == second
    assert first["own_order"] == (
        "StageMismatchError: micro-batch 0 has other samples (sample indices, or targets where ranks feed no "
        "indices) on rank 0 (stages 0-1) than on rank 1 (stages 2-3): every rank must be fed the same micro-batches "
        "in the same order (seed the data order alike on every rank, e.g. "
        "DataLoader(..., generator=torch.Generator().manual_seed(0)))")
    assert first["own_augmentation"] is None


def test_ranks_out_of_step_say_what_each_was_doing(tmp_path):
    names = ["counts", "one_sided_drain", "one_sided_end_group", "peer_left"]
    first, second = run_scenarios(tmp_path, names)
    for name in names[:-1]:
        assert first[name] is not None and first[name] == second[name], name  # the same error on both ranks
        assert first[name].startswith(
            "PeerFailureError: rank 0 (stages 0-1) and rank 1 (stages 2-3) are out of step: "
        ), first[name]
        assert first[name].endswith("every rank must be fed the same micro-batches and call end_group, drain, "
                                    "infer and gather_stages at the same points")
    counts = first["counts"]
    assert "the first runs a drain tick (tick 5, 5 micro-batches fed" in counts
    assert "the second runs a step tick (tick 5, 6 micro-batches fed" in counts
    drained = first["one_sided_drain"]
    assert "runs a drain tick (tick 3" in drained and "runs gather_stages(dst=0) (after 3 ticks" in drained
    grouped = first["one_sided_end_group"]
    assert "the first runs a step tick (tick 2, 3 micro-batches fed, 1 in the open accumulation group" in grouped
    assert "the second runs a step tick (tick 2, 3 micro-batches fed, 0 in the open accumulation group" in grouped
    # gather_stages with a peer gone: a PeerFailureError naming it, not gloo's bare RuntimeError.
    left = first["peer_left"]
    assert left.startswith("PeerFailureError: rank 0 (stages 0-1) could not"), left
    assert "rank 1 (stages 2-3)" in left and "the peer process died, stalled or failed" in left
    assert second["peer_left"] is None


def _own_bug_in_the_handshake(rank, world_size):
    """Rank 1's own dry run fails with an error of its own (not a stage mismatch, not a collective)."""
    if rank == 1:
        import petra_hub.engine.handshake as handshake

        def broken(*args, **kwargs):
            raise KeyError("a bug on rank 1")

        handshake.dry_run = broken
    try:
        pipeline(timeout=5.0).step(*batch(4, 0))
    except Exception as error:
        return f"{type(error).__name__}: {error}"


def test_a_ranks_own_error_in_the_handshake_is_not_blamed_on_a_peer(tmp_path):
    """Only the handshake's collectives are taken for a peer's failure: before, any exception in it became 'a peer
    process died', on the rank that raised it too."""
    results, _, _ = run_ranks(_own_bug_in_the_handshake, 2, out_dir=tmp_path, deadline=60)
    assert results[1]["value"] == "KeyError: 'a bug on rank 1'", results[1]
    assert results[0]["value"].startswith("PeerFailureError: rank 0 (stages 0-1) could not complete the start-up "
                                          "handshake: a peer process died"), results[0]


# -- an exception inside step ----------------------------------------------------------------------------------------
def test_an_exception_inside_step_breaks_the_pipeline_with_a_clear_error():
    calls = []

    def exploding_loss(outputs, targets):
        calls.append(len(calls))
        if len(calls) == 4:
            raise ValueError("the loss exploded")
        return F.cross_entropy(outputs, targets)

    run = pipeline(loss=exploding_loss)
    with pytest.raises(ValueError, match="the loss exploded"):
        for index in range(10):
            run.step(*batch(4, index))
    # The head (stage 3 of 4) runs micro-batch b at tick b + 3: the fourth loss is micro-batch 3's, at tick 6.
    operations = {
        "step": lambda: run.step(*batch(4, 99)),
        "drain": run.drain,
        "infer": lambda: run.infer(batch(4, 0)[0]),
        "gather_stages": run.gather_stages,
        "state_dict": run.state_dict,
        "end_group": run.end_group,
    }
    for name, operation in operations.items():
        with pytest.raises(PipelineError, match=r"broken since tick 6: ValueError: the loss exploded") as raised:
            operation()
        assert isinstance(raised.value.__cause__, ValueError), name
    assert len(run.counters()) == 4 and run.last_lr() == 0.1  # what only reads state still answers

    # A micro-batch refused before anything ran (wrong shape) leaves the pipeline usable.
    run = pipeline()
    run.step(*batch(4, 0))
    with pytest.raises(ValueError, match="same per-sample shape"):
        run.step(torch.zeros(4, 5), torch.zeros(4, dtype=torch.long))
    run.step(*batch(4, 1))
    assert sorted(b for b, _ in run.drain()) == [0, 1]


# -- the timeout bounds each exchange in total (3 processes) --------------------------------------------------------
class _Sleeper(nn.Module):
    """Wraps a stage; its `at`-th call (the handshake's dry run is the first) sleeps `seconds` first."""

    reversible = False

    def __init__(self, stage, at, seconds, clock_file=None):
        super().__init__()
        self.stage, self.at, self.seconds, self.clock_file, self.calls = stage, at, seconds, clock_file, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            if self.clock_file:
                with open(self.clock_file, "w") as handle:
                    handle.write(repr(time.time()))
            time.sleep(self.seconds)
        return self.stage(x)


def _slow_then_stalled_neighbours(rank, world_size, timeout, clock_file):
    stages = linear_stages(count=3)
    # At tick 5 rank 1 waits in one exchange for both neighbours: rank 0 is 1.8 s late (it sleeps before its forward
    # of micro-batch 5), rank 2 never comes (its forward of micro-batch 3). Stage 0's calls: the dry run, one
    # forward per tick, and from tick 4 on the recomputation of micro-batch t - 4 too: call 8 is tick 5's forward.
    # The head's calls: the dry run, then one per tick from tick 2: call 5 is tick 5's.
    stages[0] = _Sleeper(stages[0], at=8, seconds=1.8)
    stages[2] = _Sleeper(stages[2], at=5, seconds=600, clock_file=clock_file)
    run = pipeline(stages, timeout=timeout)
    for index in range(12):
        run.step(*batch(4, index))
    run.drain()


def test_a_stalled_peer_is_reported_within_the_timeout_in_total(tmp_path):
    timeout = 2.5
    clock_file = str(tmp_path / "stalled_at")
    results, _, _ = run_ranks(
        _slow_then_stalled_neighbours, 3, timeout, clock_file, out_dir=tmp_path, deadline=60, expendable=(2,)
    )
    assert results[1] is not None, "rank 1 hung"
    error = results[1]["error"]
    assert error.startswith("PeerFailureError: rank 1 (stage 1) could not receive"), error
    assert "from rank 2 (stage 2) at tick 5 within 2.5s: the peer process died, stalled or failed" in error
    stalled_at = float(open(clock_file).read())
    # One deadline for the whole exchange: the 1.8 s spent waiting for rank 0 count against it (waiting the full
    # timeout for each neighbour in turn took 1.8 + 2.5 s).
    waited = results[1]["ended"] - stalled_at
    assert timeout - 0.5 < waited < timeout + 1.2, waited
