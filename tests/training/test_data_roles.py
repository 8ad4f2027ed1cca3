"""Each rank reads only what its stages need: the rank of stage 0 loads the items, the rank of the last stage reads
the labels column, a rank between them loads nothing; the weights are those one process trains."""

import torch
from torch.utils.data import Dataset

from petra_hub.data import load_image_dataset, take
from petra_hub.testing.ranks import run_ranks
from tests.training.test_multiprocess import as_launched
from tests.training.test_trainer import make_trainer

STEPS, MICRO_BATCH, K = 6, 8, 2  # make_trainer's


class Counted(Dataset):
    """A built-in data set that counts the items loaded from it (its epochs' augmentation seeds, `set_epoch`, and
    its description kept); without `with_labels`, it hides its labels column."""

    def __init__(self, base, with_labels: bool = True):
        self.base, self.loaded, self.with_labels = base, 0, with_labels
        self.info, self.set_epoch = base.info, base.set_epoch

    @property
    def labels(self):
        if not self.with_labels:
            raise AttributeError("labels")
        return self.base.labels

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        self.loaded += 1
        return self.base[index]


def train_set():
    return take(load_image_dataset("digits", "train"), 64)


def _train(rank, world_size, folder, with_labels, then_infer=False):
    """Train on a counted set; with `then_infer`, also evaluate on and predict a counted test set."""
    if world_size > 1:
        as_launched(rank, world_size)
    data = Counted(train_set(), with_labels)
    trainer = make_trainer(folder, train=data, max_steps=STEPS, petra_partition="4,3,3" if world_size == 3 else None)
    trainer.train()
    result = {"loaded": data.loaded, "why": trainer._reading.why,
              "state": {k: v.clone() for k, v in trainer.model.state_dict().items()}}
    if then_infer:
        counted = Counted(trainer.eval_dataset)
        metrics = trainer.evaluate(counted)
        evaluated = counted.loaded
        prediction = trainer.predict(counted)
        result.update(evaluated=evaluated, predicted=counted.loaded - evaluated, accuracy=metrics["eval_accuracy"],
                      loss=metrics["eval_loss"], logits=torch.as_tensor(prediction.predictions),
                      labels=torch.as_tensor(prediction.label_ids))
    return result


def test_only_the_first_rank_loads_items_and_three_ranks_train_evaluate_and_predict_as_one_does(tmp_path):
    results, _, _ = run_ranks(_train, 3, str(tmp_path / "three"), True, True, deadline=240)
    assert all(r is not None and "value" in r for r in results), [r and r.get("traceback") for r in results]
    first, middle, last = (r["value"] for r in results)
    checked = 2  # the first items, which every rank collates to check them against the model before training
    assert first["loaded"] == checked + STEPS * K * MICRO_BATCH
    assert middle["loaded"] == last["loaded"] == checked
    assert first["why"] is middle["why"] is last["why"] is None
    size = 40  # make_trainer's test set
    assert first["evaluated"] == first["predicted"] == size
    assert middle["evaluated"] == middle["predicted"] == 0
    assert last["evaluated"] == last["predicted"] == 2  # its first items: whether its batches carry labels
    one = _train(0, 1, str(tmp_path / "one"), True, True)
    for value in (first, middle, last):
        assert all(torch.equal(value["state"][name], one["state"][name]) for name in one["state"])
        assert (value["accuracy"], value["loss"]) == (one["accuracy"], one["loss"])
        assert torch.equal(value["logits"], one["logits"]) and torch.equal(value["labels"], one["labels"])


def test_without_a_labels_column_the_last_rank_loads_the_items_and_says_why(tmp_path):
    results, _, _ = run_ranks(_train, 3, str(tmp_path / "three"), False, deadline=240)
    assert all(r is not None and "value" in r for r in results), [r and r.get("traceback") for r in results]
    first, middle, last = (r["value"] for r in results)
    assert first["loaded"] == last["loaded"] == 2 + STEPS * K * MICRO_BATCH and middle["loaded"] == 2
    assert "its labels cannot be read without loading the items" in last["why"]
    assert first["why"] is middle["why"] is None
    assert all(torch.equal(last["state"][name], first["state"][name]) for name in first["state"])


def test_what_each_rank_reads_follows_its_stages_and_the_labels_column():
    from torch.utils.data import DataLoader

    from petra_hub.training import EpochSampler
    from petra_hub.training.feeding import reading_for

    data = train_set()
    loader = DataLoader(data, batch_size=8, sampler=EpochSampler(len(data), 0))
    column, first = data.labels, data.labels[:2].clone()
    assert reading_for(True, False, loader, column, first).images  # stage 0: the items
    middle = reading_for(False, False, loader, column, first)
    assert not middle.images and middle.labels is None and middle.why is None
    last = reading_for(False, True, loader, column, first)
    assert not last.images and last.labels is column
    assert reading_for(False, True, loader, column, None) == middle  # nothing to predict against: no labels needed
    for collated, why in ((first + 1, "labels differ"), (first.float(), "labels differ"),
                          (first, "cannot be read without loading")):
        reading = reading_for(False, True, loader, None if "cannot" in why else column, collated)
        assert reading.images and why in reading.why
    stream = DataLoader(data, batch_size=8)  # not ordered by an EpochSampler: read as a stream
    assert not reading_for(False, True, stream, column, first).images  # a stream: told by the first stage
    assert reading_for(True, False, stream, column, first).images


class WorkerLogged(Dataset):
    """A data set whose items, loaded in a DataLoader worker, leave a line naming the loading process's rank."""

    def __init__(self, base, log_path):
        self.base, self.log_path, self.info, self.labels = base, log_path, base.info, base.labels

    def __len__(self):
        return len(self.base)

    def __getitem__(self, index):
        import os

        if torch.utils.data.get_worker_info() is not None:
            with open(self.log_path, "a") as log:
                log.write(f"{os.environ.get('RANK', '0')}\n")
        return self.base[index]


