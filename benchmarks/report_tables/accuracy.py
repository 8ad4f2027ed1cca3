"""Tables of benchmarks/accuracy_digits.py (test accuracy per configuration, beside the paper's Table 4) and of
benchmarks/delay_sensitivity.py."""

from __future__ import annotations

from .base import renders, table


@renders("accuracy_digits", "main")
def accuracy_main(r, arg=None):
    rows = []
    for s in r["summary"]:
        baseline = r["settings"].get("baseline", "backprop")
        gap = f"{s['gap_mean']:+.2f} ± {s['gap_std']:.2f}" if "gap_mean" in s else (
            "(reference)" if s["config"] == baseline else "n/a")
        rows.append([
            s["config"], s["mode"], s["k"], f"{s['learning_rate']:g}", s["optimizer_steps"],
            f"{s['mean']:.2f} ± {s['std']:.2f}", f"{s['min']:.2f}", f"{s['max']:.2f}",
            ", ".join(f"{a:.2f}" for a in s["accuracies"]), gap, f"{s['mean_wall_s']:.0f}",
        ])  # fmt: skip
    seeds = ", ".join(map(str, r["settings"]["seeds"]))
    header = ["configuration", "mode", "k", "lr", "optimizer steps", "test accuracy % (mean ± std)", "min", "max",
              f"per seed ({seeds})", f"gap to {r['settings'].get('baseline', 'backprop')} (pts, paired mean ± std)",
              "s / run"]  # fmt: skip
    return table(header, rows, "llrrrrrrlrr")


@renders("accuracy_digits", "summary")
def accuracy_summary(r, arg=None):
    def label(s):
        name = "PETRA" if s["mode"] == "petra" else s["mode"].replace("_", " ")
        if s["mode"] == "petra" or s["k"] > 1:
            return f"{name} k={s['k']}"
        return f"{name} (k=1)" if s["mode"] in ("delayed", "input_buffer", "weight_stash") else name

    rows = [[f"{s['mean']:.2f} ± {s['std']:.2f}" for s in r["summary"]]]
    return table([label(s) for s in r["summary"]], rows, "r" * len(r["summary"]))


# The paper's Table 4: CIFAR-100 test accuracy (%) of RevNet-18, k = 1 (reversible backprop is not in it).
PAPER_TABLE4_REVNET18 = {"backprop": 77.5, "delayed": 76.5, "input_buffer": 76.4, "weight_stash": 75.4, "petra": 75.9}


@renders("accuracy_digits", "table4")
def accuracy_table4(r, arg=None):
    """Our six configurations beside the paper's CIFAR-100 RevNet-18 row; ranks among the paper's five (ties share
    a rank, marked "=")."""
    ours = {s["mode"]: s for s in r["summary"] if s["k"] == 1}
    compared = [mode for mode in ours if mode in PAPER_TABLE4_REVNET18]
    our_ranks = ranks({mode: round(ours[mode]["mean"], 2) for mode in compared})
    paper_ranks = ranks(PAPER_TABLE4_REVNET18)
    rows = []
    for mode, s in ours.items():
        paper = PAPER_TABLE4_REVNET18.get(mode)
        gap = f"{s['gap_mean']:+.2f} ± {s['gap_std']:.2f}" if "gap_mean" in s else "(reference)"
        rows.append([
            mode, f"{s['mean']:.2f} ± {s['std']:.2f}", gap, our_ranks.get(mode, "—"),
            "—" if paper is None else f"{paper:.1f}",
            "—" if paper is None else f"{paper - PAPER_TABLE4_REVNET18['backprop']:+.1f}",
            paper_ranks.get(mode, "—"),
        ])  # fmt: skip
    seeds = len(r["settings"]["seeds"])
    header = ["configuration", f"digits: test accuracy % ({seeds} seeds)", "gap to backprop (paired)", "rank",
              "paper CIFAR-100", "paper gap", "paper rank"]
    return table(header, rows, "lrrrrrr")


def ranks(scores: dict[str, float]) -> dict[str, str]:
    """1 for the best; equal scores share the rank of the first of them, marked with "="."""
    result = {}
    for name, score in scores.items():
        rank = 1 + sum(other > score for other in scores.values())
        tied = sum(other == score for other in scores.values()) > 1
        result[name] = f"{rank}{'=' if tied else ''}"
    return result


@renders("delay_sensitivity", "main")
def delay_sensitivity_main(r, arg=None):
    rows = [[row["model"], row["delay"], f"{row['final_loss']:.3f}", f"{100 * row['test_accuracy']:.2f}"]
            for row in r["rows"]]
    return table(["model", "delay d (micro-batches)", f"training loss, last {r['settings']['steps'] // 4} steps",
                  "test accuracy %"], rows, "lrrr")


@renders("remedy_screen", "main")
def remedy_screen_main(r, arg=None):
    """One row per setting of benchmarks/remedy_screen.py, as the plan lists them."""
    baseline = r["settings"]["baseline"]
    rows = []
    for s in r["rows"]:
        gap = f"{s['gap_mean']:+.2f}" if "gap_mean" in s else (
            "(reference)" if f"{s['config']} {s['flags']}".strip() == baseline else "n/a")
        cosine = "n/a" if s["cosine_true_mean"] is None else f"{s['cosine_true_mean']:.3f}"
        rows.append([s["config"], s["stages"], f"`{s['flags']}`" if s["flags"] else "", f"{s['epochs']:g}",
                     ", ".join(f"{seed}: {a:.2f}" for seed, a in zip(s["seeds"], s["accuracies"])), f"{s['mean']:.2f}",
                     gap, cosine])
    header = ["configuration", "J", "recipe flags", "epochs", "test accuracy % (seed: %)", "mean",
              f"gap to {baseline} (pts, paired)", "mean cosine to e2e"]
    return table(header, rows, "lrlrlrrr")
