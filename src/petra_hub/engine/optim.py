"""The paper's optimizer for one stage: SGD with Nesterov momentum, no weight decay on batch-norm parameters and
biases (every parameter with at most one dimension)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def decayed_by_the_paper(param: nn.Parameter) -> bool:
    """The paper's weight-decay rule (timm's too): weights with more than one dimension; norms and biases spared."""
    return param.dim() > 1


def weight_decay_groups(stage: nn.Module, weight_decay: float,
                        decays: Callable[[nn.Parameter], bool] = decayed_by_the_paper) -> list[dict]:
    """The trainable parameters of `stage` in two groups: those `decays` picks at `weight_decay`, the others at 0
    (an empty group left out)."""
    trained = [p for p in stage.parameters() if p.requires_grad]
    groups = [{"params": [p for p in trained if decays(p)], "weight_decay": weight_decay},
              {"params": [p for p in trained if not decays(p)], "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def paper_sgd(stage: nn.Module, lr: float, weight_decay: float = 5e-4, momentum: float = 0.9) -> torch.optim.SGD:
    return torch.optim.SGD(weight_decay_groups(stage, weight_decay), lr=lr, momentum=momentum, nesterov=True)


def gradient_norm(params: list[nn.Parameter], clip_to: float | None = None) -> torch.Tensor | None:
    """The total 2-norm of the parameters' gradients, a tensor on their device (None where none has one), clipping
    them to `clip_to` if given."""
    grads = [param.grad for param in params if param.grad is not None]
    if not grads:
        return None
    norm = torch.nn.utils.get_total_norm(grads)
    if clip_to:
        torch.nn.utils.clip_grads_with_norm_(params, clip_to, norm)
    return norm.detach()


# The states torch's and transformers' optimizers keep in their parameter's shape (factored ones, such as
# Adafactor's row and column statistics, have other shapes and are not checked).
PARAMETER_SHAPED_STATES = {"momentum_buffer", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum",
                           "acc_delta", "ax", "eta", "prev", "mu_product_buffer", "exp_inf", "grad_avg"}


def check_state_shapes(optimizer: torch.optim.Optimizer | None, where: str) -> None:
    """After `load_state_dict`: each state that torch's optimizers keep in its parameter's shape (momentum, moments)
    has it, so that a corrupt or foreign state fails here, naming `where`, instead of at the first update."""
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            for name, value in optimizer.state.get(param, {}).items():
                if name in PARAMETER_SHAPED_STATES and torch.is_tensor(value) and value.shape != param.shape:
                    raise ValueError(f"{where}: optimizer state {name!r} has shape {list(value.shape)}, its "
                                     f"parameter {list(param.shape)}")
