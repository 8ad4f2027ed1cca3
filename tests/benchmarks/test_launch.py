"""benchmarks/_launch.py: environment variables a benchmark sets reach its ranks, even after forked launches."""

import os

from .conftest import load


def _read_probe(rank, world_size):
    return os.environ.get("PETRA_LAUNCH_PROBE"), os.environ.get("OMP_NUM_THREADS")


def test_a_launch_with_environment_gets_fresh_processes_that_see_it():
    launch = load("_launch").launch
    assert launch(_read_probe, 1) == [(None, "1")]  # forked from the preloading server, one thread
    assert launch(_read_probe, 1, env={"PETRA_LAUNCH_PROBE": "yes"}) == [("yes", "1")]  # spawned
    assert "PETRA_LAUNCH_PROBE" not in os.environ
