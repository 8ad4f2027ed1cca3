"""Analysis of the PETRA runtime, for benchmarks and tests: stage profiles, event simulations of the engine's tick
loop, and replays of torch's synchronous pipeline schedules from measured costs.

It imports the engine (`petra_hub.engine`); the engine never imports it, so that a training run loads none of it.

    costs = profile_stages(stages, (inputs, targets), mode="petra")
    simulation = simulate("petra", costs, Placement.balanced(len(costs), 4))
"""

from ..engine.partitioning import StageCost
from .profiling import profile_stages, split_backward_shares
from .simulation import Simulation, simulate
from .synchronous import schedule_order, simulate_1f1b, simulate_schedule

__all__ = [
    "Simulation",
    "StageCost",
    "profile_stages",
    "schedule_order",
    "simulate",
    "simulate_1f1b",
    "simulate_schedule",
    "split_backward_shares",
]
