"""Saving a pipeline between two steps without draining it: a pipeline loaded from the state continues exactly as the
one that was saved, on any number of processes, and the saving changes nothing."""

import io

import pytest
import torch
import torch.nn.functional as F

from petra_hub.engine import Layout, MemoryOptions, Pipeline, PipelineError, Precision, Remedies
from petra_hub.testing.models import random_images, small_model, small_revvit
from petra_hub.testing.ranks import run_ranks

MICRO_BATCHES = 11


def data(config, count=MICRO_BATCHES):
    generator = torch.Generator().manual_seed(3)
    batches = []
    for _ in range(count):
        if hasattr(config, "image_size"):  # a RevViT
            images = torch.randn(4, config.num_channels, config.image_size, config.image_size, generator=generator,
                                 dtype=torch.float64)
        else:
            seed = int(torch.randint(99, (), generator=generator))
            images = random_images(config, batch=4, dtype=torch.float64, seed=seed)
        batches.append((images, torch.randint(0, config.num_labels, (4,), generator=generator)))
    return batches


def momentum(index, stage):
    return torch.optim.SGD(stage.parameters(), lr=0.05, momentum=0.9)


def make_model(kind):
    if kind == "revvit-dropout":  # random stages: the in-flight micro-batches replay their forwards' dropout masks
        return small_revvit(hidden_dropout_prob=0.2, drop_path_rate=0.1, num_hidden_layers=4)
    return small_model("revnet18")


def make_pipeline(model, mode="petra", k=2, remedies=None, partition=None, **options):
    model.train()
    return Pipeline(model.get_stages(), F.cross_entropy, mode=mode, accumulation_steps=k, optimizer_factory=momentum,
                    remedies=remedies, layout=Layout(partition=partition), timeout=30, **options)


