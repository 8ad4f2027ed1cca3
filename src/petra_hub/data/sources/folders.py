"""Image folders (the ImageNet layout): ``data_dir/train/<class>/*.JPEG``, ``data_dir/val/<class>/*``.

Classes are indexed by the sorted names of the ``train/`` sub-folders (of the evaluation
folder when there is no ``train/``); the evaluation folder is the first of ``val/``,
``validation/``, ``test/`` that exists.  Images are found recursively (sorted, links
followed) by extension, decoded with PIL and converted to RGB; an image that cannot be
decoded (e.g. a truncated JPEG) is a ValueError naming its path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from . import pil_to_uint8

if TYPE_CHECKING:
    from ..registry import DatasetSpec
    from . import Loaded

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff", ".webp")


def scan_split_folder(root: str, class_to_idx: dict[str, int]) -> tuple[list[str], list[int]]:
    """Image paths under ``root/<class>/`` and their class indices."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    unknown = [c for c in classes if c not in class_to_idx]
    if unknown:
        raise ValueError(f"{root}: class folders {unknown[:5]} do not exist in train/")
    files, labels = [], []
    for c in classes:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, c), followlinks=True):
            dirnames.sort()
            for f in sorted(filenames):
                if f.lower().endswith(IMAGE_EXTENSIONS):
                    files.append(os.path.join(dirpath, f))
                    labels.append(class_to_idx[c])
    if not files:
        raise FileNotFoundError(
            f"no images in {root!r}: expected image-folder layout <split>/<class_name>/<image> "
            f"with extensions {', '.join(IMAGE_EXTENSIONS)}")
    return files, labels


@dataclass(frozen=True)
class ImageFolders:
    """Reader of ``train/`` and the first existing of ``eval_folders`` under ``data_dir``."""

    eval_folders: tuple[str, ...] = ("val", "validation", "test")
    embedded = None
    layout = "train/ and val/ (or validation/), each holding one sub-folder of images per class"

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None) -> Loaded:
        name = spec.info.name
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"data_dir {data_dir!r} for {name!r} is not a folder")
        train_root = os.path.join(data_dir, "train")
        if split == "train":
            root = train_root
        else:
            root = next((os.path.join(data_dir, d) for d in self.eval_folders
                         if os.path.isdir(os.path.join(data_dir, d))), None)
        if root is None or not os.path.isdir(root):
            raise FileNotFoundError(f"no {name} {split} folder in {data_dir!r}: expected {self.layout}")
        class_root = train_root if os.path.isdir(train_root) else root
        classes = sorted(e.name for e in os.scandir(class_root) if e.is_dir())
        if not classes:
            raise FileNotFoundError(f"no class folders in {class_root!r}: expected "
                                    "<split>/<class_name>/<image> (image-folder layout)")
        files, labels = scan_split_folder(root, {c: i for i, c in enumerate(classes)})
        info = replace(spec.info, num_labels=len(classes), label_names=tuple(classes))

        def source(index: int) -> torch.Tensor:
            from PIL import Image

            try:
                with Image.open(files[index]) as im:
                    return pil_to_uint8(im)
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - PIL raises many types; name the file
                raise ValueError(f"{files[index]}: cannot decode the image "
                                 f"({type(exc).__name__}: {exc})") from exc

        return source, torch.as_tensor(labels, dtype=torch.int64), info
