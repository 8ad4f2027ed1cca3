"""Images the recipe and the readers decode: 16-bit and float images are scaled to 0..255, not saturated by
convert("RGB"); what cannot be scaled is refused naming the mode and the values."""

from __future__ import annotations

import io

import datasets
import numpy as np
import pytest
from PIL import Image

from petra_hub.data.sources import pil_to_uint8
from petra_hub.recipe.data import ApplyTransform

GRADIENT = (np.arange(64 * 64).reshape(64, 64) * 16).astype(np.uint16)  # 0..65520


def _reopened(image: Image.Image, format: str) -> Image.Image:
    buffer = io.BytesIO()
    image.save(buffer, format=format)
    return Image.open(io.BytesIO(buffer.getvalue()))


def test_a_16_bit_png_is_scaled_not_saturated():
    image = _reopened(Image.fromarray(GRADIENT), "PNG")
    assert image.mode == "I;16"
    pixels = pil_to_uint8(image).numpy()
    assert pixels.shape == (3, 64, 64) and (pixels[0] == pixels[2]).all()
    assert (pixels[0] == GRADIENT // 257).all()  # 0..254 in 255 steps (convert("RGB") left 99.6% at 255)
    assert pixels.max() == 254 and len(np.unique(pixels)) == 255


def test_a_32_bit_integer_image_of_16_bit_values_is_scaled():
    pixels = pil_to_uint8(Image.fromarray(GRADIENT.astype(np.int32))).numpy()
    assert (pixels[1] == GRADIENT // 257).all()


def test_a_float_image_in_0_1_is_scaled():
    ramp = np.linspace(0, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    image = _reopened(Image.fromarray(ramp), "TIFF")
    assert image.mode == "F"
    pixels = pil_to_uint8(image).numpy()
    assert pixels.min() == 0 and pixels.max() == 255 and len(np.unique(pixels)) == 256  # was 0..1, 2 values


@pytest.mark.parametrize("array,message", [
    (np.full((2, 2), 2.5, np.float32), r"a float image \(mode F\) with values in 2.5..2.5: expected values in "
                                       r"\[0, 1\]"),
    (np.full((2, 2), 70_000, np.int32), r"a 32-bit integer image \(mode I\) with values in 70000..70000: expected "
                                        r"16-bit values \(0..65535\)"),
])
def test_what_cannot_be_scaled_is_refused_naming_the_mode(array, message):
    with pytest.raises(ValueError, match=message):
        pil_to_uint8(Image.fromarray(array))


def test_the_recipe_transform_scales_16_bit_images():
    batch = ApplyTransform(np.asarray, "image")({"image": [_reopened(Image.fromarray(GRADIENT), "PNG")]})
    assert (batch["pixel_values"][0][..., 0] == GRADIENT // 257).all()


def _image_folder(root, size: int = 8, first_size: int | None = None) -> str:
    """root/train/{a,b}/{0..3}.png, size x size (a/0.png, the first in order, first_size x first_size)."""
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / "train" / label).mkdir(parents=True)
        for i in range(4):
            side = first_size if (label, i) == ("a", 0) and first_size else size
            image = Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8))
            image.save(root / "train" / label / f"{i}.png")
    return str(root / "train")


def test_a_truncated_image_in_a_train_dir_is_named(tmp_path):
    from petra_hub.recipe.data import DataArguments, load_data

    folder = _image_folder(tmp_path)
    bad = tmp_path / "train" / "b" / "2.png"
    bad.write_bytes(bad.read_bytes()[:60])
    data = load_data(DataArguments(train_dir=folder, train_val_split=None), seed=0, splits={"train"})
    assert data.train[0]["pixel_values"].shape == (3, 8, 8)
    paths = data.train.with_format(None).cast_column("image", datasets.Image(decode=False))["image"]
    row = [image["path"] for image in paths].index(str(bad))
    with pytest.raises(ValueError, match=rf"^image {bad} \(column 'image'\): cannot decode the image \(OSError: "):
        data.train[row]


@pytest.mark.parametrize("first,expected", [(4, 4), (300, 224)])
def test_the_size_inferred_from_the_first_image_is_capped(tmp_path, caplog, first, expected):
    from petra_hub.recipe.data import DataArguments, load_data

    folder = _image_folder(tmp_path, size=8, first_size=first)
    with caplog.at_level("WARNING", logger="petra_hub.recipe.data"):
        data = load_data(DataArguments(train_dir=folder, train_val_split=None), seed=0, splits={"train"})
    assert data.image_size == expected  # 300 before: every item 3x300x300
    assert data.train[1]["pixel_values"].shape == (3, expected, expected)
    warned = "is 300 pixels on its shorter side: the images are resized to 224" in caplog.text
    assert warned == (first == 300) and ("pass --image_size for more" in caplog.text) == warned
    assert load_data(DataArguments(train_dir=folder, train_val_split=None, image_size=256), seed=0,
                     splits={"train"}).image_size == 256


def test_an_image_above_pils_bomb_limit_is_refused_naming_it(tmp_path, monkeypatch):
    """PIL only warns between MAX_IMAGE_PIXELS and twice that: a 12000x12000 PNG of 450 KB decoded to 432 MB. Above
    the limit an image is now refused, named (here with the limit lowered to 50 pixels, below the 8x8 images)."""
    from PIL import Image

    from petra_hub.data.sources import open_image
    from petra_hub.recipe.data import DataArguments, load_data

    folder = _image_folder(tmp_path, size=8)
    data = load_data(DataArguments(train_dir=folder, train_val_split=None), seed=0, splits={"train"})
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 50)
    with pytest.raises(ValueError, match=r"\(column 'image'\): cannot decode the image \(DecompressionBombWarning: "):
        data.train[0]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64)  # at the limit: read
    assert data.train[0]["pixel_values"].shape == (3, 8, 8) and open_image(next(tmp_path.rglob("*.png"))).size == (8, 8)
