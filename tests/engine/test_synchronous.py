"""torch's multi-chunk schedules replayed from costs: their orders taken from torch, their times and memory worked
out by hand for uniform chunks (the 1F1B cases are in test_simulation.py)."""

from collections import Counter
from dataclasses import replace

import pytest

from petra_hub.analysis import schedule_order, simulate_schedule
from petra_hub.engine import Placement, StageCost

SPLIT = ("ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")


def uniform(count, forward=1.0, backward=2.0, input_share=0.5, graph=300, sent=50):
    """Stages of equal cost: a chunk of two holds 2 x 300 B of graph less the 50 B passed inside it."""
    return [StageCost(forward, backward, 0.0, sent, sent, 300, parameter_bytes=100, graph_bytes=graph,
                      input_backward_s=None if input_share is None else input_share * backward)
            for _ in range(count)]  # fmt: skip


def chunked(schedule, ranks, m, checkpointing="none", **options):
    """2W chunks of 2 stages each (W for Schedule1F1B) on `ranks` ranks."""
    chunks = ranks if schedule == "Schedule1F1B" else 2 * ranks
    costs = uniform(2 * chunks, **options)
    return simulate_schedule(schedule, costs, Placement.balanced(len(costs), chunks), ranks, m, checkpointing)


@pytest.mark.parametrize("schedule", ["ScheduleInterleaved1F1B", *SPLIT])
def test_torchs_order_runs_every_forward_and_backward_once(schedule):
    orders, owners = schedule_order(schedule, 4, 8, 8)
    assert sorted(Counter(owners).values()) == [2, 2, 2, 2]
    ops = Counter((op.kind, op.chunk, op.micro_batch) for order in orders for entry in order for op in entry)
    assert all(count == 1 for count in ops.values())
    for chunk in range(8):
        for i in range(8):
            assert ("F", chunk, i) in ops
            assert ("B", chunk, i) in ops or {("I", chunk, i), ("W", chunk, i)} <= ops.keys()
    for rank, order in enumerate(orders):
        assert all(owners[op.chunk] == rank for entry in order for op in entry)
    if schedule == "ScheduleZBVZeroBubble":
        assert owners == [0, 1, 2, 3, 3, 2, 1, 0]  # the V
    if schedule == "ScheduleDualPipeV":
        assert any(len(entry) == 2 for order in orders for entry in order)  # a forward overlapped with a backward


def test_interleaved_1f1b_takes_the_textbook_time():
    # v = 2 chunks per rank, each F = 2 and B = 4: (v m + W - 1)(F + B) per step
    for ranks, m in ((2, 4), (4, 8), (4, 16)):
        result = chunked("ScheduleInterleaved1F1B", ranks, m)
        assert result.time_per_micro_batch == pytest.approx((2 * m + ranks - 1) * 6.0 / m)
        assert result.bubble_fraction == pytest.approx((ranks - 1) / (2 * m + ranks - 1), rel=0.05)


def test_zbv_has_no_bubble_when_forward_and_both_backward_halves_cost_the_same():
    # the zero-bubble V schedule's claim: with F = I = W and m >= 2W the ranks never wait (after the first step)
    for ranks, m in ((2, 4), (4, 8), (4, 16)):
        assert chunked("ScheduleZBVZeroBubble", ranks, m).time_per_micro_batch == pytest.approx(12.0)
    assert chunked("ScheduleZBVZeroBubble", 4, 4).time_per_micro_batch > 12.0  # too few micro-batches to fill
    # every other schedule leaves a bubble at m = 2W
    for schedule in ("ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble", "ScheduleDualPipeV"):
        assert chunked(schedule, 4, 8).time_per_micro_batch > 12.0


def test_a_split_backward_keeps_the_recomputed_graph_from_input_to_weight_gradient():
    # ZBV on 2 ranks, m = 4, checkpointed: rank 1 (chunks 1 and 2) ends its step with I, I, I then W, W, W, so it
    # holds 3 recomputed graphs (550 B) with their micro-batches' inputs and outputs (100 B) on top of its parameters
    result = chunked("ScheduleZBVZeroBubble", 2, 4, checkpointing="all")
    assert result.peak_memory[1] == 400 + 3 * (550 + 100)
    # not checkpointed, the graphs of the micro-batches in flight, which the same order holds at most 4 at once
    assert chunked("ScheduleZBVZeroBubble", 2, 4).peak_memory[1] == 400 + 4 * 550


