"""What the engine must keep accepting while it checks more between ranks (each case worked before those checks and
was refused after them): targets only where the last stage runs, settings given as numpy numbers, lazy stages not
built on the ranks that do not run them, and optimizers whose state is not shaped like the parameters."""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from petra_hub.engine import Pipeline
from petra_hub.testing.ranks import run_ranks


def stages(lazy=False, seed=0):
    torch.manual_seed(seed)
    if lazy:
        return [nn.Sequential(nn.LazyLinear(6), nn.Tanh()), nn.LazyLinear(3)]
    return [nn.Sequential(nn.Linear(6, 6), nn.Tanh()), nn.Linear(6, 3)]


def batch(index):
    generator = torch.Generator().manual_seed(index)
    return torch.randn(4, 6, generator=generator), torch.randint(0, 3, (4,), generator=generator)


def train(run, targets_here=True, steps=4):
    losses = []
    for index in range(steps):
        inputs, targets = batch(index)
        losses += [float(loss) for _, loss in run.step(inputs, targets if targets_here else None)]
    losses += [float(loss) for _, loss in run.drain()]
    return losses


def sgd(index, stage):
    return torch.optim.SGD(stage.parameters(), lr=0.1)


def _cases(rank, world_size):
    out = {}
    # the first rank runs no last stage: it need not be given the targets
    out["targets_on_the_last_rank_only"] = train(Pipeline(stages(), F.cross_entropy, optimizer_factory=sgd,
                                                          timeout=20), targets_here=rank == 1)
    out["numpy_settings"] = train(Pipeline(stages(), F.cross_entropy, optimizer_factory=sgd, timeout=20,
                                           accumulation_steps=np.int64(2), max_grad_norm=np.float32(1.0)))
    lazy = stages(lazy=True)
    run = Pipeline(lazy, F.cross_entropy, optimizer_factory=sgd, timeout=20)
    train(run)
    run.gather_stages(dst=None)
    out["lazy_gathered"] = [list(p.shape) for stage in lazy for p in stage.parameters()]
    return out


def test_two_processes_accept_what_one_process_does(tmp_path):
    results, codes, _ = run_ranks(_cases, 2, out_dir=tmp_path, deadline=120)
    for rank, result in enumerate(results):
        assert result is not None and "error" not in result, (rank, result and result.get("traceback"))
    last = results[1]["value"]
    alone = train(Pipeline(stages(), F.cross_entropy, optimizer_factory=sgd))
    assert last["targets_on_the_last_rank_only"] == alone and len(alone) == 4
    numpy_alone = train(Pipeline(stages(), F.cross_entropy, optimizer_factory=sgd, accumulation_steps=2,
                                 max_grad_norm=1.0))
    assert last["numpy_settings"] == numpy_alone
    assert results[0]["value"]["lazy_gathered"] == last["lazy_gathered"] == [[6, 6], [6], [3, 6], [3]]


def test_a_factored_optimizer_state_loads_back():
    """Adafactor keeps row and column statistics, not parameter-shaped moments: its state must load back (resume)."""
    for factory in (lambda i, s: torch.optim.Adafactor(s.parameters(), lr=0.01),
                    lambda i, s: torch.optim.SGD(s.parameters(), lr=0.1, momentum=0.9)):
        run = Pipeline(stages(), F.cross_entropy, optimizer_factory=factory)
        train(run)
        fresh = Pipeline(stages(seed=1), F.cross_entropy, optimizer_factory=factory)
        fresh.load_state_dict(run.state_dict())
        assert train(fresh, steps=2)
