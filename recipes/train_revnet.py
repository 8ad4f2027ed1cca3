"""Train a RevNet with PETRA: `accelerate launch --config_file accelerate_config.yaml recipes/train_revnet.py`.

With no arguments: a small RevNet18 on the embedded digits data, PETRA across the launched processes, then
evaluation and a Hub-ready folder (safetensors, image processor, model card) in `outputs/revnet18-digits-petra`.
Arguments come from the command line or a YAML/JSON file (`recipes/configs/*.yaml`), e.g.
`accelerate launch --config_file accelerate_config.yaml recipes/train_revnet.py recipes/configs/cifar10_revnet18_petra.yaml`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np
import yaml
from transformers import HfArgumentParser, set_seed

from petra_hub.data import DATASET_SPECS, collate_image_batch, image_processor_for, load_image_dataset, take
from petra_hub.models.revnet import PRESETS, RevNetConfig, RevNetForImageClassification
from petra_hub.training import PetraTrainer, PetraTrainingArguments


@dataclass
class ModelArguments:
    preset: str = field(default="revnet18", metadata={"help": ", ".join(PRESETS)})
    stem: str | None = field(default=None, metadata={"help": "cifar or imagenet; default from the data set"})
    downsampling: str = field(default="buffered", metadata={"help": "buffered (paper) or invertible"})
    hidden_sizes: str | None = field(default="16,32,64,128", metadata={"help": "per-stream widths; 'paper' for the preset's"})
    embedding_size: int | None = field(default=16, metadata={"help": "stem width per stream; 0 for the preset's"})


@dataclass
class DataArguments:
    dataset: str = field(default="digits", metadata={"help": "; ".join(f"{name}: {spec.description}" for name, spec in DATASET_SPECS.items())})
    data_dir: str | None = field(default=None, metadata={"help": "local files of the data set"})
    hub_id: str | None = field(default=None, metadata={"help": "a Hub data set id instead of local files"})
    max_train_samples: int | None = field(default=None, metadata={"help": "use only the first N training images"})
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N test images"})


DEFAULTS = dict(
    output_dir="outputs/revnet18-digits-petra",
    num_train_epochs=12,
    per_device_train_batch_size=32,
    per_device_eval_batch_size=128,
    gradient_accumulation_steps=1,
    learning_rate=0.05,
    optim="sgd",
    optim_args="momentum=0.9,nesterov=True",
    weight_decay=5e-4,
    lr_scheduler_type="cosine",
    warmup_steps=0.05,
    eval_strategy="epoch",
    save_strategy="no",
    logging_steps=10,
    report_to=[],
    seed=0,
)


def parse(argv: list[str]):
    parser = HfArgumentParser((ModelArguments, DataArguments, PetraTrainingArguments))
    values = dict(DEFAULTS)
    if argv and argv[0].endswith((".yaml", ".yml", ".json")):
        with open(argv[0], encoding="utf-8") as handle:
            values.update(yaml.safe_load(handle) or {})
        argv = argv[1:]
    # Command-line flags override the file, which overrides the defaults.
    defaults = []
    for key, value in values.items():
        if isinstance(value, list):
            defaults += [f"--{key}", *map(str, value)] if value else [f"--{key}", "none"]
        else:
            defaults += [f"--{key}", str(value)]
    return parser.parse_args_into_dataclasses(defaults + argv)


def build_model(model_args: ModelArguments, info) -> RevNetForImageClassification:
    overrides = {"num_labels": info.num_labels, "downsampling": model_args.downsampling}
    overrides["stem"] = model_args.stem or ("imagenet" if info.image_size >= 128 else "cifar")
    if model_args.hidden_sizes and model_args.hidden_sizes != "paper":
        overrides["hidden_sizes"] = [int(w) for w in model_args.hidden_sizes.split(",")]
    if model_args.embedding_size:
        overrides["embedding_size"] = model_args.embedding_size
    config = RevNetConfig.from_preset(model_args.preset, **overrides)
    config.id2label = dict(enumerate(info.label_names))
    config.label2id = {name: index for index, name in config.id2label.items()}
    return RevNetForImageClassification(config)


def accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


def run(argv: list[str]) -> tuple[PetraTrainer, dict[str, float]]:
    """Train, evaluate, save (and push when asked); returns the trainer and the final test metrics."""
    model_args, data_args, training_args = parse(argv)
    set_seed(training_args.seed)  # the same initial weights on every rank
    source = {"data_dir": data_args.data_dir, "hub_id": data_args.hub_id} if data_args.dataset != "digits" else {}
    train = take(load_image_dataset(data_args.dataset, "train", seed=training_args.seed, **source), data_args.max_train_samples)
    test = take(load_image_dataset(data_args.dataset, "test", **source), data_args.max_eval_samples)
    model = build_model(model_args, train.info)
    trainer = PetraTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=test,
        data_collator=collate_image_batch,
        processing_class=image_processor_for(train.info),
        compute_metrics=accuracy,
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    metrics = trainer.evaluate()
    trainer.save_model()
    if training_args.push_to_hub:
        trainer.push_to_hub()
    if trainer.is_world_process_zero():
        print(f"final test accuracy {metrics.get('eval_accuracy', float('nan')):.4f}; model saved to {training_args.output_dir}")
    return trainer, metrics


def main() -> None:
    run(sys.argv[1:])


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
