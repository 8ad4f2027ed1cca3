"""The schedule simulator against times worked out by hand for uniform stages, and its events drawn like a trace."""

import pytest

from petra_hub.engine import Placement, StageCost, simulate


def uniform(count=10, forward=1.0, backward=2.0, update=0.0, sent=1000):
    costs = [StageCost(forward, backward, update, sent, sent, 100) for _ in range(count - 1)]
    return costs + [StageCost(0.0, forward + backward, update, 0, sent, 100)]  # the head's fused forward+backward


def test_petra_runs_at_the_pace_of_its_slowest_rank():
    costs = uniform()
    result = simulate("petra", costs, Placement.from_sizes([5, 5]), micro_batches=40)
    assert result.time_per_micro_batch == pytest.approx(15.0)  # 5 stages x (1 + 2) on each rank, every tick
    assert all(u > 0.8 for u in result.utilisation)  # below 1 only by the fill and the drain
    assert result.peak_memory == (500, 500)
    uneven = simulate("petra", costs, Placement.from_sizes([3, 7]), micro_batches=40)
    assert uneven.time_per_micro_batch == pytest.approx(21.0)
    assert uneven.utilisation[0] < 0.5 < uneven.utilisation[1]


def test_naive_model_parallelism_runs_one_micro_batch_at_a_time():
    costs = uniform()
    result = simulate("backprop", costs, Placement.from_sizes([5, 5]), micro_batches=8)
    assert result.time_per_micro_batch == pytest.approx(30.0)  # every forward and backward, one after the other
    assert result.bubble_fraction == pytest.approx(0.5, abs=0.01)


def test_transfers_and_updates_add_their_time():
    costs = uniform(update=0.5, sent=2000)
    result = simulate("petra", costs, Placement.from_sizes([5, 5]), link_bandwidth=1000.0, latency=0.25,
                      micro_batches=40)
    # work and updates, then the header and the payload (2 latencies) and 2000 B at 1000 B/s
    assert result.time_per_micro_batch == pytest.approx(5 * 3.5 + 2 * 0.25 + 2.0)
    grouped = simulate("petra", costs, Placement.from_sizes([5, 5]), accumulation_steps=2, micro_batches=40)
    # k = 2: stage j updates on every other tick, in phase with j; each tick one rank has 3 of its 5 stages updating,
    # and the ranks wait for each other at every exchange
    assert grouped.time_per_micro_batch == pytest.approx(5 * 3 + 3 * 0.5)
    kinds = {e.kind for e in result.events}
    assert kinds == {"forward", "backward", "forward+backward", "update", "exchange"}


def test_the_engines_own_time_is_spent_by_every_stage_every_tick():
    costs = [StageCost(c.forward_s, c.backward_s, c.update_s, c.forward_bytes, c.backward_bytes, c.held_bytes, 0.1)
             for c in uniform()]
    assert simulate("petra", costs, Placement.from_sizes([5, 5]), micro_batches=40).time_per_micro_batch == \
        pytest.approx(15.5)
    synchronous = simulate("backprop", costs, Placement.from_sizes([5, 5]), micro_batches=8)
    assert synchronous.time_per_micro_batch == pytest.approx(30.0 + 19 * 0.5)  # 19 ticks per micro-batch


def test_simulated_events_draw_as_a_timeline(tmp_path):
    from petra_hub.plots import plot_timeline

    result = simulate("petra", uniform(), Placement.from_sizes([5, 5]), micro_batches=12)
    path = plot_timeline(list(result.events), tmp_path / "simulated.png", title="simulated")
    assert path.read_bytes()[:4] == b"\x89PNG"
