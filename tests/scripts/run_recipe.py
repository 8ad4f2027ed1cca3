"""Run under `accelerate launch`: the recipe, then rank 0 records what the trained model computes."""

import json
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed as dist

recipe = runpy.run_path(str(Path(__file__).resolve().parents[2] / "recipes" / "train_revnet.py"))
trainer, metrics = recipe["run"](sys.argv[1:])
rank, world = dist.get_rank(), dist.get_world_size()
out = Path(trainer.args.output_dir)
report = {
    "rank": rank,
    "world_size": world,
    "local_stages": list(trainer.pipeline.local),
    "backwards": {str(i): c.backwards for i, c in trainer.pipeline.counters().items()},
    "metrics": metrics,
}
(out / f"rank{rank}.json").write_text(json.dumps(report))
if rank == 0:
    torch.manual_seed(0)
    images = torch.randn(4, 3, 16, 16)
    model = trainer.model.eval()
    torch.save({"images": images, "logits": model(images).logits.detach()}, out / "expected_logits.pt")
