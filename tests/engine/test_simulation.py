"""The schedule simulator against times worked out by hand for uniform stages, and its events drawn like a trace."""

import pytest

from petra_hub.analysis import simulate, simulate_1f1b
from petra_hub.engine import Placement, StageCost


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


def test_payloads_move_once_both_ranks_of_a_link_are_done_so_the_slower_rank_pays_the_transfer_too():
    costs = uniform(sent=2000)
    uneven = simulate("petra", costs, Placement.from_sizes([3, 7]), link_bandwidth=1000.0, latency=0.25,
                      micro_batches=40)
    # rank 1 (7 stages, 21 s a tick) finishes last; rank 0 has posted its payloads long before, but they only move
    # once rank 1 has posted its own: 2 latencies and 2000 B at 1000 B/s more, not hidden behind rank 1's work
    assert uneven.time_per_micro_batch == pytest.approx(21.0 + 2 * 0.25 + 2.0)
    overlapped = simulate("petra", costs, Placement.from_sizes([3, 7]), link_bandwidth=1000.0, latency=0.25,
                          micro_batches=40, overlap_transfers=True)
    assert overlapped.time_per_micro_batch == pytest.approx(21.0)  # rank 0's payload leaves at its end: hidden
    # naive model parallelism: the idle rank's header of each tick waits at the working rank before it is done, so
    # only the two ticks whose work crosses the link (the forward and the backward) pay a transfer
    synchronous = simulate("backprop", costs, Placement.from_sizes([5, 5]), link_bandwidth=1000.0, latency=0.25,
                           micro_batches=8)
    assert synchronous.time_per_micro_batch == pytest.approx(30.0 + 2 * (2 * 0.25 + 2.0))



def test_a_half_duplex_link_carries_the_two_directions_one_after_the_other():
    costs = [StageCost(1.0, 2.0, 0.0, 3000, 1000, 100) for _ in range(9)] + [StageCost(0.0, 3.0, 0.0, 0, 1000, 100)]
    link = {"link_bandwidth": 1000.0, "latency": 0.25, "micro_batches": 40}
    full = simulate("petra", costs, Placement.from_sizes([5, 5]), **link)
    half = simulate("petra", costs, Placement.from_sizes([5, 5]), duplex=False, **link)
    # each tick, after the headers, 3000 B go right and 1000 B left: at once, the larger direction; one after the
    # other, each payload with its latency
    assert full.time_per_micro_batch == pytest.approx(15.0 + 2 * 0.25 + 3.0)
    assert half.time_per_micro_batch == pytest.approx(15.0 + 3 * 0.25 + 4.0)
    # naive model parallelism sends one way per tick: the same on both links
    synchronous = [simulate("backprop", costs, Placement.from_sizes([5, 5]), duplex=duplex,
                            **link | {"micro_batches": 8}) for duplex in (True, False)]
    assert synchronous[0].time_per_micro_batch == synchronous[1].time_per_micro_batch


def test_the_engines_own_time_is_spent_by_every_stage_every_tick():
    costs = [StageCost(c.forward_s, c.backward_s, c.update_s, c.forward_bytes, c.backward_bytes, c.held_bytes, 0.1)
             for c in uniform()]
    assert simulate("petra", costs, Placement.from_sizes([5, 5]), micro_batches=40).time_per_micro_batch == \
        pytest.approx(15.5)
    synchronous = simulate("backprop", costs, Placement.from_sizes([5, 5]), micro_batches=8)
    assert synchronous.time_per_micro_batch == pytest.approx(30.0 + 19 * 0.5)  # 19 ticks per micro-batch


