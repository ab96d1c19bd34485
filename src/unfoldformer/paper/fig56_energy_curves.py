"""Figures 5–6: per-layer energy curves of a weight-tied model on real text (THEORY §7 items 5–6, §7.1).

One data set; a 12-step weight-tied model (d_model = embedding dim) on the same frozen
inputs X = Y⁽⁰⁾, in three variants: ``random`` (random init, no ReLU), ``random-relu``
(the same weights, ReLU) and ``trained-relu`` (the same init, ReLU, trained by plain SGD as
a ``SequenceClassifier``: masked mean pooling + linear head — the released code had no
pooling). Two formulas: the corrected ``paper`` preset (one PSD metric AᵀA for energy and
attention, key-norm bias, F1 FFN with spectrum clipped to ±0.95; §3.1, §3.4) and the
``paper-as-released`` formulas (§7.1, energy E_rel); the trained released model gets
`released_normalize_()` after training, as released (it squares W_f again), and its
accuracy is reported before and after. The ``paper`` F1 energy leaves out ι_{≥0} (the
input embeddings are not non-negative, so E(Y⁽⁰⁾) would be +∞).

Energies come from ``forward(..., return_energies="steps")`` (float64). A step rises when
E_after > E_before + tol·(1 + |E_before|), tol = `descent_tolerance` of the model dtype;
every other step lowers (does not raise) its energy; a curve is monotone when no layer step
rises. Box plots use 1.5·IQR whiskers (as matplotlib); plotted energies are E − w, w = the
lowest lower whisker over the layers (the paper subtracts the global minimum first: same).

`compute` does no file I/O (texts come loaded; `select` draws seeded subsets); `plot`
writes one PNG (rows = formulas, columns = variants).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from ..classifier import SequenceClassifier, masked_mean
from ..config import ModelConfig
from ..data import EncodedBatch, StaticEmbeddings, TextExample
from ..data.batching import eval_batches, seeded_subset
from ..descent import descent_tolerance, lowered, share_lowered
from ..model import UnfoldedTransformer
from ..plots import box_stats, lowest_whisker, pyplot, save_figure

__all__ = ["CurveSettings", "CurvesResult", "FORMULAS", "VARIANTS", "VariantCurves", "compute",
           "curve_summary", "n_stages", "plot", "select", "spread_ratio",
           "summary"]

VARIANTS = ("random", "random-relu", "trained-relu")
FORMULAS = ("paper", "paper-as-released")
VARIANT_LABELS = {"random": "random init, no ReLU", "random-relu": "random init, ReLU",
                  "trained-relu": "trained, ReLU"}
FORMULA_LABELS = {"paper": "corrected (paper preset)", "paper-as-released": "as released (E_rel)"}


@dataclass
class CurveSettings:
    """Everything that shapes one data set's curves (recorded in results.json)."""

    depth: int = 12
    eval_max_length: int | None = None       # None: full-length inputs for the curves
    train_max_length: int | None = 32        # training sequences truncated to this many tokens
    train_batch_size: int = 16
    train_epochs: int = 1
    lr: float = 1e-2                         # plain SGD, as the paper
    accuracy_max_length: int | None = 32     # accuracy inputs truncated (None: full length)
    batch_tokens: int = 8192                 # padded tokens per evaluation batch
    formulas: tuple[str, ...] = FORMULAS
    variants: tuple[str, ...] = VARIANTS


@dataclass
class VariantCurves:
    """Energies of one (formula, variant) on the N evaluation samples, float64."""

    formula: str
    variant: str
    energies: np.ndarray            # (N, T+1): E(Y⁽ᵗ⁾)
    attention_before: np.ndarray    # (N, T): attention term at Y⁽ᵗ⁻¹⁾
    attention_after: np.ndarray     # (N, T): ... at U⁽ᵗ⁾
    ffn_before: np.ndarray          # (N, T): FFN term at U⁽ᵗ⁾
    ffn_after: np.ndarray           # (N, T): ... at Y⁽ᵗ⁾
    pooled: np.ndarray              # (N, d): masked mean of Y⁽ᵀ⁾ (what the head sees)
    accuracy: float | None = None
    accuracy_as_trained: float | None = None   # released only: before released_normalize_()
    training: dict | None = None


@dataclass
class CurvesResult:
    dataset: str
    seed: int
    tolerance: float                # descent_tolerance of the model dtype
    lengths: np.ndarray             # (N,) tokens per evaluation sample (after truncation)
    n_train: int
    n_accuracy: int
    settings: CurveSettings
    inputs_pooled: np.ndarray | None = None                          # (N, d): masked mean of X
    majority_rate: float | None = None   # share of the most frequent label among the accuracy examples
    curves: dict[str, VariantCurves] = field(default_factory=dict)  # key "formula/variant"


