"""The process group petra_hub creates is destroyed at exit, before the interpreter's teardown: left to it, gloo's
worker threads aborted a 2-process recipe that had finished and saved (SIGABRT, "terminate called without an active
exception"; 1 launch in 12 on a loaded 2-core machine)."""

import os
import subprocess
import sys
import textwrap

from petra_hub.testing.ranks import free_port

# Registered before init_distributed, so it runs after the handlers registered by it (atexit runs last-in first-out).
SCRIPT = textwrap.dedent("""
    import atexit
    import torch.distributed as dist
    from petra_hub.training import distributed

    atexit.register(lambda: print("group alive at the end of exit:", dist.is_initialized(), flush=True))
    distributed.check_launch = lambda: None   # not under accelerate launch; a world of one process stands in
    distributed.launched_world_size = lambda: 2
    assert distributed.init_distributed(timeout=10)
    {after}
""")


def exit_report(after: str = "") -> str:
    env = {
        **os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
        "CUDA_VISIBLE_DEVICES": "",
    }
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(after=after)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


def test_the_group_init_distributed_created_is_destroyed_at_exit():
    assert exit_report() == "group alive at the end of exit: False"


def test_a_group_the_user_made_after_destroying_ours_is_left_to_the_user():
    replace = "dist.destroy_process_group(); dist.init_process_group('gloo')"
    assert exit_report(replace) == "group alive at the end of exit: True"
