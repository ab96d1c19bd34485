"""Training you can watch: per-step rows of `metrics.csv`, a TensorBoard log, energy-curve statistics.

Every `run.log_every` steps the trainer logs one `step` row: the mean training loss of the steps since
the previous row (rank 0's examples under DDP), the learning rate and the gradient norm (before
clipping) of that step and, for unfolded (energy) models, statistics of that step's batch at the
weights that produced its loss: the share of samples whose energy curve E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾) never
rises (beyond round-off, `descent.descent_tolerance`) and the mean per-token energies E(Y⁽⁰⁾)/n and
E(Y⁽ᵀ⁾)/n (n = the sample's real tokens). Each evaluation adds an `eval` row. The rows live in the
checkpointed training state: `metrics.csv` is rewritten whole (atomically) when a run starts or
resumes, then appended row by row, so a resumed run's file holds exactly the rows of its steps.
TensorBoard (`torch.utils.tensorboard`, optional package `tensorboard`) gets the same scalars in
`out_dir/tensorboard`; a resumed run purges the log (a TensorBoard session start at step 0) and logs the
checkpoint's rows again, so the log holds exactly the rows of `metrics.csv`: every point before the
checkpoint, its own step's included, once.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import torch

from ..descent import descent_tolerance, lowered
from ..model import UnfoldedTransformer
from ..utils import atomic_write_text

__all__ = ["COLUMNS", "MetricsLog", "curve_statistics", "grad_norm"]

#: Columns of metrics.csv: `row` is "step" (per-step) or "eval" (an evaluation).
COLUMNS = ("row", "step", "epoch", "loss", "lr", "grad_norm", "never_rising_share", "energy_per_token_first",
           "energy_per_token_last", "train_loss", "eval_loss", "eval_accuracy", "eval_n", "energy_monotone_share",
           "layer_descent_share", "train_tokens", "train_time_s", "tokens_per_s", "run_id")
#: TensorBoard tag of each logged value.
TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
        "never_rising_share": "energy/never_rising_share", "energy_per_token_first": "energy/per_token_first",
        "energy_per_token_last": "energy/per_token_last", "eval_accuracy": "eval/accuracy",
        "eval_loss": "eval/loss", "train_loss": "eval/train_loss"}


def grad_norm(parameters) -> float:
    """The 2-norm of all gradients together (float64 sum of squares), read before clipping."""
    total = torch.zeros((), dtype=torch.float64)
    for p in parameters:
        if p.grad is not None:
            total += p.grad.detach().double().pow(2).sum().cpu()
    return float(total.sqrt())


@torch.no_grad()
def curve_statistics(model, ids: torch.Tensor, mask: torch.Tensor) -> dict:
    """Never-rising share and mean per-token energies of a batch (unfolded encoders; {} otherwise). A tied
    model's share is of curves that never rise; an untied model has one energy per layer, so its share is of
    samples whose every layer lowers its own E_ℓ (the reported values are not one curve)."""
    if not isinstance(model.encoder, UnfoldedTransformer):
        return {}
    _, out = model(ids, mask, return_energies=True)
    curve = out.energies                                                   # (B, T + 1) float64
    per_token = out.energies_per_token(mask)                               # (B, T + 1) float64
    tol = descent_tolerance(out.hidden.dtype)
    if model.encoder.config.tied:
        never = lowered(curve[:, :-1], curve[:, 1:], tol).all(1)                  # (B,) one energy's curve
    else:
        never = lowered(out.layer_before, out.layer_after, tol).all(1)            # (B,) each layer its own E_ℓ
    return {"never_rising_share": float(never.double().mean()),
            "energy_per_token_first": float(per_token[:, 0].mean()),
            "energy_per_token_last": float(per_token[:, -1].mean())}


def _rows(steps: list[dict], evals: list[dict]) -> list[dict]:
    """Step and eval rows in step order (a step's own row before its evaluation)."""
    both = [(r["step"], 0, {"row": "step", **r}) for r in steps] + [(r["step"], 1, {"row": "eval", **r})
                                                                     for r in evals]
    return [row for _, _, row in sorted(both, key=lambda t: (t[0], t[1]))]


def _csv(rows: list[dict], header: bool) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, COLUMNS, lineterminator="\n", extrasaction="ignore")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


class MetricsLog:
    """metrics.csv (rewritten on start, then appended) and an optional TensorBoard writer (rank 0 only)."""

    def __init__(self, out: Path, tensorboard: bool, start_step: int, note=print):
        self.path, self._writer = out / "metrics.csv", None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                note("TensorBoard is not installed (pip install tensorboard): no TensorBoard log")
            else:
                self._writer = SummaryWriter(str(out / "tensorboard"), purge_step=0 if start_step else None)

    def rewrite(self, steps: list[dict], evals: list[dict]) -> None:
        """metrics.csv holds exactly these rows; TensorBoard (purged when the writer opened) gets them again."""
        atomic_write_text(self.path, _csv(_rows(steps, evals), header=True))
        if self._writer is not None:
            for row in _rows(steps, evals):
                self._scalars(row, row["row"])
            self._writer.flush()

    def add(self, row: dict, kind: str) -> None:
        """Append one row (`kind` "step" or "eval") and send its values to TensorBoard."""
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(_csv([{"row": kind, **row}], header=False))
            handle.flush()
        if self._writer is not None:
            self._scalars(row, kind)
            self._writer.flush()

    def _scalars(self, row: dict, kind: str) -> None:
        for key, tag in TAGS.items():
            if kind == "eval" and key not in ("eval_accuracy", "eval_loss", "train_loss"):
                continue
            if row.get(key) is not None:
                self._writer.add_scalar(tag, row[key], row["step"])

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
