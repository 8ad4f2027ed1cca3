"""What each rank reads of the training data: the rank of stage 0 the images, the rank of the last stage the labels,
a rank between them nothing but the order.

Every rank draws the same order (`EpochSampler`, seeded alike) and hands the engine each micro-batch's sample
indices, whose digest neighbouring ranks compare. Only a rank that runs stage 0 iterates the DataLoader (decoding,
augmenting and collating, with its workers and pinned memory). The rank of the last stage takes the labels of the
batch's indices from the label column the checks read before training (`check_all_labels`), without loading an
image; where a data set has no such column (a plain torch `Dataset` without a `labels` tensor), or its collated
labels are not the column's, that rank loads the items as the first does and says why, once. A stream
(`IterableDataset`) has no indices and cannot be read twice in the same order: the rank of stage 0 alone iterates it
and, before each micro-batch, tells the others of its pipeline its size and labels (`Pipeline.share_from_first_stage`;
nothing more at the stream's end), and neighbours compare the digests of the labels.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Callable, Iterator

import torch
from torch.utils.data import DataLoader

from .batches import epoch_batches, split_batch
from .sampler import EpochSampler

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class MicroBatch:
    """One micro-batch as a rank has it: what it read (None where it reads nothing) and what every rank knows."""

    size: int
    sample_ids: torch.Tensor | None  # None for a stream
    pixel_values: torch.Tensor | None = None
    labels: torch.Tensor | None = None
    batch: dict | None = None  # the collated batch, where this rank loaded the items


@dataclasses.dataclass(frozen=True)
class Reading:
    """What a rank reads: the items (`images`: the DataLoader's collated batches), or only the labels from
    `labels` (a tensor indexed by sample), or nothing; `why` says why a rank that needs labels alone loads the
    items."""

    images: bool
    labels: torch.Tensor | None = None
    why: str | None = None


Share = Callable[[dict | None], dict | None]  # Pipeline.share_from_first_stage


def is_stream(loader: DataLoader) -> bool:
    """Whether `loader` reads a stream (an `IterableDataset`), not a data set ordered by an `EpochSampler`."""
    return not isinstance(loader.sampler, EpochSampler)


def reading_for(runs_first: bool, runs_last: bool, loader: DataLoader, labels: torch.Tensor | None,
                first_labels: torch.Tensor | None) -> Reading:
    """What a rank that runs stage 0 (`runs_first`) and/or the last stage (`runs_last`) reads. `labels`: the data
    set's labels read without loading items (None where there are none); `first_labels`: the collated labels of
    its first items, which the column must reproduce (values and dtype) to stand in for them (None: its batches
    carry no labels, as a set to predict may not, and the last stage needs none)."""
    if runs_first:
        return Reading(images=True)
    if not runs_last or first_labels is None or is_stream(loader):  # a stream's labels: told by the first
        return Reading(images=False)
    if labels is None:
        return Reading(images=True, why="its labels cannot be read without loading the items (give the data set a "
                                        "`labels` tensor, or use a `datasets.Dataset` with a label column)")
    expected = labels[: len(first_labels)]
    if expected.dtype != first_labels.dtype or not torch.equal(expected, first_labels):
        return Reading(images=True, why="its collator's labels differ from the data set's label column")
    return Reading(images=False, labels=labels)


def rank_batches(loader: DataLoader, dataset, reading: Reading, epoch: int, offset: int, replica: int,
                 replicas: int, seed: int, share: Share, device: torch.device | None = None) -> Iterator[MicroBatch]:
    """This rank's micro-batches of `epoch`, from the `offset`-th on, reading what `reading` says; on a CUDA
    `device`, the images read are copied there ahead (`ahead_on_device`)."""
    if is_stream(loader):
        if not reading.images:
            return _told(share)
        batches = epoch_batches(loader, dataset, epoch, offset, replica, replicas, seed)
        return _telling(ahead_on_device(_loaded(batches, itertools.repeat(None)), device), share)
    if reading.images:
        batches = epoch_batches(loader, dataset, epoch, offset, replica, replicas, seed)  # positions the sampler
        return ahead_on_device(_loaded(batches, loader.batch_sampler), device)
    if hasattr(dataset, "set_epoch"):
        dataset.set_epoch(epoch)
    loader.sampler.set_epoch(epoch, start=offset * loader.batch_size)
    return _indexed_only(loader, reading)


def inference_batches(loader: DataLoader, reading: Reading, share: Share,
                      device: torch.device | None = None) -> Iterator[MicroBatch]:
    """The batches of an evaluation or a prediction (no epochs, no shuffling), reading what `reading` says."""
    if is_stream(loader):
        if not reading.images:
            return _told(share)
        return _telling(ahead_on_device(_loaded(iter(loader), itertools.repeat(None)), device), share)
    loader.sampler.set_epoch(0)
    if reading.images:
        return ahead_on_device(_loaded(iter(loader), loader.batch_sampler), device)
    return _indexed_only(loader, reading)


def _loaded(batches, index_batches) -> Iterator[MicroBatch]:
    """The collated `batches`, each with its sample indices (None for a stream)."""
    for indices, batch in zip(index_batches, batches):
        pixel_values, labels = split_batch(batch)
        ids = None if indices is None else torch.tensor(indices)
        yield MicroBatch(len(pixel_values), ids, pixel_values, labels, batch)


def _indexed_only(loader: DataLoader, reading: Reading) -> Iterator[MicroBatch]:
    """The sampler's index batches, with the labels of `reading`'s column where it has one; no item loaded."""
    for indices in loader.batch_sampler:
        ids = torch.tensor(indices)
        yield MicroBatch(len(indices), ids, labels=reading.labels[ids] if reading.labels is not None else None)


def ahead_on_device(batches: Iterator[MicroBatch], device: torch.device | None) -> Iterator[MicroBatch]:
    """`batches` with their images copied to a CUDA `device` one micro-batch ahead, on a CUDA stream of their own:
    the copy of the next micro-batch runs while the ticks of the current one compute, asynchronously from pinned
    memory (`dataloader_pin_memory`, which the loader applies on a machine with CUDA). Each is handed on once the
    compute stream has been told to wait for its copy. The labels stay where they are: small, told to other ranks
    from the CPU (streams), and moved by the engine where the last stage runs. Elsewhere `batches` as they are.
    The next micro-batch is read from the loader, never from the pipeline's other ranks, before the current one is
    handed on."""
    if device is None or device.type != "cuda":
        yield from batches
        return
    copies = torch.cuda.Stream(device)

    def start_copy(batch: MicroBatch) -> tuple[MicroBatch, torch.cuda.Event]:
        with torch.cuda.stream(copies):
            pixel_values = batch.pixel_values.to(device, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(copies)
        return dataclasses.replace(batch, pixel_values=pixel_values), copied

    def ready(batch: MicroBatch, copied: torch.cuda.Event) -> MicroBatch:
        compute = torch.cuda.current_stream(device)
        compute.wait_event(copied)
        batch.pixel_values.record_stream(compute)  # the allocator must not reuse it while the compute stream reads it
        return batch

    ahead = None
    for batch in batches:
        started = start_copy(batch)
        if ahead is not None:
            yield ready(*ahead)
        ahead = started
    if ahead is not None:
        yield ready(*ahead)


def _telling(batches: Iterator[MicroBatch], share: Share) -> Iterator[MicroBatch]:
    """`batches`, each first told to the pipeline's other ranks (its size and labels), then their end."""
    for batch in batches:
        told = {"size": torch.tensor([batch.size])}
        if torch.is_tensor(batch.labels):
            told["labels"] = batch.labels
        share(told)
        yield batch
    share(None)


def _told(share: Share) -> Iterator[MicroBatch]:
    """The micro-batches the first stage's rank tells of, until it tells of none."""
    while (told := share(None)) is not None:
        yield MicroBatch(int(told["size"]), None, labels=told.get("labels"))


def log_reading(reading: Reading, rank: int, what: str = "the train set") -> None:
    """Say once why a rank that needs the labels alone loads the items."""
    if reading.why is not None:
        logger.warning("rank %d runs the last stage and loads every item of %s: %s", rank, what, reading.why)
