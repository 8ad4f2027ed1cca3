"""Tables of benchmarks/simulator.py (the simulator against measured runs) and benchmarks/predict.py (its
predictions for many devices, PETRA against torch's schedules at equal memory)."""

from __future__ import annotations

import statistics

from .base import mib, ms, need, renders, table
from .throughput import NOT_MEASURED, groups_spec
from .throughput_rivals import EQUAL_MEMORY, fastest, worst_ratio_at_equal_memory


def split_label(row: dict) -> str:
    """A simulator row's stages per rank: "4,6", or the engine stages' groups "1,2/7" ("4k/6": keeping its graph)."""
    groups, partition = row.get("groups"), row["partition"]
    return groups_spec(groups, partition, row.get("kept", [])) if groups else ",".join(map(str, partition))


@renders("simulator", "main")
def simulator_main(r, arg=None):
    """Measured against predicted time per micro-batch, per mode and partition, with the automatic partition; for
    runs that traced their windows, how much slower the operations ran than profiled, and the prediction from the
    run's own operation times (which leaves the simulator only the schedule and the link to get right)."""
    traced = all("error_from_run" in row for row in need(r, "rows"))  # newer runs
    overlapped = not traced and all("error_overlapped" in row for row in r["rows"])  # torch's schedules' runs

    def spread(key: str) -> str:
        errors = sorted(abs(row[key]) for row in r["rows"])
        return f"median {100 * statistics.median(errors):.1f}%, max {100 * errors[-1]:.1f}%"

    def operations(row: dict) -> str:
        return " / ".join(f"{run / profiled:.2f}"
                          for run, profiled in zip(row["measured_operations_s"], row["profiled_operations_s"]))

    rows = []
    for row in r["rows"]:
        auto = r.get("auto_partition", {}).get(row["mode"])
        mode = f"{row['mode']}, m = {row['m']}" if "m" in row else row["mode"]
        rows.append([mode, split_label(row), ms(row["measured_s"]), ms(row["predicted_s"]),
                     f"{100 * row['error']:+.1f}%"]
                    + ([f"{100 * row['error_overlapped']:+.1f}%"] if overlapped else [])
                    + ([operations(row), f"{100 * row['error_from_run']:+.1f}%"] if traced else [])
                    + ["yes" if auto == row["partition"] else ""])  # fmt: skip
    rows.append(["**all**", "", "", "", spread("error")] + ([spread("error_overlapped")] if overlapped else [])
                + (["", spread("error_from_run")] if traced else []) + [""])
    header = ["mode", "stages per rank", "measured ms / micro-batch", "predicted ms", "error"]
    header += ["error if transfers overlapped compute"] if overlapped else []
    header += ["operations' time, run / profile (rank 0 / 1)", "error from the run's operation times"] if traced else []
    return table(header + ["Placement.auto's choice"], rows,
                 "llrrr" + ("r" if overlapped else "") + ("rr" if traced else "") + "l")


@renders("simulator", "memory")
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


@renders("predict", "main")
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


RIVAL_CHECKPOINTING = {"none": "no checkpointing", "but_last": "checkpointed but the last chunk",
                       "all": "checkpointed"}


@renders("predict", "rivals")
def predict_rivals(r, arg=None):
    """PREDICTED: each PETRA setting against torch's schedules (simulated; results before `simulate_schedule` hold
    `Schedule1F1B` alone) on one link (`arg`, default PCIe): the fastest setting within PETRA's peak memory per
    device (+2%), the fastest checkpointed one and the fastest of all; a rival's peak is what its schedule needs."""
    return rivals_at_equal_memory(r, arg or "PCIe 4.0 x16", "peak_bytes")


@renders("predict", "rivals-allocated")
def predict_rivals_allocated(r, arg=None):
    """`predict_rivals` with each rival's peak as torch 2.14 allocates it (its buffers included)."""
    return rivals_at_equal_memory(r, arg or "PCIe 4.0 x16", "torch_peak_bytes")


@renders("predict", "equal-memory")
def predict_equal_memory(r, arg=None):
    """PREDICTED, the goals at equal memory: at every memory level (each setting's peak), the fastest rival
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


@renders("predict", "costs")
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
