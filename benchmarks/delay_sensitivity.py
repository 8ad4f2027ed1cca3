"""How much a stale gradient alone slows a model down, without the engine: plain autograd with a uniform delay.

    python benchmarks/delay_sensitivity.py            # RevViT and RevNet18 on digits, delays 0 1 2 6 (~4 min)
    python benchmarks/delay_sensitivity.py --quick    # fewer steps (~40 s): delay_sensitivity-quick.json

Every step t applies the gradient of micro-batch t - d computed at the weights of step t - d (a deep copy of the
model kept for d steps), with Adam; d = 0 is plain backprop. This is the delayed gradient of the paper's delayed
baseline with the same delay at every stage (PETRA's stage j waits 2(J - 1 - j) micro-batches), written here without
petra_hub's engine, so it tells whether a model's slow PETRA training comes from the delay itself. Reported: the
training loss averaged over the last quarter of the steps and the test accuracy after them. Tables:
docs/benchmarks-accuracy.md (`python benchmarks/report.py`).
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common import add_out_argument, progress, results_path, write_results  # noqa: E402
from petra_hub import RevNetConfig, RevNetForImageClassification, RevViTConfig, RevViTForImageClassification  # noqa: E402
from petra_hub.data import load_image_dataset  # noqa: E402

MODELS = {  # small enough for CPU; the RevNet at the recipe's widths, the RevViT at the recipe's depth and patches
    "revvit": lambda: RevViTForImageClassification(RevViTConfig.from_preset(
        "revvit-tiny", image_size=16, patch_size=4, hidden_size=48, num_hidden_layers=2, num_labels=10)),
    "revnet18": lambda: RevNetForImageClassification(RevNetConfig.from_preset(
        "revnet18", stem="cifar", hidden_sizes=[16, 32, 64, 128], embedding_size=16, num_labels=10)),
}


def digits(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_image_dataset("digits", split, augment=False)  # normalised 16x16 images, as the recipe sees them
    items = [data[index] for index in range(len(data))]
    return torch.stack([item["pixel_values"] for item in items]), torch.tensor([item["labels"] for item in items])


def recalibrate(model: torch.nn.Module, images: torch.Tensor) -> None:
    """Batch-norm running statistics from the training images at the final weights (the forwards ran on the stale
    copies, so the model's own were never updated), then eval mode."""
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.reset_running_stats()
            module.momentum = None  # a cumulative average over the passes below
    model.train()
    with torch.no_grad():
        for chunk in images.split(256):
            model(pixel_values=chunk)
    model.eval()


def train(name: str, delay: int, steps: int, lr: float, train_set, test_set, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = MODELS[name]()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    images, labels = train_set
    generator = torch.Generator().manual_seed(seed)
    waiting, losses = [], []
    for _ in range(steps + delay):
        batch = torch.randint(0, len(labels), (32,), generator=generator)
        waiting.append((copy.deepcopy(model), batch))
        if len(waiting) <= delay:
            continue
        stale, batch = waiting.pop(0)
        loss = F.cross_entropy(stale(pixel_values=images[batch]).logits, labels[batch])
        loss.backward()
        for param, old in zip(model.parameters(), stale.parameters()):
            param.grad = old.grad
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    recalibrate(model, images)
    with torch.no_grad():
        accuracy = float((model(pixel_values=test_set[0]).logits.argmax(-1) == test_set[1]).float().mean())
    tail = losses[-max(1, steps // 4):]
    return {"model": name, "delay": delay, "steps": steps, "lr": lr, "final_loss": sum(tail) / len(tail),
            "test_accuracy": accuracy}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", type=int, nargs="+", default=[0, 1, 2, 6])
    parser.add_argument("--steps", type=int, default=None, help="Adam steps (default 300; quick: 60)")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--quick", action="store_true")
    add_out_argument(parser, "delay_sensitivity")
    args = parser.parse_args(argv)
    steps = args.steps or (60 if args.quick else 300)
    torch.set_num_threads(1)
    train_set, test_set = digits("train"), digits("test")
    rows = []
    for name in MODELS:
        for delay in args.delays:
            rows.append(train(name, delay, steps, args.lr, train_set, test_set))
            progress(f"{name} delay {delay}: loss {rows[-1]['final_loss']:.3f}, test accuracy "
                     f"{100 * rows[-1]['test_accuracy']:.2f} %")
    return write_results(results_path(args.out, "delay_sensitivity", args.quick), "delay_sensitivity",
                         "delay_sensitivity.py", argv, {"delays": args.delays, "steps": steps, "lr": args.lr},
                         rows=rows)


if __name__ == "__main__":
    main()
