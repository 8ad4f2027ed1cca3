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


# End-to-end runs of the benchmark scripts' quick modes (`@pytest.mark.benchmark_run`) take minutes together: they are
# left out of the default run, which must stay under ten minutes on two cores, and run with `--run-benchmarks`
# (the CI script runs them after the suite).
def pytest_addoption(parser):
    parser.addoption("--run-benchmarks", action="store_true",
                     help="also run the benchmark scripts end to end (tests marked benchmark_run)")


def pytest_configure(config):
    config.addinivalue_line("markers", "benchmark_run: runs a benchmark script end to end (needs --run-benchmarks)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-benchmarks"):
        return
    skip = pytest.mark.skip(reason="a benchmark script run end to end: pass --run-benchmarks")
    for item in items:
        if "benchmark_run" in item.keywords:
            item.add_marker(skip)
