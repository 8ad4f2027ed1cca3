"""Which rank runs which stages: contiguous groups of stages, one group per pipeline rank."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """`groups[r]` is the range of stage indices pipeline rank r owns."""

    groups: tuple[range, ...]

    @classmethod
    def balanced(cls, num_stages: int, num_ranks: int) -> "Placement":
        """Split J stages over W ranks as evenly as possible (the first J mod W ranks get one more)."""
        if num_ranks < 1:
            raise ValueError(f"need at least one rank, got {num_ranks}")
        if num_ranks > num_stages:
            raise ValueError(
                f"{num_ranks} pipeline processes for {num_stages} stages: each process needs at least one stage; "
                f"launch at most {num_stages} processes (or use data parallelism)"
            )
        base, extra = divmod(num_stages, num_ranks)
        return cls.from_sizes([base + (r < extra) for r in range(num_ranks)])

    @classmethod
    def from_sizes(cls, sizes: list[int]) -> "Placement":
        if not sizes or any(size < 1 for size in sizes):
            raise ValueError(f"every rank needs at least one stage, got group sizes {sizes}")
        groups, start = [], 0
        for size in sizes:
            groups.append(range(start, start + size))
            start += size
        return cls(tuple(groups))

    @property
    def num_stages(self) -> int:
        return self.groups[-1].stop

    def rank_of(self, stage: int) -> int:
        for rank, group in enumerate(self.groups):
            if stage in group:
                return rank
        raise IndexError(f"stage {stage} is outside a pipeline of {self.num_stages} stages")

    def describe(self, rank: int) -> str:
        group = self.groups[rank]
        stages = f"stage {group.start}" if len(group) == 1 else f"stages {group.start}-{group.stop - 1}"
        return f"rank {rank} ({stages})"


def replica_of(rank: int, world: int, count: int) -> int:
    """The replica of global rank `rank` when `world` processes form `count` pipeline replicas."""
    if world % count:
        raise ValueError(f"{world} processes cannot form {count} equal pipeline replicas")
    return rank // (world // count)


@dataclass(frozen=True)
class Replicas:
    """W = P x D ranks as D pipeline replicas: replica d holds pipeline ranks d*P .. d*P+P-1."""

    index: int  # this rank's replica
    count: int  # D
    pipeline_ranks: tuple[int, ...]  # the global ranks of this rank's pipeline, in pipeline order
    pipeline_group: object  # torch.distributed group of those ranks
    peer_group: object  # the D ranks that run the same stages as this one (gradients averaged over them)


def split_replicas(count: int) -> Replicas:
    """Split the default torch.distributed group into `count` pipeline replicas (a collective: every rank calls it)."""
    import torch.distributed as dist

    if count < 1:
        raise ValueError(f"data_parallel_size must be >= 1, got {count}")
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("data parallelism needs the default torch.distributed process group")
    world, rank = dist.get_world_size(), dist.get_rank()
    index = replica_of(rank, world, count)
    size = world // count
    pipelines = [dist.new_group(list(range(d * size, (d + 1) * size))) for d in range(count)]
    peers = [dist.new_group(list(range(p, world, size))) for p in range(size)]
    ranks = tuple(range(index * size, (index + 1) * size))
    return Replicas(index, count, ranks, pipelines[index], peers[rank % size])