def through_a_file(value):
    """What a checkpoint gives back: saved with torch.save, read without unpickling code."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def feed(pipeline, batches, close_every=None):
    losses = []
    for inputs, targets in batches:
        losses += pipeline.step(inputs, targets)
        if close_every and pipeline.fed % close_every == 0:
            pipeline.end_group()  # a group closed before k, as at an epoch's end
    return losses


def weights(model):
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


CASES = [
    pytest.param("revnet", "petra", 2, None, None, id="petra-k2"),
    pytest.param("revnet", "petra", 3, None, 5, id="petra-k3-groups-closed-early"),
    pytest.param("revnet", "petra", 1, Remedies(weight_prediction=0.5), None, id="petra-weight-prediction"),
    pytest.param("revnet", "delayed", 2, None, None, id="delayed-stashed-weights"),
    pytest.param("revnet", "input_buffer", 1, None, None, id="input-buffer"),
    pytest.param("revnet", "reversible_backprop", 2, None, None, id="synchronous"),
    pytest.param("revvit-dropout", "petra", 2, None, None, id="petra-dropout-and-stochastic-depth"),
    pytest.param("revnet", "petra", 2, Remedies(synchronous_updates=3), None,
                 id="synchronous-start-saved-during-and-after"),
]


@pytest.mark.parametrize("kind,mode,k,remedies,close_every", CASES)
def test_a_pipeline_loaded_between_steps_continues_as_the_saved_one(kind, mode, k, remedies, close_every):
    """Saved after 4 and after 7 micro-batches (work in flight at every stage), loaded into a new model and
    pipeline: the weights, losses and counters at the end equal those of the run that was saved, which equal those of
    a run that never saved."""
    model = make_model(kind)
    batches = data(model.config)
    never = make_model(kind)
    reference = make_pipeline(never, mode, k, remedies)
    torch.manual_seed(7)  # the dropout masks
    reference_losses = feed(reference, batches, close_every) + reference.drain()

    saved_run = make_pipeline(model, mode, k, remedies)
    torch.manual_seed(7)
    losses = feed(saved_run, batches[:4], close_every)
    assert any(worker.in_flight for worker in saved_run.workers.values()) or not saved_run.running_mode.pipelined
    saves = {4: through_a_file((weights(model), saved_run.state_dict(), torch.random.get_rng_state(), len(losses)))}
    losses += feed(saved_run, batches[4:7], close_every)
    saves[7] = through_a_file((weights(model), saved_run.state_dict(), torch.random.get_rng_state(), len(losses)))
    losses += feed(saved_run, batches[7:], close_every) + saved_run.drain()
    expected_losses = [(m, float(loss)) for m, loss in reference_losses]
    assert [(m, float(loss)) for m, loss in losses] == expected_losses
    assert all(torch.equal(a, b) for a, b in zip(weights(model).values(), weights(never).values()))

    for at, (state, pipeline_state, rng, losses_before) in saves.items():
        resumed_model = make_model(kind)
        resumed_model.load_state_dict(state)
        resumed = make_pipeline(resumed_model, mode, k, remedies)
        resumed.load_state_dict(pipeline_state)
        torch.random.set_rng_state(rng)
        resumed_losses = feed(resumed, batches[at:], close_every) + resumed.drain()
        assert [(m, float(loss)) for m, loss in resumed_losses] == expected_losses[losses_before:]
        for name, value in weights(never).items():
            assert torch.equal(resumed_model.state_dict()[name], value), (at, name)
        assert {i: (c.forwards, c.backwards, c.updates, c.last_backward) for i, c in resumed.counters().items()} == \
            {i: (c.forwards, c.backwards, c.updates, c.last_backward) for i, c in reference.counters().items()}


def test_fp16_loss_scale_and_its_open_group_survive_a_save():
    """With fp16 loss scaling the open group's overflow flags travel with the state."""
    model = small_model("revnet18", dtype=torch.float32)
    batches = [(x.float(), y) for x, y in data(model.config)]
    torch.manual_seed(7)
    never = small_model("revnet18", dtype=torch.float32)
    reference = make_pipeline(never, precision=Precision.of("fp16"))
    feed(reference, batches)
    reference.drain()
    saved_run = make_pipeline(model, precision=Precision.of("fp16"))
    feed(saved_run, batches[:5])
    state = through_a_file((weights(model), saved_run.state_dict()))
    resumed_model = small_model("revnet18", dtype=torch.float32)
    resumed_model.load_state_dict(state[0])
    resumed = make_pipeline(resumed_model, precision=Precision.of("fp16"))
    resumed.load_state_dict(state[1])
    feed(resumed, batches[5:])
    resumed.drain()
    assert all(torch.equal(a, b) for a, b in zip(weights(resumed_model).values(), weights(never).values()))


def _ranks_save_then_others_load(rank, world, partition, load_partition, folder, at):
    """Phase "save" on `world` ranks with `partition`: train `at` micro-batches, write each stage's state and (from
    rank 0) the whole model; phase "load" reads them back with `load_partition` and finishes the run."""
    torch.set_num_threads(1)
    model = small_model("revnet18")
    batches = data(model.config)
    if load_partition is None:
        pipeline = make_pipeline(model, partition=partition)
        feed(pipeline, batches[:at])
        for index, state in pipeline.state_dict().items():
            torch.save(state, f"{folder}/stage_{index}.pt")
        pipeline.gather_stages(dst=0)  # without a drain: the weights as they are now
        if rank == 0:
            torch.save(weights(model), f"{folder}/model.pt")
        return None
    model.load_state_dict(torch.load(f"{folder}/model.pt", weights_only=True))
    pipeline = make_pipeline(model, partition=load_partition)
    pipeline.load_state_dict({index: torch.load(f"{folder}/stage_{index}.pt", weights_only=True)
                              for index in pipeline.local})
    losses = feed(pipeline, batches[at:]) + pipeline.drain()
    pipeline.gather_stages(dst=0)
    return {"state": weights(model) if rank == 0 else None, "losses": [(m, float(loss)) for m, loss in losses]}


