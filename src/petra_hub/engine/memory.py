"""Memory held by a stage worker, measured from its live tensors."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MemoryStats:
    """Bytes a stage worker holds. `peak_bytes` is the largest total seen after any operation since reset."""

    activation_bytes: int = 0  # stored inputs, or kept autograd graphs, waiting for their backward
    stash_bytes: int = 0  # weight copies kept for the backward of in-flight micro-batches
    gradient_bytes: int = 0  # gradient accumulators (.grad) of the stage's parameters
    peak_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.stash_bytes + self.gradient_bytes
