"""`import petra_hub` alone registers the model families with transformers' Auto classes: a saved folder loads
through `AutoModelForImageClassification` with petra_hub's own classes, without `trust_remote_code`."""

import os
import shutil
import subprocess
import sys
import textwrap


LOAD = textwrap.dedent(
    """
    import sys
    import petra_hub
    from transformers import AutoConfig, AutoModelForImageClassification
    for folder in sys.argv[1:]:
        model = AutoModelForImageClassification.from_pretrained(folder)
        config = AutoConfig.from_pretrained(folder)
        print(type(model).__module__, type(model).__name__, type(config).__module__)
    """
)


def _run(script, *arguments):
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", script, *map(str, arguments)], capture_output=True, text=True,
                            timeout=300, env=environment, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_importing_the_package_registers_the_auto_classes(tmp_path):
    import torch

    from petra_hub.testing.models import small_model, small_revvit

    folders = []
    for name, model in (("revnet", small_model(dtype=torch.float32)), ("revvit", small_revvit(dtype=torch.float32))):
        with_code, without_code = tmp_path / name, tmp_path / f"{name}-without-code"
        model.save_pretrained(with_code)  # auto_map and the code files: the folder could also run as remote code
        shutil.copytree(with_code, without_code, ignore=shutil.ignore_patterns("*.py"))
        folders += [with_code, without_code]
    lines = _run(LOAD, *folders).strip().splitlines()
    assert [line.split()[1] for line in lines] == ["RevNetForImageClassification"] * 2 + [
        "RevViTForImageClassification"] * 2
    for line in lines:
        model_module, _, config_module = line.split()
        # petra_hub's installed classes, not the folder's copy of the code run as remote code
        assert model_module.startswith("petra_hub.models."), line
        assert config_module.startswith("petra_hub.models."), line


def test_the_engine_alone_does_not_load_transformers_and_registration_follows_it():
    script = textwrap.dedent(
        """
        import sys
        import petra_hub.engine
        print("transformers" in sys.modules, "petra_hub.models" in sys.modules)
        from transformers import AutoConfig
        print(type(AutoConfig.for_model("revnet")).__module__)
        """
    )
    first, second = _run(script).strip().splitlines()
    assert first == "False False"
    assert second.startswith("petra_hub.models.")
