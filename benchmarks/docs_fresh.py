"""The fresh-task table (`make_docs.py` block `fresh`) from benchmarks/results/fresh/*.json (`fresh_tasks.py`)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from docs_common import md

__all__ = ["fresh", "fresh_before_prior"]

TASK_ORDER = ("digits", "keywords", "listops", "imdb8")
MODEL_ORDER = ("standard", "joint-tied", "joint-untied", "alternating-tied")


def _cells(results: Path, folder: str = "fresh") -> dict[tuple[str, str, float], list[dict]]:
    cells: dict[tuple[str, str, float], list[dict]] = {}
    for path in sorted((results / folder).glob("*.json")):
        r = json.loads(path.read_text())
        cells.setdefault((r["task"], r["model"], r["lr"]), []).append(r)
    return cells


def _mean(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [v * scale for v in values if v is not None]
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def fresh_before_prior(results: Path) -> str:
    """The certified cells as run before the `certified` preset took a position prior (theory §4e), kept in
    benchmarks/results/fresh/before-position-prior/: the same table."""
    return fresh(results, "fresh/before-position-prior")


def fresh(results: Path, folder: str = "fresh") -> str:
    """One row per task, model and learning rate that was run: accuracy (%, mean ± sd over seeds), final training
    loss, parameters, training step time; `default` marks the task's default learning rate."""
    rows = []
    cells = _cells(results, folder)
    key = lambda k: (TASK_ORDER.index(k[0]) if k[0] in TASK_ORDER else 99,   # noqa: E731
                     MODEL_ORDER.index(k[1]) if k[1] in MODEL_ORDER else 99, k[2])
    for task, model, lr in sorted(cells, key=key):
        runs = cells[(task, model, lr)]
        lr_text = f"{lr:g}" + (" (default)" if runs[0].get("default_lr") else "")
        rows.append([task, model, lr_text, ", ".join(str(r["seed"]) for r in sorted(runs, key=lambda r: r["seed"])),
                     _mean([r["accuracy"] for r in runs], 100), _mean([r["train_loss"] for r in runs], 1, 3),
                     f"{runs[0]['params']:,}" if runs[0].get("params") else "—",
                     _mean([r["step_ms"] for r in runs], 1, 0)])
    return md(["task", "model", "lr", "seeds", "accuracy %", "train loss", "parameters", "step ms"], rows)
