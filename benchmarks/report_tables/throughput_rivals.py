"""Tables of benchmarks/throughput.py that set PETRA against torch's pipeline schedules at equal memory (its
rivals, benchmarks/rivals.py)."""

from __future__ import annotations

from .base import mib, ms, need, renders, summary, table
from .throughput import (
    CHECKPOINTING,
    NOT_MEASURED,
    figures,
    grouping_label,
    multi_process,
    petra_groupings,
    rival_peak,
    rival_records,
)

ENGINE_ROWS = {
    "petra": "PETRA (`mode=\"petra\"`, k = 1), steady state",
    "reversible_backprop": "naive MP: engine `reversible_backprop`",
    "backprop": "naive MP: engine `backprop`",
}


def engine_rows(r) -> dict[str, str]:
    """ENGINE_ROWS with PETRA's grouped settings after PETRA."""
    grouped = {name: grouping_label(grouping) for name, grouping in petra_groupings(r).items()}
    return {"petra": ENGINE_ROWS["petra"], **grouped} | ENGINE_ROWS


EQUAL_MEMORY = 1.02  # a simulated peak is an estimate: a rival 2% above PETRA's counts as within its memory


def fastest(candidates: list[tuple], seconds: float, peak_column: bool = True) -> list[str]:
    """Table cells for the fastest of `candidates` = [(label, peak bytes, seconds, checkpointed), ...]: its label,
    peak (unless not `peak_column`), time and how much slower it is than `seconds` (PETRA's); "none" if empty."""
    if not candidates:
        return ["none"] + ["-"] * (3 if peak_column else 2)
    label, peak, theirs, _ = min(candidates, key=lambda rival: rival[2])
    return [label, *([mib(peak)] if peak_column else []), ms(theirs), f"**{theirs / seconds:.2f}x**"]


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


@renders("throughput", "chunks")
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


@renders("throughput", "rivals")
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


@renders("throughput", "equal-memory")
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


@renders("throughput", "goals")
def throughput_goals(r, arg=None):
    """The goals at equal memory, measured: at every memory level (each setting's largest-rank peak), the
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


@renders("throughput", "petra-settings")
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
