"""`torch.compile` for pipeline stages: compile what each stage evaluates, in place (state-dict keys unchanged).

A reversible stage's forward, inverse and fused `reconstruct_and_backward` all call the same sub-modules (F and G
of a RevNet block): those are compiled, so the fused backward runs F's compiled forward and, through AOTAutograd,
its compiled backward; the cheap coupling additions stay eager. Any other stage compiles its whole forward (a
recomputation in the backward then reuses the same compiled graph). `Module.compile` keeps the modules in place,
so checkpoints, `state_dict` and `save_pretrained` see the original names.

Each compiled module keeps its own cache of graphs (`isolate_recompiles=True` unless the options say otherwise).
The F of every RevNet block shares one code object, and across widths, grad modes and batch-norm settings its
variants would otherwise exceed dynamo's recompile limit (8): dynamo then silently runs the rest eagerly, the fused
backwards first. The start-up handshake's dry run runs eagerly, so its batch of 2 compiles nothing.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from .stages import StageGroup


def compile_stage(stage: nn.Module, **options: Any) -> None:
    """Compile `stage` in place with `torch.compile` `options` (backend, mode, dynamic, ...)."""
    options.setdefault("isolate_recompiles", True)
    if isinstance(stage, StageGroup):
        for member in stage.members:
            compile_stage(member, **options)
    elif getattr(stage, "reversible", False):
        for child in stage.children():
            child.compile(**options)
    else:
        stage.compile(**options)
