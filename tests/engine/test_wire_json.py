"""Ranks exchange JSON and tensors, never pickles (`petra_hub.engine.wire`): what another rank sends cannot run code
here (before, the start-up handshake unpickled its neighbour's message: a crafted object's __reduce__ ran there)."""

import os
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from petra_hub.engine import (Pipeline, StageMismatchError, all_gather_json, broadcast_json,
                              broadcast_tensors, gather_tensors, recv_json, send_json)
from petra_hub.engine.transport import ActivationSpec
from petra_hub.testing.ranks import run_ranks


def _outcome(function):
    try:
        return ("value", function())
    except Exception as error:  # noqa: BLE001 - the test compares the errors
        return ("error", f"{type(error).__name__}: {error}")


def _helpers(rank, world_size):
    out = {}
    out["all_gather"] = all_gather_json({"rank": rank, "text": "é" * rank, "list": [1.5, None, True]})
    out["broadcast"] = broadcast_json({"from": 1} if rank == 1 else None, src=1)
    if rank == 0:
        send_json(["hello", 2], dst=1)
    else:
        out["recv"] = recv_json(src=0)
    # a message longer than its limit: refused on both sides, after the length only, so the group goes on
    out["too_long"] = _outcome(lambda: all_gather_json("x" * (50 if rank else 10), limit=40))
    if rank == 0:
        out["send_too_long"] = _outcome(lambda: send_json("y" * 100, dst=1, limit=64))
    else:
        out["send_too_long"] = _outcome(lambda: recv_json(src=0, limit=64))
    # a peer that sends bytes that are not JSON: a pickle, say
    if rank == 0:
        data = torch.frombuffer(bytearray(pickle.dumps({"a": 1})), dtype=torch.uint8)
        dist.send(torch.tensor([data.numel()]), dst=1)
        dist.send(data, dst=1)
    else:
        out["not_json"] = _outcome(lambda: recv_json(src=0))
    tensors = {"w": torch.full((2, 3), float(rank)), "n": torch.tensor(rank + 7), "b": torch.ones(4, dtype=torch.bool),
               "h": torch.arange(3, dtype=torch.bfloat16), "empty": torch.zeros(0, 5)}
    if rank == 1:
        tensors["extra"] = torch.arange(5)
    everyone = gather_tensors(tensors)
    onto_one = gather_tensors(tensors, dst=1)
    sent = broadcast_tensors(tensors if rank == 0 else None, src=0)
    out["gathered"] = [{k: (v.dtype, v.tolist()) for k, v in got.items()} for got in everyone]
    out["onto_one"] = None if onto_one is None else [sorted(got) for got in onto_one]
    out["broadcast_tensors"] = {k: (v.dtype, v.tolist()) for k, v in sent.items()}

    def refuse(position, manifest):
        if "extra" in manifest:
            raise StageMismatchError(f"rank {position} sent an extra tensor {manifest['extra']}")

    out["refused"] = _outcome(lambda: gather_tensors(tensors, accept=refuse))
    # stages that differ between ranks: gather_stages refuses before any tensor moves, on every rank
    torch.manual_seed(0)
    stages = [nn.Linear(4, 5 if rank == 1 else 4), nn.Linear(4, 2)]
    run = Pipeline(stages, F.cross_entropy, timeout=10)
    out["gather_stages"] = _outcome(lambda: run.gather_stages(dst=0))
    return out


def test_json_and_tensors_cross_between_ranks_without_pickle(tmp_path):
    results, codes, _ = run_ranks(_helpers, 2, out_dir=tmp_path, deadline=90)
    for rank, result in enumerate(results):
        assert result is not None and "error" not in result, (rank, result and result.get("traceback"))
    first, second = results[0]["value"], results[1]["value"]
    both = [{"rank": 0, "text": "", "list": [1.5, None, True]}, {"rank": 1, "text": "é", "list": [1.5, None, True]}]
    assert first["all_gather"] == second["all_gather"] == both
    assert first["broadcast"] == second["broadcast"] == {"from": 1}
    assert second["recv"] == ["hello", 2]
    assert first["too_long"] == second["too_long"] == (
        "error", "WireError: rank 1 sent every rank a message of 52 bytes, outside 1 to 40 (the limit of its kind): "
                 "refused before anything is allocated")
    assert first["send_too_long"] == second["send_too_long"] == (
        "error", "WireError: rank 0 sent rank 1 a message of 102 bytes, outside 1 to 64 (the limit of its kind): "
                 "refused before anything is allocated")
    assert second["not_json"][1].startswith("WireError: rank 0 sent a message that is not JSON")
    for got in (first["gathered"], second["gathered"]):
        assert got[0] == {"w": (torch.float32, [[0.0] * 3] * 2), "n": (torch.int64, 7), "b": (torch.bool, [True] * 4),
                          "h": (torch.bfloat16, [0.0, 1.0, 2.0]), "empty": (torch.float32, [])}
        assert got[1]["w"] == (torch.float32, [[1.0] * 3] * 2) and got[1]["extra"] == (torch.int64, list(range(5)))
    assert first["onto_one"] is None and second["onto_one"] == [["b", "empty", "h", "n", "w"],
                                                                ["b", "empty", "extra", "h", "n", "w"]]
    assert first["broadcast_tensors"] == second["broadcast_tensors"] == first["gathered"][0]
    assert first["refused"] == second["refused"] == (
        "error", "StageMismatchError: rank 1 sent an extra tensor ((5,), torch.int64)")
    assert first["gather_stages"] == second["gather_stages"] == (
        "error", "StageMismatchError: rank 0 (stage 0) sent stage 0's 'weight' as [4, 4] torch.float32, but rank 1 "
                 "(stage 1) has [5, 4] torch.float32 for it: every rank must build the same stages")


