"""Evaluation: accuracy, loss, per-class scores and energy-curve statistics (during training and of saved weights).

Energy statistics (unfolded models only, `descent.DescentCounts`) count a rise only beyond the
model's round-off allowance tol·(1 + |E|) (`descent.descent_tolerance`: 1e-6 for float32
states), the tolerance the safeguard itself uses (THEORY §3.5), on energies that are float64 evaluations
of the states (`model.py`), whose error is far below it (`descent.py`); `monotone_share_strict` reports
the same share without any allowance. `backtracked_layer_share` is the share of layer steps the
safeguard shortened or skipped (0 with it off). The safeguard is off unless asked for (`safeguard=True`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..contracts import NonFiniteResultError, check_path_given, first_non_finite_row
from ..data import dataset_record, file_record
from ..data.batching import TokenizedDataset, eval_batches, seeded_subset
from ..data.files import DataNotFoundError
from ..data.tables import read_labelled_file
from ..descent import DescentCounts, descent_tolerance
from ..errors import ConfigError
from ..model import UnfoldedTransformer
from ..recipe import TrainConfig, labelled_splits
from ..runs import check_at_least, check_device, resolve_device
from .build import load_split, tokenize_texts
from .checkpoint import _unwrap, load_classifier
from .scores import class_scores, confusion_matrix

__all__ = ["EvalSums", "evaluate", "evaluate_checkpoint", "in_training_eval_batches"]


@dataclass
class EvalSums:
    """Sums over evaluation batches; they add up across batches and processes (`to_tensor` / `from_tensor`
    pack them for one all_reduce)."""

    examples: int = 0
    correct: int = 0
    loss_sum: float = 0.0
    descent: DescentCounts = field(default_factory=DescentCounts)
    curve_sum: torch.Tensor | None = None          # (depth + 1,) float64: Σ over samples of E(Y⁽ᵗ⁾)
    confusion: np.ndarray | None = None            # (K, K) int64 [true, predicted] counts of this process (not
                                                   # packed by `to_tensor`: training reports accuracy only)

    def add(self, logits: torch.Tensor, labels: torch.Tensor, out) -> None:
        predicted = logits.argmax(-1)                                # (B,)
        self.examples += len(labels)
        self.correct += int((predicted == labels).sum())
        batch = confusion_matrix(labels.cpu().numpy(), predicted.cpu().numpy(), logits.shape[-1])   # (K, K)
        self.confusion = batch if self.confusion is None else self.confusion + batch
        self.loss_sum += float(F.cross_entropy(logits.float(), labels, reduction="sum"))
        if out.energies is not None:
            energies = out.energies.detach().cpu()                 # (B, depth + 1) float64
            self.descent.add(energies, out.layer_before.cpu(), out.layer_after.cpu(), out.step_scales.cpu(),
                             descent_tolerance(out.hidden.dtype))
            batch_curve = energies.sum(0)
            self.curve_sum = batch_curve if self.curve_sum is None else self.curve_sum + batch_curve

    def to_tensor(self, depth: int) -> torch.Tensor:
        curve = self.curve_sum if self.curve_sum is not None else torch.zeros(max(depth + 1, 0), dtype=torch.float64)
        head = [self.examples, self.correct, self.loss_sum, *self.descent.as_tuple()]
        return torch.cat([torch.tensor(head, dtype=torch.float64), curve])

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> EvalSums:
        counts = DescentCounts(*(int(v) for v in t[3:9]))
        curve = t[9:].clone() if counts.samples else None
        return cls(int(t[0]), int(t[1]), float(t[2]), counts, curve)

    def result(self, tied: bool = True) -> dict:
        """Accuracy, mean loss and energy statistics (None for standard models). An untied model (`tied`
        False) has one energy per layer, so its reported values are not one curve: its `monotone_share`
        is None and `layer_descent_share` (every layer lowers its own E_ℓ) is what it certifies."""
        n = max(self.examples, 1)
        res = {"n": self.examples, "accuracy": self.correct / n, "loss": self.loss_sum / n, "energy": None}
        if self.descent.samples:
            res["energy"] = {**self.descent.shares(), "mean_curve": (self.curve_sum / self.descent.samples).tolist(),
                             "one_energy": tied}
            if not tied:
                res["energy"].update(monotone_share=None, monotone_share_strict=None)
        return res


def one_energy(model: nn.Module) -> bool:
    """Whether the model's reported energies are one energy's curve (a tied unfolded encoder)."""
    enc = _unwrap(model).encoder
    return not isinstance(enc, UnfoldedTransformer) or bool(enc.config.tied)


def encoder_depth(model: nn.Module) -> int:
    """Depth of an unfolded encoder, -1 for the standard one."""
    enc = _unwrap(model).encoder
    return enc.config.depth if isinstance(enc, UnfoldedTransformer) else -1


@torch.no_grad()
def evaluate(model: nn.Module, ds: TokenizedDataset, batches: list[list[int]], max_length: int | None,
             pad_id: int, device: torch.device, energies: bool, safeguard: bool = False,
             progress: bool = False) -> EvalSums:
    """Sums of accuracy, loss and (unfolded models, `energies`) descent statistics over `batches`."""
    from tqdm import tqdm
    model = _unwrap(model)
    was_training = model.training
    model.eval()
    unfolded = encoder_depth(model) > 0
    sums = EvalSums()
    for batch in tqdm(batches, desc="eval", leave=False, disable=not progress, mininterval=1.0):
        ids, mask, labels = ds.collate(batch, max_length, pad_id)
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        logits, out = model(ids, mask, return_energies=energies and unfolded, safeguard=safeguard and unfolded)
        _refuse_non_finite(batch, logits, out.energies)
        sums.add(logits, labels, out)
    model.train(was_training)
    return sums


def _refuse_non_finite(batch: list[int], logits: torch.Tensor, energies: torch.Tensor | None) -> None:
    """NonFiniteResultError naming the first example (its index in the split) with a NaN/inf logit or energy:
    its loss or energy curve would be NaN, and a mean over it reports nothing true."""
    bad = first_non_finite_row({"logits (so its loss)": logits, "energy curve": energies})
    if bad is not None:
        row, name, where, value = bad
        raise NonFiniteResultError(f"example {batch[row]} of the split: its {name} has {value} at {where}; a "
                                   "non-finite loss or energy is not reported (are the weights damaged?)")


def in_training_eval_batches(ds: TokenizedDataset, cfg: TrainConfig) -> list[list[int]]:
    """Length-sorted evaluation batches over `ds`, or over a fixed seed-0 subset of `run.eval_examples`."""
    lengths = ds.lengths(cfg.data.max_length)                      # (N,)
    keep = seeded_subset(len(ds), cfg.run.eval_examples)           # (M,) sorted, or None: all
    if keep is None:
        return eval_batches(lengths, cfg.run.eval_batch_size)
    return [[int(keep[i]) for i in batch] for batch in eval_batches(lengths[keep], cfg.run.eval_batch_size)]


def evaluate_checkpoint(path: str | Path, data_dir: str | None = None, split: str | None = None,
                        max_length: int | None = None, full_length: bool = False, batch_size: int | None = None,
                        energies: bool = True, safeguard: bool = False, max_examples: int | None = None,
                        device: str = "cpu", progress: bool = False, trust_unverified: bool = False,
                        eval_file: str | Path | None = None, text_column: str | None = None,
                        label_column: str | None = None) -> dict:
    """Accuracy, per-class scores and energy-curve statistics of saved weights on a labelled split or file.

    `path`: a `.safetensors` file, a `checkpoint.pt`, or a run folder (its `best.safetensors`).
    Defaults come from the saved config: split = its eval split, max_length = its max_length
    (`full_length=True`: no truncation). `safeguard`: whole-layer descent by backtracking.
    `eval_file`: score a labelled file instead of a split (CSV, TSV, JSON lines, JSON, Parquet or a
    `datasets` folder, read as training reads files: `data.tables`), its columns those the run was
    trained with unless `text_column` / `label_column` are given; its labels are matched to the run's
    class names (`data.tables.read_labelled_file`: a label the run never saw is refused naming its row).
    Sizes must be >= 1, the device present, the split labelled and the file present (ConfigError /
    DataNotFoundError, before the weights are read). The result names the weights, their run id and
    integrity, the run's data files and the file scored; `classes`, `macro`, `confusion` and `undefined`
    are `scores.class_scores` of the predictions. `trust_unverified`: read weights without checksums that
    no run-folder manifest vouches for. A NaN or infinite logit or energy raises `NonFiniteResultError`
    naming the example.
    """
    for name, value in (("max_length", max_length), ("batch_size", batch_size), ("max_examples", max_examples)):
        check_at_least(name, value, optional=True)
    if full_length and max_length is not None:
        raise ConfigError("max_length and full_length exclude each other")
    if eval_file is None and (text_column is not None or label_column is not None):
        raise ConfigError("text_column and label_column choose the columns of an eval_file; give one")
    if eval_file is not None:
        if split is not None:
            raise ConfigError("split and eval_file exclude each other: evaluate a split of the run's data or a file")
        check_path_given("eval_file", eval_file)
        if not Path(eval_file).expanduser().exists():
            raise DataNotFoundError(f"{eval_file}: no such file or folder (given as the file to evaluate on)")
    check_device("device", device)
    device = resolve_device(device)
    loaded = load_classifier(path, data_dir=data_dir, trust_unverified=trust_unverified)
    cfg, model = loaded.config, loaded.model.to(device)
    if eval_file is None:
        split = cfg.eval_split if split is None else split         # '' is refused below, not read as "default"
        splits = labelled_splits(cfg.data.dataset)
        if split not in splits:
            raise ConfigError(f"split {split!r} of {cfg.data.dataset} has no labels to evaluate against; labelled "
                              f"splits: {', '.join(splits)}")
        ds = load_split(cfg, loaded.embeddings, split, max_examples)
        scored = {"split": split, "eval_file": None}
    else:
        columns = (text_column or cfg.data.text_column, label_column or cfg.data.label_column)
        data = read_labelled_file(eval_file, loaded.label_names, *columns)
        ds = tokenize_texts(cfg, loaded.embeddings, data.texts, data.labels, max_examples)
        scored = {"split": None, "eval_file": {**file_record(Path(eval_file).expanduser()), "text_column": columns[0],
                                               "label_column": columns[1]}}
    length = None if full_length else (cfg.data.max_length if max_length is None else max_length)
    batches = eval_batches(ds.lengths(length), batch_size or cfg.run.eval_batch_size)
    sums = evaluate(model, ds, batches, length, loaded.embeddings.pad_id, torch.device(device), energies,
                    safeguard, progress)
    unfolded = isinstance(model.encoder, UnfoldedTransformer)
    scores = class_scores(sums.confusion, loaded.label_names)
    return {**sums.result(one_energy(model)), "checkpoint": str(loaded.path), "run_id": loaded.info.get("run_id"),
            "integrity": loaded.info.get("integrity"), "kind": cfg.model.kind, "dataset": cfg.data.dataset,
            **scored, "max_length": length, "safeguard": bool(safeguard) if unfolded else None,
            "label_names": list(loaded.label_names), "data_files": _data_files(cfg),
            **{key: scores[key] for key in ("classes", "macro", "confusion", "undefined")}}


def _data_files(cfg: TrainConfig) -> list[dict]:
    d = cfg.data
    if d.dataset == "files":
        return [file_record(f) for f in (d.train_file, d.eval_file) if f is not None]
    return [dataset_record(d.dataset, d.data_dir)]
