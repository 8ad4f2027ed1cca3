"""Run a function on N gloo ranks in fresh processes, with a hard deadline, collecting per-rank results."""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank, world_size, port, function, args, out_dir, pg_timeout):
    os.environ.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    result = {}
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=pg_timeout),
        )
        result["value"] = function(rank, world_size, *args)
    except BaseException as error:  # reported to the test, which asserts on it
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()
    result["ended"] = time.time()
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    if "error" not in result:
        dist.destroy_process_group()


def run_ranks(function, world_size: int, *args, out_dir, deadline: float = 120.0, pg_timeout: float = 60.0, expendable=()):
    """Start `function(rank, world_size, *args)` on `world_size` processes; returns (results, exit codes, start
    time). Each result holds "value" or "error", and "ended" (time.time()). Processes still alive at the deadline
    are killed (exit code None); so are the `expendable` ranks as soon as all the others have ended."""
    context = mp.get_context("spawn")
    port = free_port()
    processes = [
        context.Process(target=_entry, args=(rank, world_size, port, function, args, str(out_dir), pg_timeout))
        for rank in range(world_size)
    ]
    started = time.time()
    start = time.monotonic()
    for process in processes:
        process.start()
    for rank, process in enumerate(processes):
        if rank not in expendable:
            process.join(max(0.1, deadline - (time.monotonic() - start)))
    codes = []
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join()
            codes.append(None)
        else:
            codes.append(process.exitcode)
    results = []
    for rank in range(world_size):
        path = Path(out_dir, f"rank{rank}.pkl")
        results.append(pickle.loads(path.read_bytes()) if path.exists() else None)
    return results, codes, started