def test_simulated_events_draw_as_a_timeline(tmp_path):
    from petra_hub.plots import plot_timeline, plot_timelines

    result = simulate("petra", uniform(), Placement.from_sizes([5, 5]), micro_batches=12)
    path = plot_timeline(list(result.events), tmp_path / "simulated.png", title="simulated")
    assert path.read_bytes()[:4] == b"\x89PNG"
    rival = simulate_1f1b(even(), Placement.from_sizes([5, 5]), 4, steps=2)
    assert len(rival.events) == 2 * (2 * 4 + 1) * 2  # per rank and step: m forwards, m backwards, an update
    path = plot_timelines({"PETRA": list(result.events), "1F1B": list(rival.events)}, tmp_path / "both.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


def even(count=10, forward=1.0, backward=2.0, held=300, params=100, sent=1000, graph=0):
    """Stages whose last one has a forward of its own too, so that every rank of an even split costs the same."""
    return [StageCost(forward, backward, 0.0, sent, sent, held, parameter_bytes=params, graph_bytes=graph)
            for _ in range(count)]


def test_1f1b_takes_the_textbook_time_with_its_bubble():
    # W ranks, m micro-batches, a forward F and a backward B per rank: (m + W - 1)(F + B) per step
    for ranks, m in ((2, 4), (2, 18), (5, 10)):
        result = simulate_1f1b(even(), Placement.balanced(10, ranks), m)
        per_rank = 10 // ranks * 3.0
        assert result.time_per_micro_batch == pytest.approx((m + ranks - 1) * per_rank / m)
        assert result.bubble_fraction == pytest.approx((ranks - 1) / (m + ranks - 1), abs=1e-9)
    checkpointed = simulate_1f1b(even(), Placement.balanced(10, 2), 4, checkpointing="all")
    assert checkpointed.time_per_micro_batch == pytest.approx(5 * 20.0 / 4)  # the backward runs the forward again
    but_last = simulate_1f1b(even(), Placement.balanced(10, 2), 4, checkpointing="but_last")
    assert 15.0 * 5 / 4 < but_last.time_per_micro_batch < 5 * 20.0 / 4


def test_1f1b_holds_one_micro_batch_per_rank_still_ahead_of_it():
    costs = even(sent=50, graph=300)
    result = simulate_1f1b(costs, Placement.balanced(10, 5), 8)
    # rank r keeps min(m, W - r) graphs of its 2-stage chunk (2 x 300 B, the 50 B passed inside it held once) plus
    # its 2 x 100 B of parameters
    assert result.peak_memory == tuple(200 + (5 - r) * 550 for r in range(5))
    assert simulate_1f1b(costs, Placement.balanced(10, 5), 2).peak_memory[0] == 200 + 2 * 550
    # checkpointed: the chunk's input and output (50 B each) per micro-batch, and one graph while it recomputes
    assert simulate_1f1b(costs, Placement.balanced(10, 5), 8, checkpointing="all").peak_memory[1] == 200 + 4 * 100 + 550


def test_petra_holds_its_stages_and_the_graph_its_largest_operation_builds():
    costs = [StageCost(1.0, 2.0, 0.0, 10, 10, 100, graph_bytes=40 + i) for i in range(10)]
    assert simulate("petra", costs, Placement.from_sizes([5, 5]), micro_batches=40).peak_memory == (544, 549)


def test_1f1b_pays_a_transfer_on_every_hop_of_its_critical_path():
    free = simulate_1f1b(even(), Placement.balanced(10, 2), 2)
    slow = simulate_1f1b(even(), Placement.balanced(10, 2), 2, link_bandwidth=1000.0, latency=0.5)
    assert free.time_per_micro_batch == pytest.approx(3 * 15.0 / 2)
    # a step's critical path: rank 0's first forward, the hop (0.5 s + 1000 B at 1000 B/s), rank 1's forward and
    # backward of both micro-batches, the hop back, rank 0's last backward: 5 + 1.5 + 30 + 1.5 + 10
    assert slow.time_per_micro_batch == pytest.approx(48.0 / 2)
    kinds = {e.kind for e in slow.events}
    assert kinds == {"forward", "backward", "update"}
    with pytest.raises(ValueError, match="checkpointing"):
        simulate_1f1b(even(), Placement.balanced(10, 2), 2, checkpointing="some")
