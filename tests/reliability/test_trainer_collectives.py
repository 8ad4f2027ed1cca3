"""The trainer's own collectives (start-up checks, initial weights, logged sums, the finiteness check, evaluation
results, save barriers) report a peer that has gone as a PeerFailureError saying what this process was doing, not
as gloo's bare RuntimeError."""

import dataclasses
import os
import time

import torch

from petra_hub.testing.ranks import run_ranks


@dataclasses.dataclass
class _Args:
    output_dir: str
    seed: int = 0
    save_strategy: str = "steps"


class _NoLocalStages:
    local = range(0)
    stages: list = []


class _LastStageElsewhere:
    has_last_stage = False
    last_stage_rank = 1


def _start_checks():
    from petra_hub.training.distributed import raise_on_every_rank

    with raise_on_every_rank():
        pass


def _without_its_peer(rank, world_size, folder):
    from petra_hub.training import distributed
    from petra_hub.training.evaluation import run_inference
    from petra_hub.training.guards import check_finite

    if rank == 1:
        os._exit(0)  # gone without a word, as a killed process
    time.sleep(1.0)
    calls = {
        "the start-up checks": _start_checks,
        "check_same_run": lambda: distributed.check_same_run(_Args(folder), "digits"),
        "check_shared_output_dir": lambda: distributed.check_shared_output_dir(_Args(folder)),
        "broadcast_module": lambda: distributed.broadcast_module(torch.nn.Linear(2, 2)),
        "all_reduce_sum": lambda: distributed.all_reduce_sum(torch.ones(2)),
        "check_finite": lambda: check_finite(_NoLocalStages(), "before saving"),
        "run_inference": lambda: run_inference(_LastStageElsewhere(), [], None, None, "eval"),
        "barrier": lambda: distributed.barrier("save the model"),
    }
    errors = {}
    for name, call in calls.items():
        try:
            call()
            errors[name] = None
        except Exception as error:
            errors[name] = f"{type(error).__name__}: {error}"
    return errors


def test_a_peer_gone_is_named_as_such_by_every_trainer_collective(tmp_path):
    results, codes, _ = run_ranks(_without_its_peer, 2, str(tmp_path), out_dir=tmp_path, deadline=120, pg_timeout=10)
    assert codes == [0, 0] and results[0] is not None and "error" not in results[0], results[0]
    errors = results[0]["value"]
    doing = {
        "the start-up checks": "hear whether every process passed its start-up checks",
        "check_same_run": "compare its training arguments with the other processes'",
        "check_shared_output_dir": "agree on a mark to leave in output_dir",
        "broadcast_module": "share the initial weights of process 0",
        "all_reduce_sum": "sum the logged values over the processes",
        "check_finite": "agree that every stage's weights are finite before saving",
        "run_inference": "receive the eval results from the last stage's process",
        "barrier": "wait for the other processes to save the model",
    }
    for name, what in doing.items():
        assert (errors[name] or "").startswith(f"PeerFailureError: process 0 could not {what}: a peer process died"), \
            (name, errors[name])
