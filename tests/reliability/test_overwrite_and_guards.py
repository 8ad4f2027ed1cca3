"""guards.py: what `overwrite_output_dir` clears of an earlier run, and the finiteness check's collective (JSON,
never a pickle)."""

import pytest
import torch

from petra_hub.testing.ranks import run_ranks


class _Stages:
    """What check_finite reads of a pipeline: the local stage indices and the stages."""

    def __init__(self, rank: int):
        layer = torch.nn.Linear(2, 2)
        if rank == 1:
            with torch.no_grad():
                layer.weight[0, 0] = float("nan")
        self.local = [rank]
        self.stages = {rank: layer}


def _check_finite_without_pickles(rank, world_size):
    import torch.distributed as dist

    from petra_hub.training.guards import check_finite

    def refuse(*args, **kwargs):
        raise AssertionError("all_gather_object unpickles what peers send")

    dist.all_gather_object = refuse
    try:
        check_finite(_Stages(rank), "before saving")
    except Exception as error:  # noqa: BLE001 - the test compares the type and text on every rank
        return f"{type(error).__name__}: {error}"
    return None


def test_check_finite_agrees_over_json_not_pickles():
    results, codes, _ = run_ranks(_check_finite_without_pickles, 2, deadline=120, pg_timeout=30)
    assert codes == [0, 0], results
    for result in results:
        assert result["value"].startswith("FloatingPointError: non-finite weights or batch-norm statistics in "
                                          "stage 1 (weight) before saving: training diverged"), result


# -- overwrite_output_dir ---------------------------------------------------------------------------------------------
EARLIER_RUN = ["README.md", "_tmp-checkpoint-4", "all_results.json", "checkpoint-2", "config.json",
               "configuration_revvit.py", "eval_results.json", "loading_checks.py", "model.safetensors",
               "modeling_revvit.py", "petra_state.json", "predict_results.json", "predict_results.txt",
               "preprocessor_config.json", "train_results.json", "trainer_state.json", "training_args.bin"]
# a user's files beside the run, some named like a run's (none of them is the run's)
USER_FILES = ["ablation_results.json", "checkpoint-3", "checkpoint-drafts", "checkpoint-plan.txt", "data",
              "modeling_revision_notes.py", "my_notes.txt", "prepare.py", "results.csv"]
OUR_CARD = "---\nlibrary_name: transformers\ntags:\n- petra\n- petra_hub\n---\n\n# revvit-tiny-digits-petra\n"


def _write(folder, names):
    for name in names:
        if name.startswith(("checkpoint-", "_tmp-checkpoint-", "data")):
            (folder / name).mkdir(parents=True)
            marked = name in ("checkpoint-2", "_tmp-checkpoint-4")  # a run's checkpoint holds its files
            (folder / name / ("trainer_state.json" if name == "checkpoint-2" else
                              "petra_stage_000.pt" if marked else "notes.json")).write_text("{}")
        elif name == "config.json":
            (folder / name).write_text('{"model_type": "revvit"}')
        elif name == "README.md":
            (folder / name).write_text(OUR_CARD)
        else:
            (folder / name).write_text("{}")


def test_overwrite_removes_only_what_a_run_writes_and_logs_it(tmp_path, caplog):
    from petra_hub.training.guards import clear_earlier_run

    _write(tmp_path, EARLIER_RUN + USER_FILES)
    with caplog.at_level("WARNING", logger="petra_hub.training.guards"):
        removed = clear_earlier_run(str(tmp_path), None)
    assert removed == EARLIER_RUN
    assert sorted(p.name for p in tmp_path.iterdir()) == USER_FILES
    assert caplog.messages == [f"overwrite_output_dir: removed the earlier run's files from {tmp_path}: "
                               + ", ".join(EARLIER_RUN)]


def test_overwrite_removes_nothing_without_an_earlier_run_nor_what_is_not_petra_hubs(tmp_path):
    from petra_hub.training.guards import clear_earlier_run

    project = tmp_path / "project"  # output_dir="." in a project folder: no earlier run there
    project.mkdir()
    not_a_run = ("trainer_state.json", "petra_state.json", "model.safetensors", "checkpoint-2", "_tmp-checkpoint-4")
    _write(project, [name for name in EARLIER_RUN if name not in not_a_run] + USER_FILES)
    before = sorted(p.name for p in project.iterdir())
    assert clear_earlier_run(str(project), None) == [] and sorted(p.name for p in project.iterdir()) == before
    run = tmp_path / "run"  # a run beside another model's card, configuration and code
    run.mkdir()
    _write(run, ["trainer_state.json", "modeling_revvit.py"])
    (run / "README.md").write_text("# my project\n")
    (run / "config.json").write_text('{"model_type": "bert"}')
    assert clear_earlier_run(str(run), None) == ["trainer_state.json"]
    assert sorted(p.name for p in run.iterdir()) == ["README.md", "config.json", "modeling_revvit.py"]


def test_another_run_is_what_overwrite_would_remove(tmp_path):
    """The refusal names the earlier run's files, and a user's files named like a run's (checkpoint-plan.txt, an
    empty checkpoint-3) are no run: before, they refused the folder, and overwrite_output_dir removed nothing."""
    from petra_hub.training.guards import check_not_another_run, clear_earlier_run

    users = tmp_path / "users"
    users.mkdir()
    _write(users, USER_FILES)
    check_not_another_run(str(users), None, overwrite=False)
    run = tmp_path / "run"
    run.mkdir()
    _write(run, EARLIER_RUN + USER_FILES)
    with pytest.raises(FileExistsError, match=rf"already holds another run \({', '.join(EARLIER_RUN[:3])}, \.\.\.\)"):
        check_not_another_run(str(run), None, overwrite=False)
    clear_earlier_run(str(run), None)
    check_not_another_run(str(run), None, overwrite=False)


def test_resuming_the_folders_own_checkpoint_removes_nothing(tmp_path):
    from petra_hub.training.guards import clear_earlier_run

    _write(tmp_path, EARLIER_RUN + USER_FILES)
    assert clear_earlier_run(str(tmp_path), str(tmp_path / "checkpoint-2")) == []
    assert len(list(tmp_path.iterdir())) == len(EARLIER_RUN + USER_FILES)


def test_the_recipe_overwriting_a_run_keeps_none_of_its_results(tmp_path, monkeypatch):
    import json

    from petra_hub.recipe import train as recipe

    monkeypatch.chdir(tmp_path)
    common = ["--max_steps", "1", "--max_eval_samples", "16", "--max_predict_samples", "16", "--output_dir", "out",
              "--disable_tqdm", "true"]
    recipe.run([*common, "--do_predict", "true", "--save_strategy", "steps", "--save_steps", "1"])
    (tmp_path / "out" / "my_notes.txt").write_text("mine")
    assert (tmp_path / "out" / "checkpoint-1").is_dir()
    recipe.run([*common, "--do_eval", "false", "--overwrite_output_dir", "true"])
    left = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "checkpoint-1" not in left and "predict_results.txt" not in left and "eval_results.json" not in left
    assert "my_notes.txt" in left and "train_results.json" in left
    metrics = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert "train_loss" in metrics and [key for key in metrics if key.startswith(("eval_", "predict_"))] == []
