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
