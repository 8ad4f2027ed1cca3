"""Write the benchmarks' tables into the docs, from the JSON files the benchmarks write.

    python benchmarks/report.py                 # every docs/benchmarks*.md, from benchmarks/results/*.json
    python benchmarks/report.py --results DIR --docs docs/benchmarks-memory.md
    python benchmarks/report.py --check         # exit 1 if a table differs from what its JSON gives
    python benchmarks/report.py --list          # the tables each benchmark offers

Only the text between `<!-- table:NAME -->` and `<!-- /table:NAME -->` is rewritten; everything else in the docs
is written by hand. NAME is RESULT/TABLE or RESULT/TABLE/ARG: RESULT names the file RESULT.json in the results
folder, TABLE a table of the benchmark that wrote it (its "benchmark" field), ARG what that table needs (a model,
a downsampling). A region whose file is missing, or lacks what the table needs, is left as it is.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = sorted((ROOT / "docs").glob("benchmarks*.md"))
MARKER = re.compile(r"<!-- table:(?P<name>\S+) -->\n.*?<!-- /table:(?P=name) -->", re.S)
GB, MIB = 1e9, 2**20


class Missing(Exception):
    """The results file does not hold what the table needs (e.g. a partial run)."""


class UnknownTable(ValueError):
    """A marker names a table that its results file's benchmark does not offer."""


def need(mapping: dict, key):
    if key not in mapping:
        raise Missing(f"no {key!r}")
    return mapping[key]


# -- formatting ------------------------------------------------------------------------------------------------------
def table(header: list[str], rows: list[list], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(header) - 1)
    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    lines = ["| " + " | ".join(str(cell) for cell in row) + " |" for row in [header, *rows]]
    return "\n".join([lines[0], rule, *lines[1:]])


def ms(seconds: float) -> str:
    return f"{1e3 * seconds:.1f}"


def mib(size: float) -> str:
    return f"{size / MIB:.1f}"


def percent(fraction) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


