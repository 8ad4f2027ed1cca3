"""The recipe's arguments: `ModelArguments`, `RecipeTrainingArguments` (TrainingArguments with the recipe's
defaults) and `DataArguments`, read from the defaults, one YAML or JSON file, then command-line flags, and checked
before any work starts (unknown config keys, flags that would shape no model, a checkpoint to resume from)."""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from dataclasses import dataclass, field, fields
from typing import get_args, get_origin, get_type_hints

import yaml
from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType
from transformers.training_args import OptimizerNames

from ..engine import Mode
from ..models.families import family_of_preset, preset_names, registered_families
from ..training.arguments import PetraTrainingArguments
from ..training.checkpoint import checkpoint_to_resume
from .data import DataArguments
from ..training.support_table import REFUSED, TRAINING_ARGUMENT_SUPPORT


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")
NULLS = ("null", "Null", "NULL", "None")  # on the command line, what YAML's null is in the file: unset


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "A saved RevNet or RevViT folder (or Hub id) to fine-tune; default: a new --model."},
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Fine-tuning: a new classification head when the number of labels differs."}
    )
    model: str = field(
        default="revnet18", metadata={"help": "A new model: " + ", ".join(preset_names()) + ". Its family's recipe "
                                      "defaults apply where no flag says otherwise (a RevViT trains with AdamW; "
                                      "docs/recipe.md)"}
    )
    stem: str | None = field(
        default=None, metadata={"help": "RevNet: cifar or imagenet; default: imagenet from 128 pixels"}
    )
    downsampling: str = field(default="buffered", metadata={"help": "RevNet: buffered (the paper) or invertible"})
    hidden_sizes: str | None = field(
        default="16,32,64,128", metadata={"help": "RevNet: per-stream widths; 'paper' or null for the preset's."}
    )
    embedding_size: int | None = field(
        default=16, metadata={"help": "RevNet: stem width per stream; 0 or null for the preset's."}
    )
    patch_size: int | None = field(
        default=None, metadata={"help": "RevViT: patch side; default: the preset's 16 from 128 pixels, else 4"}
    )
    layer_scale_init_value: float | None = field(
        default=None, metadata={"help": "RevViT: LayerScale, each block's attention and MLP outputs scaled by a "
                                        "learned per-channel gain starting at this value; default: 1e-4 for a new "
                                        "RevViT (its family's recipe default), null: none, the paper's blocks"}
    )
    qk_norm: bool | None = field(
        default=None, metadata={"help": "RevViT: a LayerNorm per attention head on queries and keys; default: the "
                                        "preset's none"}
    )
    conv_stem: bool | None = field(
        default=None, metadata={"help": "RevViT: a convolutional stem (3x3 convolutions of stride 2 with BatchNorm "
                                        "and ReLU, then a 1x1) in place of the patchify convolution; default: true "
                                        "for a new RevViT (its family's recipe default), false or null: the paper's "
                                        "patchify convolution"}
    )
    drop_path_rate: float | None = field(
        default=None, metadata={"help": "RevViT: stochastic depth, the last block's drop probability (rising "
                                        "linearly from 0 at the first); default: the preset's 0"}
    )

    def __post_init__(self):
        self.hidden_sizes = hidden_sizes_flag(self.hidden_sizes)


def hidden_sizes_flag(value) -> str | None:
    """`--hidden_sizes` checked: comma-separated positive integers (a YAML list of them is joined), 'paper' or None;
    a ValueError naming the flag otherwise."""
    if value is None or value == "paper":
        return value
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ValueError(f"--hidden_sizes {value!r}: expected comma-separated positive integers, one width per "
                         "layer (e.g. 16,32,64,128), 'paper' or null for the preset's widths")
    return ",".join(parts)


# ModelArguments that pick the model rather than shape it; the others are a family's recipe flags
# (`ModelFamily.recipe_flags`), refused for another family's model and with --model_name_or_path.
MODEL_CHOICE = ("model_name_or_path", "ignore_mismatched_sizes", "model")


def _recipe_default(name: str, value):
    """TrainingArguments' field `name` (help text included) with the recipe's default."""
    return field(default=value, metadata=dict(PetraTrainingArguments.__dataclass_fields__[name].metadata))


