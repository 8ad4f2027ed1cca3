"""Run under `accelerate launch`: the recipe, then each rank records what it saw and rank 0 what the trained model
computes. With RECIPE_PREPARE_ONLY=1 the ranks only build the run (data, seeded model, trainer) and record the
initial weights."""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from recipe_report import weights_digest  # next to this script

from petra_hub.recipe import train as recipe


prepared = recipe.prepare(sys.argv[1:])
trainer = prepared.trainer
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(trainer.args.output_dir)
out.mkdir(parents=True, exist_ok=True)
report = {"rank": rank, "world_size": world, "initial_weights": weights_digest(trainer.model)}
if os.environ.get("RECIPE_PREPARE_ONLY") != "1":
    metrics = recipe.execute(prepared)
    report.update(
        local_stages=list(trainer.pipeline.local),
        backwards={str(i): c.backwards for i, c in trainer.pipeline.counters().items()},
        metrics=metrics,
    )
    if rank == 0:
        torch.manual_seed(0)
        images = torch.randn(4, 3, 16, 16)
        model = trainer.model.eval()
        torch.save({"images": images, "logits": model(images).logits.detach()}, out / "expected_logits.pt")
(out / f"rank{rank}.json").write_text(json.dumps(report))
dist.barrier()
