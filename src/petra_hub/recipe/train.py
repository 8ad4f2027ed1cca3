"""The recipe's run: the model it builds from --model or --model_name_or_path, the trainer, training, evaluation
and prediction, and the files a run writes (see the package docstring)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from transformers import set_seed

from ..data.sources.hub import names_a_missing_path
from ..models.families import DataShape, family_named, family_of_preset, registered_families
from ..training.trainer import PetraTrainer
from .arguments import ModelArguments, RecipeTrainingArguments, parse, resolve_checkpoint
from .data import DataArguments, RecipeData, load_data



# -- model ------------------------------------------------------------------------------------------------------------
def _label_maps(label_names: list[str]) -> dict:
    id2label = dict(enumerate(label_names))
    return {"num_labels": len(label_names), "id2label": id2label, "label2id": {n: i for i, n in id2label.items()}}


def pretrained_config(model_args: ModelArguments):
    """The configuration of `--model_name_or_path`; a ValueError unless petra_hub knows its family."""
    from transformers import AutoConfig

    if names_a_missing_path(model_args.model_name_or_path):
        raise FileNotFoundError(f"--model_name_or_path {model_args.model_name_or_path!r} is a local path, but there is "
                                "no such folder: expected a save_pretrained folder (config.json, model.safetensors) or "
                                "a Hub model id")
    config = AutoConfig.from_pretrained(model_args.model_name_or_path)
    if family_named(getattr(config, "model_type", None)) is None:
        raise ValueError(
            f"--model_name_or_path {model_args.model_name_or_path!r} holds a {getattr(config, 'model_type', '?')!r} "
            "model; PETRA trains reversible networks: give a folder of a registered family's model_type "
            f"({' or '.join(map(repr, registered_families()))}), or leave it unset and pick --model"
        )
    return config


def _new_config(model_args: ModelArguments, data: RecipeData):
    """The configuration of a new --model, shaped to the data by its family (with the family's recipe flags)."""
    family, preset = family_of_preset(model_args.model)
    flags = {name: getattr(model_args, name) for name in family.recipe_flags}
    return family.config_for_data(preset, flags, DataShape(image_size=data.image_size))


def build_model(model_args: ModelArguments, data: RecipeData):
    """A new model from --model (shaped to the data), or the pretrained one with the data's labels."""
    labels = _label_maps(data.label_names)
    if model_args.model_name_or_path:
        config = pretrained_config(model_args)
        if config.num_labels != labels["num_labels"] and not model_args.ignore_mismatched_sizes:
            raise ValueError(
                f"{model_args.model_name_or_path!r} classifies {config.num_labels} labels, the data has "
                f"{labels['num_labels']}: pass --ignore_mismatched_sizes to train a new classification head"
            )
        return family_named(config.model_type).classifier_class.from_pretrained(
            model_args.model_name_or_path, ignore_mismatched_sizes=model_args.ignore_mismatched_sizes, **labels
        )
    config = _new_config(model_args, data)
    for key, value in labels.items():
        setattr(config, key, value)
    return family_named(config.model_type).classifier_class(config)


def accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


# -- the run ----------------------------------------------------------------------------------------------------------
@dataclass
class Recipe:
    """A prepared run: arguments, data and the trainer (model built, nothing trained yet)."""

    model_args: ModelArguments
    data_args: DataArguments
    training_args: RecipeTrainingArguments
    data: RecipeData
    trainer: PetraTrainer
    checkpoint: str | bool | None  # resolve_checkpoint: False starts afresh even in a restarted job


def prepare(argv: list[str] | None = None) -> Recipe:
    model_args, data_args, args = parse(argv)
    splits = {name for name, wanted in (("train", args.do_train), ("eval", args.do_eval),
                                        ("test", args.do_predict)) if wanted}
    if not splits:
        raise ValueError("nothing to do: do_train, do_eval and do_predict are all false")
    checkpoint = resolve_checkpoint(args.resume_from_checkpoint, args.output_dir) if args.do_train else None
    processor = None
    if model_args.model_name_or_path:
        pretrained_config(model_args)  # refuse a non-RevNet before reading any data
        processor = _pretrained_processor(model_args.model_name_or_path)
    with args.main_process_first(desc="loading the data set"):  # `datasets` caches on the first rank first
        data = load_data(data_args, seed=args.seed, splits=splits, processor=processor,
                         keep_images=args.runs_first_stage())
    set_seed(args.seed)  # immediately before the model: the same initial weights on every rank, for any world size
    model = build_model(model_args, data)
    trainer = PetraTrainer(
        model=model,
        args=args,
        train_dataset=data.train,
        eval_dataset=data.eval,
        data_collator=data.collator,
        processing_class=data.processor,
        compute_metrics=accuracy,
    )
    trainer.model_card_kwargs.update(data.card_arguments)  # the set's name and evaluated split, for the model card
    return Recipe(model_args, data_args, args, data, trainer, checkpoint)


def _pretrained_processor(path: str):
    from transformers import AutoImageProcessor

    try:
        return AutoImageProcessor.from_pretrained(path)
    except (OSError, ValueError):  # a folder without preprocessor_config.json: the data's own processor
        return None


def execute(recipe: Recipe) -> dict[str, float]:
    """Train, evaluate, predict as asked; write the metrics files; returns the evaluation metrics ({} without)."""
    trainer, args = recipe.trainer, recipe.training_args
    metrics: dict[str, float] = {}
    if args.do_train:
        result = trainer.train(resume_from_checkpoint=recipe.checkpoint)
        trainer.log_metrics("train", result.metrics)
        trainer.save_metrics("train", result.metrics)
        trainer.save_state()
    if args.do_eval:
        metrics = trainer.evaluate()
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    if args.do_train:
        trainer.save_model()  # after the evaluation: the model card reports it
    if args.do_predict:
        output = trainer.predict(recipe.data.test, metric_key_prefix="predict")
        trainer.log_metrics("predict", output.metrics)
        trainer.save_metrics("predict", output.metrics)
        if trainer.is_world_process_zero() and output.predictions is not None:
            names = recipe.data.label_names
            lines = [f"{i}\t{names[p]}" for i, p in enumerate(np.argmax(output.predictions, axis=-1))]
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, "predict_results.txt"), "w", encoding="utf-8") as handle:
                handle.write("index\tprediction\n" + "\n".join(lines) + "\n")
    if args.do_train and args.push_to_hub:
        trainer.push_to_hub()
    if trainer.is_world_process_zero() and "eval_accuracy" in metrics:
        saved = f"; model saved to {args.output_dir}" if args.do_train else ""
        print(f"final test accuracy {metrics['eval_accuracy']:.4f}{saved}")
    return metrics


def run(argv: list[str] | None = None) -> tuple[PetraTrainer, dict[str, float]]:
    """Prepare and execute the recipe; returns the trainer and the final evaluation metrics."""
    recipe = prepare(argv)
    return recipe.trainer, execute(recipe)


def main(argv: list[str] | None = None) -> None:
    """`petra-train` and `recipes/train_revnet.py`."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run(argv)

