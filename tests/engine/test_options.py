"""The pipeline's option objects check their own fields once, when built, naming the field and what it expects; a
front end reuses those checks under its own field names."""

import pytest
import torch

from petra_hub.engine import Diagnostics, Layout, MemoryOptions, OptionError, Pipeline, Remedies
from petra_hub.engine.options import fields_named


@pytest.mark.parametrize("build, message", [
    (lambda: Layout(partition="even"), "partition must be 'auto', None or the number of stages of each rank"),
    (lambda: Layout(partition=[2, 0]), r"partition must be .* \(each >= 1\), got \[2, 0\]"),
    (lambda: Layout(data_parallel_size=0), "data_parallel_size must be a whole number >= 1, got 0"),
    (lambda: Layout(device="nowhere"), "device must be a torch.device or a device name"),
    (lambda: Remedies(weight_prediction=-1), r"weight_prediction must be >= 0 \(0: off\), got -1"),
    (lambda: MemoryOptions(keep_graphs=[-1]), "keep_graphs must be stage indexes"),
    (lambda: MemoryOptions(memory_budget=-1), "memory_budget must be a whole number >= 0 bytes"),
    (lambda: Diagnostics(check_reconstruction_every=0), "check_reconstruction_every must be a whole number >= 1"),
    (lambda: Diagnostics(trace="yes"), "trace must be True or False"),
])
def test_a_wrong_field_is_named_with_what_it_expects(build, message):
    with pytest.raises(OptionError, match=message):
        build()


def test_options_are_normalised_and_compare_by_value():
    assert Layout(partition=[5, 5], device="cpu") == Layout(partition=(5, 5), device=torch.device("cpu"))
    assert MemoryOptions(keep_graphs=[0, 2]).keep_graphs == (0, 2)
    with pytest.raises(ValueError, match="not both"):
        MemoryOptions(keep_graphs=[0], memory_budget=10)


def test_the_pipeline_checks_its_core_arguments_and_option_types():
    stages = [torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)]
    with pytest.raises(OptionError, match="accumulation_steps must be a whole number >= 1"):
        Pipeline(stages, torch.nn.functional.cross_entropy, accumulation_steps=0)
    with pytest.raises(OptionError, match="timeout must be a positive number of seconds"):
        Pipeline(stages, torch.nn.functional.cross_entropy, timeout=0)
    with pytest.raises(TypeError, match="remedies must be a Remedies"):
        Pipeline(stages, torch.nn.functional.cross_entropy, remedies=0.5)


def test_a_front_end_names_its_own_fields():
    with pytest.raises(OptionError, match=r"^petra_weight_prediction must be >= 0 \(0: off\), got -2$"):
        with fields_named({"weight_prediction": "petra_weight_prediction"}):
            Remedies(weight_prediction=-2)
    with pytest.raises(OptionError, match=r"^every must be >= 0, got 0$"):
        with fields_named({"check_reconstruction_every": ("every", ">= 0")}):
            Diagnostics(check_reconstruction_every=0)
