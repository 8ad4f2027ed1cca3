"""`import petra_hub` alone registers the model families with transformers' Auto classes: a saved folder loads
through `AutoModelForImageClassification` with petra_hub's own classes, without `trust_remote_code`."""

import os
import subprocess
import sys
import textwrap

import pytest

SAVE = textwrap.dedent(
    """
    import sys
    import torch
    from petra_hub.testing.models import small_model, small_revvit
    small_model(dtype=torch.float32).save_pretrained(sys.argv[1])
    small_revvit(dtype=torch.float32).save_pretrained(sys.argv[2])
    """
)

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


@pytest.mark.parametrize("keep_code_files", [True, False], ids=["with_auto_map_code", "without_code_files"])
def test_importing_the_package_registers_the_auto_classes(tmp_path, keep_code_files):
    revnet, revvit = tmp_path / "revnet", tmp_path / "revvit"
    _run(SAVE, revnet, revvit)
    if not keep_code_files:
        for folder in (revnet, revvit):
            for code in folder.glob("*.py"):
                code.unlink()
    lines = _run(LOAD, revnet, revvit).strip().splitlines()
    assert [line.split()[1] for line in lines] == ["RevNetForImageClassification", "RevViTForImageClassification"]
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
