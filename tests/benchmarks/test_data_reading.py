"""benchmarks/data_reading.py: the data sets it makes are what the built-in readers load."""

from petra_hub.data import load_image_dataset

from .conftest import load


def test_the_made_sets_load_through_the_built_in_readers(tmp_path):
    bench = load("data_reading")
    (tmp_path / "npz").mkdir()
    imagenet32 = load_image_dataset("imagenet32", "train", data_dir=str(bench.make_imagenet32(tmp_path / "npz", 25)))
    assert len(imagenet32) == 25 and imagenet32[24]["pixel_values"].shape == (3, 32, 32)
    assert 0 <= int(imagenet32.labels.min()) and int(imagenet32.labels.max()) < 1000
    pngs = load_image_dataset("imagenet", "train", data_dir=str(bench.make_pngs(tmp_path / "png", 12, classes=3)))
    assert len(pngs) == 12 and pngs.info.num_labels == 3 and sorted(set(pngs.labels.tolist())) == [0, 1, 2]
