"""What a checkpoint and a Hub push leave behind: every mid-run push is a loadable repository with its card and
without this host's run lock or half-written checkpoints, a checkpoint's card names it, and a checkpoint of
another set-up (optimizer, number of stages) is refused before any work."""

import json
import re
import shutil
from concurrent.futures import Future
from pathlib import Path

import pytest
from huggingface_hub import HfApi, RepoUrl
from huggingface_hub.utils import filter_repo_objects
from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS

import petra_hub.training.guards as guards
from petra_hub.training.checkpoint import staging_dir
from tests.training.test_trainer import make_trainer

SAVES = dict(save_strategy="steps", save_steps=2)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A run's folder with checkpoint-2: SGD, 10 stages, no Hub repository (do not write into it)."""
    folder = tmp_path_factory.mktemp("run")
    make_trainer(folder, max_steps=2, **SAVES).train()
    return folder


@pytest.fixture
def hub(monkeypatch, tmp_path) -> tuple[list, Path]:
    """A faked Hub repository: each upload_folder copies the files the real one would send (its ignore patterns and
    huggingface_hub's own applied) into `tmp_path/repo`, and is recorded as (path_in_repo, files)."""
    uploads, repo = [], tmp_path / "repo"

    def upload_folder(self, *, repo_id, folder_path, path_in_repo=None, ignore_patterns=None, **kwargs):
        root = Path(folder_path)
        ignored = [*([ignore_patterns] if isinstance(ignore_patterns, str) else ignore_patterns or []),
                   *DEFAULT_IGNORE_PATTERNS]
        listed = sorted(path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file())
        files = list(filter_repo_objects(listed, ignore_patterns=ignored))
        for name in files:
            target = repo / (path_in_repo or "") / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / name, target)
        uploads.append((path_in_repo, files))
        done = Future()
        done.set_result("commit")
        return done  # transformers pushes checkpoints with run_as_future=True

    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(HfApi, "upload_folder", upload_folder)
    return uploads, repo


def test_a_mid_run_push_is_a_loadable_repository_without_the_run_lock(tmp_path, hub, monkeypatch):
    uploads, repo = hub
    out = tmp_path / "out"
    make_trainer(out, max_steps=2, **SAVES).train()
    leftover = Path(staging_dir(str(out / "checkpoint-8")))  # a checkpoint a killed run was writing
    shutil.copytree(out / "checkpoint-2", leftover)
    make_trainer(out, max_steps=4, **SAVES, push_to_hub=True, hub_strategy="checkpoint",
                 hub_model_id="user/revnet").train(resume_from_checkpoint=str(out / "checkpoint-2"))

    assert [where for where, _ in uploads] == [None, "last-checkpoint"]  # step 4: output_dir's model, checkpoint
    pushed = uploads[0][1]
    assert not [name for name in pushed if "lock" in name or "/" in name], pushed  # no lock, no folder
    config = json.loads((repo / "config.json").read_text())
    modules = {reference.split(".")[0] + ".py" for reference in config["auto_map"].values()}
    assert modules | {"loading_checks.py", "preprocessor_config.json", "README.md"} <= set(pushed)  # loadable, a card
    assert 'from_pretrained("user/revnet")' in (repo / "README.md").read_text()

    # Another machine downloads the repository and resumes from its last checkpoint into it.
    monkeypatch.setattr(guards.socket, "gethostname", lambda: "another-host")
    resumed = make_trainer(repo, max_steps=6, **SAVES)
    resumed.train(resume_from_checkpoint=str(repo / "last-checkpoint"))
    assert resumed.state.global_step == 6


def test_the_run_lock_refuses_a_second_run_and_is_gone_after_training(tmp_path):
    lock = tmp_path / guards.LOCK_NAME
    holder = guards.RunLock(str(tmp_path))  # a run training into the folder
    holder.acquire()
    with pytest.raises(FileExistsError, match="another run"):
        make_trainer(tmp_path, max_steps=2).train()
    holder.release()
    make_trainer(tmp_path, max_steps=2).train()
    assert not lock.exists()


def test_a_checkpoints_card_names_the_checkpoint_not_its_staging_folder(run):
    card = (run / "checkpoint-2" / "README.md").read_text()
    assert "tmp-checkpoint" not in card
    assert "model_name: checkpoint-2" in card
    assert f'from_pretrained("{run / "checkpoint-2"}")' in card
    assert not [path.name for path in run.iterdir() if "tmp" in path.name]


def test_another_optimizer_is_refused_before_any_work(run, tmp_path):
    checkpoint = run / "checkpoint-2"
    assert json.loads((checkpoint / "petra_state.json").read_text())["optimizer"] == "SGD"
    for optim, name in [("adamw_torch", "AdamW"), ("adagrad", "Adagrad")]:
        trainer = make_trainer(tmp_path / optim, optim=optim, optim_args="", max_steps=4)
        with pytest.raises(ValueError, match=rf"{re.escape(str(checkpoint))}: .*optimizer: checkpoint 'SGD', this run "
                                             rf"'{name}'"):
            trainer.train(resume_from_checkpoint=str(checkpoint))
        assert trainer.pipeline is None  # refused before the stages were built

    older = tmp_path / "older"  # a checkpoint of an earlier version, which did not record the optimizer
    shutil.copytree(checkpoint, older)
    state = json.loads((older / "petra_state.json").read_text())
    del state["optimizer"]
    (older / "petra_state.json").write_text(json.dumps(state))
    resumed = make_trainer(tmp_path / "resumed", max_steps=3)
    resumed.train(resume_from_checkpoint=str(older))
    assert resumed.state.global_step == 3


def test_more_or_fewer_stages_than_the_checkpoint_is_another_run(run, tmp_path):
    five = tmp_path / "five"
    make_trainer(five, petra_num_stages=5, max_steps=2, **SAVES).train()
    with pytest.raises(ValueError, match=r"different run \(num_stages: checkpoint 5, this run 10\)"):
        make_trainer(tmp_path / "more", max_steps=4).train(resume_from_checkpoint=str(five / "checkpoint-2"))
    with pytest.raises(ValueError, match=r"different run \(num_stages: checkpoint 10, this run 5\)"):
        make_trainer(tmp_path / "fewer", petra_num_stages=5, max_steps=4).train(
            resume_from_checkpoint=str(run / "checkpoint-2"))


def test_another_set_of_the_same_name_and_size_is_refused_on_resume(run, tmp_path):
    """The checkpoint recorded only "digits (64)": 64 images of digits' test split resumed a run trained on 64 of
    its train split."""
    from petra_hub.data import load_image_dataset, take

    checkpoint = run / "checkpoint-2"
    recorded = json.loads((checkpoint / "petra_state.json").read_text())
    assert recorded["dataset"] == "digits (64)" and recorded["train_labels"].startswith("sha256:")
    other = take(load_image_dataset("digits", "test"), 64)
    trainer = make_trainer(tmp_path / "other", train=other, max_steps=4)
    with pytest.raises(ValueError, match=r"different run \(train_labels: checkpoint 'sha256:[0-9a-f]{16}', this run "
                                         r"'sha256:[0-9a-f]{16}'\)"):
        trainer.train(resume_from_checkpoint=str(checkpoint))

    older = tmp_path / "older"  # a checkpoint of an earlier version, which did not record the labels
    shutil.copytree(checkpoint, older)
    del recorded["train_labels"]
    (older / "petra_state.json").write_text(json.dumps(recorded))
    resumed = make_trainer(tmp_path / "resumed", max_steps=3)
    resumed.train(resume_from_checkpoint=str(older))
    assert resumed.state.global_step == 3
