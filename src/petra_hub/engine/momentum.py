"""Delay-matched momentum: a stage whose gradients arrive late averages fewer of them.

An optimizer's momentum (SGD's `momentum`, the first factor of Adam's `betas`) sums past gradients with weights
beta^i, so the step it takes leans on gradients beta / (1 - beta) updates old on average: its lag. A delayed
gradient adds its delay to that. Stage j's gradients are d_j = 2(J-1-j)/k of its own updates old in a pipelined
mode, so under PETRA its update follows the loss with a lag of d_j + beta / (1 - beta) where backprop's follows with
beta / (1 - beta). With `delay_momentum` each stage's factor is lowered until the two add up to what the optimizer's
factor gives without delay:

    lag(beta) = beta / (1 - beta),    lag(beta_j) = max(0, lag(beta) - d_j),    beta_j = lag_j / (1 + lag_j),

so a stage whose delay alone exceeds the lag gets no momentum (beta_j = 0: SGD's plain step, Adam's normalised
gradient), and the last stage (d = 0) keeps beta. With SGD, whose momentum also multiplies the step by
1 / (1 - beta), the early stages' steps shrink with it, as a delay-scaled learning rate would shrink them. Asynchronous
SGD is known to act as if it had momentum of its own (Mitliagkas et al., "Asynchrony begets momentum", 2016); this
takes that as far as keeping the total lag. In synchronous modes, and during a synchronous start, every stage keeps
the optimizer's own factor.
"""

from __future__ import annotations

import torch

from .options import OptionError


def momentum_lag(beta: float) -> float:
    """The mean age, in updates, of the gradients an exponential average with factor `beta` sums."""
    return beta / (1.0 - beta)


def matched_momentum(beta: float, delay: float) -> float:
    """The factor whose lag plus `delay` is `beta`'s lag (0 where the delay alone is as long: within rounding, so
    that 0.9's lag, 9.000000000000002, less a delay of 9 is none)."""
    lag = momentum_lag(beta) - delay
    return lag / (1.0 + lag) if lag > 1e-9 * max(1.0, delay) else 0.0


class DelayMatchedMomentum:
    """Sets one stage's optimizer's momentum for the mode it runs in: `beta_j` of its delay when pipelined, the
    optimizer's own otherwise (as the optimizer was built). Every parameter group must have a momentum: a
    `momentum` (SGD, RMSprop) or `betas` (Adam and its kin); the stage's LR `scheduler` (or None) must leave it
    alone."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler, delay: float, where: str):
        if getattr(scheduler, "cycle_momentum", False):
            raise OptionError("delay_momentum", f"used with a schedule that leaves the momentum alone, but {where}'s "
                              f"{type(scheduler).__name__} cycles the momentum", True)
        self.optimizer, self.delay = optimizer, delay
        self.own: list[tuple[str, float]] = []
        for group in optimizer.param_groups:
            key = "betas" if "betas" in group else "momentum" if "momentum" in group else None
            if key is None:
                raise OptionError("delay_momentum", "used with an optimizer that has a momentum ('momentum' or "
                                  f"'betas'), but {where}'s {type(optimizer).__name__} has none", True)
            beta = float(group[key][0] if key == "betas" else group[key])
            if not 0 <= beta < 1:
                raise OptionError("delay_momentum", f"used with a momentum in [0, 1), but {where}'s is {beta}", True)
            self.own.append((key, beta))

    def apply(self, pipelined: bool) -> None:
        for group, (key, beta) in zip(self.optimizer.param_groups, self.own):
            value = matched_momentum(beta, self.delay) if pipelined else beta
            if key == "betas":
                group["betas"] = (value, group["betas"][1])
            else:
                group["momentum"] = value
