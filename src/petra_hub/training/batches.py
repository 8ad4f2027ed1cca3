"""What PetraTrainer reads from a data set: checked before the first step, on the batch the model will receive."""

from __future__ import annotations

import hashlib
import itertools
import math

import torch
from torch.utils.data import DataLoader, IterableDataset

from ..models.loading_checks import IGNORE_INDEX, class_indices
from .sampler import EpochSampler


def split_batch(batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(pixel_values, labels) of a collated batch; labels may be absent only for prediction."""
    if not isinstance(batch, dict) or "pixel_values" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(
            f"each batch must be a dict with 'pixel_values' and 'labels' (what the data collator returns), got {keys}"
        )
    return batch["pixel_values"], batch.get("labels")


def first_items(dataset, count: int = 2) -> list:
    """The first `count` items of a map-style or iterable data set (fewer if it is shorter)."""
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        items = []
        for item in dataset:
            items.append(item)
            if len(items) == count:
                break
        return items
    return [dataset[i] for i in range(min(count, len(dataset)))]


def repeated_first_batch(collator, dataset, size: int):
    """(pixel_values, labels) of `size` samples made of the data set's first items repeated: a micro-batch of the
    right shape to measure the stages on (`petra_partition="auto"`), reading no more than `check_first_batch`."""
    items = first_items(dataset)
    return split_batch(collator((items * size)[:size]))


def check_first_batch(model, collator, dataset, what: str = "train_dataset") -> dict:
    """Fail before any work if the collated batch does not fit the model (keys, image shape, channels, labels);
    returns that batch (of the first items)."""
    items = first_items(dataset)
    if not items:
        raise ValueError(f"{what} is empty")
    try:
        batch = collator(items)
    except Exception as error:
        unlabelled = _unlabelled_item(items, getattr(collator, "label_column", None))
        if unlabelled is not None:  # the collator's error would not say which item, nor why
            index, column = unlabelled
            raise ValueError(no_label_message(f"{what} (column {column!r})", index,
                                              getattr(model.config, "num_labels", None),
                                              getattr(model.config, "problem_type", None))) from error
        keys = sorted(items[0]) if isinstance(items[0], dict) else type(items[0]).__name__
        raise ValueError(
            f"the data collator failed on the first items of {what} (items hold {keys}): {type(error).__name__}: "
            f"{error}. Each batch must be a dict with 'pixel_values' and 'labels'"
        ) from error
    pixel_values, labels = split_batch(batch)
    if labels is None:
        raise ValueError(f"each batch of {what} must be a dict with 'pixel_values' and 'labels', got {sorted(batch)}")
    if not torch.is_tensor(pixel_values) or pixel_values.dim() != 4:
        shape = tuple(pixel_values.shape) if torch.is_tensor(pixel_values) else type(pixel_values).__name__
        raise ValueError(
            f"'pixel_values' must be a batch of images [batch, channels, height, width], got {shape} from {what} "
            "(apply the image transform, e.g. with dataset.with_transform)"
        )
    base = getattr(model, getattr(model, "base_model_prefix", ""), None)  # model.revnet, model.revvit, ...
    check = getattr(base, "check_pixel_values", None)
    if check is not None:
        check(pixel_values)
    num_labels = getattr(model.config, "num_labels", None)
    if not torch.is_tensor(labels):
        raise ValueError(f"'labels' must be a tensor, got {type(labels).__name__} from {what}")
    counted = class_indices(labels, num_labels, getattr(model.config, "problem_type", None))
    if counted is not None and not 0 <= int(counted.min()) <= int(counted.max()) < num_labels:
        raise ValueError(
            f"labels must lie in [0, {num_labels - 1}] ({IGNORE_INDEX} marks an image the loss ignores), got "
            f"{labels.tolist()} in the first items of {what}"
        )
    return batch


def _unlabelled_item(items: list, label_column: str | None = None) -> tuple[int, str] | None:
    """(index, key) of the first item whose label (`label_column`, else "labels" or "label") is None."""
    keys = [key for key in (label_column, "labels", "label") if key]
    for index, item in enumerate(items):
        key = next((key for key in keys if isinstance(item, dict) and key in item), None)
        if key is not None and item[key] is None:
            return index, key
    return None


def no_label_message(of: str, index: int, num_labels: int | None, problem_type: str | None = None) -> str:
    """What the checks say of an item whose label is None (an empty cell of a label column): which item, not "float
    labels", which is what the NaN a float tensor makes of None would suggest."""
    if problem_type == "single_label_classification" or problem_type is None and (num_labels or 0) > 1:
        needed = "a class index"
    else:
        needed = "a label (its targets)"
    return f"{of} has no label for item {index} (None): every training item needs {needed}"


def make_loader(args, collator, dataset, batch_size: int, sampler=None) -> DataLoader:
    """A DataLoader honouring the `dataloader_*` arguments (not sharded: the trainer orders the data itself). Its
    own generator (reseeded each epoch by `epoch_batches`) seeds the workers, so that starting an iterator never
    draws from the global generator that dropout and main-process augmentations use: a resumed run, which starts
    its iterator elsewhere in the epoch, draws what the uninterrupted run did."""
    workers = args.dataloader_num_workers
    return DataLoader(
        dataset,
        generator=torch.Generator().manual_seed(data_seed(args)),
        batch_size=batch_size,
        sampler=sampler,
        collate_fn=collator,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory and torch.cuda.is_available(),
        drop_last=args.dataloader_drop_last,
        persistent_workers=args.dataloader_persistent_workers and workers > 0,
        prefetch_factor=args.dataloader_prefetch_factor if workers > 0 else None,
    )


def data_seed(args) -> int:
    return args.data_seed if args.data_seed is not None else args.seed


def epoch_batches(loader: DataLoader, dataset, epoch: int, offset: int, replica: int, replicas: int, seed: int = 0):
    """Replica `replica`'s micro-batches of `epoch`, from its `offset`-th on (`seed`: the run's data seed)."""
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    loader.generator.manual_seed(seed + epoch)  # the workers' seeds depend on the epoch alone
    if isinstance(loader.sampler, EpochSampler):
        loader.sampler.set_epoch(epoch, start=offset * loader.batch_size)
        return iter(loader)
    return _every_dth(loader, replica, replicas, offset)


def _every_dth(loader, replica: int, replicas: int, offset: int):
    """A stream's batches for replica `replica` of D: batch replica, replica + D, ... of each whole round of D
    batches, from the `offset`-th round on. A last round shorter than D is dropped, so that every replica's epoch
    has as many micro-batches and their collectives stay in step."""
    stream = iter(loader)
    rounds = iter(lambda: tuple(itertools.islice(stream, replicas)), ())  # until the stream is exhausted
    return (batches[replica] for batches in itertools.islice(rounds, offset, None) if len(batches) == replicas)


def labels_digest(labels: torch.Tensor | None) -> str | None:
    """A fingerprint of the train set's labels, in order, as `check_all_labels` returns them (None where they are only
    known when read: a stream, a plain torch Dataset): checkpoints record it, so that a resumed run, and every
    process, reads the same data, not only a set of the same name and size (another split of it, say)."""
    if labels is None:
        return None
    return "sha256:" + hashlib.sha256(labels.to(torch.int64 if not labels.is_floating_point() else torch.float64)
                                      .contiguous().numpy().tobytes()).hexdigest()[:16]


def dataset_label(dataset) -> str | None:
    """The train set's name and size as checkpoints record it (a resumed run must read the same data)."""
    if dataset is None:
        return None
    size = len(dataset) if not isinstance(dataset, IterableDataset) and hasattr(dataset, "__len__") else None
    info = getattr(dataset, "info", None)
    name = getattr(info, "name", None) or getattr(info, "dataset_name", None) or type(dataset).__name__
    return f"{name} ({size})" if size is not None else name


def plan_steps(loader: DataLoader, args) -> tuple[int | None, int, int]:
    """(micro-batches per epoch or None without a length, steps per epoch, max_steps). As in transformers' Trainer,
    the partial accumulation group at the end of an epoch is a step of its own."""
    per_epoch = len(loader) if not isinstance(loader.dataset, IterableDataset) else None
    if per_epoch == 0:
        raise ValueError("the train dataset yields no micro-batch (empty, or drop_last with too few samples)")
    if per_epoch is None and args.max_steps <= 0:
        raise ValueError("a train_dataset without a length (an IterableDataset) needs max_steps > 0")
    steps_per_epoch = math.ceil(per_epoch / args.gradient_accumulation_steps) if per_epoch else args.max_steps
    max_steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * steps_per_epoch)
    return per_epoch, steps_per_epoch, max_steps