class Payload:
    """Unpickled, it would leave a mark: what a crafted message ran on the receiving rank before."""

    def __init__(self, mark):
        self.mark = mark

    def __reduce__(self):
        return (os.system, (f"touch {self.mark}",))


def _handshake_attacked(rank, world_size, mark):
    stages = [nn.Linear(4, 4), nn.Linear(4, 2)]
    run = Pipeline(stages, F.cross_entropy, timeout=5)
    if rank == 0:  # the attacker: answers the settings check as rank 0 would, then sends a pickle for its spec
        import petra_hub.engine.handshake as handshake

        send = dist.send_object_list

        def attack(value, dst, group=None, **_):
            send([Payload(mark)], dst=dst, group=group)

        handshake.send_json = dist.send_object_list = attack  # whichever the handshake sends its spec with
    run.step(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))


def test_the_handshake_does_not_unpickle_what_its_neighbour_sends(tmp_path):
    mark = tmp_path / "PWNED"
    results, _, _ = run_ranks(_handshake_attacked, 2, str(mark), out_dir=tmp_path, deadline=60, expendable=(0,))
    assert not mark.exists(), "rank 1 unpickled its neighbour's message"
    assert results[1] is not None, "rank 1 hung"
    assert results[1]["error"].startswith("WireError: rank 0 sent a message that is not JSON"), results[1]


def test_an_activation_spec_from_a_peer_is_checked():
    spec = ActivationSpec.of((torch.zeros(2, 3), torch.zeros(2, dtype=torch.long)))
    assert ActivationSpec.from_json(spec.to_json()) == spec
    for bad in (None, [], {"tensors": [], "is_tuple": True}, {"tensors": [[[3], "float32"]], "is_tuple": 1},
                {"tensors": [[[3], "object"]], "is_tuple": False}, {"tensors": [[[-1], "float32"]], "is_tuple": False},
                {"tensors": [[[3.0], "float32"]], "is_tuple": False}, {"tensors": [[[1] * 40, "int8"]], "is_tuple": 0},
                {"tensors": [[[3], "float32"], [[3], "float32"]], "is_tuple": False}):
        with pytest.raises(ValueError):
            ActivationSpec.from_json(bad)


def test_collectives_take_cuda_tensors_under_nccl_and_cpu_ones_otherwise(monkeypatch):
    """NCCL moves CUDA tensors only: a JSON collective built on CPU tensors would fail on a GPU run at its first
    start-up check. Every helper creates its tensors on `collective_device`."""
    from petra_hub.engine import wire

    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert wire.collective_device() == torch.device("cuda", 3)
    for backend in ("gloo", "cpu:gloo,cuda:nccl"):
        monkeypatch.setattr(dist, "get_backend", lambda group=None, backend=backend: backend)
        assert wire.collective_device() == torch.device("cpu")


def _on_the_collective_device(rank, world_size):
    """Under gloo, every tensor a helper hands torch.distributed is on `collective_device`, which each asks."""
    from petra_hub.engine import wire

    asked, devices = [], set()
    real = wire.collective_device
    wire.collective_device = lambda group=None: asked.append(1) or real(group)
    for name in ("all_gather", "broadcast", "send", "recv"):
        original = getattr(dist, name)

        def spy(tensor, *args, _original=original, **kwargs):
            for item in tensor if isinstance(tensor, list) else [tensor]:
                devices.add(str(item.device))
            return _original(tensor, *args, **kwargs)

        setattr(dist, name, spy)
    all_gather_json(rank)
    broadcast_json("x", src=0)
    if rank == 0:
        send_json(1, dst=1)
    else:
        recv_json(src=0)
    gather_tensors({"w": torch.ones(2)})
    broadcast_tensors({"w": torch.ones(2)} if rank == 0 else None, src=0)
    return len(asked), sorted(devices)


def test_every_helper_asks_where_its_tensors_go(tmp_path):
    results, _, _ = run_ranks(_on_the_collective_device, 2, out_dir=tmp_path, deadline=60)
    for result in results:
        assert result is not None and "error" not in result, result and result.get("traceback")
        asked, devices = result["value"]
        assert asked >= 6 and devices == ["cpu"]
