"""Tables of benchmarks/memory.py: PETRA's memory against the delayed modes, per model, stage and depth."""

from __future__ import annotations

from .base import GB, mib, need, percent, renders, table


def model_title(label: str) -> list[str]:
    preset, downsampling = label.split(" ")
    return [preset.replace("revnet", "RevNet"), downsampling]


@renders("memory", "headline")
def memory_headline(r, arg=None, without_stem=True):
    models = r["models"].values()
    peaks = all("peak_gb" in model["summary"].get("petra", {}) for model in models)
    rows = []
    for label, model in r["models"].items():
        delayed, petra = need(model["summary"], "delayed"), need(model["summary"], "petra")
        row = [*model_title(label), f"{delayed['total_gb']:.2f}", f"{petra['total_gb']:.2f}"]
        row.append(percent(petra["saving_vs_delayed"]))
        if peaks:
            row += [f"{delayed['peak_gb']:.2f}", f"{petra['peak_gb']:.2f}", percent(petra["peak_saving_vs_delayed"])]
        if without_stem:
            row.append(f"{delayed['total_without_stem_gb']:.2f} -> {petra['total_without_stem_gb']:.2f}")
            row.append(percent(petra["saving_vs_delayed_without_stem"]))
        rows.append(row)
    header = ["model", "downsampling", "delayed (GB)", "PETRA (GB)", "saving"]
    if peaks:
        header += ["delayed at its peak (GB)", "PETRA at its peak (GB)", "saving at the peak"]
    if without_stem:
        header += ["without the stem's image buffer: delayed -> PETRA", "saving"]
    return table(header, rows, "ll" + "r" * (len(header) - 2))


@renders("memory", "summary")
def memory_summary(r, arg=None):
    return memory_headline(r, without_stem=False)


@renders("memory", "totals")
def memory_totals(r, arg):
    model = need(r["models"], arg.replace("-", " "))
    peaks = all("peak_gb" in s for s in model["summary"].values())
    rows = []
    for name, s in model["summary"].items():
        rows.append([
            name if s["pipelined"] else f"{name} (1 micro-batch)", s["input_buffer"], s["weight_stash"],
            f"{s['activations_gb']:.2f}", f"{s['stem_gb']:.2f}", f"{s['messages_gb']:.2f}", f"{s['stash_gb']:.2f}",
            f"{s['params_gb']:.3f}",
            f"**{s['total_gb']:.2f}**", percent(s["saving_vs_delayed"]), f"{s['total_without_stem_gb']:.2f}",
            percent(s["saving_vs_delayed_without_stem"]),
        ])  # fmt: skip
        if peaks:
            rows[-1] += [f"**{s['peak_gb']:.2f}**", percent(s["peak_saving_vs_delayed"])]
    header = [
        "configuration", "input buffer", "weight stash", "activations (GB)", "of which stem (GB)",
        "messages waiting (GB)", "weight stash (GB)", "model (GB)", "model + buffers (GB)", "saving vs delayed",
        "model + buffers without the stem's buffer (GB)", "saving",
    ]  # fmt: skip
    if peaks:
        header += ["at the peak within an operation (GB)", "saving at the peak"]
    return table(header, rows, "lll" + "r" * (len(header) - 3))


@renders("memory", "stages")
def memory_stages(r, arg):
    """Per stage: activations and waiting messages (scaled) plus weight stash, in GB, one column per
    configuration."""
    modes, scale = need(r["models"], arg.replace("-", " "))["modes"], r["scale"]
    names = list(modes)
    buffers = {n: [(s["activation_bytes"] + s["message_bytes"]) * scale + s["stash_bytes"] for s in modes[n]["stages"]]
               for n in names}  # fmt: skip
    pipelined = [n for n in names if any(s["in_flight"] for s in modes[n]["stages"])]
    rows = []
    for i, stage in enumerate(modes[names[0]]["stages"]):
        in_flight = modes[pipelined[0]]["stages"][i]["in_flight"] if pipelined else 0
        rows.append([i, stage["kind"], in_flight] + [f"{buffers[n][i] / GB:.3f}" for n in names])
    rows.append(["all", "", ""] + [f"{sum(buffers[n]) / GB:.2f}" for n in names])
    return table(["stage", "kind", "in flight"] + [f"{n} (GB)" for n in names], rows, "llr" + "r" * len(names))


@renders("memory", "check")
def memory_check(r, arg):
    check = need(r, f"{arg}_check")
    (b1, s1), (b2, s2) = next(iter(check.values()))["measured_at"]
    expected = next(iter(check.values()))["expected"]
    rows = []
    for name, c in check.items():
        ratios = c["stage_ratios"]
        spread = f"{min(ratios):.4f} .. {max(ratios):.4f}" if ratios else "-"
        a, b = c["bytes"]
        rows.append([name, f"{a:,}", f"{b:,}", f"{c['ratio']:.4f}", spread, "yes" if c["stash_unchanged"] else "NO"])
    header = [
        "configuration", f"activations, b={b1} {s1}x{s1} (bytes)", f"b={b2} {s2}x{s2} (bytes)",
        f"ratio (expected {expected:.4f})", "per-stage ratios", "stash unchanged",
    ]  # fmt: skip
    return table(header, rows, "lrrrrl")


@renders("memory", "process-check")
def memory_process_check(r, arg=None):
    check = need(r, "process_check")
    rows = []
    for mode, runs in check["modes"].items():
        for world_size, per_rank in runs.items():
            for rank, g in enumerate(per_rank):
                rows.append([mode, world_size, rank, mib(g["process_bytes"]), mib(g["malloc_bytes"]),
                             f"**{g['malloc_bytes'] / g['process_bytes']:.3f}**", mib(g["stage_bytes"]),
                             f"{g['stage_bytes'] / g['process_bytes']:.2f}"])  # fmt: skip
    header = ["mode", "processes", "rank", "engine, this process (MiB)", "malloc (MiB)", "malloc / engine",
              "engine, one device per stage (MiB)", "one device per stage / this process"]  # fmt: skip
    return table(header, rows, "lrrrrrrr")


@renders("memory", "depth")
def memory_depth(r, arg):
    study = need(need(r, "depth_study"), arg)
    header, rows = ["J", "layout"], []
    for J, entry in study.items():
        row = [J, entry["layout"]]
        for name, m in entry["modes"].items():
            worst = m["max_stage"]
            row += [f"{m['max_stage_mb']:,.1f} ({worst}{entry['layout'][worst]})", f"{m['total_mb']:,.1f}"]
            if len(rows) == 0:
                header += [f"{name}: largest stage (MB)", f"{name}: all stages (MB)"]
        rows.append(row)
    return table(header, rows, "ll" + "r" * (len(header) - 2))


@renders("memory", "table6")
def memory_table6(r, arg=None):
    presets = need(r, "table6")
    header = ["stage"] + [f"{p} {column}" for p in presets for column in ("kind", "in flight", "buffer (GB)")]
    rows = []
    for i in range(max(len(t["layout"]) for t in presets.values())):
        row = [i]
        for t in presets.values():
            row += [t["layout"][i], t["in_flight"][i], f"{t['buffer_gb'][i]:.3f}"] if i < len(t["layout"]) else [""] * 3
        rows.append(row)
    return table(header, rows, "l" + "lrr" * len(presets))
