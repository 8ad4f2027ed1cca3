"""Tables of benchmarks/fidelity.py: how close PETRA's delayed gradients are to the end-to-end ones, per stage."""

from __future__ import annotations

import statistics

from .base import need, percent, renders, table


def fidelity_epochs(r) -> list[int]:
    last = int(r["settings"]["epochs"])
    return sorted({1, max(1, last // 2), last})


def run_records(run: dict) -> list[dict]:
    """One run's probe records (benchmarks/fidelity.py stores them as columns and rows, to keep the JSON small)."""
    return [dict(zip(run["columns"], row)) for row in run["rows"]]


def fidelity_records(r) -> list[dict]:
    """Every seed's probe records."""
    return [record for run in need(r, "runs") for record in run_records(run)]


def fidelity_mean(r, metric: str, stage: int, epoch: int | None = None) -> float:
    """The mean of `metric` at `stage` over every seed's records (of `epoch`, counted from 1, if given)."""
    values = [rec[metric] for rec in fidelity_records(r) if rec["stage"] == stage
              and (epoch is None or int(rec["epoch"] - 1e-9) + 1 == epoch)]
    return statistics.fmean(values)


@renders("fidelity", "main")
def fidelity_main(r, arg=None):
    """Per stage, the cosine similarities at the first, middle and last epoch."""
    stages = sorted({rec["stage"] for rec in fidelity_records(r)})
    epochs = fidelity_epochs(r)
    rows = []
    for stage in stages:
        row = [stage]
        for epoch in epochs:
            row.append(" / ".join(f"{fidelity_mean(r, m, stage, epoch):.3f}"
                                  for m in ("cosine_true", "cosine_stashed_true", "cosine_stashed")))
        rows.append(row)
    header = ["stage"] + [f"epoch {e}: PETRA·e2e / stash·e2e / PETRA·stash" for e in epochs]
    return table(header, rows, "r" + "r" * len(epochs))


@renders("fidelity", "summary")
def fidelity_summary(r, arg=None):
    """Per stage over the whole run: mean cosines and norm ratios, and how often PETRA is the closer of the two
    delayed gradients to the end-to-end one."""
    every = fidelity_records(r)
    rows = []
    for stage in sorted({rec["stage"] for rec in every}):
        records = [rec for rec in every if rec["stage"] == stage]
        differ = [rec for rec in records if abs(rec["cosine_true"] - rec["cosine_stashed_true"]) > 1e-9]
        closer = statistics.fmean(rec["cosine_true"] > rec["cosine_stashed_true"] for rec in differ) if differ else None
        rows.append([stage] + [f"{fidelity_mean(r, m, stage):.3f}" for m in (
            "cosine_true", "cosine_stashed_true", "cosine_stashed", "norm_ratio_true", "norm_ratio_stashed_true",
            "norm_ratio_stashed")] + [percent(closer) if closer is not None else "same gradient"])
    header = ["stage", "cos PETRA·e2e", "cos stash·e2e", "cos PETRA·stash", "‖PETRA‖/‖e2e‖", "‖stash‖/‖e2e‖",
              "‖PETRA‖/‖stash‖", "PETRA closer to e2e"]
    return table(header, rows, "r" * len(header))
