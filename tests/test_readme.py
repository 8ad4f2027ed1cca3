"""The README stays short, and its Quick start runs as written: its Trainer snippet reaches a sensible accuracy."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
MAX_WORDS = 2000


def quick_start_code() -> str:
    text = README.read_text()
    start = text.index("## Quick start")
    section = text[start : text.index("\n## ", start)]
    return "\n".join(re.findall(r"```python\n(.*?)```", section, flags=re.S))


def test_quick_start_snippets_run_as_written(tmp_path):
    """(A second run into the same output_dir replaces the first: tests/training/test_overwrite_default.py.)"""
    result = subprocess.run(
        [sys.executable, "-c", quick_start_code()], cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(result.stdout.strip().splitlines()[-1])
    assert accuracy > 0.8
    assert (tmp_path / "outputs" / "quick-start" / "model.safetensors").is_file()


def test_the_readme_is_short():
    """The front page is an introduction; the reference lives in docs/. Counted as `wc -w` counts."""
    words = len(README.read_text().split())
    assert words <= MAX_WORDS, f"README.md has {words} words; move detail to docs/"


def test_the_readme_links_only_to_pages_that_exist():
    text = README.read_text()
    for target in re.findall(r"\]\(((?:docs|examples|recipes)/[^)#]+)", text):
        assert (README.parent / target).exists(), target