@dataclass
class RecipeTrainingArguments(PetraTrainingArguments):
    """`PetraTrainingArguments` with the recipe's defaults (the README's main job)."""

    output_dir: str | None = _recipe_default("output_dir", "outputs/revnet18-digits-petra")
    do_train: bool = _recipe_default("do_train", True)
    do_eval: bool = _recipe_default("do_eval", True)
    eval_strategy: IntervalStrategy | str = _recipe_default("eval_strategy", "epoch")
    per_device_train_batch_size: int = _recipe_default("per_device_train_batch_size", 32)
    per_device_eval_batch_size: int = _recipe_default("per_device_eval_batch_size", 128)
    learning_rate: float = _recipe_default("learning_rate", 0.05)
    weight_decay: float = _recipe_default("weight_decay", 5e-4)
    max_grad_norm: float = _recipe_default("max_grad_norm", 0.0)  # no clipping, as in the paper
    # weight prediction over half the delay: better than plain PETRA on 6 of 7 seeds of the main job's setting, equal
    # on the 7th (docs/delay-remedies.md); the engine's and PetraTrainer's default stays the paper's PETRA
    petra_weight_prediction: float = _recipe_default("petra_weight_prediction", 0.5)
    num_train_epochs: float = _recipe_default("num_train_epochs", 12.0)
    lr_scheduler_type: SchedulerType | str = _recipe_default("lr_scheduler_type", "cosine")
    warmup_steps: float = _recipe_default("warmup_steps", 0.05)
    logging_steps: float = _recipe_default("logging_steps", 10)
    save_strategy: SaveStrategy | str = _recipe_default("save_strategy", "no")
    seed: int = _recipe_default("seed", 0)
    optim: OptimizerNames | str = _recipe_default("optim", "sgd")
    optim_args: str | None = _recipe_default("optim_args", "momentum=0.9,nesterov=True")
    remove_unused_columns: bool = _recipe_default("remove_unused_columns", False)  # transforms need the image column
    overwrite_output_dir: bool = field(
        default=True,
        metadata={"help": "A second run into the same output_dir replaces the earlier run's outputs, as transformers' "
                          "Trainer trains into it again: before training, its checkpoints, metrics "
                          "(*_results.json/txt), model files, model card and code files are removed (logged by name); "
                          "other files stay, and nothing is removed when resuming from one of the folder's own "
                          "checkpoints. False refuses a folder that holds another run instead."},
    )


def build_parser() -> HfArgumentParser:
    parser = HfArgumentParser(
        (ModelArguments, DataArguments, RecipeTrainingArguments),
        usage="%(prog)s [config.yaml | config.json] [--flag value ...]",
        description="Train a RevNet or a RevViT with PETRA (petra_hub's recipe). A YAML/JSON file of flags may "
                    "stand anywhere on the command line; flags given on the command line override it.",
        allow_abbrev=False,
    )
    mark_refused_fields(parser)
    return parser


def mark_refused_fields(parser: argparse.ArgumentParser) -> None:
    """Replace the help of every flag of a field the support table refuses (and of its --no_ form) by
    "[refused by petra_hub: <the table's reason>]": transformers' help would describe a feature PetraTrainer refuses."""
    for action in parser._actions:  # argparse's list of the parser's arguments
        support = TRAINING_ARGUMENT_SUPPORT.get(action.dest)
        if support is not None and support.status == REFUSED:
            action.help = f"[refused by petra_hub: {support.note}]".replace("%", "%%")  # argparse formats help with %


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def _field_names(parser: HfArgumentParser) -> list[str]:
    return [f.name for dtype in parser.dataclass_types for f in fields(dtype) if f.init]


def _split_config_file(parser: HfArgumentParser, argv: list[str]) -> tuple[str | None, list[str]]:
    """The config file (a .yaml/.yml/.json argument that is no flag's value) and the other arguments."""
    found, rest = [], []
    for i, token in enumerate(argv):
        previous = parser._option_string_actions.get(argv[i - 1]) if i else None  # argparse's option table
        is_value = previous is not None and previous.nargs is None and "=" not in argv[i - 1]
        if token.lower().endswith(CONFIG_SUFFIXES) and not token.startswith("-") and not is_value:
            found.append(token)
        else:
            rest.append(token)
    if len(found) > 1:
        raise ValueError(f"one config file at most, got {found}")
    return (found[0] if found else None), rest