def _train_on_cifar_files(rank, world_size, folder, data_dir, log_path, workers=1):
    """Train on CIFAR-10 batch files, each process holding the images only where it runs the first stage, with a
    DataLoader worker that logs the items it loads."""
    from petra_hub.training import PetraTrainingArguments

    if world_size > 1:
        as_launched(rank, world_size)
    keep_images = PetraTrainingArguments(output_dir=folder, report_to=[]).runs_first_stage()
    data = load_image_dataset("cifar10", "train", data_dir=data_dir, keep_images=keep_images)
    trainer = make_trainer(folder, train=WorkerLogged(data, log_path), max_steps=7, dataloader_num_workers=workers,
                           petra_partition="4,3,3" if world_size == 3 else None)
    trainer.train()
    kept_file = getattr(data._source, "_kept_file", "all")  # the files read on demand: those of the checked items
    return {"keep_images": keep_images, "runs_first_stage": trainer.pipeline.has_first_stage, "kept_file": kept_file,
            "state": {k: v.clone() for k, v in trainer.model.state_dict().items()}}


def test_processes_without_the_first_stage_hold_no_images_start_no_workers_and_train_as_one_process_does(tmp_path):
    import numpy as np

    from petra_hub.testing.data_files import write_cifar10

    write_cifar10(str(tmp_path / "cifar"), np.random.default_rng(0), n_train=20)
    data_dir, log_path = str(tmp_path / "cifar"), tmp_path / "loaded-in-workers"
    data_set = load_image_dataset("cifar10", "train", data_dir=data_dir)
    results, _, _ = run_ranks(_train_on_cifar_files, 3, str(tmp_path / "three"), data_dir, str(log_path),
                              deadline=240)
    assert all(r is not None and "value" in r for r in results), [r and r.get("traceback") for r in results]
    values = [r["value"] for r in results]
    assert [v["keep_images"] for v in values] == [v["runs_first_stage"] for v in values] == [True, False, False]
    assert [v["kept_file"] for v in values] == ["all", 0, 0]  # the first file: the checked first items' only
    loaded = log_path.read_text().split()
    assert set(loaded) == {"0"} and len(loaded) == len(data_set)  # 7 steps of k = 2: the 13 micro-batches of an epoch
    one = _train_on_cifar_files(0, 1, str(tmp_path / "one"), data_dir, str(tmp_path / "one-log"), workers=0)
    assert one["keep_images"]
    for value in values:
        assert all(torch.equal(value["state"][name], one["state"][name]) for name in one["state"])


class CountedStream(torch.utils.data.IterableDataset):
    """A stream of a data set's items that counts the items read from it."""

    def __init__(self, base):
        self.base, self.read = base, 0

    def __iter__(self):
        for index in range(len(self.base)):
            self.read += 1
            yield self.base[index]


def _train_on_a_stream(rank, world_size, folder):
    if world_size > 1:
        as_launched(rank, world_size)
    stream = CountedStream(take(load_image_dataset("digits", "train"), 40))  # 5 micro-batches a pass
    trainer = make_trainer(folder, train=stream, max_steps=STEPS, petra_partition="4,3,3" if world_size == 3 else None)
    trainer.train()
    trained = stream.read
    test = CountedStream(take(load_image_dataset("digits", "test"), 20))  # 2 batches of 16, the last of 4
    metrics, prediction = trainer.evaluate(test), trainer.predict(test)
    return {"read": trained, "inferred": test.read, "accuracy": metrics["eval_accuracy"], "loss": metrics["eval_loss"],
            "logits": torch.as_tensor(prediction.predictions), "labels": torch.as_tensor(prediction.label_ids),
            "losses": [log["loss"] for log in trainer.state.log_history if "loss" in log],
            "state": {k: v.clone() for k, v in trainer.model.state_dict().items()}}


def test_only_the_first_rank_iterates_a_stream_and_three_ranks_train_evaluate_and_predict_as_one_does(tmp_path):
    results, _, _ = run_ranks(_train_on_a_stream, 3, str(tmp_path / "three"), deadline=240)
    assert all(r is not None and "value" in r for r in results), [r and r.get("traceback") for r in results]
    first, middle, last = (r["value"] for r in results)
    checked = 2  # the first items, which every rank collates to check them against the model before training
    assert middle["read"] == last["read"] == checked
    assert first["read"] == checked + 2 * 40  # 5 micro-batches a pass, k = 2: 3 steps a pass, 6 steps in 2 passes
    assert middle["inferred"] == last["inferred"] == 0 and first["inferred"] == 2 * 20
    one = _train_on_a_stream(0, 1, str(tmp_path / "one"))
    for value in (first, middle, last):
        assert all(torch.equal(value["state"][name], one["state"][name]) for name in one["state"])
        assert value["losses"] == one["losses"]
        assert (value["accuracy"], value["loss"]) == (one["accuracy"], one["loss"])
        assert torch.equal(value["logits"], one["logits"]) and torch.equal(value["labels"], one["labels"])


def test_batches_stay_as_they_are_where_the_device_is_not_a_gpu():
    from petra_hub.training.feeding import MicroBatch, ahead_on_device

    batches = [MicroBatch(2, None, torch.zeros(2, 3, 4, 4), torch.tensor([0, 1])) for _ in range(3)]
    for device in (None, torch.device("cpu"), torch.device("meta")):
        assert all(a is b for a, b in zip(ahead_on_device(iter(batches), device), batches, strict=True))
