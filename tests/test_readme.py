"""The README's Quick start runs as written, and its Trainer snippet reaches a sensible accuracy."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def quick_start_code() -> str:
    text = README.read_text()
    section = text[text.index("## Quick start") : text.index("## API")]
    return "\n".join(re.findall(r"```python\n(.*?)```", section, flags=re.S))


def test_quick_start_snippets_run_as_written(tmp_path):
    """Twice in a row in the same folder: the second run trains into outputs/quick-start again, as transformers'
    Trainer does (it replaces the first run's outputs)."""
    for attempt in ("first", "second"):
        result = subprocess.run(
            [sys.executable, "-c", quick_start_code()], cwd=tmp_path, capture_output=True, text=True, timeout=300,
            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
        )
        assert result.returncode == 0, (attempt, result.stderr[-3000:])
        accuracy = float(result.stdout.strip().splitlines()[-1])
        assert accuracy > 0.8, attempt
        assert (tmp_path / "outputs" / "quick-start" / "model.safetensors").is_file()
