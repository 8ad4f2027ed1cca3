"""Run a script where petra_hub cannot be imported: what a `trust_remote_code` user without the package has."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

_BLOCK_PETRA_HUB = textwrap.dedent(
    """
    import importlib.abc
    import sys


    class NoPetraHub(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "petra_hub" or name.startswith("petra_hub."):
                raise ImportError(f"{name} is blocked in this process")
            return None


    sys.meta_path.insert(0, NoPetraHub())
    sys.modules.pop("petra_hub", None)
    """
)


def run_without_petra_hub(script: str, args: list[str], folder: Path) -> subprocess.CompletedProcess:
    """`script` (Python source) run in a fresh interpreter in `folder`, every import of petra_hub refused, offline,
    remote code cached under `folder`; its arguments `args`. The caller checks the return code and output."""
    path = folder / "without_petra_hub.py"
    path.write_text(_BLOCK_PETRA_HUB + textwrap.dedent(script))
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(folder / "modules"), OMP_NUM_THREADS="1",
               TRANSFORMERS_VERBOSITY="error")
    return subprocess.run([sys.executable, str(path), *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=120)
