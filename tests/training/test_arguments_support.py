"""No silent no-ops: every field of `PetraTrainingArguments` is honoured, refused with a clear ValueError, or listed
as meaningless for PETRA (docs/training-arguments.md), and the docs table is the one the code generates.

The fields come from the dataclass itself, so a new transformers release cannot slip one in unnoticed."""

import dataclasses
import types
import typing
from pathlib import Path

import pytest
from transformers import TrainingArguments

from petra_hub.training import PetraTrainingArguments
from petra_hub.training.support import (
    HONOURED,
    NOT_APPLICABLE,
    REFUSED,
    STATUSES,
    TRAINING_ARGUMENT_SUPPORT,
    check_supported,
    markdown_table,
    replace_table,
    table_in,
)
from petra_hub.training.support_table import FieldSupport

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "training-arguments.md"
FIELDS = {field.name: field for field in dataclasses.fields(PetraTrainingArguments)}


def by_status(status: str) -> list[str]:
    return [
        name for name in FIELDS
        if name in TRAINING_ARGUMENT_SUPPORT and TRAINING_ARGUMENT_SUPPORT[name].status == status
    ]


def default_of(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    return field.default_factory()


# -- (1) every field has exactly one entry ---------------------------------------------------------------------------


def test_every_dataclass_field_is_classified():
    missing = sorted(set(FIELDS) - set(TRAINING_ARGUMENT_SUPPORT))
    assert not missing, f"classify these fields in petra_hub/training/support.py (and regenerate the docs): {missing}"


def test_no_stale_entries():
    stale = sorted(set(TRAINING_ARGUMENT_SUPPORT) - set(FIELDS))
    assert not stale, f"these entries name no field of PetraTrainingArguments any more: {stale}"


def test_the_transformers_fields_are_all_there():
    """PetraTrainingArguments adds fields; it must not hide any of TrainingArguments'."""
    assert {field.name for field in dataclasses.fields(TrainingArguments)} <= set(FIELDS)


def test_entries_are_well_formed():
    for name, support in TRAINING_ARGUMENT_SUPPORT.items():
        assert isinstance(support, FieldSupport) and support.status in STATUSES, name
        assert support.note.strip() and "\n" not in support.note, name
    assert all(TRAINING_ARGUMENT_SUPPORT[name].status == HONOURED for name in FIELDS if name.startswith("petra_"))
    with pytest.raises(ValueError, match="status"):
        FieldSupport("ignored", "a status that does not exist")
    with pytest.raises(dataclasses.FrozenInstanceError):
        TRAINING_ARGUMENT_SUPPORT["seed"].status = REFUSED


@pytest.mark.parametrize(
    "name",
    # Fields that once changed nothing: each is now honoured or refused.
    ["max_grad_norm", "bf16", "fp16", "torch_compile", "label_smoothing_factor", "eval_on_start",
     "load_best_model_at_end", "hub_strategy", "do_train"],
)  # fmt: skip
def test_the_reported_no_ops_are_settled(name):
    expected = {"do_train": NOT_APPLICABLE}
    assert TRAINING_ARGUMENT_SUPPORT[name].status == expected.get(name, HONOURED)


# -- (2) a refused field set to anything but its default is a ValueError naming it ------------------------------------

# Values a type alone cannot suggest sensibly (a choice among names, a path, a list of keys).
SENSIBLE = {
    "include_num_input_tokens_seen": "all",
    "train_sampling_strategy": "group_by_length",
    "length_column_name": "num_pixels",
    "debug": "underflow_overflow",
    "torch_compile_backend": "inductor",
    "torch_compile_mode": "reduce-overhead",
    "ddp_backend": "gloo",
    "fsdp": "full_shard",
    "fsdp_config": {"min_num_params": 1000},
    "deepspeed": "ds_config.json",
    "optim_target_modules": "all-linear",
    "label_names": ["targets"],
    "include_for_metrics": ["inputs"],
    "dataloader_multiprocessing_context": "spawn",
    "accelerator_config": {"split_batches": True},
    "activation_checkpointing_kwargs": {"use_reentrant": False},
    "gradient_checkpointing_kwargs": {"use_reentrant": False},
    "liger_kernel_config": {"rope": True},
}


def parallelism_config():
    from accelerate.parallelism_config import ParallelismConfig

    return ParallelismConfig(dp_shard_size=2)


BUILDERS = {"parallelism_config": parallelism_config}  # an object only accelerate can build

# Refused fields for which no non-default value can be built here, with the reason.
SKIPPED: dict[str, str] = {}


def type_names(annotation) -> set[str]:
    """The names of the types in a field's annotation ('int', 'str', 'dict', ...), whatever its spelling."""
    if isinstance(annotation, str):
        return {part.strip().split("[")[0] for part in annotation.split("|")}
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return set().union(*(type_names(arg) for arg in typing.get_args(annotation)))
    origin = typing.get_origin(annotation) or annotation
    return {getattr(origin, "__name__", str(origin))}


def non_default_value(field: dataclasses.Field):
    """A sensible value other than the field's default, from its type."""
    if field.name in SENSIBLE:
        return SENSIBLE[field.name]
    if field.name in BUILDERS:
        return BUILDERS[field.name]()
    default = default_of(field)
    names = type_names(field.type)
    if isinstance(default, bool) or (default is None and names & {"bool"} and not names & {"str", "dict"}):
        return not default
    if isinstance(default, (int, float)):
        return default + 1
    if default is None and "int" in names:
        return 2
    if default is None and "float" in names:
        return 0.5
    if default is None and "dict" in names:
        return {"key": 1}
    if default is None and "str" in names:
        return "something"
    raise LookupError(f"no non-default value for {field.name}: {field.type!r} = {default!r}")


@pytest.mark.parametrize("name", by_status(REFUSED))
def test_refused_field_raises_naming_it(name, tmp_path):
    if name in SKIPPED:
        pytest.skip(SKIPPED[name])
    value = non_default_value(FIELDS[name])
    with pytest.raises(ValueError) as raised:
        PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", **{name: value})
    message = str(raised.value)
    assert name in message and "PetraTrainer" in message
    assert TRAINING_ARGUMENT_SUPPORT[name].note in message  # why, and what to do instead


@pytest.mark.parametrize("name", ["bf16_full_eval", "gradient_checkpointing", "include_num_input_tokens_seen"])
def test_a_refused_field_at_its_default_or_its_equivalent_is_accepted(name, tmp_path):
    equivalent = {"gradient_checkpointing": False, "include_num_input_tokens_seen": False}
    value = equivalent.get(name, default_of(FIELDS[name]))
    args = PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", **{name: value})
    check_supported(args)


def test_the_first_refused_field_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"^fp16_full_eval=True"):  # it comes before use_liger_kernel
        PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", use_liger_kernel=True, fp16_full_eval=True)