def check_all_labels(dataset, num_labels: int | None, what: str = "train_dataset", collator=None,
                     problem_type: str | None = None) -> torch.Tensor | None:
    """Every label of an in-memory data set, checked before training (not only the first batch's): class indices in
    [0, num_labels) or IGNORE_INDEX, for single-label classification (`class_indices`); floating-point labels of one
    value per item cannot be the targets of several classes. Data sets that only produce labels when read (a plain
    torch Dataset, a stream) are checked batch by batch by the loss instead. A `datasets.Dataset`'s label column is
    the one the collator reads (its `label_column`, as the recipe's ImageClassificationCollator has), else the one
    its transform names (the recipe's ApplyTransform), else "labels" or "label". An item whose label is None (an
    empty cell of the column; a list of labels holding None) is refused as such, by its index. Returns the labels it
    checked (None where there were none to read), for `labels_digest`: the column is read once."""
    labels, column, missing = _all_labels(dataset, getattr(collator, "label_column", None))
    of = f"{what} (column {column!r})" if column else what
    if missing is not None:
        raise ValueError(no_label_message(of, missing, num_labels, problem_type))
    if labels is not None and labels.is_floating_point() and labels.dim() == 1 and (num_labels or 0) > 1:
        raise ValueError(f"{of} has floating-point labels ({labels[:5].tolist()}, ...), one per item: class labels "
                         f"must be integers (multi-label and regression targets are [items, {num_labels}])")
    counted = None if labels is None else class_indices(labels, num_labels, problem_type)
    if counted is None:
        return labels
    low, high = int(counted.min()), int(counted.max())
    if low < 0 or high >= num_labels:
        bad = int((((labels < 0) & (labels != IGNORE_INDEX)) | (labels >= num_labels)).nonzero()[0])
        raise ValueError(
            f"{of} has labels outside [0, {num_labels - 1}] (the model's num_labels={num_labels}): "
            f"item {bad} is labelled {int(labels[bad])}"
        )
    return labels


