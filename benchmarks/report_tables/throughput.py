"""Tables of benchmarks/throughput.py, part 1 and the engine's modes of part 2: the run, the stages, the partition,
PETRA against naive model parallelism and torch's Schedule1F1B, one process against plain backprop."""

from __future__ import annotations

import statistics

from .base import mib, ms, need, per_rank_median, renders, summary, table


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


NOT_MEASURED = (
    "_Not in these results: they predate the rivals and their memory measurement (`python "
    "benchmarks/throughput.py` measures them)._"
)


CHECKPOINTING = {"torch": "`torch.utils.checkpoint`", "torch_but_last": "`torch.utils.checkpoint` but the last chunk",
                 "once": "recompute once", None: "off"}  # fmt: skip


def rival_records(r) -> list[dict] | None:
    """The torch schedules of a throughput run with their memory (None for runs made before they were measured)."""
    return multi_process(r).get("rivals")


def rival_peak(r, record) -> int:
    """The largest per-rank activation peak of a torch schedule's setting, or of an engine mode (a name)."""
    if isinstance(record, str):
        return max(multi_process(r)["info"]["activation_peak_bytes"][record])
    return max(record["peak_bytes"])


@renders("throughput", "run")
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


@renders("throughput", "stages")
def throughput_stages(r, arg=None):
    one, f = r["one"], figures(r)
    header = ["stage"] + [f"{i} {letter}" for i, letter in enumerate(f["layout"])]
    rows = [
        ["ms per micro-batch (fwd + bwd + update)"] + [f"{c:.1f}" for c in one["stage_ms"]],
        [f"rank (partition {r['partition']})"] + [rank for rank, g in enumerate(f["groups"]) for _ in g],
        ["PETRA FIFO, steady state (MiB)"] + [mib(b) for b in one["fifo_bytes"]],
    ]
    return table(header, rows)


@renders("throughput", "partition")
def throughput_partition(r, arg=None):
    f = figures(r)
    rows = [[rank, f"{g[0]}-{g[-1]}", f"{f['rank_ms'][rank]:.1f}"] for rank, g in enumerate(f["groups"])]
    return table(["rank", "stages", "CPU ms per tick (sum of its stages' costs)"], rows, "llr")


@renders("throughput", "two-processes")
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


@renders("throughput", "exchange")
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


@renders("throughput", "ratios")
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


@renders("throughput", "memory")
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


@renders("throughput", "one-process")
def throughput_one_process(r, arg=None):
    one, n, rows = r["one"], r["settings"]["micro_batches"], []
    for label, key in (("plain `model(x)`; `loss.backward()`; `opt.step()`", "plain"),
                       ('`Pipeline(stages, mode="petra")`, steady state', "petra")):  # fmt: skip
        median, low, high = summary([t / n for t in one["times"][key]])
        cpu, faults = statistics.median(one["cpu"][key]) / n, statistics.median(one["faults"][key])
        rows.append([label, ms(median), ms(low), ms(high), ms(cpu), f"{faults:.0f}"])
    header = ["loop", "wall ms / micro-batch", "min", "max", "CPU ms / micro-batch", "page faults / mb"]
    return table(header, rows)


@renders("throughput", "one-process-ratio")
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


@renders("throughput", "summary")
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
    for title, best in fastest_rivals(r, f):
        setting = f"{CHECKPOINTING[best['checkpointing']]}, m = {best['m']}, {mib(rival_peak(r, best))} MiB"
        rows.append([f"fastest torch schedule {title} (PETRA: {mib(rival_peak(r, 'petra'))} MiB): "
                     f"`{best['torch_class']}`, checkpointing {setting}", ms(f["med"][best["key"]]),
                     f"{f['med'][best['key']] / f['med']['petra']:.2f}x"])  # fmt: skip
    return table(["method", "ms / micro-batch", "PETRA faster by"], rows)


def fastest_rivals(r, f) -> list[tuple[str, dict]]:
    """("within PETRA's memory" / "at any memory", the fastest measured torch schedule there), for those that have
    one (none for runs made before the rivals were measured)."""
    measured = [record for record in rival_records(r) or [] if record["status"] == "measured"]
    if not measured:
        return []
    budget = rival_peak(r, "petra")
    found = []
    for title, candidates in (("within PETRA's memory", [x for x in measured if rival_peak(r, x) <= budget]),
                              ("at any memory", measured)):  # fmt: skip
        if candidates:
            found.append((title, min(candidates, key=lambda record: f["med"][record["key"]])))
    return found


@renders("throughput", "versus-torch")
def throughput_versus_torch(r, arg=None):
    """PETRA against what a user would otherwise run on 2 processes, torch's schedules, in rows whose labels do not
    change between runs (the README quotes them): checkpointed 1F1B, which does PETRA's work (its fastest m), and
    the fastest torch schedule within PETRA's memory and at any memory."""
    f = figures(r)
    petra = f["med"]["petra"]
    best_1f1b, m = min(one_f_one_b(r), key=lambda pair: f["med"][pair[0]])
    rivals = fastest_rivals(r, f)  # empty for runs made before the rivals (and PETRA's memory) were measured
    rows = [["PETRA (steady state)", ms(petra), "-", f"{mib(rival_peak(r, 'petra'))} MiB" if rivals else ""],
            ["`Schedule1F1B` with checkpointing (the same work), its fastest m", ms(f["med"][best_1f1b]),
             f"{f['med'][best_1f1b] / petra:.2f}x", f"m = {m}"]]
    for title, best in rivals:
        rows.append([f"fastest torch schedule {title}", ms(f["med"][best["key"]]),
                     f"{f['med'][best['key']] / petra:.2f}x",
                     f"`{best['torch_class']}`, checkpointing {CHECKPOINTING[best['checkpointing']]}, "
                     f"m = {best['m']}, {mib(rival_peak(r, best))} MiB"])  # fmt: skip
    return table(["method", "ms / micro-batch", "PETRA faster by", "setting"], rows, "lrrl")
