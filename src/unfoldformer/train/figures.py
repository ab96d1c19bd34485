"""Figures of a run folder: `loss.png`, `accuracy.png` and (energy models) `energy.png`.

`plot_run(RUN)` reads the folder's `metrics.csv` (per-step and evaluation rows, `train.watch`) and
writes, each atomically:

- `loss.png`: the per-step training loss (mean over each `run.log_every` window) and, at each
  evaluation, the training loss since the previous one and the evaluation loss;
- `accuracy.png`: the evaluation accuracy at each evaluation;
- `energy.png` (unfolded models): the mean per-token energies E(Y⁽⁰⁾)/n and E(Y⁽ᵀ⁾)/n of the logged
  training batches, and the share of their samples whose energy never rises (tied: the curve of the one
  energy E; untied: every layer lowers its own E_ℓ — one energy per layer, not one curve).

Training calls it at the end (`run.plots`); `unfoldformer plot RUN` calls it on any run folder.

`plot_confusion(scores, path)` draws an evaluation's confusion matrix (`scores.class_scores`: rows the
true class, columns the predicted one, shaded by the share of the row, counts written in the cells up to
20 classes) beside each class's precision, recall and F1; `unfoldformer evaluate --output` calls it.
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from ..errors import UnfoldformerError
from ..plots import pyplot, save_figure

__all__ = ["FIGURES", "plot_confusion", "plot_run"]

FIGURES = ("loss.png", "accuracy.png", "energy.png")


def _read(folder: Path) -> tuple[list[dict], list[dict]]:
    path = folder / "metrics.csv"
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.DictReader(handle, strict=True))
    except OSError as exc:
        raise UnfoldformerError(f"{path}: cannot read it ({exc.strerror or exc}); is {folder} a run folder?") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise UnfoldformerError(f"{path}: damaged ({str(exc).splitlines()[0]}); re-run training or restore it") \
            from None
    if not rows or "row" not in rows[0]:
        raise UnfoldformerError(f"{path}: no per-step rows (written by an older version, or the run has not "
                                "logged a step yet)")
    if "step" not in rows[0]:
        raise UnfoldformerError(f"{path}: damaged (no 'step' column); re-run training or restore it")
    parsed = [_parsed(path, number, r) for number, r in enumerate(rows, 1)]
    return [r for r in parsed if r["row"] == "step"], [r for r in parsed if r["row"] == "eval"]


def _parsed(path: Path, number: int, row: dict) -> dict:
    """One metrics.csv row with its numbers as floats; UnfoldformerError naming the row for a damaged one."""
    if None in row or None in row.values():
        raise UnfoldformerError(f"{path}, row {number}: damaged (its number of fields differs from the header's)")
    out = {"row": row["row"]}
    for key, text in row.items():
        if key in ("row", "run_id"):
            continue
        try:
            out[key] = float(text) if text != "" else None
        except ValueError:
            raise UnfoldformerError(f"{path}, row {number}, column {key!r}: {text[:40]!r} is not a number "
                                    "(the file is damaged)") from None
    if out.get("step") is None:
        raise UnfoldformerError(f"{path}, row {number}: damaged (no step)")
    return out


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
                   title="Energy never rises, beyond round-off (tied: the curve; untied: each layer its E_ℓ)")
        written.append(_save(fig, folder / "energy.png"))
    return written


def _window(steps: list[dict]) -> int:
    return int(steps[1]["step"] - steps[0]["step"]) if len(steps) > 1 else 1


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    save_figure(fig, path)
    return path


def plot_confusion(scores: dict, path: str | Path, title: str = "", max_annotated: int = 20) -> Path:
    """Write the confusion matrix and per-class scores of `scores` (`class_scores`' keys) to `path`."""
    names = [row["label"] for row in scores["classes"]]
    counts = np.asarray(scores["confusion"], dtype=np.int64)                        # (K, K) [true, predicted]
    share = counts / np.maximum(counts.sum(1, keepdims=True), 1)                    # (K, K) share of each row
    k = len(names)
    side = min(max(0.45 * k + 2.0, 4.0), 16.0)
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(2 * side + 1.5, side), width_ratios=(1.15, 1))
    image = left.imshow(share, cmap="Blues", vmin=0, vmax=1)
    fig.colorbar(image, ax=left, fraction=0.046, pad=0.04, label="share of the true class")
    if k <= max_annotated:
        for t in range(k):
            for p in range(k):
                left.text(p, t, str(counts[t, p]), ha="center", va="center", fontsize=8,
                          color="white" if share[t, p] > 0.5 else "black")
    ticks = range(k) if k <= 50 else []
    left.set_xticks(ticks, [names[i] for i in ticks], rotation=45, ha="right", fontsize=8)
    left.set_yticks(ticks, [names[i] for i in ticks], fontsize=8)
    left.set(xlabel="predicted class", ylabel="true class",
             title=f"Confusion matrix\nn = {scores['n']}, accuracy {scores['accuracy']:.3f}")
    rows = np.arange(k)
    for offset, key in zip((-0.27, 0.0, 0.27), ("precision", "recall", "f1")):
        right.barh(rows + offset, [row[key] for row in scores["classes"]], height=0.27, label=key)
    right.set_yticks(ticks, [names[i] for i in ticks], fontsize=8)
    right.set(xlim=(0, 1), ylim=(k - 0.5, -0.5), xlabel="score",
              title=f"Per class\nmacro F1 {scores['macro']['f1']:.3f} over the {scores['macro']['classes']} "
                    "classes present")
    right.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, Path(path))
