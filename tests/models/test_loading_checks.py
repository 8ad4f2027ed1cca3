"""The loading checks every model family shares (petra_hub/models/loading_checks.py): non-finite weights warn naming
them, a bad config.json is an error naming the file, and the checks travel with `trust_remote_code` folders."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import petra_hub.models.loading_checks as shared
from petra_hub import RevNetForImageClassification, RevViTForImageClassification, RevViTModel
from petra_hub.testing.models import small_model, small_revvit

FAMILIES = {
    "revnet": (lambda: small_model("revnet18", dtype=torch.float32), "revnet.embedder.layers.1.running_var"),
    "revvit": (lambda: small_revvit("revvit-tiny", dtype=torch.float32), "revvit.encoder.1.mlp.norm.weight"),
}


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    build, inner = FAMILIES[request.param]
    return request.param, build(), inner


def poison(model: torch.nn.Module, inner: str) -> None:
    """NaN in the classifier's weight, infinity in an inner weight or statistic."""
    with torch.no_grad():
        model.classifier.weight[0, 0] = float("nan")
        model.state_dict()[inner].view(-1)[0] = float("inf")


def test_the_families_share_one_file():
    """Each family's loading_checks.py (imported relatively, so save_pretrained copies it) is the shared file."""
    import petra_hub.models.revnet.loading_checks as revnet
    import petra_hub.models.revvit.loading_checks as revvit

    assert RevNetForImageClassification.from_pretrained.__func__ is revnet.CheckedLoadingMixin.from_pretrained.__func__
    assert RevViTForImageClassification.from_pretrained.__func__ is revvit.CheckedLoadingMixin.from_pretrained.__func__
    source = Path(shared.__file__).resolve()
    assert Path(revnet.__file__).resolve() == source and Path(revvit.__file__).resolve() == source
    # It imports nothing of petra_hub: trust_remote_code users run it without the package.
    assert "petra_hub" not in source.read_text().split("from __future__")[1]


def test_non_finite_weights_warn_naming_them(family, tmp_path):
    name, model, inner = family
    poison(model, inner)
    model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="non-finite values") as caught:
        loaded = type(model).from_pretrained(tmp_path)
    message = " ".join(str(warning.message) for warning in caught if "non-finite" in str(warning.message))
    assert "classifier.weight" in message and inner in message
    assert type(model).__name__ in message
    assert torch.isnan(loaded.classifier.weight[0, 0])
    if name == "revvit":  # the base model, whose state-dict names lack the "revvit." prefix, warns too
        with pytest.warns(UserWarning, match=r"RevViTModel.*encoder\.1\.mlp\.norm\.weight"):
            RevViTModel.from_pretrained(tmp_path)


def test_finite_weights_load_without_a_warning(family, tmp_path):
    _, model, _ = family
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        type(model).from_pretrained(tmp_path)
    assert not [warning for warning in caught if "non-finite" in str(warning.message)]


@pytest.mark.parametrize("damage,error,message", [
    (lambda config: config.write_text("[1, 2]"), ValueError, "must hold a JSON object of .* got a list"),
    (lambda config: config.write_text("{"), ValueError, "is not valid JSON"),
    (lambda config: config.unlink(), FileNotFoundError, "needs its config.json"),
])
def test_a_bad_config_file_is_an_error_naming_it(family, tmp_path, damage, error, message):
    _, model, _ = family
    model.save_pretrained(tmp_path)
    damage(tmp_path / "config.json")
    with pytest.raises(error, match=message) as raised:
        type(model).from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(raised.value)
    # A config given explicitly needs no file.
    if not (tmp_path / "config.json").exists():
        assert type(type(model).from_pretrained(tmp_path, config=model.config)) is type(model)


REMOTE_NAN_SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import sys
    import warnings


    class NoPetraHub(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "petra_hub" or name.startswith("petra_hub."):
                raise ImportError(f"{name} is blocked in this process")
            return None


    sys.meta_path.insert(0, NoPetraHub())
    from transformers import AutoModelForImageClassification

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = AutoModelForImageClassification.from_pretrained(sys.argv[1], trust_remote_code=True)
    print("MODULE", type(model).__module__)
    print("WARNINGS", [str(warning.message) for warning in caught if "non-finite" in str(warning.message)])
    """
)


def test_the_checks_travel_with_remote_code(family, tmp_path):
    """A saved folder carries loading_checks.py as a plain file, and its remote code warns without petra_hub."""
    _, model, inner = family
    poison(model, inner)
    folder = tmp_path / "saved"
    model.save_pretrained(folder)
    copied = folder / "loading_checks.py"
    assert copied.is_file() and not copied.is_symlink()
    assert copied.read_text() == Path(shared.__file__).read_text()
    (tmp_path / "load.py").write_text(REMOTE_NAN_SCRIPT)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "PYTHONSTARTUP")}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"), OMP_NUM_THREADS="1",
               TRANSFORMERS_VERBOSITY="error")
    result = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(folder)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line.startswith(("MODULE", "WARN")))
    assert lines["MODULE"].startswith("transformers_modules")
    assert "classifier.weight" in lines["WARNINGS"] and inner in lines["WARNINGS"]
