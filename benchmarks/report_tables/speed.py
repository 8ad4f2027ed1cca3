"""Tables of the one-process speed studies: benchmarks/overhead.py (PETRA against plain backprop, operator by
operator), messages.py (message dtypes), kept_graphs.py (graphs kept instead of recomputed), remedy_costs.py (the
delay remedies' time and memory) and affinity.py (ranks bound to cores)."""

from __future__ import annotations

from .base import mib, ms, need, renders, table


@renders("overhead", "main")
def overhead_main(r, arg=None):
    """Plain backprop against one-process PETRA: wall time, time in operators and outside them, then the operators
    that cost most, per micro-batch (medians over the windows). Time outside operators is the profiled windows' wall
    time minus their time in operators: both from the same windows (the bare windows are others, with no operator
    times), so it includes the profiler's own cost per operator."""
    plain, petra = need(r, "plain"), need(r, "petra")

    def row(label, a, b, calls=("", "")):
        return [label, calls[0], ms(a), calls[1], ms(b), f"{1e3 * (b - a):+.1f}"]

    rows = [row("**wall time**, not profiled", plain["unprofiled_wall_s"], petra["unprofiled_wall_s"]),
            row("wall time under the profiler", plain["wall_s"], petra["wall_s"]),
            row("in operators (self CPU time, profiled)", plain["in_ops_s"], petra["in_ops_s"]),
            row("outside operators: Python, the loop, the engine, the profiler (the two above subtracted)",
                plain["wall_s"] - plain["in_ops_s"], petra["wall_s"] - petra["in_ops_s"])]  # fmt: skip
    top = sorted(set(plain["ops"]) | set(petra["ops"]),
                 key=lambda k: -max(plain["ops"].get(k, [0, 0])[1], petra["ops"].get(k, [0, 0])[1]))[:16]
    for key in top:
        (ca, ta), (cb, tb) = plain["ops"].get(key, [0, 0]), petra["ops"].get(key, [0, 0])
        rows.append(row(f"`{key}`", ta, tb, (f"{ca:g}", f"{cb:g}")))
    header = ["per micro-batch", "plain: calls", "plain (ms)", "PETRA: calls", "PETRA (ms)", "PETRA - plain (ms)"]
    return table(header, rows, "lrrrrr")


@renders("messages", "main")
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


KEPT_GRAPH_LABELS = {"plain": "plain torch loop (the reference)",
                     "plain_second_forward": "the same loop with a forward without graph first (PETRA's operations)",
                     "plain_staged": "the plain loop split into the J stages (a graph, backward and SGD step each)",
                     "backprop": "plain backprop through the engine (`backprop` mode)",
                     "petra": "PETRA, recomputing (the paper)", "petra_budget": "PETRA, `memory_budget` halfway",
                     "petra_kept": "PETRA, stored-input stages' graphs kept",
                     "petra_all_kept": "PETRA, every stage's graph kept"}


@renders("kept_graphs", "main")
def kept_graphs_main(r, arg=None):
    def memory(name, key):  # the plain loops are not a pipeline: nothing is counted for them
        return "-" if name.startswith("plain") else mib(r[key][name])

    faults = r.get("median_minor_faults")  # runs before the page faults were counted have none

    rows = [[KEPT_GRAPH_LABELS[name], ", ".join(map(str, r["kept"][name])) or "-",
             f"{1e3 * r['median_s'][name]:.2f}", f"{r['ratio_to_plain'][name]:.3f}x",
             f"{r['ratio_to_backprop'][name]:.3f}x", *([f"{faults[name]:.0f}"] if faults else []),
             memory(name, "held_bytes"), memory(name, "peak_bytes")]
            for name in KEPT_GRAPH_LABELS if name in r["kept"]]
    return table(["method", "stages keeping their graph", "ms per micro-batch (median)",
                  "time / plain loop (median of paired windows)", "time / `backprop` mode",
                  *(["minor page faults per micro-batch (median)"] if faults else []),
                  "held between ticks (MiB)", "held after an operation, at most (MiB)"],
                 rows, "llrrr" + ("r" if faults else "") + "rr")


REMEDY_LABELS = {"petra": "PETRA, k = 1 over 32 (the reference)",
                 "predict-half": "weight prediction over half the delay (`petra_weight_prediction 0.5`)",
                 "delay-momentum": "delay-matched momentum (`petra_delay_momentum`)",
                 "predict-half+delay-momentum": "both",
                 "k4-over-8": "k = 4 over micro-batches of 8 (accumulation at equal updates)"}


@renders("remedy_costs", "main")
def remedy_costs_main(r, arg=None):
    rows = [[REMEDY_LABELS[name], f"{1e3 * r['median_s'][name]:.2f}", f"{r['ratio_to_petra'][name]:.3f}x",
             mib(r["held"][name]["total_bytes"]), mib(r["held"][name]["remedy_bytes"]),
             mib(r["peak_within_bytes"][name])]
            for name in REMEDY_LABELS if name in need(r, "median_s")]
    return table(["setting", f"ms per update of {r['settings']['samples_per_update']} samples (median)",
                  "time / PETRA (median of paired windows)", "held between ticks (MiB)",
                  "of which the remedy's own state (MiB)", "held inside operations, at most (MiB)"], rows)


