"""Train RevMLP, a reversible model family defined outside petra_hub (`examples/revmlp/`), with PETRA on the
embedded digits data, across the launched processes, then save it with its model card:

    OMP_NUM_THREADS=1 accelerate launch --config_file accelerate_config.yaml --num_processes 2 \
        examples/train_revmlp.py [output_dir] [epochs]

Importing `revmlp` registers the family, so that `save_model` writes its card and `AutoModelForImageClassification`
loads the folder afterwards; the folder also carries the family's code for `trust_remote_code=True`."""

import json
import sys

import numpy as np
import revmlp
from transformers import set_seed

from petra_hub import PetraTrainer, PetraTrainingArguments
from petra_hub.data import collate_image_batch, image_processor_for, load_image_dataset


def accuracy(prediction) -> dict:
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def main(output_dir: str = "outputs/revmlp-digits-petra", epochs: float = 6) -> dict:
    set_seed(0)  # before building the model: the same initial weights on every process
    train, test = load_image_dataset("digits", "train"), load_image_dataset("digits", "test")
    model = revmlp.RevMLPForImageClassification(revmlp.RevMLPConfig(
        **revmlp.PRESETS["revmlp-small"], preset="revmlp-small", image_size=train.info.image_size,
        num_labels=train.info.num_labels))
    args = PetraTrainingArguments(
        output_dir=output_dir, petra_mode="petra", per_device_train_batch_size=32, num_train_epochs=epochs,
        learning_rate=0.05, optim="sgd", optim_args="momentum=0.9,nesterov=True", lr_scheduler_type="cosine",
        warmup_steps=0.05, max_grad_norm=0, eval_strategy="epoch", report_to=[], disable_tqdm=True, seed=0)
    trainer = PetraTrainer(model=model, args=args, train_dataset=train, eval_dataset=test,
                           data_collator=collate_image_batch, processing_class=image_processor_for(train.info),
                           compute_metrics=accuracy)
    trainer.train()
    metrics = trainer.evaluate()
    trainer.save_model()  # every stage gathered into one folder: safetensors, config, code, processor, card
    if trainer.is_world_process_zero():
        print(json.dumps({"eval_accuracy": metrics["eval_accuracy"], "stages": len(trainer.stages)}))
    return metrics


if __name__ == "__main__":
    main(*sys.argv[1:2], *map(float, sys.argv[2:3]))
