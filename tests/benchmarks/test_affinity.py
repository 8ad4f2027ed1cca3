"""Each process of a CPU run on its own cores: the shares, and processes really bound to them."""

import os

import pytest

from petra_hub.testing.affinity import cpu_share
from petra_hub.testing.ranks import run_ranks

from .conftest import run_quick


def test_the_cores_are_cut_into_contiguous_disjoint_shares_that_cover_them_all():
    cores = list(range(16))
    shares = [cpu_share(rank, 10, cores) for rank in range(10)]
    assert sorted(len(share) for share in shares) == [1] * 4 + [2] * 6  # as equal as 16 / 10 allows
    assert [core for share in shares for core in share] == cores  # in order: contiguous, disjoint, complete
    assert cpu_share(1, 2, [3, 7, 5, 9]) == [7, 9]  # the cores this process may use, whatever their numbers


def test_more_processes_than_cores_or_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match="3 processes a core of its own: this process may run on 2"):
        cpu_share(0, 3, [0, 1])
    with pytest.raises(ValueError, match="local rank 2 is not one of 2 processes"):
        cpu_share(2, 2, [0, 1])


def report_affinity(rank, world_size):
    import torch

    return sorted(os.sched_getaffinity(0)), torch.get_num_threads()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_launched_ranks_run_each_on_its_own_share():
    results, codes, _ = run_ranks(report_affinity, 2, bind_cores=True)
    assert codes == [0, 0]
    shares = [result["value"][0] for result in results]
    assert shares == [cpu_share(rank, 2) for rank in range(2)]
    assert not set(shares[0]) & set(shares[1])
    assert all(result["value"][1] <= len(share) for result, share in zip(results, shares))  # no more threads than cores


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
@pytest.mark.benchmark_run
def test_quick_run_times_both_ways_and_renders(tmp_path, report):
    out = tmp_path / "affinity.json"
    (row,) = run_quick("affinity", out, "--groups", "4k/6")["rows"]
    assert row["groups"] == "4k/6" and row["free_s"] > 0 and row["bound_s"] > 0
    assert row["free_over_bound"] == pytest.approx(row["free_s"] / row["bound_s"])  # one round: the ratio is the pair's
    assert all(0.8 < t < 3 for t in row["tail_free"] + row["tail_bound"])  # a mean over a median, per rank
    assert "| 4k/6 |" in report.render("affinity/main", tmp_path)
