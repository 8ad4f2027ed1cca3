"""A resumed run draws the random numbers the uninterrupted run drew: checkpoints hold each rank's generators
(`rng_state_<rank>.pth`), and starting a data iterator never draws from the global generator. Without both,
stochastic depth and the recipe's random crops made a resumed run differ from the uninterrupted one."""

import logging

import numpy as np
import torch
from datasets import ClassLabel, Dataset, Image
from PIL import Image as PILImage
from sklearn.datasets import load_digits

from petra_hub import RevViTForImageClassification
from petra_hub.data import collate_image_batch
from petra_hub.testing.models import small_revvit_config
from petra_hub.training import PetraTrainer
from petra_hub.recipe.data import ApplyTransform, ImageClassificationCollator, image_transforms
from tests.training.test_trainer import make_trainer, state_of

STEPS = dict(max_steps=6, save_strategy="steps", save_steps=3)


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[name], b[name]) for name in a), [n for n in a if not torch.equal(a[n], b[n])]


def vit_trainer(folder, init_seed):
    base = make_trainer(folder, optim="adamw_torch", optim_args=None, learning_rate=1e-3, **STEPS)
    torch.manual_seed(init_seed)
    model = RevViTForImageClassification(small_revvit_config("revvit-tiny", drop_path_rate=0.1))
    return PetraTrainer(model=model, args=base.args, train_dataset=base.train_dataset,
                        data_collator=collate_image_batch)


def test_stochastic_depth_resumes_exactly(tmp_path):
    full = vit_trainer(tmp_path / "full", init_seed=0)
    full.train()
    assert (tmp_path / "full" / "checkpoint-3" / "rng_state_0.pth").is_file()
    resumed = vit_trainer(tmp_path / "resumed", init_seed=123)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert_same_weights(state_of(full.model), state_of(resumed.model))


def cropped_digits(count=48, size=16):
    """The recipe's `datasets` path: torchvision's RandomResizedCrop and flip, drawn from the global generator."""
    digits = load_digits()
    images = [PILImage.fromarray((im / 16.0 * 255.0).astype(np.uint8), mode="L").resize((size, size)).convert("RGB")
              for im in digits.images[:count]]
    table = Dataset.from_dict({"image": images, "label": digits.target[:count].tolist()}).cast_column("image", Image())
    table = table.cast_column("label", ClassLabel(names=[str(i) for i in range(10)]))
    train_transform, _ = image_transforms(size, (0.5,) * 3, (0.5,) * 3)
    return table.with_transform(ApplyTransform(train_transform, "image"))


def crop_trainer(folder, train, init_seed):
    base = make_trainer(folder, init_seed=init_seed, remove_unused_columns=False, **STEPS)
    return PetraTrainer(model=base.model, args=base.args, train_dataset=train,
                        data_collator=ImageClassificationCollator("label"))


def test_random_augmentations_resume_exactly(tmp_path):
    train = cropped_digits()
    full = crop_trainer(tmp_path / "full", train, init_seed=0)
    full.train()
    resumed = crop_trainer(tmp_path / "resumed", train, init_seed=1)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert_same_weights(state_of(full.model), state_of(resumed.model))


def test_a_checkpoint_without_generators_resumes_and_says_so(tmp_path, caplog):
    make_trainer(tmp_path / "full", **STEPS).train()
    (tmp_path / "full" / "checkpoint-3" / "rng_state_0.pth").unlink()  # as written before this file existed
    resumed = make_trainer(tmp_path / "resumed", **STEPS)
    with caplog.at_level(logging.WARNING, logger="petra_hub.training.rng_state"):
        resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-3"))
    assert resumed.state.global_step == 6
    assert "random generators of 0 processes, this run has 1" in caplog.text


def test_persistent_workers_augment_each_epoch_as_fresh_workers_do(tmp_path):
    """Workers kept alive between epochs hold copies of the data set: they once kept augmenting with epoch 0's
    stream, since set_epoch reached only the main process's copy."""
    weights = []
    for persistent in (False, True):
        trainer = make_trainer(tmp_path / str(persistent), max_steps=12, dataloader_num_workers=1,
                               dataloader_persistent_workers=persistent)
        trainer.train()
        weights.append(state_of(trainer.model))
    assert_same_weights(*weights)
