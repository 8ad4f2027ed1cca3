"""Start a function on N fresh CPU processes (a gloo group over TCP when N > 1) and collect what each returns.

Used by `benchmarks/throughput.py`. Every process runs with one intra-op thread (OMP_NUM_THREADS=1 is set in the
environment *before* the children start, because a spawned child imports torch while unpickling its target,
before any code of ours runs in it). A process that raises reports its traceback instead of a value; processes
still alive at the deadline are killed, so a hung gloo exchange cannot hang the benchmark.
"""

from __future__ import annotations

import os
import pickle
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

SINGLE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


class LaunchError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank, world_size, port, function, args, out_dir, pg_timeout):
    os.environ.update(SINGLE_THREAD_ENV)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    result = {}
    try:
        if world_size > 1:
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=pg_timeout),
            )
        result["value"] = function(rank, world_size, *args)
    except BaseException as error:  # reported to the parent, which raises
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    if world_size > 1 and "error" not in result:
        dist.destroy_process_group()


def launch(function, world_size: int, *args, deadline: float = 3600.0, pg_timeout: float = 600.0) -> list:
    """Run `function(rank, world_size, *args)` on `world_size` spawned processes; returns the per-rank values.

    `function` must be importable by the children (a module-level function). Raises LaunchError with the first
    failing rank's traceback if any process fails, dies or misses the deadline."""
    os.environ.update(SINGLE_THREAD_ENV)  # inherited by the children before they import torch
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="petra-bench-") as out_dir:
        processes = [
            context.Process(target=_entry, args=(rank, world_size, port, function, args, out_dir, pg_timeout))
            for rank in range(world_size)
        ]
        start = time.monotonic()
        for process in processes:
            process.start()
        for process in processes:
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
    for rank, (result, code) in enumerate(zip(results, codes)):
        if result is None or "error" in result:
            detail = result["traceback"] if result else f"exit code {code} (None: killed at the {deadline:g}s deadline)"
            raise LaunchError(f"{function.__name__} failed on rank {rank} of {world_size}:\n{detail}")
    return [result["value"] for result in results]