# ----------------------------------------------------------------------------- data helpers
def select(examples: Sequence[TextExample], k: int | None, seed: int, stream: int) -> list[TextExample]:
    """A seeded random subset of k examples (`data.seeded_subset`; all, in order, when k is None or ≥ len)."""
    idx = seeded_subset(len(examples), k, seed, stream)
    return list(examples) if idx is None else [examples[i] for i in idx]


def _length_batches(lengths: np.ndarray, batch_tokens: int) -> list[list[int]]:
    """Length-sorted batches whose padded attention B · n² stays within batch_tokens · 64."""
    return eval_batches(lengths, batch_size=len(lengths), max_tokens_sq=batch_tokens * 64)


def _sub_batch(enc: EncodedBatch, idx) -> EncodedBatch:
    """Rows `idx` of an encoded batch, trimmed to their longest sequence: (b, n')."""
    ids, pad = enc.ids[idx], enc.padding_mask[idx]
    width = max(1, int((~pad).sum(1).max()))
    return EncodedBatch(ids[:, :width], pad[:, :width])


# ----------------------------------------------------------------------------- models
def _encoder(formula: str, relu: bool, d: int, depth: int, seed: int) -> UnfoldedTransformer:
    """The tied model of `formula` with seeded init (same weights with and without ReLU)."""
    torch.manual_seed(seed)
    return UnfoldedTransformer(ModelConfig.preset(formula, d_model=d, depth=depth, relu=relu))


def _energy_curves(encoder: UnfoldedTransformer, emb: StaticEmbeddings, enc: EncodedBatch,
                   batch_tokens: int) -> dict[str, np.ndarray]:
    """Energies of every evaluation sample in original order: (N, T+1) and (N, T) arrays."""
    lengths = (~enc.padding_mask).sum(1).numpy()
    keys = ("energies", "attention_before", "attention_after", "ffn_before", "ffn_after")
    parts: dict[str, list] = {k: [] for k in keys + ("pooled", "inputs_pooled")}
    order = []
    encoder.eval()
    with torch.no_grad():
        for idx in _length_batches(lengths, batch_tokens):
            sub = _sub_batch(enc, torch.as_tensor(idx))
            x = emb.embed(sub)                                     # (b, n, d)
            out = encoder(x, sub.padding_mask, return_energies="steps")   # the curve and the sub-step terms
            for k in keys:
                parts[k].append(getattr(out, k).numpy())
            parts["pooled"].append(masked_mean(out.hidden, sub.padding_mask).numpy())
            parts["inputs_pooled"].append(masked_mean(x, sub.padding_mask).numpy())
            order.append(idx)
    inverse = np.argsort(np.concatenate(order))
    return {k: np.concatenate(v)[inverse] for k, v in parts.items()}


# ----------------------------------------------------------------------------- training
def _train_batches(lengths: torch.Tensor, batch_size: int, gen: torch.Generator) -> list[torch.Tensor]:
    """Shuffled minibatches of similar length (sorted within chunks of 50 batches), in random order."""
    perm = torch.randperm(len(lengths), generator=gen)
    batches: list[torch.Tensor] = []
    chunk = 50 * batch_size
    for start in range(0, len(perm), chunk):
        part = perm[start:start + chunk]
        part = part[torch.argsort(lengths[part], stable=True)]
        batches.extend(part.split(batch_size))
    return [batches[i] for i in torch.randperm(len(batches), generator=gen)]


