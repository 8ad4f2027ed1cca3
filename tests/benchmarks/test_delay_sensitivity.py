"""benchmarks/delay_sensitivity.py: the stale-gradient simulation without the engine, on a few steps."""

from .conftest import load


def test_a_delay_of_zero_is_plain_backprop_and_a_delay_shifts_the_gradients():
    benchmark = load("delay_sensitivity")
    train_set, test_set = benchmark.digits("train"), benchmark.digits("test")
    assert train_set[0].shape[1:] == (3, 16, 16) and len(test_set[1]) == 360
    fresh = benchmark.train("revvit", 0, 12, 1e-3, train_set, test_set)
    again = benchmark.train("revvit", 0, 12, 1e-3, train_set, test_set)
    stale = benchmark.train("revvit", 3, 12, 1e-3, train_set, test_set)
    assert fresh == again  # seeded
    assert stale["final_loss"] != fresh["final_loss"] and stale["steps"] == fresh["steps"] == 12
    assert 0.0 <= stale["test_accuracy"] <= 1.0
