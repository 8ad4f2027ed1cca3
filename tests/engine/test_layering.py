"""The runtime stands alone: `petra_hub.engine` imports neither `petra_hub.analysis` (profiles for predictions,
simulations, the synchronous rivals' replays) nor transformers, and none of its modules hides an import inside a
function (how an import cycle between two modules goes unnoticed)."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import petra_hub.engine

ENGINE = Path(petra_hub.engine.__file__).parent

LOADED = """
import importlib, json, pkgutil, sys
import petra_hub.engine
for module in pkgutil.iter_modules(petra_hub.engine.__path__, "petra_hub.engine."):
    importlib.import_module(module.name)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_engine_loads_no_analysis_and_no_transformers():
    result = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, timeout=300, check=True)
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert "petra_hub.engine.pipeline" in loaded
    assert not [name for name in loaded if name == "petra_hub.analysis" or name.startswith("petra_hub.analysis.")]
    assert not [name for name in loaded if name == "transformers" or name.startswith("transformers.")]


def _imports_inside_functions(path: Path) -> list[str]:
    """`from .x import y` (or `from ..x`) statements in the body of a function of the module at `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and inner.level > 0:
                    found.append(f"{path.name}:{inner.lineno} from {'.' * inner.level}{inner.module or ''}")
    return found


def test_no_engine_module_imports_inside_a_function():
    found = [hit for path in sorted(ENGINE.glob("*.py")) for hit in _imports_inside_functions(path)]
    assert not found, f"import these at the top of the module (a cycle hides behind an import in a function): {found}"


def test_the_engine_imports_nothing_of_the_analysis():
    for path in sorted(ENGINE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = ("." * node.level) + (node.module or "")
                assert "analysis" not in module, f"{path.name}:{node.lineno} imports {module}"
            elif isinstance(node, ast.Import):
                assert not any("petra_hub.analysis" in alias.name for alias in node.names), path.name
