"""benchmarks/remedy_screen.py: each plan line one run with its own flags, settings grouped and paired by seed."""

import json

import pytest

from .conftest import load

PLAN = """# two settings of one model
base revnet18 backprop 0 0.1
same revnet18 petra-k1 0 0.1
fast revnet18 petra-k1+predict-half 0 0.1 --learning_rate 0.2 --petra_num_stages 4
"""


@pytest.mark.benchmark_run
def test_each_line_runs_with_its_flags_and_is_paired_with_the_baseline(tmp_path):
    screen = load("remedy_screen")
    plan = tmp_path / "plan.txt"
    plan.write_text(PLAN)
    result = screen.main([str(plan), "--jobs", "3", "--fidelity-every", "2", "--baseline", "backprop", "--out",
                          str(tmp_path / "screen.json")])
    assert json.loads((tmp_path / "screen.json").read_text())["rows"] == json.loads(json.dumps(result["rows"]))
    base, same, fast = result["runs"]
    assert (base["num_stages"], same["num_stages"], fast["num_stages"]) == (10, 10, 4)
    # the recipe's linear scaling applies to the plan's rate as to the default one
    assert fast["learning_rate"] == pytest.approx(0.2 * 32 / 256) and base["learning_rate"] == pytest.approx(0.05)
    assert base["cosine_true_mean"] == pytest.approx(1.0, abs=1e-6) and fast["cosine_true_mean"] < 1 - 1e-6
    rows = {row["config"]: row for row in result["rows"]}
    assert rows["petra-k1+predict-half"]["flags"] == "--learning_rate 0.2"  # the stages are a column
    assert rows["petra-k1"]["gap_mean"] == pytest.approx(same["test_accuracy"] - base["test_accuracy"])
    # other stages: no baseline to pair with
    assert "gap_mean" not in rows["petra-k1+predict-half"] and "gap_mean" not in rows["backprop"]


def test_a_plan_line_without_its_fields_or_a_name_used_twice_is_refused(tmp_path):
    screen = load("remedy_screen")
    plan = tmp_path / "plan.txt"
    plan.write_text("only three words\n")
    with pytest.raises(ValueError, match=r"plan.txt:1: expected NAME MODEL CONFIG SEED EPOCHS"):
        screen.read_plan(plan)
    plan.write_text("a revnet18 backprop 0 1\na revnet18 backprop 1 1\n")
    with pytest.raises(ValueError, match="a name is used twice"):
        screen.read_plan(plan)


def test_a_merge_takes_runs_from_earlier_screens_and_refuses_one_that_ran_otherwise(tmp_path):
    screen = load("remedy_screen")

    def run(name, config, seed, accuracy, flags=()):
        return {"name": name, "model": "revnet18", "config": config, "seed": seed, "epochs": 1.0,
                "recipe_args": list(flags), "num_stages": 10, "test_accuracy": accuracy, "cosine_true_mean": None}

    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(json.dumps({"runs": [run("bp", "backprop", 0, 90.0), run("p", "petra-k1", 0, 85.0)]}))
    second.write_text(json.dumps({"runs": [run("p", "petra-k1", 0, 10.0),
                                           run("q", "petra-k2", 0, 88.0, ["--x", "1"])]}))
    plan = tmp_path / "plan.txt"
    plan.write_text("bp revnet18 backprop 0 1\np revnet18 petra-k1 0 1\nq revnet18 petra-k2 0 1 --x 1\n")
    result = screen.main([str(plan), "--merge", str(first), str(second), "--baseline", "backprop", "--out",
                          str(tmp_path / "merged.json")])
    rows = {row["config"]: row for row in result["rows"]}
    assert rows["petra-k1"]["gap_mean"] == -5.0 and rows["petra-k2"]["gap_mean"] == -2.0  # the first screen's p
    flagged = screen.main([str(plan), "--merge", str(first), str(second), "--baseline", " petra-k2  --x '1'",
                           "--out", str(tmp_path / "flagged.json")])  # a baseline with its flags, spelt loosely
    assert flagged["settings"]["baseline"] == "petra-k2 --x 1"  # as the rows spell it, for the report's tables
    rows = {row["config"]: row for row in flagged["rows"]}
    assert rows["backprop"]["gap_mean"] == 2.0 and rows["petra-k1"]["gap_mean"] == -3.0
    assert "gap_mean" not in rows["petra-k2"]
    plan.write_text("q revnet18 petra-k2 0 1 --x 2\n")
    with pytest.raises(ValueError, match="run 'q' differs from the plan in recipe_args"):
        screen.main([str(plan), "--merge", str(second), "--out", str(tmp_path / "refused.json")])


def test_a_screen_over_depths_draws_the_gap_against_j(tmp_path):
    screen = load("remedy_screen")

    def run(name, config, seed, stages, accuracy, cosine):
        return {"name": name, "model": "revvit-tiny", "config": config, "seed": seed, "epochs": 1.0,
                "recipe_args": ["--petra_num_stages", str(stages)], "num_stages": stages, "test_accuracy": accuracy,
                "cosine_true_mean": cosine}

    runs = [run(f"{config}-{stages}-{seed}", config, seed, stages, accuracy - (stages if config == "p" else 0), cos)
            for stages in (4, 8) for seed, accuracy in ((0, 90.0), (1, 80.0))
            for config, cos in (("backprop", 1.0), ("p", 0.9))]
    earlier = tmp_path / "earlier.json"
    earlier.write_text(json.dumps({"runs": runs}))
    plan = tmp_path / "plan.txt"
    plan.write_text("".join(f"{r['name']} revvit-tiny {r['config']} {r['seed']} 1 --petra_num_stages "
                            f"{r['num_stages']}\n" for r in runs))
    picture = tmp_path / "depth.png"
    result = screen.main([str(plan), "--merge", str(earlier), "--baseline", "backprop", "--plot", str(picture),
                          "--out", str(tmp_path / "merged.json")])
    gaps = {row["stages"]: (row["gap_mean"], row["gap_std"]) for row in result["rows"] if row["config"] == "p"}
    assert gaps == {4: (-4.0, 0.0), 8: (-8.0, 0.0)}
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