def _optional_fields(parser: HfArgumentParser) -> set[str]:
    """The fields that may be None (`X | None`, `Optional[X]`)."""
    names = set()
    for dtype in parser.dataclass_types:
        hints = get_type_hints(dtype)  # the annotations: HfArgumentParser rewrites the fields' types
        names.update(name for name, kind in hints.items() if type(None) in get_args(kind))
    return names


def _null_flags(parser: HfArgumentParser, argv: list[str]) -> tuple[list[str], dict]:
    """(the other arguments, {name: None}) for the flags given `null` (or `None`) on the command line: as `null` in
    the config file, it unsets a field that may be None (argparse would read the word as a string, or refuse it as
    a number); for any other field it is an error naming the flag."""
    optional, rest, nulls = _optional_fields(parser), [], {}
    index = 0
    while index < len(argv):
        token = argv[index]
        option, attached, value = token.partition("=") if token.startswith("--") else (token, "", None)
        if not attached:
            value = argv[index + 1] if token.startswith("--") and index + 1 < len(argv) else None
        action = parser._option_string_actions.get(option)  # argparse's option table
        if action is None or value not in NULLS or action.nargs == 0:
            rest.append(token)
            index += 1
            continue
        if action.dest not in optional:
            raise ValueError(f"{option} {value}: this flag cannot be unset (it has no null value); give a value, or "
                             "leave the flag out for its default")
        nulls[action.dest] = None
        index += 1 if attached else 2
    return rest, nulls


def _read_config_file(parser: HfArgumentParser, path: str) -> dict:
    with open(path, encoding="utf-8") as handle:
        values = json.load(handle) if path.lower().endswith(".json") else yaml.safe_load(handle)
    values = {} if values is None else values
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of argument names to values, got {type(values).__name__}")
    known = _field_names(parser)
    unknown = [key for key in values if key not in known]
    if unknown:
        hints = [f"{key!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(str(key), known, 1))
                 else repr(key) for key in unknown]
        raise ValueError(f"{path}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
                         f"see --help for the arguments")
    hints = _type_hints(parser)
    for key, value in values.items():
        values[key] = _file_value(path, key, value, parser._option_string_actions[f"--{key}"], hints.get(key))
    return values


def _type_hints(parser: HfArgumentParser) -> dict:
    hints = {}
    for dtype in parser.dataclass_types:
        try:
            hints.update(get_type_hints(dtype))
        except (NameError, TypeError):  # an annotation that does not resolve: its values are taken as they come
            pass
    return hints


def _admits(hint, container: type) -> bool:
    """Whether the type annotation `hint` admits a `container` (dict or list) value."""
    return any((get_origin(option) or option) is container for option in (get_args(hint) or (hint,)))


def _file_value(path: str, key: str, value, action: argparse.Action, hint):
    """A config file's `value` for `--key` as the flag reads it (YAML reads 5e-4 as a string, 5,5 may come as a
    number, and a list of a comma-separated flag's items is joined); anything the field cannot take is a ValueError
    naming the file and key, before anything runs."""
    def refused(expected: str) -> ValueError:
        return ValueError(f"{path}: {key}: {value!r} is not {expected}")

    if isinstance(value, (dict, list)):
        if action.nargs in ("+", "*") and isinstance(value, list) or _admits(hint, type(value)):
            return value
        if isinstance(value, list) and action.type is str and all(isinstance(v, (str, int, float)) for v in value):
            return ",".join(map(str, value))  # a comma-separated flag (hidden_sizes: [8, 16], optim_args)
        raise refused(f"a single {getattr(action.type, '__name__', 'value')}")
    if value is None:
        return value
    try:
        if action.type is int:
            if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
                raise refused("a whole number")
            return int(value)
        if action.type is float:
            if isinstance(value, bool):
                raise refused("a number")
            return float(value)
        if action.type is string_to_bool:
            return value if isinstance(value, bool) else string_to_bool(value)
        if action.type is str and isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
        if str(error).startswith(path):
            raise
        raise ValueError(f"{path}: {key}: {value!r} is not a valid {action.type.__name__} ({error})") from None
    return value