def test_two_ranks_save_in_flight_and_three_ranks_or_one_process_continue_bit_identically(tmp_path):
    torch.set_num_threads(1)
    never = small_model("revnet18")
    reference = make_pipeline(never)
    batches = data(never.config)
    assert feed(reference, batches[:6]) == []  # J = 10: no micro-batch has reached the loss yet
    reference_losses = [(m, float(loss)) for m, loss in feed(reference, batches[6:]) + reference.drain()]
    (tmp_path / "save").mkdir()
    (tmp_path / "load").mkdir()
    results, codes, _ = run_ranks(_ranks_save_then_others_load, 2, [4, 6], None, str(tmp_path), 6,
                                  out_dir=tmp_path / "save", deadline=120)
    assert codes == [0, 0], [r and r.get("traceback") for r in results]
    results, codes, _ = run_ranks(_ranks_save_then_others_load, 3, [4, 6], [3, 3, 4], str(tmp_path), 6,
                                  out_dir=tmp_path / "load", deadline=120)
    assert codes == [0, 0, 0], [r and r.get("traceback") for r in results]
    one = _ranks_save_then_others_load(0, 1, None, [10], str(tmp_path), 6)
    assert results[2]["value"]["losses"] == one["losses"] == reference_losses
    for state in (results[0]["value"]["state"], one["state"]):
        for name, value in weights(never).items():
            assert torch.equal(state[name], value), name


def test_what_cannot_be_saved_in_flight_asks_for_a_drain():
    """Kept graphs cannot be saved: `state_dict` names them and asks for a drain; after the drain it works."""
    model = small_model("revnet18")
    pipeline = make_pipeline(model, memory=MemoryOptions(keep_graphs=[1, 2]))
    feed(pipeline, data(model.config, 3))
    assert pipeline.snapshot_blocker() == "stages [1, 2] keep their forward's autograd graph, which cannot be saved"
    with pytest.raises(PipelineError, match=r"needs a drained pipeline here \(stages \[1, 2\] keep .*call drain"):
        pipeline.state_dict()
    pipeline.drain()
    assert pipeline.state_dict()[0]["in_flight"]["pending"] == {}

    probed = make_pipeline(small_model("revnet18"))
    probed.probe()
    feed(probed, data(model.config, 2))
    assert probed.snapshot_blocker() == "a gradient-fidelity probe is in flight"


def test_a_loaded_state_that_does_not_fit_the_schedule_is_refused():
    """Stages saved at different moments, work in flight the schedule does not have there, or a pipeline that has
    stepped already: each refused with what is wrong."""
    model = small_model("revnet18")
    batches = data(model.config, 6)
    pipeline = make_pipeline(model)
    feed(pipeline, batches[:3])
    early = through_a_file(pipeline.state_dict())
    feed(pipeline, batches[3:4])
    late = through_a_file(pipeline.state_dict())

    mixed = {**late, 0: early[0]}
    with pytest.raises(ValueError, match="stand at different positions"):
        make_pipeline(small_model("revnet18")).load_state_dict(mixed)

    tampered = through_a_file(late)
    tampered[2]["in_flight"]["pending"].pop(min(tampered[2]["in_flight"]["pending"]))
    with pytest.raises(ValueError, match=r"saved stage 2 holds micro-batches \[.*\] in flight, where the schedule "
                                         r"has \[.*\] at tick 4"):
        make_pipeline(small_model("revnet18")).load_state_dict(tampered)

    stepped = make_pipeline(small_model("revnet18"))
    feed(stepped, batches[:1])
    with pytest.raises(PipelineError, match="loads the work in flight before its first step"):
        stepped.load_state_dict(late)


@pytest.mark.parametrize("mode", ["petra", "reversible_backprop"])
def test_a_long_run_between_drains_keeps_only_the_sizes_of_the_micro_batches_in_flight(mode):
    """What the router keeps per micro-batch (its size, and its digest across ranks) is forgotten once the micro-batch
    has finished at every stage, but for the last one fed: it does not grow with the run."""
    model = small_model("revnet18")
    pipeline = make_pipeline(model, mode, k=1)
    batches = data(model.config, 30)
    feed(pipeline, batches)
    latency = 2 * (pipeline.num_stages - 1)
    expected = list(range(30 - latency, 30)) if mode == "petra" else [29]
    assert sorted(pipeline.router.batch_sizes) == expected
    pipeline.drain()
    assert pipeline.router.batch_sizes == {}
