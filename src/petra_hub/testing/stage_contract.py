"""The reversible-stage contract as a pytest mixin: any model family whose stages PETRA inverts gets the same checks.

    class TestMyStages(ReversibleStageContract):
        @pytest.fixture(params=["small", "wide"])
        def stage_cases(self, request):
            model = build(request.param).double().train()
            return reversible_stage_cases(model.get_stages(), example_input)

Each case is (stage, the input it receives). Work in float64 with batch norms in training mode: the checks are
exact up to rounding (inverse(forward(x)) == x to 1e-12, the fused backward equal to autograd to 1e-10), and the
fused backward must evaluate every parameterised sub-module exactly once. Under bf16 autocast (on float32 copies)
a reversible stage must return its streams in the dtype it received them in, so that the coupling and the
reconstruction round in float32 (`petra_hub.engine.precision`).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..engine.batchnorm import frozen_running_stats
from ..engine.tensors import Activation, as_tuple


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.detach(), expected.detach()
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-300))


def reversible_stage_cases(stages: list[nn.Module], inputs: Activation) -> list[tuple[nn.Module, Activation]]:
    """(stage, its input) for every reversible stage, running the stages in order without touching running stats."""
    cases, x = [], inputs
    with torch.no_grad():
        for stage in stages:
            if getattr(stage, "reversible", False):
                cases.append((stage, x))
            with frozen_running_stats(stage):
                x = stage(x)
    return cases


class CallCounter:
    """Counts the evaluations of every leaf module that holds parameters (convolutions, norms, linears)."""

    def __init__(self, module: nn.Module):
        self.modules = [m for m in module.modules() if not list(m.children()) and list(m.parameters(recurse=False))]
        self.calls = {id(m): 0 for m in self.modules}
        self.handles = [m.register_forward_hook(self._hook) for m in self.modules]

    def _hook(self, module, *args):
        self.calls[id(module)] += 1

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


class ReversibleStageContract:
    """Tests every case of the `stage_cases` fixture (a list of (stage, input) pairs) that subclasses provide."""

    inversion_tolerance = 1e-12
    gradient_tolerance = 1e-10

    def test_inverse_of_forward_is_identity(self, stage_cases):
        assert stage_cases, "no reversible stage to test"
        for stage, x in stage_cases:
            with torch.no_grad(), frozen_running_stats(stage):
                rebuilt = stage.inverse(stage(x))
            for got, want in zip(as_tuple(rebuilt), as_tuple(x)):
                assert relative_error(got, want) < self.inversion_tolerance, type(stage).__name__

    def test_fused_backward_matches_autograd_evaluating_each_function_once(self, stage_cases):
        for stage, x in stage_cases:
            device = as_tuple(x)[0].device  # the cases may live on a GPU (tests/gpu)
            generator = torch.Generator(device=device).manual_seed(3)
            params = list(stage.parameters())
            leaves = tuple(t.detach().requires_grad_(True) for t in as_tuple(x))
            with frozen_running_stats(stage):
                y = as_tuple(stage(leaves if isinstance(x, tuple) else leaves[0]))
            grads = tuple(torch.randn(t.shape, dtype=t.dtype, device=device, generator=generator) for t in y)
            expected = torch.autograd.grad(y, [*leaves, *params], grads)

            stage.zero_grad(set_to_none=True)
            counter = CallCounter(stage)
            with torch.no_grad():
                outputs = tuple(t.detach() for t in y)
                rebuilt, input_grads = stage.reconstruct_and_backward(
                    outputs if isinstance(x, tuple) else outputs[0], grads if isinstance(x, tuple) else grads[0]
                )
            counter.remove()
            assert set(counter.calls.values()) == {1}, "each sub-function must run exactly once"
            for got, want in zip(as_tuple(rebuilt), as_tuple(x)):
                assert relative_error(got, want) < self.inversion_tolerance
            for got, want in zip(as_tuple(input_grads), expected[: len(leaves)]):
                assert relative_error(got, want) < self.gradient_tolerance
            for param, want in zip(params, expected[len(leaves) :]):
                assert relative_error(param.grad, want) < self.gradient_tolerance

    def test_streams_keep_their_dtype_under_autocast(self, stage_cases):
        """F may run in bf16; the streams, the coupling and the reconstruction stay float32 (at frozen weights the
        reconstruction is then as exact as in float32)."""
        for stage, x in stage_cases:
            stage = copy.deepcopy(stage).float()
            x = tuple(t.float() for t in as_tuple(x)) if isinstance(x, tuple) else x.float()
            autocast = torch.autocast(as_tuple(x)[0].device.type, dtype=torch.bfloat16)
            with torch.no_grad(), frozen_running_stats(stage), autocast:
                y = stage(x)
                rebuilt = stage.inverse(y)
                fused, grads = stage.reconstruct_and_backward(y, y)
            for value in (y, rebuilt, fused, grads):
                assert {t.dtype for t in as_tuple(value)} == {torch.float32}, type(stage).__name__
            for got, fused_got, want in zip(as_tuple(rebuilt), as_tuple(fused), as_tuple(x)):
                assert relative_error(got, want) < 1e-5 and relative_error(fused_got, want) < 1e-5
