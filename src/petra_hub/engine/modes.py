"""The six training configurations the PETRA paper compares (its Tables 3 and 4), behind one switch."""

from __future__ import annotations

from enum import Enum


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
            raise ValueError(f"Unknown PETRA mode {value!r}; expected one of {[m.value for m in cls]}") from None

    @property
    def pipelined(self) -> bool:
        """Whether micro-batches overlap (a new one enters every tick) and gradients are therefore delayed."""
        return self not in (Mode.BACKPROP, Mode.REVERSIBLE_BACKPROP)

    @property
    def reconstructs(self) -> bool:
        """Whether reversible stages rebuild their input by inversion instead of storing it."""
        return self in (Mode.REVERSIBLE_BACKPROP, Mode.WEIGHT_STASH, Mode.PETRA)

    @property
    def stashes_weights(self) -> bool:
        return self in (Mode.DELAYED, Mode.WEIGHT_STASH)

    @property
    def keeps_graph(self) -> bool:
        """Standard backprop keeps the forward's autograd graph instead of recomputing."""
        return self is Mode.BACKPROP