def test_rebuilt_arguments_are_accepted(tmp_path):
    """transformers normalises some values (debug '' -> [], accelerator_config None -> AcceleratorConfig(), ...);
    rebuilding the arguments runs the check again on those."""
    args = PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", label_names=["labels"])
    rebuilt = dataclasses.replace(args, seed=1)
    assert rebuilt.seed == 1 and rebuilt.debug == [] and rebuilt.accelerator_config is not None


def test_a_subclass_cannot_turn_a_refused_feature_on_by_default(tmp_path):
    """Defaults are transformers' own: a subclass's default counts as a setting (its own new fields are its own)."""

    @dataclasses.dataclass
    class Custom(PetraTrainingArguments):
        bf16_full_eval: bool = True
        my_knob: int = 3

    with pytest.raises(ValueError, match=r"^bf16_full_eval=True"):
        Custom(output_dir=str(tmp_path), report_to="none")
    assert Custom(output_dir=str(tmp_path), report_to="none", bf16_full_eval=False).my_knob == 3


@pytest.mark.parametrize(
    "settings, named",
    [
        (dict(optim="lomo"), "optim"),
        (dict(optim="galore_adamw", optim_target_modules=None), "optim"),
        (dict(optim="schedule_free_sgd"), "optim"),
        (dict(lr_scheduler_type="reduce_lr_on_plateau", eval_strategy="epoch"), "lr_scheduler_type"),
        (dict(lr_scheduler_type="greedy", eval_strategy="epoch"), "lr_scheduler_type"),
        (dict(lr_scheduler_type="cosine", petra_lr_milestones="2,4"), "lr_scheduler_type"),
        (
            dict(lr_scheduler_type="constant", lr_scheduler_kwargs={"x": 1}, petra_lr_milestones="2"),
            "lr_scheduler_kwargs",
        ),
        (dict(save_strategy="best", metric_for_best_model="accuracy"), "save_strategy"),
        (dict(optim="adamw_torch", optim_args="null"), "optim_args"),  # crashed inside Trainer's optimizer setup
    ],
)  # fmt: skip
def test_values_an_honoured_field_cannot_take_are_refused(settings, named, tmp_path):
    assert TRAINING_ARGUMENT_SUPPORT[named].status == HONOURED
    with pytest.raises(ValueError, match=rf"^{named}="):
        PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", **settings)