def test_the_split_halves_add_up_to_the_backward_and_the_first_chunk_skips_its_input_half():
    result = chunked("ScheduleZBVZeroBubble", 2, 4, input_share=0.25)
    seconds = Counter()
    for event in result.events:
        seconds[event.kind, event.stage == 0] += event.end - event.start
    steps, m = 4, 4
    # chunks 1-3: I = 0.25 x 4 s, W = 3 s per micro-batch; chunk 0 (stage 0): I skipped, W the whole 4 s
    assert seconds["backward", False] == pytest.approx(steps * m * 3 * 1.0)
    assert seconds["backward (weights)", False] == pytest.approx(steps * m * 3 * 3.0)
    assert seconds["backward (weights)", True] == pytest.approx(steps * m * 4.0)
    assert seconds["backward", True] == 0.0
    # a measured weight half (torch's split walks the graph twice: I + W = 1.5 x B) replaces the rest of B
    costs = [replace(c, weight_backward_s=1.0 * c.backward_s) for c in uniform(8, input_share=0.5)]
    measured = simulate_schedule("ScheduleZBVZeroBubble", costs, Placement.balanced(8, 4), 2, 4)
    weights = sum(e.end - e.start for e in measured.events if e.kind == "backward (weights)" and e.stage > 0)
    assert weights == pytest.approx(steps * m * 3 * 4.0)
    assert measured.time_per_micro_batch > chunked("ScheduleZBVZeroBubble", 2, 4, input_share=0.5).time_per_micro_batch


def test_settings_torch_refuses_and_costs_without_the_split_are_refused():
    with pytest.raises(ValueError, match="DualPipeV requires at least as many microbatches"):
        chunked("ScheduleDualPipeV", 4, 4)
    with pytest.raises(ValueError, match="input_backward_s"):
        chunked("ScheduleZBVZeroBubble", 2, 4, input_share=None)
    assert chunked("ScheduleInterleaved1F1B", 2, 4, input_share=None).time_per_micro_batch > 0  # no split needed
    with pytest.raises(ValueError, match="one chunk per rank"):
        simulate_schedule("Schedule1F1B", uniform(8), Placement.balanced(8, 4), 2, 4)
    with pytest.raises(ValueError, match="unknown schedule"):
        simulate_schedule("ScheduleNothing", uniform(8), Placement.balanced(8, 4), 2, 4)


def test_transfers_that_occupy_the_ranks_cost_time_only_where_a_rank_was_busy():
    # 1F1B, 2 one-stage chunks, F = 1, B = 2, 50 B at 100 B/s: each message takes 0.5 s. Worked by hand, m = 2:
    # overlapped, a step ends with rank 0's last backward at 10; when the ranks copy the messages themselves, rank 1
    # receives its second forward's input (0.5) after sending the first backward's gradient (0.5) while rank 0
    # sends each forward's output (0.5 each) and waits: its last backward ends at 11.
    costs, chunks = uniform(2), Placement.balanced(2, 2)
    overlapped = simulate_schedule("Schedule1F1B", costs, chunks, 2, 2, link_bandwidth=100.0)
    copied = simulate_schedule("Schedule1F1B", costs, chunks, 2, 2, link_bandwidth=100.0, overlap_transfers=False)
    assert overlapped.time_per_micro_batch == pytest.approx(10.0 / 2)
    assert copied.time_per_micro_batch == pytest.approx(11.0 / 2)
    # one micro-batch per step is a chain: the receiver copies while the sender sends, so nothing changes
    chain = [simulate_schedule("Schedule1F1B", costs, chunks, 2, 1, link_bandwidth=100.0, overlap_transfers=overlap)
             for overlap in (True, False)]  # fmt: skip
    assert chain[0].time_per_micro_batch == pytest.approx(chain[1].time_per_micro_batch)


def test_torchs_buffers_add_a_receive_buffer_per_micro_batch_and_hold_sent_messages_until_the_step_ends():
    # Schedule1F1B, 2 one-stage chunks sending 50 B each way, m = 2: chunk 0 keeps 2 buffers for its output's
    # gradient, chunk 1 two for its input, 100 B each, whatever the schedule holds; its sends are not held
    costs, chunks = uniform(2), Placement.balanced(2, 2)
    needed, torch = (simulate_schedule("Schedule1F1B", costs, chunks, 2, 2, buffers=b) for b in ("needed", "torch"))
    assert [t - n for t, n in zip(torch.peak_memory, needed.peak_memory)] == [100, 100]
    # ZBV, 4 chunks of 2 stages in a V, m = 4: buffers 4 x 50 for each input and output gradient that crosses a
    # chunk boundary (rank 0: chunks 0 and 3, 400 B; rank 1: chunks 1 and 2, 800 B), plus the messages sent to the
    # other rank so far in the step (each rank sends 4 outputs and 4 gradients of 50 B: at most 400 B)
    costs, chunks = uniform(8, graph=50), Placement.balanced(8, 4)
    needed, torch = (simulate_schedule("ScheduleZBVZeroBubble", costs, chunks, 2, 4, buffers=b)
                     for b in ("needed", "torch"))  # fmt: skip
    extra = [t - n for t, n in zip(torch.peak_memory, needed.peak_memory)]
    assert 400 + 200 <= extra[0] <= 400 + 400 and 800 + 200 <= extra[1] <= 800 + 400
    with pytest.raises(ValueError, match="buffers"):
        simulate_schedule("Schedule1F1B", costs, Placement.balanced(8, 2), 2, 2, buffers="pytorch")
