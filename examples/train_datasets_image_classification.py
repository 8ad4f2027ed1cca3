"""Train a RevNet with PETRA on a `datasets` image-classification set, the way transformers' image-classification
example does it, then evaluate, predict, save, reload and run `pipeline("image-classification")`.

    OMP_NUM_THREADS=1 accelerate launch --config_file accelerate_config.yaml --num_processes 2 \
        examples/train_datasets_image_classification.py --output_dir outputs/revnet-digits-datasets

The data set is built offline from scikit-learn's digits (PIL images in an "image" column, a ClassLabel "label"
column), so the example runs anywhere; replace `digits_dataset()` by `load_dataset(...)` for your own data. Each
process runs a contiguous group of the RevNet's stages; every process calls `train`, `evaluate`, `predict` and
`save_model`. Each process prints one `RESULTS {...}` line (JSON) at the end.
"""

import argparse
import json
import os

import numpy as np
import torch
import torch.distributed as dist
from datasets import ClassLabel, Dataset, DatasetDict, Image
from PIL import Image as PILImage
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torchvision.transforms import v2
from transformers import AutoModelForImageClassification, ViTImageProcessor, pipeline, set_seed

from petra_hub import PetraTrainer, PetraTrainingArguments, RevNetConfig, RevNetForImageClassification

LABELS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def digits_dataset() -> DatasetDict:
    """scikit-learn's digits as a `datasets` image/label set: 16x16 RGB PIL images, 1,437 train / 360 test."""
    digits = load_digits()
    images = [
        PILImage.fromarray((image / 16.0 * 255.0).astype(np.uint8), mode="L").resize((16, 16)).convert("RGB")
        for image in digits.images
    ]
    train, test = train_test_split(np.arange(len(images)), test_size=0.2, random_state=0, stratify=digits.target)

    def split(indices) -> Dataset:
        data = Dataset.from_dict({"image": [images[i] for i in indices], "label": digits.target[indices].tolist()})
        return data.cast_column("image", Image()).cast_column("label", ClassLabel(names=LABELS))

    return DatasetDict(train=split(train), test=split(test))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", default="outputs/revnet-digits-datasets")
    parser.add_argument("--num_train_epochs", type=float, default=2)
    parser.add_argument("--hidden_sizes", default="8,16,16,32", help="per-stream widths of the RevNet18")
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()

    dataset = digits_dataset()
    labels = dataset["train"].features["label"].names
    id2label = dict(enumerate(labels))

    # The image processor saved with the model; the training transforms use its size, mean and std.
    pixels = np.stack([np.asarray(image, dtype=np.float32) / 255.0 for image in dataset["train"]["image"]])
    image_processor = ViTImageProcessor(
        size={"height": 16, "width": 16}, image_mean=pixels.mean(axis=(0, 1, 2)).tolist(),
        image_std=pixels.std(axis=(0, 1, 2)).tolist(),
    )
    size = image_processor.size["height"]
    normalize = v2.Normalize(mean=image_processor.image_mean, std=image_processor.image_std)
    to_tensor = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), normalize, v2.ToPureTensor()]
    # Digits are not mirror-symmetric: a random resized crop without flip for training.
    train_transforms = v2.Compose([v2.RandomResizedCrop(size, scale=(0.7, 1.0), ratio=(0.9, 1.1)), *to_tensor])
    eval_transforms = v2.Compose([v2.Resize(size), v2.CenterCrop(size), *to_tensor])

    def preprocess_train(batch):
        batch["pixel_values"] = [train_transforms(image.convert("RGB")) for image in batch["image"]]
        return batch

    def preprocess_eval(batch):
        batch["pixel_values"] = [eval_transforms(image.convert("RGB")) for image in batch["image"]]
        return batch

    train_dataset = dataset["train"].with_transform(preprocess_train)
    test_dataset = dataset["test"].with_transform(preprocess_eval)

    def collate_fn(examples):
        pixel_values = torch.stack([example["pixel_values"] for example in examples])
        labels = torch.tensor([example["label"] for example in examples])
        return {"pixel_values": pixel_values, "labels": labels}

    def compute_metrics(prediction):
        return {"accuracy": float((np.argmax(prediction.predictions, axis=1) == prediction.label_ids).mean())}

    args = PetraTrainingArguments(
        output_dir=options.output_dir,
        petra_mode="petra",
        num_train_epochs=options.num_train_epochs,
        per_device_train_batch_size=32,  # the micro-batch
        gradient_accumulation_steps=1,  # k
        per_device_eval_batch_size=128,
        learning_rate=0.05,
        optim="sgd",
        optim_args="momentum=0.9,nesterov=True",
        weight_decay=5e-4,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
        eval_strategy="epoch",
        save_strategy="no",
        logging_steps=10,
        report_to="none",
        remove_unused_columns=False,  # the transforms need the "image" column
        disable_tqdm=True,
        seed=options.seed,
    )
    set_seed(args.seed)  # the same initial weights on every process
    config = RevNetConfig.from_preset(
        "revnet18", stem="cifar", num_labels=len(labels), id2label=id2label,
        label2id={name: i for i, name in id2label.items()},
        hidden_sizes=[int(width) for width in options.hidden_sizes.split(",")], embedding_size=8,
    )
    model = RevNetForImageClassification(config)

    trainer = PetraTrainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=test_dataset,
        data_collator=collate_fn,
        processing_class=image_processor,
        compute_metrics=compute_metrics,
    )
    train_result = trainer.train()
    metrics = trainer.evaluate()
    prediction = trainer.predict(test_dataset)
    predicted = np.argmax(prediction.predictions, axis=1)
    predict_accuracy = float((predicted == prediction.label_ids).mean())
    trainer.save_model()
    # The card's facts that a set built in memory cannot tell, given as transformers' examples give them.
    trainer.create_model_card(dataset="scikit-learn digits", eval_split="20% stratified test split",
                              tasks="image-classification")

    rank = dist.get_rank() if dist.is_initialized() else 0
    results = {
        "rank": rank,
        "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        "train_loss": train_result.training_loss,
        "eval_accuracy": metrics["eval_accuracy"],
        "predict_accuracy": predict_accuracy,
        "predict_metric_accuracy": prediction.metrics["test_accuracy"],
        "num_predictions": int(len(predicted)),
        "labels_match": bool(np.array_equal(prediction.label_ids, np.asarray(dataset["test"]["label"]))),
    }
    if trainer.is_world_process_zero():  # reload the saved folder, then the pipeline on one test image
        reloaded = AutoModelForImageClassification.from_pretrained(args.output_dir).eval()
        batch = collate_fn([test_dataset[i] for i in range(64)])
        with torch.no_grad():
            logits = reloaded(pixel_values=batch["pixel_values"]).logits.numpy()
        results["reloaded_max_logit_difference"] = float(np.abs(logits - prediction.predictions[:64]).max())
        classifier = pipeline("image-classification", model=args.output_dir, device="cpu")
        top = classifier(dataset["test"][0]["image"], top_k=1)[0]
        results.update(pipeline_label=top["label"], predicted_label=id2label[int(predicted[0])],
                       saved_files=sorted(os.listdir(args.output_dir)))
    print("RESULTS " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main()
