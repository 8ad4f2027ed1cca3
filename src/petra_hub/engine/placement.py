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
    def for_pipeline(cls, sizes: list[int] | None, num_stages: int, num_ranks: int) -> "Placement":
        """`sizes` stages per rank (None: an even split), checked to cover `num_stages` stages over `num_ranks`."""
        placement = cls.from_sizes(sizes) if sizes else cls.balanced(num_stages, num_ranks)
        if placement.num_stages != num_stages or len(placement.groups) != num_ranks:
            raise ValueError(
                f"partition {sizes} must give every one of the {num_ranks} ranks a group, covering all {num_stages} "
                "stages"
            )
        return placement

    @classmethod
    def auto(cls, costs: list, num_ranks: int, memory_limit: int | None = None, link_bandwidth: float | None = None,
             latency: float = 0.0, accumulation_steps: int = 1) -> "Placement":
        """The contiguous partition of the stages whose slowest rank is fastest, from measured `costs`
        (`profile_stages`): a rank's time per micro-batch is the compute of its stages (each one's update once every
        `accumulation_steps` micro-batches) plus, with `link_bandwidth` (bytes/s), sending its boundary messages (plus
        `latency` seconds each). Dynamic programming over the prefixes; with `memory_limit` (bytes per rank) only
        groups whose stages hold at most that much are allowed."""
        count = len(costs)
        cls.balanced(count, num_ranks)  # the same errors for impossible counts

        def rank_time(start: int, stop: int) -> float:
            time = sum(c.forward_s + c.backward_s + c.update_s / accumulation_steps for c in costs[start:stop])
            if link_bandwidth:
                for sent in (costs[stop - 1].forward_bytes if stop < count else 0,
                             costs[start].backward_bytes if start > 0 else 0):
                    time += sent / link_bandwidth + latency if sent else 0.0
            return time

        def fits(start: int, stop: int) -> bool:
            return memory_limit is None or sum(c.held_bytes for c in costs[start:stop]) <= memory_limit

        # best[w][j]: (bottleneck, sizes) of the best split of the first j stages over w ranks
        best = [{0: (0.0, [])}] + [{} for _ in range(num_ranks)]
        for ranks in range(1, num_ranks + 1):
            for stop in range(ranks, count - (num_ranks - ranks) + 1):
                options = [
                    (max(best[ranks - 1][start][0], rank_time(start, stop)), best[ranks - 1][start][1] + [stop - start])
                    for start in range(ranks - 1, stop) if start in best[ranks - 1] and fits(start, stop)
                ]
                if options:
                    best[ranks][stop] = min(options, key=lambda option: option[0])
        if count not in best[num_ranks]:
            raise ValueError(f"no split of {count} stages over {num_ranks} ranks keeps every rank within "
                             f"memory_limit={memory_limit} bytes")
        return cls.from_sizes(best[num_ranks][count][1])

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

    def describe(self, rank: int, global_ranks: list[int] | None = None) -> str:
        """How errors name pipeline rank `rank`: by its global rank (`global_ranks[rank]`, what the launcher and the
        logs call it) where that differs, as in a data-parallel replica or a subgroup."""
        group = self.groups[rank]
        stages = f"stage {group.start}" if len(group) == 1 else f"stages {group.start}-{group.stop - 1}"
        if global_ranks is not None and global_ranks[rank] != rank:
            return f"rank {global_ranks[rank]} (pipeline rank {rank}, {stages})"
        return f"rank {rank} ({stages})"


def replica_of(rank: int, world: int, count: int) -> int:
    """The replica of global rank `rank` when `world` processes form `count` pipeline replicas."""
    if world % count:
        raise ValueError(f"{world} processes cannot form {count} equal pipeline replicas")
    return rank // (world // count)


def pipeline_rank_of(rank: int, world: int, count: int) -> int:
    """The position of global rank `rank` in its pipeline when `world` processes form `count` replicas; position 0
    runs stage 0 (every placement's groups are contiguous from it)."""
    return rank - replica_of(rank, world, count) * (world // count)


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
    return Replicas(index, count, ranks, pipelines[index], peers[pipeline_rank_of(rank, world, count)])


def pipeline_groups(group, data_parallel_size: int, distributed: bool) -> tuple[object, object, Replicas | None]:
    """(the pipeline's group, the group of every rank of the run, the replicas or None): `group` itself twice
    without data parallelism; with it, this rank's replica's pipeline and the default group (a collective)."""
    if data_parallel_size == 1:
        return group, group, None
    if not distributed or group is not None:
        raise ValueError("data parallelism needs the default torch.distributed process group")
    replicas = split_replicas(data_parallel_size)
    return replicas.pipeline_group, None, replicas
