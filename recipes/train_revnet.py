"""Train a RevNet with PETRA:
`OMP_NUM_THREADS=1 accelerate launch --config_file accelerate_config.yaml recipes/train_revnet.py`.
`--model revvit-tiny` (or `recipes/configs/digits_revvit_tiny.yaml`) trains a RevViT instead.

With no arguments: a small RevNet18 on the embedded digits data, PETRA across the launched processes, 12 epochs,
evaluation every epoch, then a Hub-ready folder (safetensors, image processor, model card) in
`outputs/revnet18-digits-petra`. A YAML/JSON file of arguments (`recipes/configs/*.yaml`) and flags combine, flags
winning: `recipes/train_revnet.py recipes/configs/cifar10_revnet18_petra.yaml --num_train_epochs 1`.
`--help` lists every argument with the recipe's defaults. The logic lives in `petra_hub.recipe`, which the
`petra-train` command runs too.
"""

from petra_hub.recipe import main, parse, run  # noqa: F401  (parse, run: for runpy.run_path users)

if __name__ == "__main__":
    main()
