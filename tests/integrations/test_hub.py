"""Hub-ready folders, (faked) uploads and loading from a local Hub cache, all offline."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import huggingface_hub
import pytest
import torch
from huggingface_hub import CommitInfo, HfApi, ModelCard, RepoUrl
from safetensors.torch import load as load_safetensors
from transformers import AutoImageProcessor, AutoModelForImageClassification

import petra_hub
from petra_hub import RevNetForImageClassification
from petra_hub.data import dataset_spec, image_processor_for
from petra_hub.integrations.hub import push_folder_to_hub, save_for_hub
from petra_hub.integrations.model_card import TrainingSummary
from petra_hub.integrations.timm import TimmRevNet
from petra_hub.testing.models import small_model

REPO_ID = "user/revnet-test"


def tiny_model() -> RevNetForImageClassification:
    return small_model(dtype=torch.float32, stem="cifar", num_labels=10).eval()


def assert_same_parameters(loaded: torch.nn.Module, reference: torch.nn.Module) -> None:
    expected = reference.state_dict()
    actual = loaded.state_dict()
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(actual[key], value), key


# ---------------------------------------------------------------------------------------------------------------
# Hub-ready folder


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = tiny_model()
    folder = tmp_path_factory.mktemp("hub") / "revnet-tiny"
    summary = TrainingSummary(model_name="revnet-tiny", preset="revnet18", dataset="digits", num_stages=10,
                              accumulation_steps=2, eval_accuracy=0.5)
    returned = save_for_hub(model, folder, summary, repo_id="user/revnet-tiny")
    return model, Path(returned)


def test_save_for_hub_writes_a_loadable_folder(saved):
    model, folder = saved
    files = set(os.listdir(folder))
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "README.md"} <= files
    loaded = RevNetForImageClassification.from_pretrained(folder).eval()
    assert_same_parameters(loaded, model)
    images = torch.randn(2, 3, 16, 16)
    assert torch.equal(loaded(images).logits, model(images).logits)

    processor = AutoImageProcessor.from_pretrained(folder)
    assert processor.size == {"height": 16, "width": 16}
    assert processor.image_mean == pytest.approx([0.3054] * 3)
    assert loaded.config.id2label[3] == "3"  # the data set's class names replaced LABEL_i

    card = ModelCard.load(folder / "README.md")
    assert card.data.eval_results[0].metric_value == 0.5
    assert "a custom RevNet (derived from revnet18)" in card.text  # the widths differ from the preset's
    assert "widths 4/8/8/8 per stream, cifar stem, buffered downsampling" in card.text
    assert 'from_pretrained("user/revnet-tiny")' in card.text
    assert f"{sum(p.numel() for p in model.parameters()):,}" in card.text  # counted from the model


def test_save_for_hub_unknown_dataset_needs_a_processor(tmp_path):
    summary = TrainingSummary(model_name="m", preset="revnet18", dataset="my-photos")
    with pytest.raises(ValueError, match="unknown data set"):
        save_for_hub(tiny_model(), tmp_path, summary)


def test_save_for_hub_unwraps_a_timm_model_and_takes_a_given_processor(tmp_path):
    wrapper = TimmRevNet(num_classes=3, stem="cifar", hidden_sizes=[4, 8, 8, 8], embedding_size=4).eval()
    processor = image_processor_for(dataset_spec("cifar10").info)
    summary = TrainingSummary(model_name="m", preset="revnet18", dataset="my-photos")
    folder = save_for_hub(wrapper, tmp_path / "m", summary, processor)
    loaded = RevNetForImageClassification.from_pretrained(folder).eval()
    assert_same_parameters(loaded, wrapper.model)
    assert loaded.config.id2label[0] == "LABEL_0"  # an unknown data set has no class names to give
    assert AutoImageProcessor.from_pretrained(folder).size == {"height": 32, "width": 32}
    with pytest.raises(TypeError, match="PreTrainedModel"):
        save_for_hub(torch.nn.Linear(2, 2), tmp_path / "linear", summary, processor)


# ---------------------------------------------------------------------------------------------------------------
# uploads, faked at the HfApi class level (no network)


@pytest.fixture
def fake_hub(monkeypatch, tmp_path):
    """Record what create_repo / create_commit / upload_folder would send. transformers' push_to_hub calls
    create_repo then create_commit on its shared HfApi; our push_folder_to_hub calls create_repo then upload_folder."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    calls: dict[str, list] = {"create_repo": [], "create_commit": [], "upload_folder": [], "library": []}

    def commit_info(repo_id: str, message: str, payload: str) -> CommitInfo:
        oid = hashlib.sha1(payload.encode()).hexdigest()
        return CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/{oid}", commit_message=message,
                          commit_description="", oid=oid, pr_url=None)

    def create_repo(self, repo_id, *, token=None, private=None, repo_type=None, exist_ok=False, **kwargs):
        calls["create_repo"].append({"repo_id": repo_id, "private": private, "exist_ok": exist_ok})
        calls["library"].append((self.library_name, self.library_version))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_commit(self, repo_id, operations, *, commit_message, **kwargs):
        contents = {}
        for operation in operations:  # the files still exist now (push_to_hub deletes its temporary folder later)
            source = operation.path_or_fileobj
            contents[operation.path_in_repo] = Path(source).read_bytes() if isinstance(source, str) else source
        calls["create_commit"].append({"repo_id": repo_id, "files": contents, "message": commit_message})
        return commit_info(repo_id, commit_message, ",".join(sorted(contents)))

    def upload_folder(self, *, repo_id, folder_path, commit_message=None, ignore_patterns=None, **kwargs):
        root = Path(folder_path)
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        calls["upload_folder"].append({"repo_id": repo_id, "files": files, "message": commit_message})
        return commit_info(repo_id, commit_message, ",".join(files))

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    monkeypatch.setattr(HfApi, "create_commit", create_commit)
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return calls


