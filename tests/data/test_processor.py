"""The image processor saved with a model prepares an image as evaluation did (pipelines and the model card's
how-to use it): ImageNet's shorter side to 256 then the centre 224 x 224, the recipe's Resize + CenterCrop. It once
squashed every image to S x S, so a published ImageNet model saw distorted inputs (mean difference 0.7)."""

import numpy as np
import pytest
import torch
from PIL import Image

from petra_hub.data import dataset_spec, image_processor_for
from petra_hub.data.registry import DatasetInfo
from petra_hub.recipe.data import image_transforms


def photo(width=500, height=300):
    rng = np.random.default_rng(0)
    smooth = rng.random((height // 20 + 1, width // 20 + 1, 3))  # large blobs: resampling details barely matter
    return Image.fromarray(np.uint8(255 * smooth)).resize((width, height), Image.BILINEAR)


def processed(processor, image):
    return processor(image, return_tensors="pt")["pixel_values"][0]


def test_imagenet_processor_crops_the_centre_as_evaluation_does():
    spec = dataset_spec("imagenet")
    info = spec.info
    image = photo()
    tensor = torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()
    evaluated = spec.test_transform(tensor, info.image_size, None).float() / 255
    evaluated = (evaluated - torch.tensor(info.mean).view(3, 1, 1)) / torch.tensor(info.std).view(3, 1, 1)
    mine = processed(image_processor_for(info, spec.eval_shorter_side), image)
    assert mine.shape == evaluated.shape == (3, 224, 224)
    assert float((mine - evaluated).abs().mean()) < 0.03
    squashed = processed(image_processor_for(info), image)  # what was saved before
    assert float((squashed - evaluated).abs().mean()) > 0.2


@pytest.mark.parametrize("size", [(40, 24), (24, 40)])
def test_the_recipes_processor_matches_its_evaluation_transform(size):
    info = DatasetInfo("mine", 2, 20, 3, (0.5,) * 3, (0.5,) * 3, ("a", "b"))
    image = photo(*size)
    _, evaluate = image_transforms(20, info.mean, info.std)
    mine = processed(image_processor_for(info, shorter_side=20), image)
    assert mine.shape == (3, 20, 20)
    assert float((mine - evaluate(image)).abs().mean()) < 0.03


def test_square_sets_keep_a_plain_resize():
    spec = dataset_spec("digits")
    assert spec.eval_shorter_side is None
    assert type(image_processor_for(spec.info, spec.eval_shorter_side)).__name__ == "ViTImageProcessor"