@pytest.mark.parametrize(
    "settings",
    [
        dict(lr_scheduler_type="constant", petra_lr_milestones="150,225"),  # the paper recipes
        dict(lr_scheduler_type="constant_with_warmup", petra_lr_milestones="2"),  # the docs name the three allowed
        dict(petra_lr_milestones="2"),  # the default linear
        dict(lr_scheduler_type="cosine", lr_scheduler_kwargs={"num_cycles": 0.5}),
        dict(optim="sgd", optim_args="momentum=0.9,nesterov=True"),
        dict(save_strategy="epoch", eval_strategy="epoch", load_best_model_at_end=True, save_total_limit=2),
    ],
)
def test_honoured_values_are_accepted(settings, tmp_path):
    PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", **settings)


def test_an_unclassified_transformers_field_is_refused_when_set(tmp_path, monkeypatch):
    """What a field new in a transformers release meets at run time, until it is classified."""
    import petra_hub.training.support as support

    args = PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", eval_delay=3)
    monkeypatch.delitem(support.TRAINING_ARGUMENT_SUPPORT, "eval_delay")
    with pytest.raises(ValueError, match=r"^eval_delay=3.*not been checked"):
        check_supported(args)
    check_supported(PetraTrainingArguments(output_dir=str(tmp_path), report_to="none"))


# -- (3) the docs page holds the generated table ----------------------------------------------------------------------


def test_docs_table_is_the_generated_one():
    text = PAGE.read_text(encoding="utf-8")
    assert table_in(text) == markdown_table(), "regenerate it: python -m petra_hub.training.support --write"
    assert replace_table(text) == text
    before = text.split("<!-- table:training-arguments -->")[0]
    assert before.strip().count("\n") >= 2, "the page starts with a hand-written introduction"


def test_docs_table_has_one_row_per_field():
    table = markdown_table()
    for name, support in TRAINING_ARGUMENT_SUPPORT.items():
        rows = [line for line in table.splitlines() if line.startswith(f"| `{name}` |")]
        assert len(rows) == 1, name
        assert support.status.replace("_", " ") in rows[0] and support.note.replace("|", "\\|") in rows[0], name


# -- (4) not-applicable fields are harmless at any value --------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        dict(do_train=True, do_eval=True, do_predict=True),
        dict(resume_from_checkpoint="outputs/checkpoint-10"),
        dict(use_cache=True),
        dict(logging_nan_inf_filter=False),
        dict(eval_accumulation_steps=4, eval_use_gather_object=True),
        dict(local_rank=0),
    ],
)
def test_not_applicable_fields_are_not_refused(settings, tmp_path):
    assert all(TRAINING_ARGUMENT_SUPPORT[name].status == NOT_APPLICABLE for name in settings)
    args = PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", **settings)
    check_supported(args)


def test_a_refused_field_set_after_the_arguments_were_built_is_refused_by_the_trainer(tmp_path):
    """`args.save_only_model = True` after construction (a common pattern) was accepted and ignored: the checkpoint
    still held every stage's optimizer state."""
    from petra_hub.training import PetraTrainer
    from tests.training.test_trainer import make_trainer

    for name, value in (("save_only_model", True), ("bf16_full_eval", True)):
        trainer = make_trainer(tmp_path / name, max_steps=1)
        setattr(trainer.args, name, value)
        for call in (trainer.train, trainer.evaluate, lambda: trainer.predict(trainer.eval_dataset)):
            with pytest.raises(ValueError, match=rf"{name}=True is not supported by PetraTrainer"):
                call()
    args = PetraTrainingArguments(output_dir=str(tmp_path / "built"), report_to=[])
    args.save_only_model = True
    with pytest.raises(ValueError, match="save_only_model=True is not supported by PetraTrainer"):
        PetraTrainer(model=trainer.model, args=args, train_dataset=trainer.train_dataset,
                     data_collator=trainer.data_collator)


@pytest.mark.parametrize("settings, message", [
    ({"petra_weight_prediction": -1}, r"petra_weight_prediction must be >= 0 \(0: off\), got -1"),
    ({"petra_check_reconstruction_every": -1}, r"petra_check_reconstruction_every must be a whole number >= 0"),
    ({"petra_data_parallel": 0}, "petra_data_parallel must be a whole number >= 1, got 0"),
    ({"petra_partition": "3,0"}, r"petra_partition must be .*each >= 1"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be a whole number >= 1"),
    ({"petra_timeout": 0}, "petra_timeout must be a positive number of seconds"),
])
def test_the_engines_checks_refuse_a_knob_under_the_arguments_field_name(settings, message, tmp_path):
    """The engine's option objects check each knob once; the arguments build them when they are built."""
    with pytest.raises(ValueError, match=message):
        PetraTrainingArguments(output_dir=str(tmp_path), report_to="none", **settings)
