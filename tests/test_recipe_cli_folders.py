"""--train_dir / --validation_dir and a path-like --dataset_name are checked before `datasets` reads them: errors
name the flag, the path and what was expected (datasets said 'Instruction "train" corresponds to no data!', blamed
--label_column_name, or looked a local path up on the Hub)."""

import pytest
from PIL import Image

from petra_hub.recipe.arguments import parse
from petra_hub.recipe.data import load_data

EXPECTED = r"expected a folder of one sub-folder per class holding its images \({}/<class>/<image>; the sub-folder " \
           r"names are the labels\)"


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def _image(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(path)


def _load(*flags):
    _, data_args, _ = parse([*flags, "--output_dir", "unused"])
    return load_data(data_args, seed=0, splits={"train"})


def test_a_missing_folder_is_named(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(ValueError, match=rf"^--train_dir '{missing}' does not exist: {EXPECTED.format(missing)}$"):
        _load("--train_dir", str(missing))


def test_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match=r"^--validation_dir '.*afile' is a file, not a folder: expected a folder"):
        _load("--validation_dir", str(tmp_path / "afile"))


def test_an_empty_folder_is_named(tmp_path):
    (tmp_path / "empty" / "cat").mkdir(parents=True)  # a class folder without images is no class
    with pytest.raises(ValueError, match=r"^--train_dir '.*empty' holds no images in sub-folders: expected"):
        _load("--train_dir", str(tmp_path / "empty"))


def test_images_without_class_folders_do_not_blame_the_label_column(tmp_path):
    for index in range(3):
        _image(tmp_path / "flat" / f"{index}.png")
    with pytest.raises(ValueError, match=r"^--train_dir '.*flat' holds images at its top level \(0.png, ...\) and no "
                                         r"class sub-folders: expected a folder .* \(--label_column_name does not "
                                         r"apply to an image folder\)$"):
        _load("--train_dir", str(tmp_path / "flat"))


def test_images_beside_class_folders_and_a_single_class(tmp_path):
    _image(tmp_path / "mixed" / "cat" / "0.png")
    _image(tmp_path / "mixed" / "stray.png")
    with pytest.raises(ValueError, match=r"holds images at its top level \(stray.png, ...\) beside the class "
                                         r"sub-folders \['cat'\]"):
        _load("--train_dir", str(tmp_path / "mixed"))
    (tmp_path / "mixed" / "stray.png").unlink()
    with pytest.raises(ValueError, match=r"^--train_dir '.*mixed' has a single class sub-folder \('cat'\): an image "
                                         r"classifier needs at least two classes, one sub-folder each$"):
        _load("--train_dir", str(tmp_path / "mixed"))


def test_good_folders_still_load(tmp_path):
    for name in ("cat", "dog"):
        _image(tmp_path / "train" / name / "0.png")
    data = _load("--train_dir", str(tmp_path / "train"))
    assert data.label_names == ["cat", "dog"] and len(data.train) == 2


@pytest.mark.parametrize("name", ["./my_data", "../my_data", "/no/such/data", "~/no_such_data_petra"])
def test_a_path_like_dataset_name_must_exist(name):
    with pytest.raises(ValueError, match=rf"^--dataset_name '{name}' is a local path, but there is no such file or "
                                         r"folder: expected a folder \(save_to_disk output, or data files\) or a Hub "
                                         r"id such as uoft-cs/cifar10$"):
        _load("--dataset_name", name)
