"""The six training configurations the PETRA paper compares (its Tables 3 and 4), behind one switch.

Each mode carries everything said about it anywhere (model cards, CLI help, docs tables): its buffer policy and a
one-sentence description. Adding a mode means adding one member here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class BufferPolicy:
    """How a stage obtains what its backward needs."""

    pipelined: bool  # micro-batches overlap (a new one enters every tick), so gradients are delayed
    reconstructs: bool  # reversible stages rebuild their input by inversion instead of storing it
    stashes_weights: bool  # the backward runs with the weights of the forward (a copy kept per micro-batch)
    keeps_graph: bool  # the forward's autograd graph is kept for the backward (no recomputation)


class Mode(str, Enum):
    """How a stage obtains what its backward needs, and whether the schedule is pipelined (delayed).

    | mode                | input of the backward                  | weights of the backward | delayed |
    |---------------------|----------------------------------------|-------------------------|---------|
    | backprop            | the autograd graph kept from forward   | current (= forward's)   | no      |
    | reversible_backprop | rebuilt by inversion                   | current (= forward's)   | no      |
    | delayed             | stored input, recomputed               | stashed at forward      | yes     |
    | input_buffer        | stored input, recomputed               | current                 | yes     |
    | weight_stash        | rebuilt by inversion (current weights) | stashed at forward      | yes     |
    | petra               | rebuilt by inversion                   | current                 | yes     |

    Non-reversible stages always store their input (or graph); "rebuilt by inversion" applies to reversible ones.
    """

    BACKPROP = "backprop"
    REVERSIBLE_BACKPROP = "reversible_backprop"
    DELAYED = "delayed"
    INPUT_BUFFER = "input_buffer"
    WEIGHT_STASH = "weight_stash"
    PETRA = "petra"

    @classmethod
    def parse(cls, value: "Mode | str") -> "Mode":
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"Unknown PETRA mode {value!r}; expected one of {cls.names()}") from None

    @classmethod
    def names(cls) -> list[str]:
        return [mode.value for mode in cls]

    @property
    def policy(self) -> BufferPolicy:
        return _POLICIES[self]

    @property
    def description(self) -> str:
        """One sentence for model cards, help texts and docs."""
        return _DESCRIPTIONS[self]

    @property
    def pipelined(self) -> bool:
        """Whether micro-batches overlap (a new one enters every tick) and gradients are therefore delayed."""
        return self.policy.pipelined

    @property
    def reconstructs(self) -> bool:
        """Whether reversible stages rebuild their input by inversion instead of storing it."""
        return self.policy.reconstructs

    def rebuilds_input(self, stage, keeps_graph: bool = False) -> bool:
        """Whether `stage` rebuilds its input by inversion in this mode: a reversible stage (`stage.reversible`)
        in a mode that reconstructs, unless it keeps its forward's graph instead."""
        return self.reconstructs and bool(getattr(stage, "reversible", False)) and not keeps_graph

    @property
    def stashes_weights(self) -> bool:
        return self.policy.stashes_weights

    @property
    def keeps_graph(self) -> bool:
        """Standard backprop keeps the forward's autograd graph instead of recomputing."""
        return self.policy.keeps_graph


_POLICIES = {
    Mode.BACKPROP: BufferPolicy(pipelined=False, reconstructs=False, stashes_weights=False, keeps_graph=True),
    Mode.REVERSIBLE_BACKPROP: BufferPolicy(
        pipelined=False, reconstructs=True, stashes_weights=False, keeps_graph=False
    ),
    Mode.DELAYED: BufferPolicy(pipelined=True, reconstructs=False, stashes_weights=True, keeps_graph=False),
    Mode.INPUT_BUFFER: BufferPolicy(pipelined=True, reconstructs=False, stashes_weights=False, keeps_graph=False),
    Mode.WEIGHT_STASH: BufferPolicy(pipelined=True, reconstructs=True, stashes_weights=True, keeps_graph=False),
    Mode.PETRA: BufferPolicy(pipelined=True, reconstructs=True, stashes_weights=False, keeps_graph=False),
}

_DESCRIPTIONS = {
    Mode.BACKPROP: "standard end-to-end backpropagation, not pipelined (the reference).",
    Mode.REVERSIBLE_BACKPROP: "synchronous backpropagation in which the reversible blocks recompute their inputs by "
    "inversion instead of storing them; not pipelined.",
    Mode.DELAYED: "pipelined with delayed gradients; each stage stores its inputs and stashes the weights of the "
    "forward pass for the backward pass.",
    Mode.INPUT_BUFFER: "pipelined with delayed gradients; each stage stores its inputs and runs the backward pass "
    "with its current weights.",
    Mode.WEIGHT_STASH: "pipelined with delayed gradients; reversible stages recompute their inputs by inversion and "
    "the weights of the forward pass are stashed for the backward pass.",
    Mode.PETRA: "the PETRA method: pipelined with delayed gradients; reversible stages recompute their inputs by "
    "inversion with their current weights, so they keep neither activations nor weight copies; the stages that are "
    "not reversible keep their inputs.",
}
assert set(_POLICIES) == set(_DESCRIPTIONS) == set(Mode), "every mode needs a policy and a description"
