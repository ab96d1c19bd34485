"""Evaluation: accuracy, loss and energy-curve statistics (in training and of saved weights).

Energy statistics (unfolded models only) count a rise only beyond the model's round-off allowance
tol·(1 + |E|) (`model.descent_tolerance`: 1e-6 for float32 states), the tolerance the safeguard
itself uses (THEORY §3.5); `monotone_share_strict` reports the same share without any allowance.
`backtracked_layer_share` is the share of layer steps the safeguard shortened (0 with it off).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..data.batching import TokenizedDataset, eval_batches
from ..model import UnfoldedTransformer, descent_tolerance, lowered
from .build import build_classifier, load_embeddings_for, load_split, subset_indices
from .checkpoint import CheckpointError, _unwrap, load_weights, restore_model_state, table_sha256
from .config import TrainConfig

__all__ = ["eval_sums", "evaluate_checkpoint", "finalize_eval", "in_training_eval_batches"]


def _encoder_depth(model: nn.Module) -> int:
    enc = _unwrap(model).encoder
    return enc.config.depth if isinstance(enc, UnfoldedTransformer) else -1


@torch.no_grad()
def eval_sums(model: nn.Module, ds: TokenizedDataset, batches: list[list[int]], max_length: int | None,
              pad_id: int, device: torch.device, energies: bool, progress: bool = False) -> torch.Tensor:
    """Float64 sums [n, correct, loss, n_energy, monotone, layer_descent, backtracked, layer_steps,
    monotone_strict, curve (depth + 1)...] over `batches` (reducible across ranks with all_reduce)."""
    from tqdm import tqdm
    model = _unwrap(model)
    was_training = model.training
    model.eval()
    depth = _encoder_depth(model)
    sums = torch.zeros(9 + max(depth + 1, 0), dtype=torch.float64)
    for batch in tqdm(batches, desc="eval", leave=False, disable=not progress, mininterval=1.0):
        ids, mask, labels = ds.collate(batch, max_length, pad_id)
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        logits, out = model(ids, mask, return_energies=energies and depth > 0)
        sums[0] += len(batch)
        sums[1] += (logits.argmax(-1) == labels).sum().item()
        sums[2] += F.cross_entropy(logits.float(), labels, reduction="sum").item()
        if out.energies is not None:
            _add_energy_sums(sums, out)
    model.train(was_training)
    return sums


def in_training_eval_batches(ds: TokenizedDataset, cfg: TrainConfig) -> list[list[int]]:
    """Length-sorted evaluation batches over `ds`, or over a fixed seed-0 subset of `run.eval_examples`."""
    lengths = ds.lengths(cfg.data.max_length)                      # (N,)
    keep = subset_indices(len(ds), cfg.run.eval_examples)          # (M,) sorted, or None: all
    if keep is None:
        return eval_batches(lengths, cfg.run.eval_batch_size)
    return [[int(keep[i]) for i in batch] for batch in eval_batches(lengths[keep], cfg.run.eval_batch_size)]


def _add_energy_sums(sums: torch.Tensor, out) -> None:
    """A rise counts only beyond the model's round-off allowance tol·(1 + |E|) (`descent_tolerance`)."""
    tol = descent_tolerance(out.hidden.dtype)
    e = out.energies.detach().cpu()                                # (B, depth + 1) float64
    before, after = out.layer_before.detach().cpu(), out.layer_after.detach().cpu()   # (B, depth)
    sums[3] += e.shape[0]
    sums[4] += lowered(e[:, :-1], e[:, 1:], tol).all(dim=1).sum().item()
    sums[5] += lowered(before, after, tol).all(dim=1).sum().item()
    if out.step_scales is not None:
        sums[6] += (out.step_scales < 1).sum().item()
        sums[7] += out.step_scales.numel()
    sums[8] += (e.diff(dim=1) <= 0).all(dim=1).sum().item()
    sums[9:] += e.sum(dim=0)


def finalize_eval(sums: torch.Tensor) -> dict:
    """Accuracy, mean loss and energy-curve statistics (None for standard models) from `eval_sums`."""
    n = float(sums[0])
    res: dict[str, Any] = {"n": int(n), "accuracy": float(sums[1]) / max(n, 1), "loss": float(sums[2]) / max(n, 1)}
    m = float(sums[3])
    res["energy"] = None if m == 0 else {
        "samples": int(m),
        "monotone_share": float(sums[4]) / m,               # whole curve E(Y⁰) ≥ … ≥ E(Yᵀ) up to round-off
        "layer_descent_share": float(sums[5]) / m,          # every layer: E_ℓ(Y⁽ℓ⁾) ≤ E_ℓ(Y⁽ℓ⁻¹⁾) up to round-off
        "monotone_share_strict": float(sums[8]) / m,        # the same without any round-off allowance
        "backtracked_layer_share": float(sums[6]) / float(sums[7]) if float(sums[7]) else None,
        "mean_curve": (sums[9:] / m).tolist(),
    }
    return res


def evaluate_checkpoint(path: str | Path, data_dir: str | None = None, split: str | None = None,
                        max_length: int | None = None, full_length: bool = False, batch_size: int | None = None,
                        energies: bool = True, safeguard: bool | None = None, max_examples: int | None = None,
                        device: str = "cpu", progress: bool = False) -> dict:
    """Accuracy and energy-curve statistics of saved weights on a labelled split.

    `path`: a `.safetensors` file, a `checkpoint.pt`, or a run folder (its `best.safetensors`).
    Defaults come from the saved config: split = its eval split, max_length = its max_length
    (`full_length=True`: no truncation), safeguard = the preset's (None keeps it).
    """
    path = Path(path)
    path = path / "best.safetensors" if path.is_dir() else path
    state, cfg, info = load_weights(path)
    if data_dir is not None:
        cfg.data.data_dir = data_dir
    cfg.validate()
    embeddings = load_embeddings_for(cfg)
    model = build_classifier(cfg, embeddings)
    _check_embeddings(model, cfg, info, path)
    restore_model_state(model, state, cfg, str(path))
    if safeguard is not None and isinstance(model.encoder, UnfoldedTransformer):
        model.encoder.config.safeguard = safeguard
    model.to(device)
    split = split or cfg.eval_split
    ds = load_split(cfg, embeddings, split, max_examples)
    length = None if full_length else (max_length or cfg.data.max_length)
    batches = eval_batches(ds.lengths(length), batch_size or cfg.run.eval_batch_size)
    sums = eval_sums(model, ds, batches, length, embeddings.pad_id, torch.device(device), energies, progress)
    enc = model.encoder
    return {**finalize_eval(sums), "checkpoint": str(path), "kind": cfg.model.kind, "dataset": cfg.data.dataset,
            "split": split, "max_length": length,
            "safeguard": bool(enc.config.safeguard) if isinstance(enc, UnfoldedTransformer) else None}


def _check_embeddings(model: nn.Module, cfg: TrainConfig, info: dict, where: Path) -> None:
    if cfg.model.trainable_embeddings:
        return
    sha = table_sha256(model.embedding.weight)
    if sha != info.get("embedding_sha256"):
        raise CheckpointError(f"{where}: the rebuilt embedding table ({cfg.data.embeddings}) differs from the one "
                              f"the model was trained with (sha256 {sha[:12]} vs {str(info.get('embedding_sha256'))[:12]})")
