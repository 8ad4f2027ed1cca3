"""Pictures drawn from the benchmarks' JSON files (no measuring here): memory per stage by buffer configuration.

    python benchmarks/plots.py    # docs/images/memory-stages-<model>.png from benchmarks/results/memory.json

The numbers are those of docs/benchmarks-memory.md's per-stage tables: activations held for pending backwards
(scaled to micro-batch 64, 224x224) plus stashed weights, per stage, for every buffer configuration.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from petra_hub.plots import plot_stage_memory

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("revnet18 buffered", "revnet50 buffered")


def stage_buffers(result: dict, model: str) -> tuple[dict[str, list[float]], str]:
    modes, scale = result["models"][model]["modes"], result["scale"]
    buffers = {name: [s["activation_bytes"] * scale + s["stash_bytes"] for s in mode["stages"]]
               for name, mode in modes.items()}
    layout = "".join(s["kind"] for s in next(iter(modes.values()))["stages"])
    return buffers, layout


def main(argv=None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "memory.json")
    parser.add_argument("--images", type=Path, default=ROOT / "docs" / "images")
    args = parser.parse_args(argv)
    result = json.loads(args.results.read_text())
    written = []
    for model in MODELS:
        buffers, layout = stage_buffers(result, model)
        name = model.replace(" ", "-")
        title = f"{model.replace('revnet', 'RevNet')}: buffers per stage (micro-batch 64, 224x224)"
        written.append(plot_stage_memory(buffers, layout, args.images / f"memory-stages-{name}.png", title))
        print(f"wrote {written[-1]}")
    return written


if __name__ == "__main__":
    main()
