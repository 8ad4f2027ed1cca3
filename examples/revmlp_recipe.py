"""petra_hub's recipe for a model family of your own: import the package that registers it, then run the recipe.

    OMP_NUM_THREADS=1 accelerate launch --config_file accelerate_config.yaml --num_processes 2 \
        examples/revmlp_recipe.py --model revmlp-small --output_dir outputs/revmlp-digits-petra

Every flag of `recipes/train_revnet.py` applies (`--help` lists them); `--model` now also knows the RevMLP presets."""

import revmlp  # noqa: F401  (registers the RevMLP family)
from petra_hub.recipe import main

if __name__ == "__main__":
    main()