def parse(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, RecipeTrainingArguments]:
    """(model, data, training) arguments from the defaults, a config file, then command-line flags."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    config_file, flags = _split_config_file(parser, argv)
    flags, nulls = _null_flags(parser, flags)
    values = _read_config_file(parser, config_file) if config_file else {}
    given = argparse.Namespace(**{name: _UNSET for name in _field_names(parser)})
    parser.parse_args(flags, namespace=given)  # only the flags present replace _UNSET
    values.update({key: value for key, value in vars(given).items() if value is not _UNSET})
    values.update(nulls)
    if values.get("do_eval") is False and "eval_strategy" not in values:
        values["eval_strategy"] = "no"  # turning evaluation off turns off the recipe's default per-epoch evaluation
    check_architecture_flags(values)
    if not values.get("model_name_or_path"):  # a new model trains with its family's defaults where none is given
        family, _ = family_of_preset(values.get("model", ModelArguments.model))
        defaults = dict(family.recipe_defaults)
        if delayed_mode(values.get("petra_mode", RecipeTrainingArguments.petra_mode)):
            defaults.update(family.delayed_recipe_defaults)
        values.update({key: value for key, value in defaults.items() if key not in values})
    model_args, data_args, training_args = parser.parse_dict(values)
    if "output_dir" not in values:  # name the folder after what it will hold
        training_args.output_dir = default_output_dir(model_args, data_args, training_args)
    return model_args, data_args, training_args


def delayed_mode(name) -> bool:
    """Whether the mode `name` trains with delayed gradients (False for a name that is no mode: the arguments'
    own check refuses it by name)."""
    try:
        return Mode.parse(name).pipelined
    except (ValueError, TypeError, AttributeError):
        return False


def default_output_dir(model_args: ModelArguments, data_args: DataArguments, args: PetraTrainingArguments) -> str:
    """outputs/<model>-<data>-<mode>, e.g. outputs/revnet18-digits-petra (the default run's)."""
    model = os.path.basename(os.path.normpath(str(model_args.model_name_or_path or model_args.model)))
    return f"outputs/{model}-{data_args.set_name}-{args.petra_mode}"


def check_architecture_flags(values: dict) -> None:
    """Refuse the flags that would shape no model: another family's, or any with --model_name_or_path."""
    shaping = [field.name for field in fields(ModelArguments) if field.name not in MODEL_CHOICE]
    given = [key for key in shaping if values.get(key) is not None]
    if values.get("model_name_or_path"):
        given += ["model"] if "model" in values else []
        if given:
            raise ValueError(
                f"--{given[0]} shapes a new model, but --model_name_or_path {values['model_name_or_path']!r} brings "
                "its own architecture: drop the flag, or drop --model_name_or_path to train a new model"
            )
        return
    family, values["model"] = family_of_preset(values.get("model", ModelArguments.model))
    unknown = [flag for flag in family.recipe_flags if flag not in shaping]
    if unknown:
        raise ValueError(f"model family {family.title!r} declares recipe_flags {unknown}, which are not flags of the "
                         f"recipe (its shaping flags are {', '.join(shaping)})")
    foreign = [key for key in given if key not in family.recipe_flags]
    if foreign:
        owners = [other.title for other in registered_families().values() if foreign[0] in other.recipe_flags]
        own = ", ".join("--" + key for key in family.recipe_flags) or "none"
        raise ValueError(f"--{foreign[0]} shapes {' or '.join(owners) or 'another model family'} models, not "
                         f"--model {values['model']} ({family.title}), whose own flags are {own}")


def resolve_checkpoint(value, output_dir: str) -> str | bool | None:
    """`--resume_from_checkpoint`: a checkpoint folder, or `true` / `last` for the last `checkpoint-N` of
    `output_dir`; `false` to start afresh, even in a job torchrun restarts (False); nothing to leave it to the
    trainer, which resumes a restarted job by itself (None). The words are the command line's; the rest is the
    trainer's."""
    word = str(value).strip().lower() if isinstance(value, str) else None
    if value is False or word in ("false", "no"):
        return False
    if word in ("", "none"):
        value = None
    elif word in ("true", "last", "yes"):
        value = True
    return checkpoint_to_resume(value, output_dir)
