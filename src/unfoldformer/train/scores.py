"""Per-class precision, recall and F1, their macro averages, and the confusion matrix of a classifier.

`confusion_matrix(labels, predictions, n_classes)` counts (true class, predicted class) pairs;
`class_scores(confusion, label_names)` turns the counts into scores. No files, no figures (the command
line prints and draws them: `cli/evaluate.py`, `train/figures.plot_confusion`).

For class c with tp = C[c, c], fp = Σ_{r≠c} C[r, c] (predicted c, truly another), fn = Σ_{p≠c} C[c, p]:

    precision = tp / (tp + fp),   recall = tp / (tp + fn),   F1 = 2 tp / (2 tp + fp + fn)

(F1 is the harmonic mean of precision and recall, written with counts so it needs one division).
Undefined values are reported as 0, never NaN (JSON has no NaN), and named: a class never predicted has
no precision (0/0), a class absent from the data has no recall (0/0), and a class with neither has no
F1. Each such class is listed under `undefined`. The macro averages are the plain means over the
classes that occur in the data (support > 0): a class the evaluated file lacks is shown with its row
but does not pull the averages down. This is scikit-learn's `precision_recall_fscore_support` with
`labels` = the classes present, `average="macro"` and `zero_division=0`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["class_scores", "confusion_matrix"]


def confusion_matrix(labels: Sequence[int], predictions: Sequence[int], n_classes: int) -> np.ndarray:
    """(K, K) int64 counts: entry [t, p] is the number of examples of true class t predicted as p."""
    labels, predictions = np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)   # (N,)
    if labels.shape != predictions.shape:
        raise ValueError(f"{labels.shape[0]} labels but {predictions.shape[0]} predictions")
    outside = (labels < 0) | (labels >= n_classes) | (predictions < 0) | (predictions >= n_classes)
    if outside.any():
        row = int(np.flatnonzero(outside)[0])
        raise ValueError(f"example {row}: class {labels[row]} predicted as {predictions[row]}, outside 0 … "
                         f"{n_classes - 1}")
    counts = np.bincount(labels * n_classes + predictions, minlength=n_classes * n_classes)   # (K·K,)
    return counts.reshape(n_classes, n_classes)


def _ratio(num: int, den: int) -> float:
    return num / den if den else 0.0


def class_scores(confusion, label_names: Sequence[str]) -> dict:
    """Scores of a (K, K) confusion matrix of counts (rows: true class, columns: predicted class).

    Returns `classes` (one dict per class, in class order: `label`, `precision`, `recall`, `f1`,
    `support` = true examples, `predicted` = examples predicted as it), `macro` (means over the classes
    present, with their number `classes`), `accuracy`, `n`, `confusion` (the counts as nested lists) and
    `undefined` (`precision`: classes never predicted; `recall`: classes absent from the data; `f1`:
    both), whose scores are reported as 0 (module doc)."""
    counts = np.asarray(confusion, dtype=np.int64)                                   # (K, K)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1] or counts.shape[0] != len(label_names):
        raise ValueError(f"a confusion matrix of shape {counts.shape} for {len(label_names)} label names")
    if (counts < 0).any():
        raise ValueError("a confusion matrix holds counts; found a negative entry")
    tp = np.diag(counts)                                                             # (K,)
    support, predicted = counts.sum(1), counts.sum(0)                                # (K,) true, predicted
    classes, undefined = [], {"precision": [], "recall": [], "f1": []}
    for c, name in enumerate(label_names):
        t, s, p = int(tp[c]), int(support[c]), int(predicted[c])
        fp, fn = p - t, s - t
        classes.append({"label": str(name), "precision": _ratio(t, p), "recall": _ratio(t, s),
                        "f1": _ratio(2 * t, 2 * t + fp + fn), "support": s, "predicted": p})
        for key, den in (("precision", p), ("recall", s), ("f1", 2 * t + fp + fn)):
            if den == 0:
                undefined[key].append(str(name))
    present = [row for row in classes if row["support"] > 0]
    macro = {key: float(np.mean([row[key] for row in present])) if present else 0.0
             for key in ("precision", "recall", "f1")}
    n = int(counts.sum())
    return {"classes": classes, "macro": {**macro, "classes": len(present)}, "accuracy": _ratio(int(tp.sum()), n),
            "n": n, "confusion": counts.tolist(), "undefined": undefined}
