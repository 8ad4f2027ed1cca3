"""RunLock (`output_dir/_petra_run.lock`): one holder at a time even when two processes try at the same instant, on
a clean folder or over a stale lock file; a killed holder's lock is free at once; a live holder's is refused."""

import json
import multiprocessing
import os
import signal
import socket
import time

import pytest

from petra_hub.training.guards import LOCK_NAME, RunLock

ROUNDS = 300  # the racing processes share a start instant, one per core: the lock before flock lost ~100 rounds
DEAD_PID = 2**22 + 12345  # above any pid_max: no such process
FORK = multiprocessing.get_context("fork")  # the children only take and drop locks: no start-up imports


def _race(rank, barrier, start, acquired, folder, stale):
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpus[rank % len(cpus)]})  # both on a core at once, as two runs on a busy host
    lock_file = os.path.join(folder, LOCK_NAME)
    for round_ in range(ROUNDS):
        if stale:
            if rank == 0:  # a killed run's file, or one read while it was being written
                with open(lock_file, "w", encoding="utf-8") as handle:
                    handle.write(json.dumps({"pid": DEAD_PID, "host": socket.gethostname(), "since": 0.0})
                                 if round_ % 2 else '{"pid": 4')
            barrier.wait()
        if rank == 0:
            start.value = time.monotonic() + 0.002
        barrier.wait()
        at = start.value + rank * (round_ % 8) * 10e-6  # the same instant, or rank 1 a few microseconds later
        while time.monotonic() < at:
            pass
        lock = RunLock(folder)
        try:
            lock.acquire()
            acquired[2 * round_ + rank] = 1
        except FileExistsError:
            pass
        barrier.wait()  # both have tried before either releases
        lock.release()


@pytest.mark.parametrize("stale", [False, True], ids=["clean-folder", "stale-lock"])
def test_two_processes_racing_never_both_hold_the_lock(tmp_path, stale):
    barrier = FORK.Barrier(2, timeout=60)
    start = FORK.Value("d", 0.0, lock=False)
    acquired = FORK.Array("b", 2 * ROUNDS, lock=False)
    processes = [FORK.Process(target=_race, args=(rank, barrier, start, acquired, str(tmp_path), stale))
                 for rank in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [process.exitcode for process in processes] == [0, 0]
    holders = [acquired[2 * round_] + acquired[2 * round_ + 1] for round_ in range(ROUNDS)]
    both, neither = holders.count(2), holders.count(0)
    assert (both, neither) == (0, 0), f"{both} of {ROUNDS} rounds had two holders, {neither} none"
    assert not (tmp_path / LOCK_NAME).exists()  # the last holder's release removed it


def _hold(folder, ready, done):
    lock = RunLock(folder)
    lock.acquire()
    ready.set()
    done.wait(60)
    lock.release()


def _holder(folder):
    ready, done = FORK.Event(), FORK.Event()
    process = FORK.Process(target=_hold, args=(folder, ready, done))
    process.start()
    assert ready.wait(30)
    return process, done


def test_a_killed_holders_lock_is_taken_over_at_once(tmp_path):
    process, _ = _holder(str(tmp_path))
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    lock_file = tmp_path / LOCK_NAME
    assert json.loads(lock_file.read_text())["pid"] == process.pid  # left behind, naming the dead holder
    lock = RunLock(str(tmp_path))
    began = time.monotonic()
    lock.acquire()
    assert time.monotonic() - began < 1.0 and lock.held
    assert json.loads(lock_file.read_text())["pid"] == os.getpid()
    lock.release()
    assert not lock_file.exists()


def test_a_live_holders_lock_is_refused_then_free_once_released(tmp_path):
    process, done = _holder(str(tmp_path))
    try:
        lock = RunLock(str(tmp_path))
        message = (f"another run (process {process.pid} on {socket.gethostname()}) is training into "
                   f"{str(tmp_path)!r}; wait for it or choose another output_dir")
        with pytest.raises(FileExistsError) as refused:
            lock.acquire()
        assert str(refused.value) == message and not lock.held
        assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == process.pid  # untouched
    finally:
        done.set()
        process.join(30)
    lock.acquire()
    assert lock.held
    lock.release()


def test_a_holder_yet_to_write_its_name_is_still_refused(tmp_path):
    import fcntl

    with open(tmp_path / LOCK_NAME, "w") as held:  # locked, still empty: a holder between its flock and its write
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(FileExistsError, match=r"another run \(process unknown on an unknown host\)"):
            RunLock(str(tmp_path)).acquire()
