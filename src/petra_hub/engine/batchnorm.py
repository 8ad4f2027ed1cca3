"""Batch-norm policy helpers shared by the models' users and the engine.

PETRA normalises with batch statistics in every training-time evaluation (forward, inversion, recomputation) but
updates the running statistics only once per micro-batch, during the backward recomputation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def batch_norms(module: nn.Module) -> list[_BatchNorm]:
    return [m for m in module.modules() if isinstance(m, _BatchNorm)]


@contextlib.contextmanager
def frozen_running_stats(module: nn.Module | list[_BatchNorm]) -> Iterator[None]:
    """Normalise with batch statistics without touching running statistics or `num_batches_tracked`.

    In training mode a batch norm with `track_running_stats=False` uses batch statistics and updates nothing;
    in eval mode it still uses its running statistics, so this is harmless around evaluation too. `module` may be
    given as its `batch_norms` list, by a caller that enters this every micro-batch (so that the module is walked
    once, not every time).
    """
    layers = [m for m in (batch_norms(module) if isinstance(module, nn.Module) else module) if m.track_running_stats]
    for layer in layers:
        layer.track_running_stats = False
    try:
        yield
    finally:
        for layer in layers:
            layer.track_running_stats = True
