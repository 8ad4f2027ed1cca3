"""What every picture shares: matplotlib without a display, and writing a figure to a PNG."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """`matplotlib.pyplot` on the Agg backend (files only), or an ImportError that says how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError('petra_hub.plots needs matplotlib: pip install -e ".[plots]"') from None
    return plt


def save(figure, path: str | Path, dpi: int = 100, rect: tuple | None = None) -> Path:
    """Lay `figure` out (within `rect`), write it to `path` (folders created) and close it."""
    figure.tight_layout(rect=rect)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    pyplot().close(figure)
    return path
