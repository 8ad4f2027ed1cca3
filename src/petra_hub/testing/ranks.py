"""Run a function on N new CPU processes joined in a gloo group, with a hard deadline (tests, benchmarks).

Every process runs with one intra-op thread: the environment is set before the children start, because torch
reads it when it is imported, which happens in the fork server (or, spawned, while unpickling the target) before
any code of ours runs. A process that raises reports
its error instead of a value; processes still alive at the deadline are killed, so a hung exchange cannot hang the
caller.
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


# imported once by the fork server instead of by every process: a fresh interpreter spends seconds on them
PRELOADED = ["torch", "torch.distributed", "petra_hub.engine", "petra_hub.models"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank, world_size, port, function, args, out_dir, pg_timeout, bind_cores=False):
    os.environ.update(SINGLE_THREAD_ENV)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if bind_cores:
        from petra_hub.testing.affinity import bind_to_cpu_share

        bind_to_cpu_share(rank, world_size)
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
    except BaseException as error:  # reported to the parent
        result["error"] = f"{type(error).__name__}: {error}"
        result["traceback"] = traceback.format_exc()
    result["ended"] = time.time()
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    if world_size > 1 and "error" not in result:
        dist.destroy_process_group()


def run_ranks(
    function,
    world_size: int,
    *args,
    out_dir: str | os.PathLike | None = None,
    deadline: float = 120.0,
    pg_timeout: float = 60.0,
    expendable: tuple[int, ...] = (),
    start_method: str = "forkserver",
    bind_cores: bool = False,
) -> tuple[list[dict | None], list[int | None], float]:
    """Start `function(rank, world_size, *args)` (a module-level function) on `world_size` processes.

    By default the processes are forked from a server that has imported torch and petra_hub once (the server
    starts with the first call and keeps the environment of that moment); `start_method="spawn"` starts each one
    from scratch, which environment variables read at start-up (glibc's MALLOC_*) need.

    Returns (results, exit codes, start time). Each result holds "value" or "error" (+ "traceback"), and "ended"
    (time.time()); a rank that never reported gives None. Processes alive at the deadline are killed (exit code
    None); so are the `expendable` ranks as soon as all the others have ended. `bind_cores`: each process on its
    own share of the cores (`testing.affinity`).
    """
    os.environ.update(SINGLE_THREAD_ENV)  # inherited by the children before they import torch
    import torch.multiprocessing as mp

    context = mp.get_context(start_method)
    if start_method == "forkserver":
        context.set_forkserver_preload(PRELOADED)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="petra-ranks-") as scratch:
        folder = str(out_dir) if out_dir is not None else scratch
        processes = [
            context.Process(target=_entry,
                            args=(rank, world_size, port, function, args, folder, pg_timeout, bind_cores))
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
            path = Path(folder, f"rank{rank}.pkl")
            results.append(pickle.loads(path.read_bytes()) if path.exists() else None)
    return results, codes, started
