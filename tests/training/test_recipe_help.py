"""`petra-train --help` says what holds for a pipeline: the effective batch size formula of a PETRA run, which
TrainingArguments fields PetraTrainer refuses (from the support table), and the training modes without stray
punctuation."""

import os
import re
import subprocess
import sys

import pytest

from petra_hub.recipe.arguments import build_parser
from petra_hub.training.support_table import REFUSED, TRAINING_ARGUMENT_SUPPORT

FORMULA = "per_device_train_batch_size * gradient_accumulation_steps * petra_data_parallel"
REFUSED_FIELDS = sorted(name for name, support in TRAINING_ARGUMENT_SUPPORT.items() if support.status == REFUSED)


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.fixture(scope="module")
def text(parser):
    return " ".join(parser.format_help().split())


def option_helps(raw: str) -> dict[str, str]:
    """{option: its help on one line} from argparse's help text: each option's block runs to the next option."""
    helps, option = {}, None
    for line in raw.splitlines():
        found = re.match(r"  (--[\w-]+)", line)
        if found:
            option = found.group(1)
            helps[option] = line
        elif option is not None and line.startswith("   "):
            # argparse wraps after hyphens ("micro-" / "batches"): those joins take no space
            helps[option] += ("" if helps[option].endswith("-") else " ") + line.strip()
        else:
            option = None
    return {name: " ".join(text.split()) for name, text in helps.items()}


def test_the_effective_batch_size_is_that_of_a_pipeline(text, parser):
    assert "num_devices" not in text
    assert text.count(FORMULA) >= 2  # per_device_train_batch_size's help and gradient_accumulation_steps'
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps"):
        (action,) = [action for action in parser._actions if action.dest == name]
        assert FORMULA in action.help and "num_devices" not in action.help


def test_every_refused_field_is_marked_with_the_support_tables_reason(parser, text):
    assert {"deepspeed", "fsdp", "bf16_full_eval", "ddp_timeout"} <= set(REFUSED_FIELDS)
    dests = {action.dest for action in parser._actions}
    assert set(REFUSED_FIELDS) <= dests  # every refused field is a flag of the recipe
    for action in parser._actions:
        if action.dest in REFUSED_FIELDS:
            note = TRAINING_ARGUMENT_SUPPORT[action.dest].note
            assert action.help.startswith(f"[refused by petra_hub: {note}]"), (action.dest, action.help)
        elif action.help is not None:
            assert "refused by petra_hub" not in action.help, action.dest
    helps = option_helps(parser.format_help())
    for name in REFUSED_FIELDS:
        assert f"[refused by petra_hub: {TRAINING_ARGUMENT_SUPPORT[name].note}]" in helps[f"--{name}"], name
    assert "Enable DeepSpeed integration" not in text  # transformers' help of a refused field is replaced


def test_the_modes_are_listed_without_stray_punctuation(text):
    assert ".;" not in text
    for mode in ("backprop:", "reversible_backprop:", "delayed:", "input_buffer:", "weight_stash:", "petra:"):
        assert mode in text


def test_petra_train_help_runs(tmp_path):
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    result = subprocess.run([sys.executable, "-c", "from petra_hub.recipe import main; main()", "--help"],
                            capture_output=True, text=True, timeout=300, env=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    shown = " ".join(result.stdout.split())
    assert FORMULA in shown and "num_devices" not in shown and ".;" not in shown
    assert "[refused by petra_hub: DeepSpeed wraps the whole model" in shown
