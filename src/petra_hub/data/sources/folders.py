"""Image folders (the ImageNet layout): ``data_dir/train/<class>/*.JPEG``, ``data_dir/val/<class>/*``.

Classes are indexed by the sorted names of the ``train/`` sub-folders (of the evaluation
folder when there is no ``train/``); the evaluation folder is the first of ``val/``,
``validation/``, ``test/`` that exists.  Images are found recursively by extension (in
``os.walk``'s order: a folder's files, sorted, then its sub-folders, sorted, depth first),
decoded with PIL and converted to RGB; an image that cannot be decoded (e.g. a truncated
JPEG) is a ValueError naming its path.

Links are followed (data sets are often linked in: a class folder, or part of one, may be a
link to a folder elsewhere), and each folder is read once: folders are told apart by
``(st_dev, st_ino)``, so a folder reached twice within one class (two links to it, or a
link to a sibling folder) is listed once, under the path it was first reached by.  Two
layouts are ValueErrors naming the link, rather than read in a way that cannot be right:

- a link to a folder it is in (``cat/up -> ..``, ``cat/a -> .``, or a loop through a folder
  linked in from elsewhere): a cycle, which would list the same images over and over (and,
  through ``..``, the other classes' images under this class);
- a folder reached from two classes (``cat/dogs -> ../dog``, or a class folder that links
  to another's): its images would have two labels.

Each split is scanned on its own: ``train/`` and ``val/`` may link to the same folders.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from . import open_image, pil_to_uint8

if TYPE_CHECKING:
    from ..registry import DatasetSpec
    from . import Loaded

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".pgm", ".bmp", ".tif", ".tiff", ".webp")


def _links_to_a_folder_it_is_in(path: str) -> bool:
    """True when ``path`` is a link whose target holds the link itself (``..``, ``.``, ``/``)."""
    if not os.path.islink(path):
        return False
    target = os.path.realpath(path)
    here = os.path.realpath(os.path.dirname(path))
    return here == target or here.startswith(target.rstrip(os.sep) + os.sep)


def _images_under(top: str, cls: str, seen: dict[tuple[int, int], tuple[str, str]]) -> list[str]:
    """Image paths under the class folder ``top`` (in ``os.walk``'s order), links followed,
    each folder read once; ``seen`` maps each folder read so far to (its class, its path).
    Folders that cannot be listed are skipped, as ``os.walk`` does."""
    found = []
    stack: list[tuple[str, tuple[tuple[int, int], ...]]] = [(top, ())]  # (folder, the folders it is reached through)
    while stack:
        path, chain = stack.pop()
        try:
            st = os.stat(path)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key in chain or _links_to_a_folder_it_is_in(path):
            what = "a link to" if os.path.islink(path) else "the same folder as"
            raise ValueError(f"{path}: {what} {os.path.realpath(path)}, a folder it is in (a cycle: its images "
                             "would be listed over and over); remove the link, or link to a folder outside it")
        if key in seen:
            first_cls, first = seen[key]
            if first_cls != cls:
                raise ValueError(f"{path} and {first} are the same folder (through a link), under classes "
                                 f"{first_cls!r} and {cls!r}: its images would have two labels")
            continue  # already listed, under its first path
        seen[key] = (cls, path)
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue
        subfolders = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()  # follows links
            except OSError:
                is_dir = False
            if is_dir:
                subfolders.append(entry.path)
            elif entry.name.lower().endswith(IMAGE_EXTENSIONS):
                found.append(entry.path)
        stack.extend((sub, chain + (key,)) for sub in reversed(subfolders))
    return found


def class_folders(root: str) -> list[str]:
    """The class folders of ``root``, sorted: its sub-folders but hidden ones (``.ipynb_checkpoints``, ``.git``),
    which are no class, as `datasets`' imagefolder skips them."""
    return sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))


def scan_split_folder(root: str, class_to_idx: dict[str, int],
                      every_class: bool = False) -> tuple[list[str], list[int]]:
    """Image paths under ``root/<class>/`` and their class indices; with ``every_class`` (the folder the classes
    come from), a class folder without images is an error naming it: the model would get an output never trained."""
    classes = class_folders(root)
    unknown = [c for c in classes if c not in class_to_idx]
    if unknown:
        raise ValueError(f"{root}: class folders {unknown[:5]} do not exist in train/")
    files, labels, empty = [], [], []
    seen: dict[tuple[int, int], tuple[str, str]] = {}
    for c in classes:
        found = _images_under(os.path.join(root, c), c, seen)
        files += found
        labels += [class_to_idx[c]] * len(found)
        empty += [] if found else [c]
    if every_class and empty and files:
        raise FileNotFoundError(
            f"{root}: class folders {empty[:5]} hold no images (extensions {', '.join(IMAGE_EXTENSIONS)}): "
            "remove them or add their images, so that every class the model gets is trained")
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

    def __call__(self, spec: DatasetSpec, split: str, data_dir: str | None, keep_images: bool = True) -> Loaded:
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
        classes = class_folders(class_root)
        if not classes:
            raise FileNotFoundError(f"no class folders in {class_root!r}: expected "
                                    "<split>/<class_name>/<image> (image-folder layout)")
        files, labels = scan_split_folder(root, {c: i for i, c in enumerate(classes)}, every_class=root == class_root)
        info = replace(spec.info, num_labels=len(classes), label_names=tuple(classes))

        def source(index: int) -> torch.Tensor:
            try:
                with open_image(files[index]) as im:
                    return pil_to_uint8(im)
            except MemoryError:
                raise
            except Exception as exc:  # noqa: BLE001 - PIL raises many types; name the file
                raise ValueError(f"{files[index]}: cannot decode the image "
                                 f"({type(exc).__name__}: {exc})") from exc

        return source, torch.as_tensor(labels, dtype=torch.int64), info
