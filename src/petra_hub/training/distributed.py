"""Process-group set-up for pipeline ranks started by `accelerate launch` or `torchrun`."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import os

import torch
import torch.distributed as dist

from ..engine import all_gather_json, broadcast_json, collective_device, disagreements, peer_failure


def launched_world_size() -> int:
    """The number of processes the launcher started (1 when run as a plain script)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def requested_processes(parent_cmdline: list[str]) -> int | None:
    """The processes an `accelerate launch` command line asked for: its `--num_processes`, else the `num_processes`
    of its `--config_file` (None if it is not such a command, or says none)."""
    words = [w for w in parent_cmdline if w]
    if not any(w.endswith("accelerate") for w in words) or "launch" not in words:
        return None
    number = _flag_value(words, "num_processes")
    if number is not None:
        return int(number)
    config = _flag_value(words, "config_file")
    if config is None or not os.path.isfile(config):
        return None
    import yaml

    with open(config, encoding="utf-8") as handle:
        values = yaml.safe_load(handle)
    number = values.get("num_processes") if isinstance(values, dict) else None
    return int(number) if isinstance(number, int) else None


def _flag_value(words: list[str], name: str) -> str | None:
    """The value of `--name` (or `--name-with-dashes`) in `words`, as `--flag value` or `--flag=value`."""
    for index, word in enumerate(words):
        for flag in (f"--{name}", f"--{name.replace('_', '-')}"):
            if word == flag and index + 1 < len(words):
                return words[index + 1]
            if word.startswith(flag + "="):
                return word.split("=", 1)[1]
    return None


def check_launch() -> None:
    """Refuse a launch that asked for several processes but started one: on a CPU-only machine `accelerate launch
    --num_processes N` without a multi-process config, with `--cpu`, or with a `MULTI_CPU` config runs a single
    process, which would silently hold every stage."""
    if launched_world_size() > 1:
        return
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as handle:
            parent = [part.decode(errors="replace") for part in handle.read().split(b"\0")]
    except OSError:  # not Linux, or no parent to read: nothing to check
        return
    requested = requested_processes(parent)
    if requested is None or requested <= 1:
        return
    if "--cpu" in parent:
        raise RuntimeError(
            f"accelerate launch was asked for {requested} processes but started one: --cpu makes it run a single "
            "process. Drop --cpu (petra_hub uses gloo on machines without GPUs by itself): accelerate launch "
            f"--config_file accelerate_config.yaml --num_processes {requested} ..."
        )
    raise RuntimeError(
        f"accelerate launch was asked for {requested} processes but started one (on a machine without GPUs its "
        "default launcher, and a MULTI_CPU configuration without mpirun, run a single process). Launch with the "
        f"project's multi-process configuration: accelerate launch --config_file accelerate_config.yaml "
        f"--num_processes {requested} ..."
    )


def init_distributed(timeout: float) -> bool:
    """Join the launcher's process group: NCCL with one GPU per rank where there are GPUs, gloo otherwise.

    `timeout` bounds every collective (a dead or stalled peer becomes an error instead of a hang). Returns whether
    a multi-process group is active. Must run before `TrainingArguments` sets up accelerate, so that accelerate
    adopts this group instead of treating a CPU-only machine as a single process.
    """
    check_launch()
    if launched_world_size() <= 1:
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    if dist.is_initialized():
        return True
    if torch.cuda.is_available():
        local_rank, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local_rank >= gpus:  # NCCL needs a GPU of its own per process
            raise RuntimeError(
                f"process {local_rank} of this machine has no GPU of its own: the machine has {gpus} GPU(s) and NCCL "
                f"needs one per process; launch at most {gpus} processes per machine (accelerate launch "
                f"--num_processes {gpus} ...), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run on CPUs with gloo"
            )
        torch.cuda.set_device(local_rank)
        backend = "nccl"
    else:
        backend = "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout), **attempt_store(timeout))
    atexit.register(release_process_group, dist.group.WORLD)
    return True


def attempt_store(timeout: float) -> dict:
    """Under torchrun (and `accelerate launch`, which runs it), the process group's rendezvous in a store of this
    attempt's own: a prefix of the launcher's store, whose keys outlive a restart, so that the processes of a
    restarted job never read the addresses of the attempt before, whose processes are gone (gloo then fails to
    connect). Elsewhere nothing: `env://` as usual."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=timeout))
    return {"store": dist.PrefixStore(f"petra_hub/attempt_{attempt}", store), "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"])}


def release_process_group(group: dist.ProcessGroup) -> None:
    """Destroy the process group `init_distributed` created, if it is still the live one (registered to run at
    exit). Left to the interpreter's teardown, gloo's worker threads can outlive Python and abort the process
    (SIGABRT, "terminate called without an active exception") after a run that succeeded."""
    if dist.is_initialized() and dist.group.WORLD is group:
        dist.destroy_process_group()


def world_size() -> int:
    """Processes in the default group (1 without one)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def process_rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return dist.get_rank() if dist.is_initialized() else 0


def together(doing: str):
    """Around a trainer-level collective: a peer that died or stalled becomes a PeerFailureError saying what this
    process was doing, instead of gloo's bare error."""
    return peer_failure(doing, f"process {process_rank()}")


