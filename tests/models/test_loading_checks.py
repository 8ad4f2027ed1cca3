"""The loading checks every model family shares (petra_hub/models/loading_checks.py): non-finite weights warn naming
them, a bad config.json is an error naming the file, and the checks travel with `trust_remote_code` folders."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch

import petra_hub.models.loading_checks as shared
from petra_hub import RevNetForImageClassification, RevViTForImageClassification, RevViTModel
from petra_hub.testing.models import small_model, small_revvit
from tests.models import remote_checks

FAMILIES = {
    "revnet": (lambda: small_model("revnet18", dtype=torch.float32), "revnet.embedder.layers.1.running_var"),
    "revvit": (lambda: small_revvit("revvit-tiny", dtype=torch.float32), "revvit.encoder.1.mlp.norm.weight"),
}


@pytest.fixture(params=sorted(FAMILIES))
def family(request):
    build, inner = FAMILIES[request.param]
    return request.param, build(), inner


def poison(model: torch.nn.Module, inner: str) -> None:
    """NaN in the classifier's weight, infinity in an inner weight or statistic."""
    with torch.no_grad():
        model.classifier.weight[0, 0] = float("nan")
        model.state_dict()[inner].view(-1)[0] = float("inf")


def test_the_families_share_one_file():
    """Each family's loading_checks.py (imported relatively, so save_pretrained copies it) is the shared file."""
    import petra_hub.models.revnet.loading_checks as revnet
    import petra_hub.models.revvit.loading_checks as revvit

    assert RevNetForImageClassification.from_pretrained.__func__ is revnet.CheckedLoadingMixin.from_pretrained.__func__
    assert RevViTForImageClassification.from_pretrained.__func__ is revvit.CheckedLoadingMixin.from_pretrained.__func__
    source = Path(shared.__file__).resolve()
    assert Path(revnet.__file__).resolve() == source and Path(revvit.__file__).resolve() == source
    # It imports nothing of petra_hub: trust_remote_code users run it without the package.
    assert "petra_hub" not in source.read_text().split("from __future__")[1]


def test_non_finite_weights_warn_naming_them(family, tmp_path):
    name, model, inner = family
    poison(model, inner)
    model.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="non-finite values") as caught:
        loaded = type(model).from_pretrained(tmp_path)
    message = " ".join(str(warning.message) for warning in caught if "non-finite" in str(warning.message))
    assert "classifier.weight" in message and inner in message
    assert type(model).__name__ in message
    assert torch.isnan(loaded.classifier.weight[0, 0])
    if name == "revvit":  # the base model, whose state-dict names lack the "revvit." prefix, warns too
        with pytest.warns(UserWarning, match=r"RevViTModel.*encoder\.1\.mlp\.norm\.weight"):
            RevViTModel.from_pretrained(tmp_path)


def test_finite_weights_load_without_a_warning(family, tmp_path):
    _, model, _ = family
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        type(model).from_pretrained(tmp_path)
    assert not [warning for warning in caught if "non-finite" in str(warning.message)]


@pytest.mark.parametrize("damage,error,message", [
    (lambda config: config.write_text("[1, 2]"), ValueError, "must hold a JSON object of .* got a list"),
    (lambda config: config.write_text("{"), ValueError, "is not valid JSON"),
    (lambda config: config.unlink(), FileNotFoundError, "needs its config.json"),
])
def test_a_bad_config_file_is_an_error_naming_it(family, tmp_path, damage, error, message):
    _, model, _ = family
    model.save_pretrained(tmp_path)
    damage(tmp_path / "config.json")
    with pytest.raises(error, match=message) as raised:
        type(model).from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(raised.value)
    # A config given explicitly needs no file.
    if not (tmp_path / "config.json").exists():
        assert type(type(model).from_pretrained(tmp_path, config=model.config)) is type(model)


def poisoned_folder(name):
    """What the interpreter without petra_hub loads (tests/models/remote_checks.py) for one family: a saved model
    with non-finite weights, and the name of the inner one."""

    def prepare(folder):
        build, inner = FAMILIES[name]
        model = build()
        poison(model, inner)
        model.save_pretrained(folder)
        return remote_checks.RemoteLoad("AutoModelForImageClassification", expected=inner)

    return prepare


for _family in FAMILIES:
    remote_checks.register(f"non_finite_{_family}", poisoned_folder(_family))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_checks_travel_with_remote_code(name, tmp_path_factory):
    """A saved folder carries loading_checks.py as a plain file, and its remote code warns without petra_hub."""
    outcome = remote_checks.outcome(f"non_finite_{name}", tmp_path_factory)
    inner = outcome.expected
    copied = outcome.folder / "loading_checks.py"
    assert copied.is_file() and not copied.is_symlink()
    assert copied.read_text() == Path(shared.__file__).read_text()
    assert outcome.error is None, outcome.error
    assert outcome.petra_hub_importable is False
    assert outcome.model_module.startswith("transformers_modules")
    caught = str([message for message in outcome.warnings if "non-finite" in message])
    assert "classifier.weight" in caught and inner in caught


# Folders and Hub ids with subfolder= --------------------------------------------------------------------------------


def assert_same_weights(loaded: torch.nn.Module, reference: torch.nn.Module) -> None:
    expected, actual = reference.state_dict(), loaded.state_dict()
    assert actual.keys() == expected.keys()
    assert all(torch.equal(actual[key], value) for key, value in expected.items())


