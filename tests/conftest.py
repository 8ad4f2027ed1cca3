import os
import sys
from pathlib import Path

# Read at import time by huggingface_hub / datasets: set before anything imports them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models: one thread is fastest, deterministic, and immune to oversubscription when other work shares the cores.
torch.set_num_threads(1)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def revmlp():
    """The example model family of examples/revmlp/ (a package outside petra_hub), imported as a user would."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import revmlp

        yield revmlp
    finally:
        sys.path.remove(str(EXAMPLES))