@renders("affinity", "main")
def affinity_main(r, arg=None):
    rows = [[row["groups"], f"{1e3 * row['free_s']:.1f}", f"{1e3 * row['bound_s']:.1f}",
             f"{row['free_over_bound']:.3f}",
             " / ".join(f"{t:.3f}" for t in row["tail_free"]), " / ".join(f"{t:.3f}" for t in row["tail_bound"])]
            for row in need(r, "rows")]  # fmt: skip
    return table(["PETRA setting", "free: ms per micro-batch (median)", "bound", "speed bound / free (paired median)",
                  "operations' mean / median, free (rank 0 / 1)", "bound"], rows, "lrrrrr")


@renders("data_reading", "main")
def data_reading_main(r, arg=None):
    """Per data set, way of reading and process, medians over the repeats: what producing the micro-batches cost,
    what the data set holds, and the run's speed."""
    names = {"imagenet32": "ImageNet32 npz", "imagenet": "PNG folder"}
    rows = []
    for row in r["summary"]:
        for rank in row["ranks"]:
            first = rank["rank"] == 0
            rows.append([names.get(row["data"], row["data"]), row["way"], rank["rank"], f"{rank['data_cpu_s']:.1f}",
                         f"{rank['cpu_s']:.1f}", f"{rank['data_set_mib']:.0f}", f"{rank['peak_rss_mib']:.0f}",
                         f"{row['images_per_s']:.0f}" if first else "",
                         f"{row['images_per_s_ratio']:.2f}x" if first else ""])
    header = ["data", "who reads", "process", "data CPU s", "all CPU s", "data set MiB", "peak RSS MiB", "images/s",
              "images/s ratio"]
    return table(header, rows, "llrrrrrrr")


@renders("data_reading", "building")
def data_reading_building(r, arg=None):
    """The memory of building the ImageNet32 set in a fresh process, with and without its images, by its size."""
    rows = [[f"{row['images']:,}", "yes" if row["keep_images"] else "no", f"{row['peak_mib']:.0f}",
             f"{row['held_mib']:.0f}"] for row in r["building"]]
    return table(["images", "holds them", "peak MiB added", "held MiB"], rows, "rlrr")


@renders("chaos", "main")
def chaos_main(r, arg=None):
    """Per fault injected into the first run on `arg` processes: whom it hit, where, how long until the job trained
    again, the steps recomputed and the checkpoints written since the fault before."""
    run = need(r, "by_processes")[arg or "2"]["runs"][0]
    rows = [[record["fault"], record["rank"], record["at_step"], record["resumed_from_step"],
             record["steps_recomputed"], f"{record['seconds_to_training']:.1f}",
             len(record["saves_since_last_fault"]), f"{record['bytes_written'] / 2**20:.1f}"]
            for record in run["faults"]]
    header = ["fault", "process", "at step", "resumed from step", "steps recomputed", "s to training again",
              "checkpoints written", "MiB written"]
    return table(header, rows, "lrrrrrrr")


@renders("chaos", "summary")
def chaos_summary(r, arg=None):
    """Per process count and fault kind, over every faulty run: the faults injected, the median and largest seconds
    until the job trained again, the median steps recomputed; and the runs whose final weights equal, bit for bit,
    those of a run that never stopped nor saved."""
    rows = []
    for processes, result in need(r, "by_processes").items():
        identical = f"{result['bit_identical_runs']} of {len(result['runs'])}"
        for index, row in enumerate(result["summary"]):
            rows.append([processes if index == 0 else "", row["fault"], row["count"],
                         f"{row['median_seconds_to_training']:.1f}", f"{row['max_seconds_to_training']:.1f}",
                         f"{row['median_steps_recomputed']:g}", identical if index == 0 else ""])
    header = ["processes", "fault", "faults", "median s to training again", "max s", "median steps recomputed",
              "runs bit-identical"]
    return table(header, rows, "rlrrrrr")


@renders("checkpoint_cost", "main")
def checkpoint_cost_main(r, arg=None):
    """Per way of saving (medians over the repeats): the run's wall time, the time inside each save, the extra wall
    time per save against not saving, a checkpoint's size and its stage files', and whether the final weights are
    those of the run that never saved."""
    rows = []
    for way, row in need(r, "ways").items():
        saving = row["saves"] > 0
        rows.append([way, f"{row['wall_s']:.2f}", row["saves"], ms(row["seconds_per_save"]) if saving else "-",
                     ms(row["extra_s_per_save"]) if saving else "-",
                     mib(row["checkpoint_bytes"]) if saving else "-", mib(row["stage_file_bytes"]) if saving else "-",
                     "yes" if row["bit_identical_to_no_saves"] else "no"])
    header = ["checkpoints", "wall s", "saves", "ms in each save", "extra ms per save", "MiB each",
              "MiB of stage files", "weights of the run that never saved"]
    return table(header, rows, "lrrrrrrl")
