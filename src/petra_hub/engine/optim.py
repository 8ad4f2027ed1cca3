"""The paper's optimizer for one stage: SGD with Nesterov momentum, no weight decay on batch-norm parameters and
biases (every parameter with at most one dimension)."""

from __future__ import annotations

import torch
from torch import nn


def paper_sgd(stage: nn.Module, lr: float, weight_decay: float = 5e-4, momentum: float = 0.9) -> torch.optim.SGD:
    decay = [p for p in stage.parameters() if p.requires_grad and p.dim() > 1]
    no_decay = [p for p in stage.parameters() if p.requires_grad and p.dim() <= 1]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.SGD([g for g in groups if g["params"]], lr=lr, momentum=momentum, nesterov=True)
