"""The training recipe behind `recipes/train_revnet.py` and the `petra-train` command.

    OMP_NUM_THREADS=1 accelerate launch --config_file accelerate_config.yaml recipes/train_revnet.py \
        [config.yaml] [--flag value ...]

With no arguments: a small RevNet18 (widths 16,32,64,128, embedding 16) on the embedded digits data, PETRA across
the launched processes, 12 epochs, evaluation every epoch, then a Hub-ready folder in
`outputs/revnet18-digits-petra`. `--model` picks another RevNet or a RevViT (`revvit-tiny`, ...). It follows
transformers' `run_image_classification.py`: `--dataset_name`, `--train_dir` / `--validation_dir`,
`--model_name_or_path`, `do_train` / `do_eval` / `do_predict`, `--resume_from_checkpoint`, and
`train_results.json` / `eval_results.json` / `all_results.json` in `output_dir`.

Arguments (`petra_hub.recipe.arguments`): the fields of `ModelArguments`, `DataArguments` and
`RecipeTrainingArguments` (whose defaults are the recipe's, so `--help` shows them). One YAML or JSON file, anywhere
on the command line, is read with `HfArgumentParser.parse_dict`; flags given on the command line override it; `null`
unsets a value, in the file as on the command line (`--hidden_sizes null`: the preset's widths).
"""

from .arguments import DataArguments, ModelArguments, RecipeTrainingArguments, build_parser, parse, resolve_checkpoint
from .train import main, prepare, run

__all__ = [
    "DataArguments",
    "ModelArguments",
    "RecipeTrainingArguments",
    "build_parser",
    "main",
    "parse",
    "prepare",
    "resolve_checkpoint",
    "run",
]


if __name__ == "__main__":
    main()
