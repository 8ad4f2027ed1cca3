"""The stage contract, coarser pipelines (consecutive stages fused into one) and the letters that name stage kinds.

A stage is an `nn.Module` mapping an activation (a tensor or a tuple of tensors) to the next. A reversible stage
sets `reversible = True` and also offers `inverse(y) -> x` and `reconstruct_and_backward(y, grad_y) -> (x, grad_x)`
(rebuild the input from the output and backpropagate through the stage in one pass, accumulating parameter
gradients). `petra_hub.testing.stage_contract` checks a model's stages against this contract.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from .placement import Placement
from .tensors import Activation


class StageGroup(nn.Module):
    """Consecutive stages run as one. Reversible when all of them are: the inverse runs the inverses backwards,
    and the fused backward chains each member's fused backward from the last to the first."""

    def __init__(self, stages: list[nn.Module]):
        super().__init__()
        self.members = nn.ModuleList(stages)
        self.reversible = all(getattr(stage, "reversible", False) for stage in stages)

    def forward(self, x: Activation) -> Activation:
        for stage in self.members:
            x = stage(x)
        return x

    def inverse(self, y: Activation) -> Activation:
        for stage in reversed(self.members):
            y = stage.inverse(y)
        return y

    def reconstruct_and_backward(self, y: Activation, grad_y: Activation) -> tuple[Activation, Activation]:
        for stage in reversed(self.members):
            y, grad_y = stage.reconstruct_and_backward(y, grad_y)
        return y, grad_y


def merge_stages(stages: list[nn.Module], groups: int | Sequence[int]) -> list[nn.Module]:
    """Group `stages` into contiguous pipeline stages: `groups` is how many (evenly sized; unchanged when the counts
    agree) or the size of each group in order, e.g. [1, 2, 7]. A group is reversible when all its members are, so
    grouping consecutive reversible blocks keeps them free of input buffers."""
    if isinstance(groups, int):
        if not 1 <= groups <= len(stages):
            raise ValueError(f"cannot make {groups} pipeline stages out of {len(stages)} model stages")
        sizes = [len(group) for group in Placement.balanced(len(stages), groups).groups]
    else:
        sizes = list(groups)
        if not sizes or any(not isinstance(size, int) or size < 1 for size in sizes) or sum(sizes) != len(stages):
            raise ValueError(
                f"stage group sizes {sizes} must be positive integers adding up to the model's {len(stages)} stages"
            )
    merged, start = [], 0
    for size in sizes:
        members = stages[start : start + size]
        merged.append(members[0] if size == 1 else StageGroup(members))
        start += size
    return merged


def group_sizes(stages: list[nn.Module]) -> list[int]:
    """How many model stages each pipeline stage groups (the inverse of `merge_stages`' sizes)."""
    return [len(stage.members) if isinstance(stage, StageGroup) else 1 for stage in stages]


def stage_layout(stages: list[nn.Module]) -> str:
    """One letter per stage: S the first (stem), H the last (head), R a reversible stage, D any other (e.g. a
    non-reversible downsampling block). RevNet18 reads "SRRDRDRDRH"."""
    letters = []
    for index, stage in enumerate(stages):
        if index == 0:
            letters.append("S")
        elif index == len(stages) - 1:
            letters.append("H")
        else:
            letters.append("R" if getattr(stage, "reversible", False) else "D")
    return "".join(letters)