def barrier(doing: str) -> None:
    """Wait until every process is here (nothing to wait for with one); `doing` says for what, in the error."""
    if dist.is_initialized():
        with together(f"wait for the other processes to {doing}"):
            dist.barrier()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum `values` over all processes (unchanged with one), on the device the backend moves (`collective_device`)."""
    if world_size() <= 1:
        return values
    reduced = values.to(collective_device())
    with together("sum the logged values over the processes"):
        dist.all_reduce(reduced)
    return reduced.cpu()


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Give every process the parameters and buffers of process `src` (as DistributedDataParallel does at start):
    whether or not the model was built after seeding, every rank then trains the same model."""
    if world_size() <= 1:
        return
    tensors = [t for t in [*module.parameters(), *module.buffers()] if t.numel()]
    by_kind: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_kind.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    for group in by_kind.values():
        flat = torch.cat([t.detach().reshape(-1) for t in group])
        with together(f"share the initial weights of process {src}"):
            dist.broadcast(flat, src=src)
        offset = 0
        with torch.no_grad():
            for tensor in group:
                tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                offset += tensor.numel()


@contextlib.contextmanager
def raise_on_every_rank():
    """Run a check on every rank; if it fails on any, raise on all (the failing rank's error, others a summary),
    instead of leaving the other ranks waiting for a peer that has stopped."""
    error = None
    try:
        yield
    except Exception as caught:  # re-raised below, after the others have heard of it
        error = caught
    if world_size() > 1:
        with together("hear whether every process passed its start-up checks"):
            messages = all_gather_json(None if error is None else f"{type(error).__name__}: {error}")
        failed = [(rank, m) for rank, m in enumerate(messages) if m is not None]
        if failed and error is None:
            rank, message = failed[0]
            raise RuntimeError(f"process {rank} stopped before training: {message}")
    if error is not None:
        raise error


# TrainingArguments fields that may differ between processes: where each machine writes and logs, how it loads data
# and shows progress, and what the launcher sets per process. Every other field must agree: rank 0 reads the images
# and the last rank the labels, each in its own order, and every stage must update alike.
PER_PROCESS_FIELDS = frozenset({
    "output_dir", "logging_dir", "run_name", "report_to", "disable_tqdm", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor", "petra_timeout",
    "local_rank", "process_index", "local_process_index",
})


def check_same_run(args, data_label: str | None, labels: str | None = None) -> None:
    """Every process must run the same job: the same TrainingArguments (`PER_PROCESS_FIELDS` aside) and train set.
    Raises the same ValueError on every rank, naming the fields and which ranks hold which values (a collective;
    nothing to do with one process). Different seeds, for one, pair rank 0's images with other images' labels."""
    if world_size() <= 1:
        return
    mine = {f.name: repr(getattr(args, f.name)) for f in dataclasses.fields(args)
            if f.init and f.name not in PER_PROCESS_FIELDS}
    mine["train_dataset"] = repr(data_label)
    mine["train_labels"] = repr(labels)  # `batches.labels_digest`: the same labels in the same order
    with together("compare its training arguments with the other processes'"):
        everyone, differ = disagreements(mine)
    if differ:
        shown = "; ".join(f"{key}: " + ", ".join(f"rank {rank} {other.get(key)}" for rank, other in enumerate(everyone))
                          for key in differ[:5])
        raise ValueError(f"the processes disagree on {', '.join(differ)} ({shown}): every process must be given the "
                         "same arguments and data (only where it writes and logs, and how it loads data, may differ)")


def check_shared_output_dir(args) -> None:
    """Checkpoints are written by every process (its stages' optimizer states) into one folder that rank 0 then
    publishes: across machines `output_dir` must be shared storage. Each process leaves a mark there and every process
    must see every mark; else the same ValueError on every rank, before any step (a collective; nothing to check with
    one process or without checkpoints)."""
    if world_size() <= 1 or args.save_strategy == "no":
        return
    with together("agree on a mark to leave in output_dir"):
        token = broadcast_json(os.urandom(8).hex() if dist.get_rank() == 0 else None, src=0)
    if not isinstance(token, str) or not token.isalnum():
        raise ValueError(f"process 0 sent {str(token)[:40]!r} as the mark for output_dir, not 16 hexadecimal digits")
    marks = [os.path.join(args.output_dir, f".petra-shared-{token}-{rank}") for rank in range(world_size())]
    os.makedirs(args.output_dir, exist_ok=True)
    with open(marks[dist.get_rank()], "w", encoding="utf-8"):
        pass
    barrier("leave their marks in output_dir")
    unseen = [rank for rank, mark in enumerate(marks) if not os.path.exists(mark)]
    with together("compare which marks in output_dir the processes see"):
        everyone = all_gather_json(unseen)  # returns once every rank has looked: the marks may go
    os.remove(marks[dist.get_rank()])
    blind = {rank: missing for rank, missing in enumerate(everyone) if missing}
    if blind:
        raise ValueError(
            f"output_dir {args.output_dir!r} is not one folder that every process sees ("
            + "; ".join(f"rank {rank} cannot see the files of ranks {missing}" for rank, missing in blind.items())
            + "): checkpoints are written by every process, so across machines put output_dir on shared storage, "
            "or set save_strategy='no'")
