"""Figures of a run folder: `loss.png`, `accuracy.png` and (energy models) `energy.png`.

`plot_run(RUN)` reads the folder's `metrics.csv` (per-step and evaluation rows, `train.watch`) and
writes, each atomically:

- `loss.png`: the per-step training loss (mean over each `run.log_every` window) and, at each
  evaluation, the training loss since the previous one and the evaluation loss;
- `accuracy.png`: the evaluation accuracy at each evaluation;
- `energy.png` (unfolded models): the mean per-token energies E(Y⁽⁰⁾)/n and E(Y⁽ᵀ⁾)/n of the logged
  training batches, and the share of their samples whose energy curve never rises.

Training calls it at the end (`run.plots`); `unfoldformer plot RUN` calls it on any run folder.
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..errors import UnfoldformerError
from ..plots import pyplot, save_figure

__all__ = ["FIGURES", "plot_run"]

FIGURES = ("loss.png", "accuracy.png", "energy.png")


def _read(folder: Path) -> tuple[list[dict], list[dict]]:
    path = folder / "metrics.csv"
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as exc:
        raise UnfoldformerError(f"{path}: cannot read it ({exc.strerror or exc}); is {folder} a run folder?") from None
    if not rows or "row" not in rows[0]:
        raise UnfoldformerError(f"{path}: no per-step rows (written by an older version, or the run has not "
                                "logged a step yet)")
    num = lambda r, k: float(r[k]) if r.get(k) not in (None, "") else None     # noqa: E731
    parsed = [{k: (r[k] if k == "row" else num(r, k)) for k in r if k not in ("run_id",)} for r in rows]
    return [r for r in parsed if r["row"] == "step"], [r for r in parsed if r["row"] == "eval"]


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_run(folder: str | Path) -> list[Path]:
    """Write the run's figures into `folder`; returns the paths written."""
    folder = Path(folder)
    steps, evals = _read(folder)
    plt, written = pyplot(), []
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(*_series(steps, "loss"), lw=1, label=f"training loss (per {_window(steps)} steps)")
    ax.plot(*_series(evals, "train_loss"), "o-", label="training loss since the last evaluation")
    ax.plot(*_series(evals, "eval_loss"), "s-", label="evaluation loss")
    ax.set(xlabel="step", ylabel="cross-entropy", title="Loss")
    ax.legend(fontsize=8)
    written.append(_save(fig, folder / "loss.png"))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(*_series(evals, "eval_accuracy"), "o-")
    ax.set(xlabel="step", ylabel="accuracy", title="Evaluation accuracy", ylim=(0, 1))
    written.append(_save(fig, folder / "accuracy.png"))
    if any(r.get("energy_per_token_last") is not None for r in steps):
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 6.0), sharex=True)
        top.plot(*_series(steps, "energy_per_token_first"), label="E(Y⁽⁰⁾)/n (input)")
        top.plot(*_series(steps, "energy_per_token_last"), label="E(Y⁽ᵀ⁾)/n (last layer)")
        top.set(ylabel="energy per token", title="Energy of the training batches")
        top.legend(fontsize=8)
        bottom.plot(*_series(steps, "never_rising_share"), color="C2")
        bottom.set(xlabel="step", ylabel="share of samples", ylim=(-0.02, 1.02),
                   title="Energy curve never rises (beyond round-off)")
        written.append(_save(fig, folder / "energy.png"))
    return written


def _window(steps: list[dict]) -> int:
    return int(steps[1]["step"] - steps[0]["step"]) if len(steps) > 1 else 1


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    save_figure(fig, path)
    return path
