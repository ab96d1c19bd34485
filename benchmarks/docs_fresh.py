"""The fresh-task table (`make_docs.py` block `fresh`) from benchmarks/results/fresh/*.json (`fresh_tasks.py`)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

from docs_common import md

__all__ = ["fresh", "fresh_before_prior", "fresh_paired", "fresh_paired_more_seeds", "fresh_tied_control"]

TASK_ORDER = ("digits", "keywords", "listops", "imdb8")
MODEL_ORDER = ("standard", "joint-tied", "joint-untied", "alternating-tied")


def _cells(results: Path, folder: str = "fresh", *more: str) -> dict[tuple[str, str, float], list[dict]]:
    cells: dict[tuple[str, str, float], list[dict]] = {}
    for path in sorted(p for f in (folder, *more) for p in (results / f).glob("*.json")):
        r = json.loads(path.read_text())
        if "task" not in r:                                         # not a cell (diagnosis/listops-baselines.json)
            continue
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


def fresh_paired_more_seeds(results: Path) -> str:
    """`fresh_paired` over seeds 0–4: the suite's cells and the extra seeds in
    benchmarks/results/fresh/listops-more-seeds/ (not part of the issue's 3-seed targets)."""
    return fresh_paired(results, ("fresh", "fresh/listops-more-seeds"))


def fresh_paired(results: Path, folders: tuple[str, ...] = ("fresh",), base_model: str = "standard",
                 base_folders: tuple[str, ...] | None = None, models: tuple[str, ...] = MODEL_ORDER[1:]) -> str:
    """Each of `models` against `base_model` (its cells read from `base_folders`, default `folders`) on the same test
    examples, seed by seed, at the task's default learning rate (cells that record each example's correctness,
    `correct`; cells with `ModelConfig` overrides are diagnosis runs and skipped): the accuracy difference in points
    ± its paired standard error over the test examples, √((b + c) − (b − c)²/N)/N with b, c the examples only one
    model gets right; then the mean difference over seeds ± its standard error over seeds (sd/√seeds)."""
    cells, rows = _cells(results, *folders), []
    base_cells = cells if base_folders is None else _cells(results, *base_folders)
    plain = lambda r: r.get("default_lr") and "correct" in r and not r.get("overrides")   # noqa: E731
    for task in TASK_ORDER:
        base = {r["seed"]: r["correct"] for (t, m, _), runs in base_cells.items() if t == task and m == base_model
                for r in runs if plain(r)}
        for model in models:
            runs = sorted((r for (t, m, _), rs in cells.items() if t == task and m == model for r in rs
                           if plain(r) and r["seed"] in base), key=lambda r: r["seed"])
            if not runs:
                continue
            diffs, texts = [], []
            for r in runs:
                ref, own = base[r["seed"]], r["correct"]
                b = sum(x == "1" and y == "0" for x, y in zip(own, ref))     # only `model` right
                c = sum(x == "0" and y == "1" for x, y in zip(own, ref))     # only `base_model` right
                n = len(own)
                diffs.append(100 * (b - c) / n)
                texts.append(f"{r['seed']}: {diffs[-1]:+.1f} ± {100 * ((b + c) - (b - c) ** 2 / n) ** 0.5 / n:.1f}")
            spread = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
            label = model if base_model == "standard" else f"{model} − {base_model}"
            rows.append([task, label, f"{len(runs[0]['correct']):,}", "; ".join(texts),
                         f"{statistics.mean(diffs):+.1f} ± {spread:.1f}"])
    return md(["task", "model", "test examples", "seed: difference ± paired SE (points)",
               "mean over seeds ± SE"], rows)


def fresh_tied_control(results: Path) -> str:
    """`fresh_paired` against the `standard-tied` control (one `nn.TransformerEncoderLayer` applied `depth` times,
    benchmarks/results/fresh/diagnosis/): the tied certified model and the untied `standard`, seeds 0–4."""
    return fresh_paired(results, ("fresh", "fresh/listops-more-seeds"), base_model="standard-tied",
                        base_folders=("fresh/diagnosis",), models=("joint-tied", "standard"))