def summary(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def per_rank_median(rows: list[list[float]]) -> list[float]:
    """Median over repetitions of each rank's value (rows: one list of per-rank values per repetition)."""
    return [statistics.median(column) for column in zip(*rows)]


# -- memory ----------------------------------------------------------------------------------------------------------
def model_title(label: str) -> list[str]:
    preset, downsampling = label.split(" ")
    return [preset.replace("revnet", "RevNet"), downsampling]


def memory_headline(r, arg=None, without_stem=True):
    rows = []
    for label, model in r["models"].items():
        delayed, petra = need(model["summary"], "delayed"), need(model["summary"], "petra")
        row = [*model_title(label), f"{delayed['total_gb']:.2f}", f"{petra['total_gb']:.2f}"]
        row.append(percent(petra["saving_vs_delayed"]))
        if without_stem:
            row.append(f"{delayed['total_without_stem_gb']:.2f} -> {petra['total_without_stem_gb']:.2f}")
            row.append(percent(petra["saving_vs_delayed_without_stem"]))
        rows.append(row)
    header = ["model", "downsampling", "delayed (GB)", "PETRA (GB)", "saving"]
    if without_stem:
        header += ["without the stem's image buffer: delayed -> PETRA", "saving"]
    return table(header, rows, "ll" + "r" * (len(header) - 2))


def memory_totals(r, arg):
    model = need(r["models"], arg.replace("-", " "))
    rows = []
    for name, s in model["summary"].items():
        rows.append([
            name if s["pipelined"] else f"{name} (1 micro-batch)", s["input_buffer"], s["weight_stash"],
            f"{s['activations_gb']:.2f}", f"{s['stem_gb']:.2f}", f"{s['messages_gb']:.2f}", f"{s['stash_gb']:.2f}",
            f"{s['params_gb']:.3f}",
            f"**{s['total_gb']:.2f}**", percent(s["saving_vs_delayed"]), f"{s['total_without_stem_gb']:.2f}",
            percent(s["saving_vs_delayed_without_stem"]),
        ])  # fmt: skip
    header = [
        "configuration", "input buffer", "weight stash", "activations (GB)", "of which stem (GB)",
        "messages waiting (GB)", "weight stash (GB)", "model (GB)", "model + buffers (GB)", "saving vs delayed",
        "model + buffers without the stem's buffer (GB)", "saving",
    ]  # fmt: skip
    return table(header, rows, "lll" + "r" * 9)


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


# -- throughput ------------------------------------------------------------------------------------------------------
def multi_process(r) -> dict:
    """Part 2 of a throughput run (stored as "two" before --num-processes existed)."""
    return r["multi"] if "multi" in r else need(r, "two")


def figures(r) -> dict:
    """What the throughput tables share: per-rank groups and costs, medians, busy cores."""
    one, two, split = r["one"], multi_process(r), r["partition"][0]
    times = two["times"]
    f = {"layout": one["layout"], "groups": [range(split), range(split, len(one["layout"]))], "times": times}
    f["rank_ms"] = [sum(one["stage_ms"][i] for i in g) for g in f["groups"]]
    f["balance"] = sum(f["rank_ms"]) / max(f["rank_ms"])
    f["med"] = {name: statistics.median(values) for name, values in times.items()}
    f["cpu"] = {name: per_rank_median(rows) for name, rows in two["cpu"].items()}
    f["exchange"] = {name: per_rank_median(rows) for name, rows in two["exchange"].items()}
    f["busy"] = {k: statistics.median(sum(c) / t for c, t in zip(two["cpu"][k], times[k])) for k in times}
    f["vs"] = {name: value / f["med"]["petra"] for name, value in f["med"].items()}
    f["fastest"] = {name: min(values) / min(times["petra"]) for name, values in times.items()}
    return f


def one_f_one_b(r) -> list[tuple[str, int]]:
    return [(f"1f1b_m{m}", m) for m in r["settings"]["pp_microbatches"]]


def throughput_run(r, arg=None):
    s, m, one = r["settings"], r["machine"], r["one"]
    w, size, layout = s["width"], s["image_size"], one["layout"]
    malloc = r["malloc"] if isinstance(r["malloc"], str) else ", ".join(f"{k}={v}" for k, v in r["malloc"].items())
    rows = [
        ["command", f"`{r['command']}`"],
        ["date, run time", f"{r['date']}, {r['elapsed_s'] / 60:.1f} min"],
        ["machine", f"`nproc` {m['nproc']} (CPUs this process may run on: {m['affinity']}); CPU: {m['cpu']}"],
        ["software", f"torch {m['torch']}, Python {m['python']}, {m['platform']}"],
        ["model", f"RevNet18, stages {' '.join(layout)} (J = {len(layout)}), CIFAR stem, stream widths "
                  f"{w}/{2 * w}/{4 * w}/{8 * w}, {size}x{size} random images ({mib(one['image_bytes'])} MiB per "
                  f"micro-batch), 10 classes, micro-batch {s['batch']}, float32"],
        ["optimizer", f"SGD (lr {s['lr']:g}, momentum 0.9): after every micro-batch for the engine modes (k = 1), "
                      "after every `step()` for torch's schedules"],
        ["timing", f"N = {s['micro_batches']} micro-batches per window, {s['repeats']} windows per method"],
        ["load average (1, 5, 15 min) at start / after part 1 / at the end", " / ".join(r["loads"])],
        ["malloc", malloc],
    ]  # fmt: skip
    return table(["run", ""], rows, "ll")


def throughput_stages(r, arg=None):
    one, f = r["one"], figures(r)
    header = ["stage"] + [f"{i} {letter}" for i, letter in enumerate(f["layout"])]
    rows = [
        ["ms per micro-batch (fwd + bwd + update)"] + [f"{c:.1f}" for c in one["stage_ms"]],
        [f"rank (partition {r['partition']})"] + [rank for rank, g in enumerate(f["groups"]) for _ in g],
        ["PETRA FIFO, steady state (MiB)"] + [mib(b) for b in one["fifo_bytes"]],
    ]
    return table(header, rows)


def throughput_partition(r, arg=None):
    f = figures(r)
    rows = [[rank, f"{g[0]}-{g[-1]}", f"{f['rank_ms'][rank]:.1f}"] for rank, g in enumerate(f["groups"])]
    return table(["rank", "stages", "CPU ms per tick (sum of its stages' costs)"], rows, "llr")


def petra_groupings(r) -> dict[str, dict]:
    """PETRA's settings with coarser engine stages ({} for runs made before `--petra-groups`)."""
    return multi_process(r)["info"].get("petra_groups", {})


def groups_spec(groups: list[int], stages_per_rank: list[int], kept: list[int] = ()) -> str:
    """([1, 2, 7], [2, 1], [1]) -> "1,2k/7": engine stage sizes, ranks separated by "/", k on the stages keeping
    their graph (as `--petra-groups` takes them)."""
    sizes = [f"{size}{'k' if index in kept else ''}" for index, size in enumerate(groups)]
    bounds = [sum(stages_per_rank[:rank]) for rank in range(len(stages_per_rank) + 1)]
    return "/".join(",".join(sizes[a:b]) for a, b in zip(bounds, bounds[1:]))


def grouping_label(grouping: dict) -> str:
    kept = grouping.get("kept", [])
    sizes = groups_spec(grouping["groups"], grouping["partition"], kept)
    keeping = f", engine stage {', '.join(map(str, kept))} keeping its graph" if kept else ""
    return f"PETRA, engine stages {' '.join(grouping['layout'])} (groups {sizes}{keeping}), steady state"


def method_labels(r) -> dict[str, str]:
    labels = {
        "petra": 'PETRA, steady state (`mode="petra"`, k = 1)',
        **{name: grouping_label(grouping) for name, grouping in petra_groupings(r).items()},
        "petra_drain": f"PETRA, {r['settings']['micro_batches']} micro-batches from empty, fill + drain included",
        "reversible_backprop": "naive MP: engine `reversible_backprop` (synchronous)",
        "backprop": "naive MP: engine `backprop` (synchronous, keeps the graph)",
    }
    return labels | {name: f"`Schedule1F1B` + checkpoint, n_microbatches = {m}" for name, m in one_f_one_b(r)}


def throughput_two_processes(r, arg=None):
    f, rows = figures(r), []
    for name, label in method_labels(r).items():
        median, low, high = summary(f["times"][name])
        exchange = " / ".join(map(ms, f["exchange"][name])) if name in f["exchange"] else "n/a"
        faulted = statistics.median(max(row) for row in multi_process(r)["faults"][name])
        rows.append([
            label, ms(median), ms(low), ms(high), "-" if name in ("petra", *petra_groupings(r)) else
            f"{f['vs'][name]:.2f}x",
            " / ".join(map(ms, f["cpu"][name])), exchange, f"{f['busy'][name]:.2f}", f"{faulted:.0f}",
        ])  # fmt: skip
    ranks = "rank " + " / ".join(map(str, range(len(r["partition"]))))
    header = [
        "method", "ms / micro-batch", "min", "max", "PETRA faster by", f"CPU ms/mb, {ranks}",
        f"in exchange ms/mb, {ranks}", "cores busy", "page faults / mb",
    ]  # fmt: skip
    return table(header, rows)


def throughput_exchange(r, arg=None):
    one, layout, split = r["one"], r["one"]["layout"], r["partition"][0]
    boundary = one["output_bytes"][split - 1]
    reversible = layout[split - 1] == "R"
    if reversible:
        back = "reversible: the rebuilt activation and its gradient go back"
    else:
        back = "not reversible: only its gradient goes back"
    bare = multi_process(r)["info"]["bare_exchange"]  # measured with 2 processes only
    row = [f"after stage {split - 1} {layout[split - 1]} ({back})", mib(boundary),
           mib((2 if reversible else 1) * boundary), ms(max(bare)) if bare else "-"]  # fmt: skip
    header = ["boundary", "forward message (MiB)", "backward message (MiB)", "bare exchange (ms, median of 20)"]
    return table(header, [row])


def throughput_ratios(r, arg=None):
    f, n = figures(r), r["settings"]["micro_batches"]
    petra_bound = max(f["cpu"]["petra"])
    cpu_bound = {mode: sum(f["cpu"][mode]) / petra_bound for mode in ("reversible_backprop", "backprop")}
    rows = []
    for mode, ideal, why in (
        ("reversible_backprop", f["balance"], "same work per micro-batch, no overlap; ideal = sum / max of the "
         "rank costs"),
        ("backprop", 0.75 * f["balance"], "no reconstruction: about 3/4 of PETRA's work"),
    ):
        ratio = f"{f['vs'][mode]:.2f}x"
        rows.append([f"naive MP, `{mode}`", f"**{ratio}**" if mode == "reversible_backprop" else ratio,
                     f"{f['fastest'][mode]:.2f}x", f"{ideal:.2f}x", f"{cpu_bound[mode]:.2f}x", why])  # fmt: skip
    for name, m in one_f_one_b(r):
        rows.append([f"`Schedule1F1B` + checkpoint, m = {m}", f"{f['vs'][name]:.2f}x", f"{f['fastest'][name]:.2f}x",
                     f"{(m + 1) / m:.2f}x", "-", "same work (checkpoint = 1 extra forward); bubble (p-1)/(m+p-1)"])
    rows.append([f"itself with fill + drain ({n} micro-batches)", f"{f['vs']['petra_drain']:.2f}x the steady cost",
                 f"{f['fastest']['petra_drain']:.2f}x", f"<= {(n + r['one']['latency'] - 1) / n:.2f}x", "-",
                 "N + 2(J-1) ticks for N micro-batches, fill/drain ticks are partly idle"])  # fmt: skip
    header = ["PETRA (steady state) against", "measured (medians)", "fastest windows", "ideal here", "from CPU times"]
    return table(header + ["why"], rows, "lrrrrl")


def throughput_memory(r, arg=None):
    one, f = r["one"], figures(r)
    graphs, held = one["graph_bytes"], multi_process(r)["info"]["petra_held_bytes"]

    def row(label, cells):
        return [label] + [f"{mib(h)} + {mib(t)} = **{mib(h + t)}**" for h, t in cells]

    groups = f["groups"]
    rows = [
        row("PETRA", [(held[rank], max(graphs[i] for i in g)) for rank, g in enumerate(groups)]),
        row("naive `reversible_backprop`", [(0, max(graphs[i] for i in g)) for g in groups]),
        row("naive `backprop` (one graph)", [(sum(graphs[i] for i in g), 0) for g in groups]),
    ]
    for _, m in one_f_one_b(r):
        cells = []
        for rank, g in enumerate(groups):
            stored = min(m, len(groups) - rank) * (one["input_bytes"][g[0]] + one["output_bytes"][g[-1]])
            cells.append((stored + (m * one["image_bytes"] if rank == 0 else 0), sum(graphs[i] for i in g)))
        rows.append(row(f"`Schedule1F1B` + checkpoint, m = {m}", cells))
    return table(["method", "rank 0: held + transient = total", "rank 1: held + transient = total"], rows, "lrr")


def throughput_one_process(r, arg=None):
    one, n, rows = r["one"], r["settings"]["micro_batches"], []
    for label, key in (("plain `model(x)`; `loss.backward()`; `opt.step()`", "plain"),
                       ('`Pipeline(stages, mode="petra")`, steady state', "petra")):  # fmt: skip
        median, low, high = summary([t / n for t in one["times"][key]])
        cpu, faults = statistics.median(one["cpu"][key]) / n, statistics.median(one["faults"][key])
        rows.append([label, ms(median), ms(low), ms(high), ms(cpu), f"{faults:.0f}"])
    header = ["loop", "wall ms / micro-batch", "min", "max", "CPU ms / micro-batch", "page faults / mb"]
    return table(header, rows)


def throughput_one_process_ratio(r, arg=None):
    one = r["one"]
    split = one["plain_split"]
    wall = statistics.median(p / b for p, b in zip(one["times"]["petra"], one["times"]["plain"]))
    cpu = statistics.median(p / b for p, b in zip(one["cpu"]["petra"], one["cpu"]["plain"]))
    expected = (2 * split["forward"] + split["backward"] + split["step"]) / sum(split.values())
    header = ["PETRA / plain, wall time", "PETRA / plain, CPU time", "plain forward F (ms)", "backward B (ms)",
              "SGD step U (ms)", "predicted (2F + B + U) / (F + B + U)", "paper's FLOP model"]  # fmt: skip
    row = [f"**{wall:.2f}**", f"{cpu:.2f}", ms(split["forward"]), ms(split["backward"]), ms(split["step"]),
           f"{expected:.2f}", "4/3 = 1.33"]  # fmt: skip
    return table(header, [row], "r" * len(header))


def throughput_summary(r, arg=None):
    f = figures(r)
    names = [name for name, _ in one_f_one_b(r)]
    ms_of = " / ".join(ms(f["med"][name]) for name in names)
    rows = [
        ["PETRA (steady state)", ms(f["med"]["petra"]), "-"],
        ["naive model parallelism, same work (`reversible_backprop`, synchronous)",
         ms(f["med"]["reversible_backprop"]), f"**{f['vs']['reversible_backprop']:.2f}x**"],
        ["naive model parallelism, `backprop` (no reconstruction)", ms(f["med"]["backprop"]),
         f"{f['vs']['backprop']:.2f}x"],
        [f"`torch.distributed.pipelining` `Schedule1F1B` + checkpointing, "
         f"{' / '.join(str(m) for _, m in one_f_one_b(r))} micro-batches per step",
         ms_of, " / ".join(f"{f['vs'][name]:.2f}x" for name in names)],
    ]  # fmt: skip
    measured = [record for record in rival_records(r) or [] if record["status"] == "measured"]
    budget = rival_peak(r, "petra") if measured else None
    for title, candidates in (("within PETRA's memory", [x for x in measured if rival_peak(r, x) <= budget]),
                              ("at any memory", measured)):  # fmt: skip
        if candidates:
            best = min(candidates, key=lambda record: f["med"][record["key"]])
            setting = f"{CHECKPOINTING[best['checkpointing']]}, m = {best['m']}, {mib(rival_peak(r, best))} MiB"
            rows.append([f"fastest torch schedule {title} (PETRA: {mib(budget)} MiB): `{best['torch_class']}`, "
                         f"checkpointing {setting}", ms(f["med"][best["key"]]),
                         f"{f['med'][best['key']] / f['med']['petra']:.2f}x"])  # fmt: skip
    return table(["method", "ms / micro-batch", "PETRA faster by"], rows)


NOT_MEASURED = (
    "_Not in these results: they predate the rivals and their memory measurement (`python "
    "benchmarks/throughput.py` measures them)._"
)
CHECKPOINTING = {"torch": "`torch.utils.checkpoint`", "torch_but_last": "`torch.utils.checkpoint` but the last chunk",
                 "once": "recompute once", None: "off"}  # fmt: skip
ENGINE_ROWS = {
    "petra": "PETRA (`mode=\"petra\"`, k = 1), steady state",
    "reversible_backprop": "naive MP: engine `reversible_backprop`",
    "backprop": "naive MP: engine `backprop`",
}


def engine_rows(r) -> dict[str, str]:
    """ENGINE_ROWS with PETRA's grouped settings after PETRA."""
    grouped = {name: grouping_label(grouping) for name, grouping in petra_groupings(r).items()}
    return {"petra": ENGINE_ROWS["petra"], **grouped} | ENGINE_ROWS


def rival_records(r) -> list[dict] | None:
    """The torch schedules of a throughput run with their memory (None for runs made before they were measured)."""
    return multi_process(r).get("rivals")


def throughput_chunks(r, arg=None):
    chunks, layout = r.get("chunks"), r["one"]["layout"]
    if chunks is None:
        return NOT_MEASURED
    if "loop" not in chunks:
        return f"_No 2W chunks: {len(layout)} stages cannot fill {2 * len(r['partition'])} chunks._"
    sizes, rows = chunks["loop"]["sizes"], []
    for c, size in enumerate(sizes):
        start = sum(sizes[:c])
        stages = f"{start}-{start + size - 1} ({' '.join(layout[start : start + size])})"
        rows.append([c, stages, chunks["loop"]["ranks"][c], chunks["v"]["ranks"][c]])
    header = ["chunk c", "stages", "rank, interleaved schedules (c mod W)",
              "rank, V schedules (c and 2W-1-c on rank c)"]  # fmt: skip
    return table(header, rows, "llrr")


def rival_peak(r, record) -> int:
    """The largest per-rank activation peak of a torch schedule's setting, or of an engine mode (a name)."""
    if isinstance(record, str):
        return max(multi_process(r)["info"]["activation_peak_bytes"][record])
    return max(record["peak_bytes"])


def throughput_rivals(r, arg=None):
    records = rival_records(r)
    if records is None:
        return NOT_MEASURED
    f, peaks = figures(r), multi_process(r)["info"]["activation_peak_bytes"]

    def timing(name):
        median, low, high = summary(need(f["times"], name))
        return [ms(median), ms(low), ms(high), f"{f['med']['petra'] / median:.2f}"]

    rows = [[label, "-", "-", *timing(mode), " / ".join(map(mib, peaks[mode])), mib(max(peaks[mode])), "-"]
            for mode, label in engine_rows(r).items()]  # fmt: skip
    for record in records:
        head = [f"`{record['torch_class']}`", CHECKPOINTING[record["checkpointing"]], record["m"]]
        if record["status"] != "measured":
            rows.append(head + ["-"] * 6 + ["not applicable: " + record["reason"].replace("|", "\\|")])
            continue
        forwards = " / ".join(", ".join(f"{x:g}" for x in rank) for rank in record["forwards_per_micro_batch"])
        rows.append(head + timing(record["key"]) + [" / ".join(map(mib, record["peak_bytes"])),
                                                    mib(max(record["peak_bytes"])), forwards])  # fmt: skip
    ranks = " / ".join(map(str, range(len(r["partition"]))))
    header = ["method", "checkpointing", "m", "ms / micro-batch", "min", "max", "PETRA time / its time",
              f"peak activation MiB, rank {ranks}", "largest rank (MiB)",
              f"forwards per micro-batch of each local chunk, rank {ranks}"]  # fmt: skip
    return table(header, rows, "lllrrrrrrl")


def throughput_equal_memory(r, arg=None):
    records = rival_records(r)
    if records is None:
        return NOT_MEASURED
    f = figures(r)
    budget = rival_peak(r, "petra")
    options = {ENGINE_ROWS[mode]: [("-", rival_peak(r, mode), f["med"][mode])]
               for mode in ("reversible_backprop", "backprop")}  # fmt: skip
    for record in records:
        if record["status"] == "measured":
            setting = f"{CHECKPOINTING[record['checkpointing']]}, m = {record['m']}"
            options.setdefault(f"`{record['torch_class']}`", []).append(
                (setting, rival_peak(r, record), need(f["med"], record["key"])))

    def cells(option):
        setting, peak, seconds = option
        return [setting, mib(peak), ms(seconds), f"**{f['med']['petra'] / seconds:.2f}**"]

    rows = []
    for label, settings in options.items():
        within = [option for option in settings if option[1] <= budget]
        if within:
            fitting = cells(min(within, key=lambda option: option[2]))
        else:
            smallest = min(settings, key=lambda option: option[1])
            fitting = [f"none (smallest: {mib(smallest[1])} MiB, {smallest[0]})", "-", "-", "-"]
        rows.append([label, *fitting, *cells(min(settings, key=lambda option: option[2]))[:3],
                     f"{f['med']['petra'] / min(option[2] for option in settings):.2f}"])  # fmt: skip
    header = [f"rival (PETRA: {mib(budget)} MiB, {ms(f['med']['petra'])} ms / micro-batch)",
              "fastest setting within PETRA's memory", "its peak (MiB)", "ms / micro-batch", "PETRA time / its time",
              "fastest setting, any memory", "its peak (MiB)", "ms / micro-batch", "PETRA time / its time"]  # fmt: skip
    return table(header, rows, "llrrrlrrr")


def throughput_goals(r, arg=None):
    """The issue's goals at equal memory, measured: at every memory level (each setting's largest-rank peak), the
    fastest torch schedule within it against PETRA's fastest setting within it; the lowest ratio over the levels
    where both have a setting, against every schedule and against the checkpointed ones."""
    records = rival_records(r)
    if records is None:
        return NOT_MEASURED
    f = figures(r)
    petra = [(f["med"][name], rival_peak(r, name)) for name in ("petra", *petra_groupings(r))]
    rivals = [(need(f["med"], x["key"]), rival_peak(r, x), x["checkpointed"]) for x in records
              if x["status"] == "measured"]  # fmt: skip
    row = [mib(min(b for _, b in petra)), mib(min(b for _, b, _ in rivals)),
           worst_ratio_at_equal_memory(petra, [(t, b) for t, b, _ in rivals]),
           worst_ratio_at_equal_memory(petra, [(t, b) for t, b, checkpointed in rivals if checkpointed])]
    header = ["PETRA's least peak (MiB, largest rank)", "a torch schedule's least", "vs fastest torch schedule",
              "vs fastest checkpointed torch schedule"]
    return table(header, [row], "rrrr")


def fastest(candidates: list[tuple], seconds: float, peak_column: bool = True) -> list[str]:
    """Table cells for the fastest of `candidates` = [(label, peak bytes, seconds, checkpointed), ...]: its label,
    peak (unless not `peak_column`), time and how much slower it is than `seconds` (PETRA's); "none" if empty."""
    if not candidates:
        return ["none"] + ["-"] * (3 if peak_column else 2)
    label, peak, theirs, _ = min(candidates, key=lambda rival: rival[2])
    return [label, *([mib(peak)] if peak_column else []), ms(theirs), f"**{theirs / seconds:.2f}x**"]


def throughput_petra_settings(r, arg=None):
    """Every PETRA setting against the fastest rival within its memory, the fastest checkpointed one and the
    fastest at any memory ("PETRA faster by" = their time / PETRA's, medians)."""
    records = rival_records(r)
    if records is None:
        return NOT_MEASURED
    f = figures(r)
    rivals = [(ENGINE_ROWS[mode], rival_peak(r, mode), f["med"][mode], False)
              for mode in ("reversible_backprop", "backprop")]  # fmt: skip
    rivals += [(f"`{x['torch_class']}`, {CHECKPOINTING[x['checkpointing']]}, m = {x['m']}", rival_peak(r, x),
                need(f["med"], x["key"]), x["checkpointed"]) for x in records if x["status"] == "measured"]

    settings = {"petra": "PETRA, one engine stage per model stage, steady state"}
    settings |= {name: grouping_label(grouping) for name, grouping in petra_groupings(r).items()}
    rows = []
    for name, label in settings.items():
        budget, seconds = rival_peak(r, name), f["med"][name]
        rows.append([label, mib(budget), ms(seconds), *fastest([x for x in rivals if x[1] <= budget], seconds),
                     *fastest([x for x in rivals if x[3]], seconds, peak_column=False), *fastest(rivals, seconds)])
    header = ["PETRA setting", "peak (MiB, largest rank)", "ms / micro-batch",
              "fastest rival within its memory", "its peak", "ms", "PETRA faster by",
              "fastest checkpointed rival, any memory", "ms", "PETRA faster by",
              "fastest rival, any memory", "its peak", "ms", "PETRA faster by"]  # fmt: skip
    return table(header, rows, "lrrlrrrlrrlrrr")


# -- accuracy --------------------------------------------------------------------------------------------------------
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


# -- fidelity --------------------------------------------------------------------------------------------------------
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


# -- simulator -------------------------------------------------------------------------------------------------------
def split_label(row: dict) -> str:
    """A simulator row's stages per rank: "4,6", or the engine stages' groups "1,2/7" ("4k/6": keeping its graph)."""
    groups, partition = row.get("groups"), row["partition"]
    return groups_spec(groups, partition, row.get("kept", [])) if groups else ",".join(map(str, partition))


def simulator_main(r, arg=None):
    """Measured against predicted time per micro-batch, per mode and partition, with the automatic partition."""
    overlapped = all("error_overlapped" in row for row in need(r, "rows"))  # torch's schedules, newer runs

    def spread(key: str) -> str:
        errors = sorted(abs(row[key]) for row in r["rows"])
        return f"median {100 * statistics.median(errors):.1f}%, max {100 * errors[-1]:.1f}%"

    rows = []
    for row in r["rows"]:
        auto = r.get("auto_partition", {}).get(row["mode"])
        mode = f"{row['mode']}, m = {row['m']}" if "m" in row else row["mode"]
        rows.append([mode, split_label(row), ms(row["measured_s"]), ms(row["predicted_s"]),
                     f"{100 * row['error']:+.1f}%"]
                    + ([f"{100 * row['error_overlapped']:+.1f}%"] if overlapped else [])
                    + ["yes" if auto == row["partition"] else ""])  # fmt: skip
    rows.append(["**all**", "", "", "", spread("error")] + ([spread("error_overlapped")] if overlapped else []) + [""])
    header = ["mode", "stages per rank", "measured ms / micro-batch", "predicted ms", "error"]
    header += ["error if transfers overlapped compute"] if overlapped else []
    return table(header + ["Placement.auto's choice"], rows, "llrrr" + ("r" if overlapped else "") + "l")


def simulator_memory(r, arg=None):
    """The allocation peak per rank measured in each run against the simulated one (both without the parameters)."""
    measured = [row for row in need(r, "rows") if "measured_peak_bytes" in row]
    if not measured:
        return NOT_MEASURED
    needed = all("predicted_needed_peak_bytes" in row for row in measured)  # torch's schedules, newer runs

    def per_rank(row, key: str) -> list[str]:
        return [" / ".join(mib(b) for b in row[key]),
                " / ".join(f"{p / m:.2f}" for p, m in zip(row[key], row["measured_peak_bytes"]))]

    rows = [[f"{row['mode']}, m = {row['m']}" if "m" in row else row["mode"], split_label(row),
             " / ".join(mib(b) for b in row["measured_peak_bytes"]), *per_rank(row, "predicted_peak_bytes")]
            + (per_rank(row, "predicted_needed_peak_bytes") if needed else []) for row in measured]  # fmt: skip
    header = ["schedule", "stages per rank", "measured peak MiB (rank 0 / rank 1)", "predicted", "predicted / measured"]
    if needed:
        header[3:] = ["predicted with torch's buffers", "/ measured", "the schedule's own need", "/ measured"]
    return table(header, rows, "llrrr" + ("rr" if needed else ""))


def predict_main(r, arg=None):
    """PREDICTED speed-ups of PETRA over synchronous model-parallel reversible backprop, by model, link and device
    count (results before RevNet34/50 were added hold RevNet18 alone, at the top level)."""
    models = r.get("models") or {"revnet18": r}
    rows = [[preset.replace("revnet", "RevNet"), row["link"], row["devices"], ",".join(map(str, row["partition"])),
             ms(row["petra_s"]), ms(row["naive_s"]), f"**{row['speedup']:.2f}x**", f"{row['partition_cap']:.2f}x"]
            for preset, model in models.items() for row in need(model, "rows")]  # fmt: skip
    header = ["model", "link (predicted)", "devices", "stages per device (Placement.auto)", "PETRA ms / micro-batch",
              "naive ms / micro-batch", "speed-up", "compute cap of the split"]  # fmt: skip
    return table(header, rows, "llrlrrrr")


EQUAL_MEMORY = 1.02  # a simulated peak is an estimate: a rival 2% above PETRA's counts as within its memory
RIVAL_CHECKPOINTING = {"none": "no checkpointing", "but_last": "checkpointed but the last chunk",
                       "all": "checkpointed"}


def predict_rivals(r, arg=None):
    """PREDICTED: each PETRA setting against torch's schedules (simulated; results before `simulate_schedule` hold
    `Schedule1F1B` alone) on one link (`arg`, default PCIe): the fastest setting within PETRA's peak memory per
    device (+2%), the fastest checkpointed one and the fastest of all; a rival's peak is what its schedule needs."""
    return rivals_at_equal_memory(r, arg or "PCIe 4.0 x16", "peak_bytes")


def predict_rivals_allocated(r, arg=None):
    """`predict_rivals` with each rival's peak as torch 2.14 allocates it (its buffers included)."""
    return rivals_at_equal_memory(r, arg or "PCIe 4.0 x16", "torch_peak_bytes")


def predict_equal_memory(r, arg=None):
    """PREDICTED, the issue's goals at equal memory: at every memory level (each setting's peak), the fastest rival
    within it against PETRA's fastest setting within it (PETRA's settings: the rivals table's, and one engine
    stage per device keeping graphs within each budget, where the results have them); per device count, the lowest
    such ratio over the levels where PETRA has a setting, against any rival and against checkpointed ones, with
    each rival's peak as its schedule needs it and as torch allocates it."""
    link = arg or "PCIe 4.0 x16"
    rows = []
    for preset, model in need(r, "models").items():
        for row in need(model, "rows"):
            if row["link"] != link:
                continue
            petra = [(seconds, peak) for _, seconds, peak in petra_settings(model, row)]
            petra += [(x["time_s"], x["peak_bytes"]) for x in row.get("petra_per_device_budgets", [])]
            cells = []
            for peak_key in ("peak_bytes", "torch_peak_bytes"):
                if not all(peak_key in x for x in row["rivals"]):
                    cells += ["-", "-"]
                    continue
                rivals = [(x["time_s"], x[peak_key], x["checkpointing"] != "none") for x in row["rivals"]]
                for checkpointed_only in (False, True):
                    cells.append(worst_ratio_at_equal_memory(petra, [(t, b) for t, b, ckpt in rivals
                                                                     if ckpt or not checkpointed_only]))
            rows.append([preset.replace("revnet", "RevNet"), row["devices"], mib(min(b for _, b in petra)),
                         mib(min(x["peak_bytes"] for x in row["rivals"])), *cells])
    header = ["model", "devices", "PETRA's least peak MiB", "a rival's least (need)",
              "vs fastest rival (need)", "vs fastest checkpointed (need)", "vs fastest rival (torch's allocation)",
              "vs fastest checkpointed (torch's allocation)"]  # fmt: skip
    return table(header, rows, "lrrrrrrr")


def petra_settings(model: dict, row: dict) -> list[tuple[str, float, int]]:
    """(label, seconds, peak bytes) of each PETRA setting of a predict row that the rivals tables list."""
    settings = [(f"one stage per model stage (J = {model['num_stages']})", row["petra_s"], row["petra_peak_bytes"])]
    for key, label in (("petra_per_device", "one engine stage per device"),
                       ("petra_per_device_kept", "one engine stage per device, every graph kept")):
        if row.get(key):
            settings.append((label, row[key]["time_s"], row[key]["peak_bytes"]))
    return settings


def worst_ratio_at_equal_memory(petra: list[tuple], rivals: list[tuple]) -> str:
    """min over memory levels M (every peak of either) of fastest rival within M / fastest PETRA within M, where
    both have a setting within M; (seconds, peak bytes) pairs; "-" where no level has both."""
    ratios = []
    for level in sorted({b for _, b in petra + rivals}):
        mine = [t for t, b in petra if b <= EQUAL_MEMORY * level]
        theirs = [t for t, b in rivals if b <= EQUAL_MEMORY * level]
        if mine and theirs:
            ratios.append(min(theirs) / min(mine))
    return f"**{min(ratios):.2f}x**" if ratios else "-"


def rivals_at_equal_memory(r, link: str, peak_key: str):
    models = need(r, "models")
    if not all(peak_key in x for model in models.values() for row in model["rows"] for x in row["rivals"]):
        return NOT_MEASURED
    rows = []
    for preset, model in models.items():
        for row in need(model, "rows"):
            if row["link"] != link:
                continue
            rivals = [(f"{x.get('schedule', 'Schedule1F1B')} {RIVAL_CHECKPOINTING[x['checkpointing']]}, m = {x['m']}",
                       x[peak_key], x["time_s"], x["checkpointing"] != "none")
                      for x in need(row, "rivals")]  # fmt: skip
            for label, seconds, peak in petra_settings(model, row):
                rows.append([preset.replace("revnet", "RevNet"), row["devices"], label, ms(seconds), mib(peak),
                             *fastest([x for x in rivals if x[1] <= EQUAL_MEMORY * peak], seconds),
                             *fastest([x for x in rivals if x[3]], seconds, peak_column=False),
                             *fastest(rivals, seconds)])  # fmt: skip
    header = ["model", "devices", "PETRA setting (predicted)", "ms / micro-batch", "peak MiB per device",
              "fastest rival within PETRA's memory (+2%)", "its peak", "ms", "PETRA faster by",
              "fastest checkpointed rival", "ms", "PETRA faster by", "fastest rival", "its peak", "ms",
              "PETRA faster by"]  # fmt: skip
    return table(header, rows, "lrlrrlrrrlrrlrrr")


def predict_costs(r, arg=None):
    """Per model: the measured stage costs the predictions start from, the one-stage-per-device cap, and the
    predicted speed-up with devices 100x faster than this core."""
    rows = []
    for preset, model in need(r, "models").items():
        costs = [1e3 * (c["forward_s"] + c["backward_s"] + c["update_s"]) for c in model["stage_costs"]]
        fast = " / ".join(f"{x:.1f}x" for x in model["hundredfold_faster_devices"].values())
        paper = r["paper_table5"].get(preset)
        rows.append([preset.replace("revnet", "RevNet"), model["num_stages"], f"{sum(costs):.0f}",
                     f"{max(costs):.0f}", f"**{model['ideal_one_stage_per_device']:.2f}x**", fast,
                     f"{paper['speedup']}x on {paper['devices']} GPUs" if paper else "-"])  # fmt: skip
    links = " / ".join(next(iter(r["models"].values()))["hundredfold_faster_devices"])
    header = ["model", "J", "sum of stage costs (ms)", "largest stage (ms)", "one stage per device: cap sum / max",
              f"predicted, J devices 100x faster ({links})", "paper Table 5 (measured, GPUs)"]  # fmt: skip
    return table(header, rows, "lrrrrll")


def overhead_main(r, arg=None):
    """Plain backprop against one-process PETRA: wall time, time in operators and outside them, then the operators
    that cost most, per micro-batch (medians over the windows)."""
    plain, petra = need(r, "plain"), need(r, "petra")

    def row(label, a, b, calls=("", "")):
        return [label, calls[0], ms(a), calls[1], ms(b), f"{1e3 * (b - a):+.1f}"]

    rows = [row("**wall time**, not profiled", plain["unprofiled_wall_s"], petra["unprofiled_wall_s"]),
            row("in operators (self CPU time, profiled)", plain["in_ops_s"], petra["in_ops_s"]),
            row("outside operators: Python, the loop, the engine (difference of the two above)",
                plain["unprofiled_wall_s"] - plain["in_ops_s"], petra["unprofiled_wall_s"] - petra["in_ops_s"]),
            row("wall time under the profiler", plain["wall_s"], petra["wall_s"])]  # fmt: skip
    top = sorted(set(plain["ops"]) | set(petra["ops"]),
                 key=lambda k: -max(plain["ops"].get(k, [0, 0])[1], petra["ops"].get(k, [0, 0])[1]))[:16]
    for key in top:
        (ca, ta), (cb, tb) = plain["ops"].get(key, [0, 0]), petra["ops"].get(key, [0, 0])
        rows.append(row(f"`{key}`", ta, tb, (f"{ca:g}", f"{cb:g}")))
    header = ["per micro-batch", "plain: calls", "plain (ms)", "PETRA: calls", "PETRA (ms)", "PETRA - plain (ms)"]
    return table(header, rows, "lrrrrr")


# -- numerics --------------------------------------------------------------------------------------------------------
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


# -- messages --------------------------------------------------------------------------------------------------------
def messages_main(r, arg=None):
    settings, rows = r["settings"], []
    for name, row in need(r, "summary").items():
        sent = row["bytes_sent_per_micro_batch"]
        rows.append([
            name, " / ".join(f"{b / 1e3:.1f}" for b in sent), f"{row['bytes_vs_fp32']:.3f}",
            ms(row["seconds_per_micro_batch"]), f"{row['speedup_vs_fp32']:.3f}",
        ])  # fmt: skip
    header = ["message dtype", "kB sent per micro-batch (rank 0 / rank 1)", "bytes vs fp32",
              f"ms per micro-batch (median of {settings['repeats']})", "speed vs fp32 (median of paired ratios)"]
    return table(header, rows)


# -- compile, gpu: the benchmark modules own their tables (they import torch, so only when asked) ---------------------
def from_benchmark(module_name: str):
    def render(r, arg=None):
        import importlib

        if str(Path(__file__).resolve().parent) not in sys.path:
            sys.path.insert(0, str(Path(__file__).resolve().parent))
        return importlib.import_module(module_name).markdown_tables(r).rstrip("\n")

    return render


# -- kept graphs and delay sensitivity ---------------------------------------------------------------------------------
KEPT_GRAPH_LABELS = {"backprop": "plain backprop (engine `backprop` mode)", "petra": "PETRA, recomputing (the paper)",
                     "petra_budget": "PETRA, `memory_budget` halfway",
                     "petra_kept": "PETRA, stored-input stages' graphs kept",
                     "petra_all_kept": "PETRA, every stage's graph kept"}


def kept_graphs_main(r, arg=None):
    rows = [[KEPT_GRAPH_LABELS[name], ", ".join(map(str, r["kept"][name])) or "-",
             f"{1e3 * r['median_s'][name]:.2f}", f"{r['ratio_to_backprop'][name]:.3f}x", mib(r["held_bytes"][name])]
            for name in KEPT_GRAPH_LABELS if name in r["kept"]]
    return table(["method", "stages keeping their graph", "ms per micro-batch (median)",
                  "time / backprop (median of paired windows)", "held between ticks (MiB)"], rows, "llrrr")


def affinity_main(r, arg=None):
    rows = [[row["groups"], f"{1e3 * row['free_s']:.1f}", f"{1e3 * row['bound_s']:.1f}",
             f"{row['free_over_bound']:.3f}",
             " / ".join(f"{t:.3f}" for t in row["tail_free"]), " / ".join(f"{t:.3f}" for t in row["tail_bound"])]
            for row in need(r, "rows")]  # fmt: skip
    return table(["PETRA setting", "free: ms per micro-batch (median)", "bound", "speed bound / free (paired median)",
                  "operations' mean / median, free (rank 0 / 1)", "bound"], rows, "lrrrrr")


def delay_sensitivity_main(r, arg=None):
    rows = [[row["model"], row["delay"], f"{row['final_loss']:.3f}", f"{100 * row['test_accuracy']:.2f}"]
            for row in r["rows"]]
    return table(["model", "delay d (micro-batches)", f"training loss, last {r['settings']['steps'] // 4} steps",
                  "test accuracy %"], rows, "lrrr")



RENDERERS = {
    "memory": {
        "summary": lambda r, arg: memory_headline(r, without_stem=False),
        "headline": memory_headline,
        "totals": memory_totals,
        "stages": memory_stages,
        "check": memory_check,
        "process-check": memory_process_check,
        "depth": memory_depth,
        "table6": memory_table6,
    },
    "throughput": {
        "summary": throughput_summary,
        "run": throughput_run,
        "stages": throughput_stages,
        "partition": throughput_partition,
        "two-processes": throughput_two_processes,
        "exchange": throughput_exchange,
        "ratios": throughput_ratios,
        "memory": throughput_memory,
        "one-process": throughput_one_process,
        "one-process-ratio": throughput_one_process_ratio,
        "chunks": throughput_chunks,
        "rivals": throughput_rivals,
        "equal-memory": throughput_equal_memory,
        "petra-settings": throughput_petra_settings,
        "goals": throughput_goals,
    },
    "accuracy_digits": {"summary": accuracy_summary, "main": accuracy_main, "table4": accuracy_table4},
    "fidelity": {"main": fidelity_main, "summary": fidelity_summary},
    "simulator": {"main": simulator_main, "memory": simulator_memory},
    "kept_graphs": {"main": kept_graphs_main},
    "affinity": {"main": affinity_main},
    "delay_sensitivity": {"main": delay_sensitivity_main},
    "predict": {"main": predict_main, "costs": predict_costs, "rivals": predict_rivals,
                "rivals-allocated": predict_rivals_allocated, "equal-memory": predict_equal_memory},
    "overhead": {"main": overhead_main},
    "messages": {"main": messages_main},
    "compile": {"main": from_benchmark("compile")},
    "gpu": {"main": from_benchmark("gpu")},
    "numerics": {
        "summary": numerics_summary,
        "run": numerics_run,
        "reconstruction": numerics_reconstruction,
        "gradients": numerics_gradients,
    },
}


# -- docs ------------------------------------------------------------------------------------------------------------
def render(name: str, results: Path) -> str:
    """The table NAME (RESULT/TABLE[/ARG]); raises Missing when its results are not there."""
    result, table_name, arg = (name.split("/", 2) + [None])[:3]
    path = results / f"{result}.json"
    if not path.exists():
        raise Missing(f"no {path}")
    data = json.loads(path.read_text())
    renderer = RENDERERS.get(data.get("benchmark"), {}).get(table_name)
    if renderer is None:
        raise UnknownTable(f"{name}: {path} comes from {data.get('benchmark')!r}, which has no table {table_name!r}")
    return renderer(data, arg)


def rewrite(text: str, results: Path) -> tuple[str, list[tuple[str, str]]]:
    """`text` with every marked region re-rendered; and (name, updated / unchanged / skipped: why) per region."""
    statuses = []

    def replace(match):
        name = match["name"]
        try:
            new = f"<!-- table:{name} -->\n{render(name, results)}\n<!-- /table:{name} -->"
        except Missing as missing:
            statuses.append((name, f"skipped: {missing}"))
            return match[0]
        statuses.append((name, "unchanged" if new == match[0] else "updated"))
        return new

    return MARKER.sub(replace, text), statuses


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of the JSON files (default %(default)s)")
    parser.add_argument("--docs", type=Path, nargs="+", default=DOCS, help="markdown files (default: benchmarks*.md)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a table would change")
    parser.add_argument("--list", action="store_true", help="list the tables of every benchmark and exit")
    args = parser.parse_args(argv)
    if args.list:
        for benchmark, tables in RENDERERS.items():
            print(f"{benchmark}: {', '.join(tables)}")
        return 0
    stale = False
    for doc in args.docs:
        text = doc.read_text()
        try:
            new, statuses = rewrite(text, args.results)
        except UnknownTable as error:
            print(f"{doc}: {error}", file=sys.stderr)
            return 2
        for name, status in statuses:
            print(f"{doc}: {name}: {status}")
        stale |= new != text
        if new != text and not args.check:
            doc.write_text(new)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