def test_push_folder_to_hub_uploads_the_folder(saved, fake_hub):
    _, folder = saved
    url = push_folder_to_hub(folder, REPO_ID, private=True)
    assert fake_hub["create_repo"] == [{"repo_id": REPO_ID, "private": True, "exist_ok": True}]
    [upload] = fake_hub["upload_folder"]
    assert upload["repo_id"] == REPO_ID
    assert {"config.json", "model.safetensors", "preprocessor_config.json", "README.md"} <= set(upload["files"])
    assert url.startswith(f"https://huggingface.co/{REPO_ID}/commit/")
    assert fake_hub["create_commit"] == []
    assert fake_hub["library"] == [("petra_hub", petra_hub.__version__)]


def test_push_folder_to_hub_needs_a_saved_model(tmp_path, fake_hub):
    with pytest.raises(FileNotFoundError, match="config.json"):
        push_folder_to_hub(tmp_path, REPO_ID)
    assert fake_hub["create_repo"] == []


def test_transformers_push_to_hub_is_intercepted(fake_hub):
    model = tiny_model()
    model.push_to_hub(REPO_ID)
    assert [call["repo_id"] for call in fake_hub["create_repo"]] == [REPO_ID]
    [commit] = fake_hub["create_commit"]
    assert commit["repo_id"] == REPO_ID
    assert {"config.json", "model.safetensors", "README.md"} <= set(commit["files"])
    uploaded = load_safetensors(commit["files"]["model.safetensors"])
    expected = model.state_dict()
    assert uploaded.keys() <= expected.keys()
    assert all(torch.equal(uploaded[key], expected[key]) for key in uploaded)


# ---------------------------------------------------------------------------------------------------------------
# loading from a local Hub cache (HF_HUB_OFFLINE=1, set by conftest.py)


def build_hub_cache(cache: Path, repo_id: str, source: Path) -> str:
    """Lay `source`'s files out as the Hub cache does: blobs/<hash>, snapshots/<commit>/<file> -> blob, refs/main."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if not path.is_file():
            continue
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return commit


def test_from_pretrained_reads_a_local_hub_cache(saved, tmp_path):
    assert huggingface_hub.constants.HF_HUB_OFFLINE
    model, folder = saved
    cache = tmp_path / "hub-cache"
    build_hub_cache(cache, "user/revnet-tiny", folder)
    loaded = RevNetForImageClassification.from_pretrained("user/revnet-tiny", cache_dir=cache)
    assert_same_parameters(loaded, model)
    auto = AutoModelForImageClassification.from_pretrained("user/revnet-tiny", cache_dir=cache)
    assert isinstance(auto, RevNetForImageClassification)
    assert_same_parameters(auto, model)
    processor = AutoImageProcessor.from_pretrained("user/revnet-tiny", cache_dir=cache)
    assert processor.size == {"height": 16, "width": 16}
    with pytest.raises(OSError):
        RevNetForImageClassification.from_pretrained("user/not-cached", cache_dir=cache)
