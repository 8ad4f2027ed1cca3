"""What a PetraTrainer's model card says is what the run did: the stages' optimizer and learning rate, the image
processor its snippets load, the part of a split it evaluated, the model it fine-tuned; and timm's pretrained
weights from a model's folder."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image
from torch.utils.data import Subset

from petra_hub.data import collate_image_batch, image_processor_for, load_image_dataset, take
from petra_hub.integrations.model_card import render_model_card
from petra_hub.testing.models import small_model
from petra_hub.training import PetraTrainer, PetraTrainingArguments
from petra_hub.training.card import summarize_trainer
from petra_hub.training.card_data import describe_data


def accuracy(prediction):
    return {"accuracy": float((np.argmax(prediction.predictions, -1) == prediction.label_ids).mean())}


def digits_trainer(tmp_path, eval_dataset=None, processing_class=None, model=None, train=None, **kwargs):
    """A tiny RevNet on 32 digits images: 2 steps of one micro-batch of 16."""
    args = PetraTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=16,
                                  per_device_eval_batch_size=64, max_steps=2, save_strategy="no", eval_strategy="no",
                                  report_to=[], disable_tqdm=True)
    train = train if train is not None else take(load_image_dataset("digits", "train"), 32)
    return PetraTrainer(model=model or small_model(dtype=torch.float32), args=args, train_dataset=train,
                        eval_dataset=eval_dataset, data_collator=collate_image_batch,
                        processing_class=processing_class, compute_metrics=accuracy, **kwargs)


def card_rows(text: str) -> dict[str, str]:
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 2:
            rows.setdefault(cells[0], cells[1])
    return rows


def load_card(folder) -> ModelCard:
    return ModelCard.load(os.path.join(folder, "README.md"))


# ---------------------------------------------------------------------------------------------------------------
# 1. the optimizer and learning rate the stages ran


@pytest.mark.parametrize("kwargs, rate", [({"lr": 0.2, "momentum": 0.5}, 0.2), ({"momentum": 0.5}, 0.001)])
def test_the_card_names_the_optimizer_cls_and_kwargs_the_stages_ran(tmp_path, kwargs, rate):
    """optimizer_cls_and_kwargs=(SGD, {...}): the stages run SGD at the given lr (without one, SGD's default), and
    the card says so (it used to name args.optim, AdamW, at args.learning_rate, 5e-05)."""
    trainer = digits_trainer(tmp_path, processing_class=image_processor_for(load_image_dataset("digits", "test").info),
                             optimizer_cls_and_kwargs=(torch.optim.SGD, kwargs))
    trainer.train()
    optimizers = [worker.optimizer for worker in trainer.pipeline.workers.values() if worker.optimizer is not None]
    assert optimizers and all(type(optimizer) is torch.optim.SGD for optimizer in optimizers)
    assert {group["initial_lr"] for optimizer in optimizers for group in optimizer.param_groups} == {rate}
    trainer.save_model()
    rows = card_rows(load_card(tmp_path).text)
    assert rows["Learning rate"] == f"{rate:g}"
    assert rows["Optimizer"] == "`optimizer_cls_and_kwargs`: `SGD(momentum=0.5)`"


def test_the_card_names_the_optimizer_of_an_overridden_get_optimizer_cls_and_kwargs(tmp_path):
    """A subclass's get_optimizer_cls_and_kwargs builds the stages' optimizers: the card names its choice; the
    learning rate stays args' (per micro-batch)."""

    class RMSpropTrainer(PetraTrainer):
        @staticmethod
        def get_optimizer_cls_and_kwargs(args, model=None):
            return torch.optim.RMSprop, {"lr": args.learning_rate, "alpha": 0.9}

    trainer = digits_trainer(tmp_path)
    trainer.__class__ = RMSpropTrainer
    summary = summarize_trainer(trainer, str(tmp_path))
    assert summary.optimizer == "`adamw_torch_fused`: `RMSprop(alpha=0.9)`"
    assert summary.learning_rate == trainer.args.learning_rate
    plain = summarize_trainer(digits_trainer(tmp_path), str(tmp_path))
    assert plain.optimizer.startswith("`adamw_torch_fused`: `AdamW(") and plain.learning_rate == 5e-05


# ---------------------------------------------------------------------------------------------------------------
# 2. the image processor the card's snippets load


def test_without_processing_class_the_folder_has_the_processor_its_card_loads(tmp_path):
    """No processing_class, a petra_hub data set: the folder gets the data set's image processor (as save_for_hub
    writes it), so the card's AutoImageProcessor and pipeline snippets run (they failed with OSError)."""
    from transformers import AutoImageProcessor, pipeline

    trainer = digits_trainer(tmp_path)
    trainer.train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        trainer.save_model()
    processor = AutoImageProcessor.from_pretrained(str(tmp_path))
    expected = image_processor_for(load_image_dataset("digits", "test").info)
    assert processor.to_dict() == expected.to_dict()
    classifier = pipeline("image-classification", model=str(tmp_path), device="cpu")
    [prediction] = classifier(Image.fromarray(np.zeros((8, 8, 3), np.uint8)), top_k=1)
    assert prediction["label"] in [str(digit) for digit in range(10)]
    assert "AutoImageProcessor.from_pretrained" in load_card(tmp_path).text


def test_without_any_processor_the_card_does_not_point_at_one(tmp_path):
    """A data set petra_hub does not know and no processing_class: nothing to save; a warning says so, and the
    card's Input line does not send the reader to a preprocessor_config.json that is not there."""
    images = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    train = [{"pixel_values": image, "labels": index % 10} for index, image in enumerate(images)]
    trainer = digits_trainer(tmp_path, train=train)
    with pytest.warns(UserWarning, match="no image processor saved"):
        trainer.save_model()
    assert not (tmp_path / "preprocessor_config.json").exists()
    text = load_card(tmp_path).text
    assert "preprocessor_config.json" not in card_rows(text)["Input"]
    assert "no image processor was saved" in card_rows(text)["Input"]
    how_to = text.split("## How to use")[1].split("## Limitations")[0]  # its snippet needs no processor
    assert "AutoImageProcessor" not in how_to and "pipeline(" not in how_to and "No image processor was saved" in how_to
    assert "the saved image processor" not in text


# ---------------------------------------------------------------------------------------------------------------
# 3. the part of a split that was evaluated


def test_a_card_says_which_part_of_the_split_was_evaluated(tmp_path):
    """eval_dataset=take(test, 64): the card reports the first 64 of the 360 images of test, in model-index and in
    its Evaluation table (it said "test split"), in the recipe's words; the whole split is still "test"."""
    test = load_image_dataset("digits", "test")
    trainer = digits_trainer(tmp_path, eval_dataset=take(test, 64),
                             processing_class=image_processor_for(test.info))
    trainer.train()
    final = trainer.evaluate()
    trainer.save_model()
    card = load_card(tmp_path)
    part = "first 64 of the 360 images of test"
    assert {result.dataset_split for result in card.data.eval_results} == {part}
    assert f"| Accuracy ({part}) | {100 * final['eval_accuracy']:.2f} % |" in card.text
    assert "test split" not in card.text
    train = load_image_dataset("digits", "train")
    assert describe_data(train, test).eval_split == "test"
    assert describe_data(train, Subset(test, range(64))).eval_split == part
    assert describe_data(train, Subset(test, range(100, 164))).eval_split == "64 of the 360 images of test"
    assert describe_data(train, Subset(take(test, 100), range(64))).eval_split == part
    assert describe_data(train, Subset(take(test, 100), range(1, 65))).eval_split == "64 of the 360 images of test"
    assert describe_data(train, {"held": take(test, 10)}).eval_split == "first 10 of the 360 images of test"


# ---------------------------------------------------------------------------------------------------------------
# 4. the model a run fine-tunes


def test_a_fine_tuning_card_names_its_base_model(tmp_path):
    """A model loaded from the Hub (config._name_or_path "owner/name"): the card's base_model, as transformers'
    TrainingSummary.from_trainer finds it (the card had none); a local folder or a bare name is no base model, and
    create_model_card(finetuned_from=...) wins."""
    model = small_model(dtype=torch.float32)
    model.config._name_or_path = "someone/revnet18-imagenet"
    trainer = digits_trainer(tmp_path, model=model)
    trainer.create_model_card()
    card = load_card(tmp_path)
    assert card.data.base_model == "someone/revnet18-imagenet"
    assert "fine-tuned from [someone/revnet18-imagenet](https://huggingface.co/someone/revnet18-imagenet)" in card.text
    trainer.create_model_card(finetuned_from="org/other")
    assert load_card(tmp_path).data.base_model == "org/other"
    (tmp_path / "local" / "revnet").mkdir(parents=True)
    for name in ("local/revnet", str(tmp_path / "local" / "revnet"), "revnet18", ""):
        model.config._name_or_path = name
        old = os.getcwd()
        os.chdir(tmp_path)
        try:
            summary = summarize_trainer(trainer, str(tmp_path))
        finally:
            os.chdir(old)
        assert summary.base_model is None, name
        assert "fine-tuned from" not in render_model_card(summary, config=model.config).text


# ---------------------------------------------------------------------------------------------------------------
# 5. timm: pretrained weights from a model's folder


def test_timm_loads_pretrained_weights_from_a_models_folder(tmp_path):
    """pretrained_cfg_overlay=dict(file=<the folder save_pretrained wrote>): the model.safetensors in it (the error
    said the existing folder did not exist); a folder without that file is an error naming the file expected."""
    import timm

    import petra_hub.integrations.timm  # noqa: F401  (registers the models)

    arch = dict(stem="cifar", hidden_sizes=[4, 8, 8, 8], embedding_size=4)
    model = small_model(dtype=torch.float32).eval()
    model.save_pretrained(tmp_path / "revnet")
    images = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    loaded = timm.create_model("revnet18", pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "revnet")),
                               **arch).eval()
    assert loaded.num_classes == 10
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images).logits)
    (tmp_path / "empty").mkdir()
    expected = str(tmp_path / "empty" / "model.safetensors")
    with pytest.raises(FileNotFoundError, match="is a folder without model.safetensors") as error:
        timm.create_model("revnet18", pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "empty")),
                          **arch)
    assert repr(expected) in str(error.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        timm.create_model("revnet18", pretrained=True, pretrained_cfg_overlay=dict(file=str(tmp_path / "none")),
                          **arch)
