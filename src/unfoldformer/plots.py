"""Figure helpers shared by the applications (`paper`, `probe`): a headless pyplot, box statistics.

Library modules never plot; these helpers serve the application sub-packages only.
"""
from __future__ import annotations

import numpy as np

__all__ = ["box_stats", "lowest_whisker", "pyplot", "save_figure"]


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend (no window, works without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def box_stats(values) -> dict:
    """Box-plot statistics of one sample (matplotlib's `boxplot_stats`: 1.5·IQR whiskers, mean, fliers)."""
    from matplotlib.cbook import boxplot_stats

    return boxplot_stats(np.asarray(values, dtype=np.float64))[0]


def lowest_whisker(values: np.ndarray) -> float:
    """The lowest lower whisker over the columns of (N, T) (the shift of the paper's figures 5–6)."""
    return float(min(box_stats(values[:, t])["whislo"] for t in range(values.shape[1])))


def save_figure(fig, path, dpi: int = 120, **options) -> None:
    """Save `fig` to `path` atomically (a temporary file renamed into place) and close it."""
    import io
    from pathlib import Path

    from .utils import atomic_write_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", dpi=dpi, **options)
    atomic_write_bytes(path, buffer.getvalue())
    pyplot().close(fig)
