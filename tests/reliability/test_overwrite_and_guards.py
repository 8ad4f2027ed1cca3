"""guards.py: what `overwrite_output_dir` clears of an earlier run, and the finiteness check's collective (JSON,
never a pickle)."""

import torch

from petra_hub.testing.ranks import run_ranks


class _Stages:
    """What check_finite reads of a pipeline: the local stage indices and the stages."""

    def __init__(self, rank: int):
        layer = torch.nn.Linear(2, 2)
        if rank == 1:
            with torch.no_grad():
                layer.weight[0, 0] = float("nan")
        self.local = [rank]
        self.stages = {rank: layer}


def _check_finite_without_pickles(rank, world_size):
    import torch.distributed as dist

    from petra_hub.training.guards import check_finite

    def refuse(*args, **kwargs):
        raise AssertionError("all_gather_object unpickles what peers send")

    dist.all_gather_object = refuse
    try:
        check_finite(_Stages(rank), "before saving")
    except Exception as error:  # noqa: BLE001 - the test compares the type and text on every rank
        return f"{type(error).__name__}: {error}"
    return None


def test_check_finite_agrees_over_json_not_pickles():
    results, codes, _ = run_ranks(_check_finite_without_pickles, 2, deadline=120, pg_timeout=30)
    assert codes == [0, 0], results
    for result in results:
        assert result["value"].startswith("FloatingPointError: non-finite weights or batch-norm statistics in "
                                          "stage 1 (weight) before saving: training diverged"), result
