"""The `trust_remote_code` checks of the model tests, run together in one interpreter where petra_hub cannot be
imported (what a user without the package has).

Each check saves a model to a folder of its own, and that interpreter loads the folder with one of transformers' Auto
classes and `trust_remote_code=True`, runs the loaded model on the saved inputs if there are any, and reports what it
loaded. Starting an interpreter with torch and transformers takes seconds, so the test modules register their folders
here when they are imported (`register`), and the first test that asks for an outcome (`outcome`) has every
registered folder that has not been loaded yet prepared and loaded by one such interpreter; each test then asserts on
its own outcome. Every folder is loaded under its own name (each gets its own copy of the remote code) in its own
try block, and the petra_hub modules in `sys.modules` are listed after each load, so one folder that fails to load
fails only its test.
"""

from __future__ import annotations

import json
import subprocess
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from petra_hub.testing.remote_code import run_without_petra_hub

SCRIPT = """
    import json
    import sys
    import traceback
    import warnings

    import torch
    import transformers

    plan_file, report_file = sys.argv[1:3]
    with open(plan_file) as handle:
        plan = json.load(handle)
    reports = {}
    for name, job in plan.items():
        report = reports[name] = {"error": None, "petra_hub_importable": None, "model_module": None,
                                  "model_class": None, "config_module": None, "warnings": []}
        try:
            import petra_hub  # noqa: F401
        except ImportError:
            report["petra_hub_importable"] = False
        else:
            report["petra_hub_importable"] = True
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                auto_class = getattr(transformers, job["auto_class"])
                model = auto_class.from_pretrained(job["folder"], trust_remote_code=True)
            report["warnings"] = [str(warning.message) for warning in caught]
            report["model_module"], report["model_class"] = type(model).__module__, type(model).__name__
            report["config_module"] = type(model.config).__module__
            if job["inputs"] is not None:
                model.eval()
                with torch.no_grad():
                    torch.save(getattr(model(torch.load(job["inputs"])), job["output"]), job["saved"])
        except Exception:
            report["error"] = traceback.format_exc()
        report["petra_hub_modules"] = sorted(module for module in sys.modules if module.split(".")[0] == "petra_hub")
    with open(report_file, "w") as handle:
        json.dump(reports, handle)
"""


@dataclass
class RemoteLoad:
    """What the interpreter without petra_hub does with a prepared folder: load it with `auto_class` (a name in
    transformers), and, if `inputs` are given, run the model (in eval mode, without gradients) on them and save the
    `output` field of its result. `expected` is kept for the test (the saved model, the outputs it expects...)."""

    auto_class: str
    inputs: torch.Tensor | None = None
    output: str = "logits"
    expected: Any = None


@dataclass
class Outcome:
    """One folder as the interpreter without petra_hub loaded it. `error` is the traceback of a failed load (or the
    failed interpreter's stderr), None when the folder loaded; `output` is the saved output of the model."""

    folder: Path
    expected: Any
    error: str | None
    petra_hub_importable: bool | None = None
    model_module: str | None = None
    model_class: str | None = None
    config_module: str | None = None
    warnings: list[str] = field(default_factory=list)
    petra_hub_modules: list[str] | None = None
    output: torch.Tensor | None = None


_PREPARATIONS: dict[str, Callable[[Path], RemoteLoad]] = {}
_OUTCOMES: dict[str, Outcome | BaseException] = {}


def register(name: str, prepare: Callable[[Path], RemoteLoad]) -> None:
    """Register a check: `prepare(folder)` saves a model to `folder` (named `name`, which must therefore be a valid
    Python identifier, unique among the checks: transformers names the remote code's module after the folder) and
    says what to do with it."""
    if not name.isidentifier():
        raise ValueError(f"{name!r} is no Python identifier")
    _PREPARATIONS[name] = prepare


def outcome(name: str, tmp_path_factory) -> Outcome:
    """The outcome of check `name`; the first call loads every registered folder not loaded yet, in one interpreter.
    A preparation that raised raises again here, for its own test only."""
    if name not in _OUTCOMES:
        _run([pending for pending in _PREPARATIONS if pending not in _OUTCOMES], tmp_path_factory)
    result = _OUTCOMES[name]
    if isinstance(result, BaseException):
        raise result
    return result


def _run(names: list[str], tmp_path_factory) -> None:
    root = tmp_path_factory.mktemp("remote_code")
    plan, loads = {}, {}
    for name in names:
        folder = root / name
        try:
            # The preparations of other modules' checks run during whichever test comes first: they leave the global
            # random state of this process as they found it.
            with torch.random.fork_rng(devices=[]):
                load = _PREPARATIONS[name](folder)
        except Exception as error:
            _OUTCOMES[name] = error
            continue
        inputs = None
        if load.inputs is not None:  # beside the folder, not in it: the folder holds only what save_pretrained wrote
            inputs = root / f"{name}.inputs.pt"
            torch.save(load.inputs, inputs)
        loads[name] = load
        plan[name] = {"folder": str(folder), "auto_class": load.auto_class, "inputs": str(inputs) if inputs else None,
                      "output": load.output, "saved": str(root / f"{name}.output.pt")}
    if not plan:
        return
    (root / "plan.json").write_text(json.dumps(plan))
    report_file = root / "report.json"
    try:
        result = run_without_petra_hub(SCRIPT, [str(root / "plan.json"), str(report_file)], root)
        failure = None if result.returncode == 0 and report_file.is_file() else (
            f"the interpreter without petra_hub exited with {result.returncode}:\n{result.stderr[-3000:]}")
    except subprocess.TimeoutExpired:
        failure = f"the interpreter without petra_hub timed out:\n{traceback.format_exc()}"
    reports = {} if failure else json.loads(report_file.read_text())
    for name, load in loads.items():
        report = reports.get(name, {"error": failure or "no report"})
        saved = Path(plan[name]["saved"])
        _OUTCOMES[name] = Outcome(folder=root / name, expected=load.expected, **report,
                                  output=torch.load(saved) if saved.is_file() else None)