def _all_labels(dataset, label_column: str | None = None) -> tuple[torch.Tensor | None, str | None, int | None]:
    """(labels, the column they come from, the first item whose label is None). A float tensor would hold a None as
    NaN (and "float labels" would be the wrong complaint): the column's empty cells are looked for first, in Arrow."""
    labels = getattr(dataset, "labels", None)
    if torch.is_tensor(labels):
        return labels, None, None
    if isinstance(labels, (list, tuple)):  # a plain data set's list of labels, read when it is: only its gaps here
        missing = next((index for index, label in enumerate(labels) if label is None), None)
        if missing is not None:
            return None, None, missing
    import datasets

    if not isinstance(dataset, datasets.Dataset):  # a stream (datasets.IterableDataset) is read only once, in training
        return None, None, None
    transform = (dataset.format.get("format_kwargs") or {}).get("transform")
    named = label_column or getattr(transform, "label_column", None)
    candidates = (named,) if named else ("labels", "label")
    column = next((name for name in candidates if name in dataset.column_names), None)
    if column is None:  # its label column, read without transforms
        return None, None, None
    if dataset.data.column(column).null_count:  # the table's count; the items the set keeps may have none
        import pyarrow.compute

        cells = dataset.select_columns([column]).with_format("arrow")[column]
        missing = pyarrow.compute.index(cells.is_null(), True).as_py()
        if missing >= 0:
            return None, column, missing
    return torch.as_tensor(dataset.select_columns([column]).with_format("numpy")[column]), column, None