def test_a_model_in_a_subfolder_loads_and_is_checked(family, tmp_path):
    """from_pretrained(root, subfolder=...) reads root/subfolder/config.json, as transformers does (it raised
    FileNotFoundError for root/config.json)."""
    _, model, inner = family
    model.save_pretrained(tmp_path / "final")
    assert_same_weights(type(model).from_pretrained(tmp_path, subfolder="final"), model)
    assert_same_weights(type(model).from_pretrained(pretrained_model_name_or_path=tmp_path, subfolder="final"), model)
    with pytest.raises(FileNotFoundError, match="needs its config.json") as raised:  # no model at the top
        type(model).from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(raised.value)

    poison(model, inner)
    model.save_pretrained(tmp_path / "final")
    with pytest.warns(UserWarning, match=r"non-finite values .*classifier\.weight"):
        type(model).from_pretrained(tmp_path, subfolder="final")
    (tmp_path / "final" / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object") as raised:
        type(model).from_pretrained(tmp_path, subfolder="final")
    assert str(tmp_path / "final" / "config.json") in str(raised.value)
    with pytest.raises(FileNotFoundError, match="needs its config.json"):
        type(model).from_pretrained(tmp_path, subfolder="elsewhere")


def build_hub_cache(cache: Path, repo_id: str, source: Path) -> None:
    """Lay `source`'s files (subfolders included) out as the Hub cache does: blobs/<hash>, snapshots/<commit>/<path>
    linking to its blob, refs/main naming the commit."""
    import hashlib

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (repo / "blobs").mkdir(parents=True)
    for path in sorted(source.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            link = repo / "snapshots" / commit / path.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)


def test_a_hub_id_loads_from_the_cache_offline_with_and_without_a_subfolder(family, tmp_path, monkeypatch):
    """A Hub id is no local folder: the checks leave its resolution (cache, offline mode) to transformers."""
    import huggingface_hub

    assert huggingface_hub.constants.HF_HUB_OFFLINE  # conftest.py
    _, model, _ = family
    source = tmp_path / "repo"
    model.save_pretrained(source)
    model.save_pretrained(source / "final")
    cache = tmp_path / "hub-cache"
    build_hub_cache(cache, "user/reversible", source)
    monkeypatch.chdir(tmp_path)  # no folder named user/reversible here
    cls = type(model)
    assert_same_weights(cls.from_pretrained("user/reversible", cache_dir=cache), model)
    assert_same_weights(cls.from_pretrained("user/reversible", subfolder="final", cache_dir=cache), model)
    assert_same_weights(cls.from_pretrained("user/reversible", subfolder="final", cache_dir=cache,
                                            local_files_only=True), model)
    with pytest.raises(OSError):
        cls.from_pretrained("user/reversible", subfolder="missing", cache_dir=cache)
    with pytest.raises(OSError):
        cls.from_pretrained("user/not-cached", cache_dir=cache)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32])
@pytest.mark.parametrize("problem_type", [None, "single_label_classification", "multi_label_classification"])
@pytest.mark.parametrize("num_labels", [1, 10])
def test_the_trainer_checks_the_labels_the_models_loss_checks(dtype, problem_type, num_labels):
    """One rule decides which labels are class indices: the trainer's check before the first step refuses a label
    of 12 exactly where the model's loss would (before, int16 and uint8 labels were class indices to the trainer
    and multi-label targets to the model, as transformers' loss infers them)."""
    from types import SimpleNamespace

    from petra_hub.training.batches import check_all_labels

    labels = torch.tensor([3, 12], dtype=dtype)
    config = SimpleNamespace(num_labels=num_labels, problem_type=problem_type)
    outcomes = []
    for check in (lambda: shared.check_labels(labels, torch.zeros(2, num_labels), config),
                  lambda: check_all_labels(SimpleNamespace(labels=labels), num_labels, problem_type=problem_type)):
        try:
            check()
            outcomes.append(None)
        except ValueError as error:
            outcomes.append("outside" if "[0, 9]" in str(error) or "[0, 0]" in str(error) else str(error))
    refused = outcomes[0] == "outside"
    inferred = problem_type is None and num_labels > 1 and dtype in (torch.int64, torch.int32)
    assert refused == (not dtype.is_floating_point and (problem_type == "single_label_classification" or inferred))
    assert outcomes[1] == outcomes[0] or dtype == torch.float32 and num_labels == 10, outcomes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a second device (CUDA) beside the CPU")
def test_non_finite_tensors_of_a_model_on_several_devices():
    """Weights on several devices (device_map="auto"): torch.stack of the per-tensor flags raised 'Expected all
    tensors to be on the same device'; the flags are now reduced per device."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).cuda())
    assert shared.non_finite_tensors(model) == []
    with torch.no_grad():
        model[1].bias[0] = float("nan")
    assert shared.non_finite_tensors(model) == ["1.bias"]


def test_non_finite_tensors_reduces_per_device_on_the_cpu():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, dtype=torch.float64))
    model.register_buffer("steps", torch.zeros(3, dtype=torch.long))  # not floating point: not checked
    assert shared.non_finite_tensors(model) == []
    with torch.no_grad():
        model[0].weight[1, 0] = float("inf")
        model[1].bias[0] = float("nan")
    assert shared.non_finite_tensors(model) == ["0.weight", "1.bias"]