def _train(clf: SequenceClassifier, enc: EncodedBatch, labels: torch.Tensor, s: CurveSettings,
           seed: int) -> dict:
    """Plain SGD, lr `s.lr`, on the cross-entropy *summed* over each minibatch.

    Summing makes one epoch equal in step length to per-example SGD (one lr-step per
    example), with the gradients of a minibatch taken at one point. A non-finite loss
    skips its step (counted).
    """
    params = [p for p in clf.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=s.lr)
    gen = torch.Generator().manual_seed(seed)
    lengths = (~enc.padding_mask).sum(1)
    losses, skipped = [], 0
    clf.train()
    for _ in range(s.train_epochs):
        for idx in _train_batches(lengths, s.train_batch_size, gen):
            sub = _sub_batch(enc, idx)
            logits, _ = clf(sub.ids, sub.padding_mask)             # (b, 2)
            loss = F.cross_entropy(logits, labels[idx], reduction="sum")
            opt.zero_grad()
            if not torch.isfinite(loss):
                skipped += 1
                continue
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()) / len(idx))
    k = max(1, len(losses) // 10)
    return {"steps": len(losses), "skipped_nonfinite_steps": skipped,
            "mean_loss_first_10pct": float(np.mean(losses[:k])) if losses else None,
            "mean_loss_last_10pct": float(np.mean(losses[-k:])) if losses else None}


def _accuracy(clf: SequenceClassifier, enc: EncodedBatch, labels: torch.Tensor, batch_tokens: int) -> float:
    """Share of correct argmax predictions, length-bucketed batches."""
    lengths = (~enc.padding_mask).sum(1).numpy()
    correct = 0
    clf.eval()
    with torch.no_grad():
        for idx in _length_batches(lengths, batch_tokens):
            sub = _sub_batch(enc, torch.as_tensor(idx))
            logits, _ = clf(sub.ids, sub.padding_mask)             # (b, 2)
            correct += int((logits.argmax(-1) == labels[idx]).sum())
    return correct / max(1, len(labels))


def _encode_labelled(emb: StaticEmbeddings, examples: Sequence[TextExample], max_length):
    texts = [e.text for e in examples]
    labels = torch.tensor([int(e.label) for e in examples], dtype=torch.long)
    return emb.encode(texts, max_length), labels


def _trained(formula: str, emb: StaticEmbeddings, train: Sequence[TextExample],
             accuracy: Sequence[TextExample], s: CurveSettings, seed: int):
    """Train the ReLU model of `formula`; returns (encoder, accuracy, accuracy_as_trained, log)."""
    encoder = _encoder(formula, True, emb.dim, s.depth, seed)
    torch.manual_seed(seed + 1)                                    # head init
    clf = SequenceClassifier(encoder, emb.table, emb.dim, n_classes=2, pad_id=emb.pad_id)
    tr_enc, tr_labels = _encode_labelled(emb, train, s.train_max_length)
    log = _train(clf, tr_enc, tr_labels, s, seed + 2)
    acc_enc, acc_labels = _encode_labelled(emb, accuracy, s.accuracy_max_length)
    acc = _accuracy(clf, acc_enc, acc_labels, s.batch_tokens)
    as_trained = None
    if formula == "paper-as-released":
        as_trained = acc
        encoder.released_normalize_()                              # re-squares W_f, as released
        acc = _accuracy(clf, acc_enc, acc_labels, s.batch_tokens)
    return encoder, acc, as_trained, log


# ----------------------------------------------------------------------------- compute
def n_stages(settings: CurveSettings) -> int:
    """Progress units reported by `compute`: one per curve set, one per training."""
    per_formula = len(settings.variants) + ("trained-relu" in settings.variants)
    return len(settings.formulas) * per_formula


def compute(eval_texts: Sequence[str], train: Sequence[TextExample], accuracy: Sequence[TextExample],
            embeddings: StaticEmbeddings, dataset: str = "", settings: CurveSettings | None = None,
            seed: int = 0, progress: Callable[[str], None] | None = None) -> CurvesResult:
    """Energy curves of every (formula, variant) on `eval_texts` (THEORY §7 items 5–6).

    `train` / `accuracy`: labelled examples for the trained variant and its accuracy.
    `progress(stage)` is called after each of `n_stages(settings)` stages. No file I/O.
    """
    s = settings or CurveSettings()
    for name in s.variants:
        if name not in VARIANTS:
            raise ValueError(f"unknown variant {name!r}; valid: {', '.join(VARIANTS)}")
    note = progress or (lambda stage: None)
    enc = embeddings.encode(list(eval_texts), s.eval_max_length)   # (N, n)
    result = CurvesResult(dataset, seed, descent_tolerance(torch.float32),
                          (~enc.padding_mask).sum(1).numpy(), len(train), len(accuracy), s)
    if accuracy:
        result.majority_rate = float(np.bincount([int(e.label) for e in accuracy]).max() / len(accuracy))
    for formula in s.formulas:
        for variant in s.variants:
            extra = {}
            if variant == "trained-relu":
                encoder, acc, as_trained, log = _trained(formula, embeddings, train, accuracy, s, seed)
                note(f"{dataset} {formula} training")
                extra = dict(accuracy=acc, accuracy_as_trained=as_trained, training=log)
            else:
                encoder = _encoder(formula, variant == "random-relu", embeddings.dim, s.depth, seed)
            curves = _energy_curves(encoder, embeddings, enc, s.batch_tokens)
            result.inputs_pooled = curves.pop("inputs_pooled")
            result.curves[f"{formula}/{variant}"] = VariantCurves(formula, variant, **curves, **extra)
            note(f"{dataset} {formula} {variant}")
    return result


# ----------------------------------------------------------------------------- statistics
def spread_ratio(pooled: np.ndarray) -> float:
    """RMS distance of pooled vectors (N, d) from their mean over the norm of the mean."""
    mean = pooled.mean(axis=0)                                     # (d,)
    return float(np.sqrt(((pooled - mean) ** 2).sum(axis=1).mean()) / max(np.linalg.norm(mean), 1e-30))


def curve_summary(c: VariantCurves, tol: float) -> dict:
    """Headline numbers of one (formula, variant): shares of lowering steps, mean/median energies."""
    E = c.energies                                                 # (N, T+1)
    layer_ok = lowered(E[:, :-1], E[:, 1:], tol)                  # (N, T)
    rel_rise = (E[:, 1:] - E[:, :-1]) / (1.0 + np.abs(E[:, :-1]))  # (N, T)
    return {
        "share_monotone": float(layer_ok.all(axis=1).mean()),
        "share_layer_steps_lowering": float(layer_ok.mean()),
        "share_attention_steps_lowering": share_lowered(c.attention_before, c.attention_after, tol),
        "share_ffn_steps_lowering": share_lowered(c.ffn_before, c.ffn_after, tol),
        "max_relative_layer_rise": float(rel_rise.max()),
        "mean_energy": E.mean(axis=0).tolist(),
        "median_energy": np.median(E, axis=0).tolist(),
        "whisker_shift": lowest_whisker(E),
        "pooled_spread_ratio": spread_ratio(c.pooled),
        "accuracy": c.accuracy,
        "accuracy_as_trained": c.accuracy_as_trained,
        "training": c.training,
    }


def summary(result: CurvesResult) -> dict:
    """JSON-serialisable numbers per "formula/variant" plus the data shape."""
    r = result
    return {
        "dataset": r.dataset,
        "n_samples": int(len(r.lengths)),
        "tokens_per_sample": {"mean": float(r.lengths.mean()), "max": int(r.lengths.max())},
        "n_train": r.n_train,
        "n_accuracy": r.n_accuracy,
        "majority_rate": r.majority_rate,
        "tolerance": r.tolerance,
        "inputs_pooled_spread_ratio": None if r.inputs_pooled is None else spread_ratio(r.inputs_pooled),
        "curves": {key: curve_summary(c, r.tolerance) for key, c in r.curves.items()},
    }


# ----------------------------------------------------------------------------- plot
def _panel(ax, c: VariantCurves) -> None:
    E = c.energies - lowest_whisker(c.energies)                    # (N, T+1), lowest whisker at 0
    stats = [box_stats(E[:, t]) for t in range(E.shape[1])]
    pos = np.arange(E.shape[1])
    ax.bxp(stats, positions=pos, showfliers=False, widths=0.6)   # fliers beyond the whiskers not drawn
    ax.plot(pos, E.mean(axis=0), "-o", color="tab:red", ms=3, lw=1.2, label="mean")
    title = VARIANT_LABELS[c.variant]
    if c.accuracy is not None:
        title += f" (acc {c.accuracy:.1%})"
    ax.set_title(title, fontsize=9)
    ax.set_xticks(pos[::2], [str(t) for t in pos[::2]])
    ax.tick_params(labelsize=7)


def plot(result: CurvesResult, path, title: str | None = None) -> None:
    """Box plots per layer (fliers not drawn) plus the mean line; rows = formulas, columns = variants."""
    plt = pyplot()
    r = result
    formulas = [f for f in r.settings.formulas if any(k.startswith(f + "/") for k in r.curves)]
    variants = list(r.settings.variants)
    fig, axes = plt.subplots(len(formulas), len(variants), squeeze=False,
                             figsize=(4.0 * len(variants), 3.2 * len(formulas)))
    for i, formula in enumerate(formulas):
        for j, variant in enumerate(variants):
            _panel(axes[i, j], r.curves[f"{formula}/{variant}"])
            axes[i, j].set_xlabel("layer t", fontsize=8)
        axes[i, 0].set_ylabel(f"{FORMULA_LABELS[formula]}\nE(Y$^{{(t)}}$) − lowest whisker", fontsize=8)
    axes[0, -1].legend(fontsize=7, loc="upper right")
    fig.suptitle(title or f"Energy per layer, {r.dataset} ({len(r.lengths)} samples)", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
