"""Tables of benchmarks/numerics.py: reconstruction error and gradient fidelity by precision policy."""

from __future__ import annotations

from .base import Missing, need, renders, table


def sci(value: float) -> str:
    return "0" if value == 0 else f"{value:.1e}"


def one_minus(cosine: float) -> str:
    """1 - cos, readable when the cosine is within rounding of 1."""
    gap = 1.0 - cosine
    return "< 1e-15" if gap < 1e-15 else f"{gap:.1e}"


def span(values: list[float], fmt=sci) -> str:
    low, high = min(values), max(values)
    return fmt(low) if fmt(low) == fmt(high) else f"{fmt(low)} .. {fmt(high)}"


def numerics_dataset(r, arg) -> dict:
    if arg is None:
        raise Missing("a numerics table needs a data set: numerics/TABLE/DATASET")
    return need(need(r, "datasets"), arg)


@renders("numerics", "run")
def numerics_run(r, arg=None):
    s, m = r["settings"], r["machine"]
    widths = "/".join(map(str, s["hidden_sizes"]))
    data = "; ".join(f"**{name}**: {d['description']}" for name, d in r["datasets"].items())
    policies = "; ".join(f"`{name}`: {label}" for name, label in r["policy_labels"].items())
    rows = [
        ["command", f"`{r['command']}`"],
        ["date, run time", f"{r['date']}, {r['elapsed_s'] / 60:.1f} min"],
        ["machine", f"`nproc` {m['nproc']}; CPU: {m['cpu']}; torch {m['torch']}, Python {m['python']}; "
                    f"{s['threads']} thread(s)"],
        ["model", f"RevNet18, stages {' '.join(r['layout'])} (J = {len(r['layout'])}; reversible: "
                  f"{', '.join(map(str, r['reversible_stages']))}), {s['stem']} stem {s['embedding_size']}, stream "
                  f"widths {widths}, float32 weights, seed {s['seed']} (the same weights for every policy)"],
        ["data", data],
        ["training", f"{s['steps']} PETRA micro-batches of {s['batch']} (k = 1), {s['optimizer']}; reconstruction "
                     f"checked every {s['check_every']} micro-batch(es)"],
        ["frozen", f"at the trained weights, no optimizer, {s['frozen_batches']} micro-batches, every one checked"],
        ["gradients", f"at the trained weights, {s['grad_batches']} held-out micro-batches of {s['batch']}, each "
                      "against plain autograd through all stages in float64 (batch statistics in both)"],
        ["policies", policies],
    ]  # fmt: skip
    return table(["run", ""], rows, "ll")


@renders("numerics", "summary")
def numerics_summary(r, arg=None):
    rows = []
    for dataset, entry in r["datasets"].items():
        for name, p in entry["policies"].items():
            t, g = p["training"], p["gradients"]["stages"]
            rows.append([
                dataset, r["policy_labels"].get(name, name), span(p["frozen"]["reconstruction"]["median"]),
                span(t["reconstruction"]["median"]), one_minus(min(s["cosine"] for s in g)),
                one_minus(min(s["backprop_cosine"] for s in g)), sci(max(s["relative_error_to_backprop"] for s in g)),
                span([s["norm_ratio"] for s in g], lambda x: f"{x:.4f}"),
                f"{t['loss_first']:.2f} -> {t['loss_last']:.2f}",
                max(t["skipped_updates"]) if "fp16" in p["precision"] else "-",
            ])  # fmt: skip
    header = ["data", "policy", "reconstruction error, frozen weights", "while training (median over the run)",
              "PETRA gradient: 1 − cos, worst stage", "plain backprop, same policy: 1 − cos, worst stage",
              "PETRA vs plain backprop: relative difference, worst stage", "PETRA gradient norm ratio",
              "training loss (first -> last 10%)", "fp16 skipped updates"]  # fmt: skip
    return table(header, rows, "ll" + "r" * (len(header) - 2))


@renders("numerics", "reconstruction")
def numerics_reconstruction(r, arg):
    entry, indices = numerics_dataset(r, arg), r["reversible_stages"]
    rows = []
    for name, p in entry["policies"].items():
        frozen, training = p["frozen"], p["training"]
        label = r["policy_labels"].get(name, name)
        rows.append([label, f"frozen (median of {frozen['micro_batches']})"]
                    + [sci(v) for v in frozen["reconstruction"]["median"]])
        rows.append(["", "training, median over the run"] + [sci(v) for v in training["reconstruction"]["median"]])
        rows.append(["", "training, last micro-batch"] + [sci(v) for v in training["reconstruction"]["last"]])
    return table(["policy", "weights"] + [f"stage {i}" for i in indices], rows, "ll" + "r" * len(indices))


@renders("numerics", "gradients")
def numerics_gradients(r, arg):
    entry = numerics_dataset(r, arg)
    policies = entry["policies"]
    header, rows = ["stage"], []
    for name in policies:
        header += [f"{name}: 1 − cos", f"{name}: norm ratio"]
    for index, kind in enumerate(r["layout"]):
        row = [f"{index} {kind}"]
        for p in policies.values():
            s = p["gradients"]["stages"][index]
            row += [one_minus(s["cosine"]), f"{s['norm_ratio']:.4f}"]
        rows.append(row)
    return table(header, rows, "l" + "r" * (len(header) - 1))
