"""Image folders with links: linked-in folders are read, each folder once; a link back to one of its own
parent folders (a cycle) and a folder reached from two classes are errors naming the link."""

from __future__ import annotations

import contextlib
import os
import re
import signal

import pytest

from petra_hub.data import load_image_dataset
from petra_hub.data.sources.folders import scan_split_folder
from petra_hub.testing.data_files import solid_image as _solid


class _TookTooLong(Exception):
    """Not an OSError: a walk that ignores OSErrors must not swallow it."""


@contextlib.contextmanager
def _deadline(seconds: float):
    """Fail (rather than hang) when the block runs longer than ``seconds``."""
    def _expired(*_):
        raise _TookTooLong(f"still scanning after {seconds} s")

    previous = signal.signal(signal.SIGALRM, _expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _cycle(link, target) -> str:
    """The error for ``link``, a link to ``target`` (a folder it is in)."""
    return rf"^{re.escape(str(link))}: a link to {re.escape(str(target))}, a folder it is in \(a cycle"


def _walked(top: str) -> list[str]:
    """The files under ``top`` as the scan listed them with ``os.walk`` (fine where there is no cycle)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(top, followlinks=True):
        dirnames.sort()
        out += [os.path.join(dirpath, f) for f in sorted(filenames)]
    return out


def _tree(root, images):
    for rel in images:
        _solid(str(root / rel), (10, 20, 30), (8, 8))


def test_link_to_a_parent_folder_is_refused(tmp_path):
    # train/cat/up -> .. made 2 images 82 items (train/ re-read under "cat" through every depth of the loop)
    root = tmp_path / "imloop"
    _tree(root, [f"{s}/{c}/1.png" for s in ("train", "val") for c in ("cat", "dog")])
    os.symlink("..", root / "train" / "cat" / "up")
    with _deadline(20), pytest.raises(ValueError, match=_cycle(root / "train" / "cat" / "up", root / "train")):
        load_image_dataset("imagenet", "train", data_dir=str(root))
    assert len(load_image_dataset("imagenet", "test", data_dir=str(root))) == 2  # val/ has no link


def test_two_links_to_the_folder_itself_are_refused_fast(tmp_path):
    # a -> . and b -> . : the walk branched twice per level, ~2^40 paths before the OS's ELOOP stopped it
    root = tmp_path / "imloop2"
    _tree(root, ["train/cat/1.png", "val/cat/1.png"])
    os.symlink(".", root / "train" / "cat" / "a")
    os.symlink(".", root / "train" / "cat" / "b")
    with _deadline(20), pytest.raises(ValueError, match=_cycle(root / "train" / "cat" / "a", root / "train" / "cat")):
        load_image_dataset("imagenet", "train", data_dir=str(root))


def test_cycle_through_a_linked_in_folder_is_refused(tmp_path):
    # train/cat/ext -> outside/, and outside/back -> train/cat: a loop neither link shows on its own path
    root, outside = tmp_path / "ds", tmp_path / "outside"
    _tree(root, ["train/cat/1.png"])
    _tree(outside, ["2.png"])
    os.symlink(outside, root / "train" / "cat" / "ext")
    os.symlink(root / "train" / "cat", outside / "back")
    link = root / "train" / "cat" / "ext" / "back"
    with _deadline(20), pytest.raises(ValueError, match=_cycle(link, root / "train" / "cat")):
        scan_split_folder(str(root / "train"), {"cat": 0})


def test_linked_in_folders_are_read(tmp_path):
    root, store = tmp_path / "ds", tmp_path / "store"
    _tree(store, ["cats/1.png", "cats/deep/2.png", "more_dogs/3.png"])
    _tree(root, ["train/dog/0.png", "train/dog/sub/9.png", "val/dog/0.png"])
    os.symlink(store / "cats", root / "train" / "cat")  # a whole class linked in
    os.symlink(store / "more_dogs", root / "train" / "dog" / "more")  # part of one
    with _deadline(20):
        files, labels = scan_split_folder(str(root / "train"), {"cat": 0, "dog": 1})
    train = str(root / "train")
    # the order os.walk gave: each folder's files (sorted), then its sub-folders (sorted), depth first
    assert files == [f"{train}/cat/1.png", f"{train}/cat/deep/2.png", f"{train}/dog/0.png",
                     f"{train}/dog/more/3.png", f"{train}/dog/sub/9.png"]
    assert labels == [0, 0, 1, 1, 1]
    assert files == _walked(f"{train}/cat") + _walked(f"{train}/dog")


def test_a_folder_reached_twice_in_one_class_is_read_once(tmp_path):
    root, store = tmp_path / "ds", tmp_path / "store"
    _tree(store, ["extra/1.png"])
    _tree(root, ["train/cat/0.png", "train/cat/sub/5.png"])
    os.symlink(store / "extra", root / "train" / "cat" / "x1")
    os.symlink(store / "extra", root / "train" / "cat" / "x2")  # the same folder again
    os.symlink("sub", root / "train" / "cat" / "zz")  # a sibling, not a parent: no cycle
    with _deadline(20):
        files, labels = scan_split_folder(str(root / "train"), {"cat": 0})
    cat = str(root / "train" / "cat")
    assert files == [f"{cat}/0.png", f"{cat}/sub/5.png", f"{cat}/x1/1.png"]
    assert labels == [0, 0, 0]


def test_a_folder_in_two_classes_is_refused(tmp_path):
    root = tmp_path / "ds"
    _tree(root, ["train/cat/1.png", "train/dog/2.png"])
    os.symlink("../dog", root / "train" / "cat" / "dogs_too")
    link = root / "train" / "cat" / "dogs_too"
    with _deadline(20), pytest.raises(ValueError, match=rf"{re.escape(str(link))}.* classes 'cat' and 'dog'"):
        scan_split_folder(str(root / "train"), {"cat": 0, "dog": 1})
    os.remove(root / "train" / "cat" / "dogs_too")
    os.symlink("dog", root / "train" / "kitten")  # a class that is another class's folder
    link = root / "train" / "kitten"
    with _deadline(20), pytest.raises(ValueError, match=rf"{re.escape(str(link))}.* classes 'dog' and 'kitten'"):
        scan_split_folder(str(root / "train"), {"cat": 0, "dog": 1, "kitten": 2})


def test_hidden_folders_are_no_class_and_an_empty_class_folder_is_refused(tmp_path):
    # .ipynb_checkpoints/ was class 0: every real class shifted by one and the model got an output never trained
    root = tmp_path / "hidden"
    _tree(root, [f"{s}/{c}/1.png" for s in ("train", "val") for c in ("cat", "dog")])
    (root / "train" / ".ipynb_checkpoints").mkdir()
    (root / "val" / ".git").mkdir()
    train = load_image_dataset("imagenet", "train", data_dir=str(root))
    assert train.info.label_names == ("cat", "dog") and train.labels.tolist() == [0, 1]
    assert load_image_dataset("imagenet", "test", data_dir=str(root)).labels.tolist() == [0, 1]
    (root / "train" / "emu").mkdir()
    with pytest.raises(FileNotFoundError, match=r"train: class folders \['emu'\] hold no images"):
        load_image_dataset("imagenet", "train", data_dir=str(root))
    (root / "val" / "emu").mkdir()  # an evaluation folder may lack a class's images
    (root / "train" / "emu" / "1.png").write_bytes((root / "train" / "cat" / "1.png").read_bytes())
    assert load_image_dataset("imagenet", "test", data_dir=str(root)).labels.tolist() == [0, 1]
