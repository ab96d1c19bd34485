"""Figures 5–6: per-layer energy curves of weight-tied models on real text (THEORY §7 items 5–6, §7.1).

One data set, the same N evaluation texts for every variant. Variants (keys "formula/variant"):

- ``paper/random``, ``paper/random-relu``: the corrected `paper` preset (one PSD metric AᵀA for
  energy and attention, key-norm bias, F1 FFN with spectrum clipped to ±0.95; §3.1, §3.4), 12 tied
  steps, d_model = embedding width, seeded random init without and with ReLU (same weights);
- ``paper-as-released/random``, ``paper-as-released/random-relu``: the released formulas (§7.1,
  energy E_rel) on the same inputs;
- trained variants (`paper.trained`): ``paper/trained-as-released`` and
  ``paper-as-released/trained-as-released`` (the paper's SGD recipe), ``paper/trained`` (a recipe
  that learns) and ``certified/trained`` (the `certified` model: the joint layer, THEORY §3.7, no
  safeguard). A trained classifier's encoder
  runs on its own inputs X = input map(embeddings).

The ``paper`` F1 energy leaves out ι_{≥0} (the input embeddings are not non-negative, so E(Y⁽⁰⁾)
would be +∞). Energies come from ``forward(..., return_energies="steps")`` (float64: the curve and
the sub-step terms). A step rises when
E_after > E_before + tol·(1 + |E_before|), tol = `descent_tolerance` of the model dtype; a curve is
monotone when no layer step rises. Per-token energies divide a sample's energies by its token count
n, so long texts do not dominate the boxes (the attention term sums over n² pairs, the FFN term over
n tokens: per token the scales still differ by length, but far less than the raw sums).

`random_curves` and `trained_curves` compute one variant each (`paper.reproduce` runs them in parallel),
`assemble` collects a data set, `compute` runs them one after the other; none writes files.
`fig56_plot.plot` draws the figure.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..classifier import masked_mean
from ..config import ModelConfig
from ..data import EncodedBatch, StaticEmbeddings, TextExample
from ..data.batching import eval_batches, seeded_subset
from ..descent import descent_tolerance, lowered, share_lowered
from ..model import UnfoldedTransformer
from ..plots import box_stats, lowest_whisker

__all__ = ["CurveSettings", "CurvesResult", "FORMULAS", "RANDOM_VARIANTS", "VariantCurves", "assemble",
           "beyond_whiskers", "change_share", "compute", "cross_terms", "curve_summary", "descent_scale", "per_token",
           "random_curves", "select", "spread_ratio", "summary", "trained_curves"]

RANDOM_VARIANTS = ("random", "random-relu")
FORMULAS = ("paper", "paper-as-released")
RANDOM_LABELS = {"random": "random init, no ReLU", "random-relu": "random init, ReLU"}


@dataclass
class CurveSettings:
    """Everything that shapes one data set's curves (recorded in results.json)."""

    depth: int = 12
    eval_max_length: int | None = None       # None: full-length inputs for the curves
    batch_tokens: int = 8192                 # padded tokens per evaluation batch
    formulas: tuple[str, ...] = FORMULAS


@dataclass
class VariantCurves:
    """Energies of one variant on the N evaluation samples, float64."""

    key: str                        # "formula/variant"
    label: str                      # how the figure names it
    energies: np.ndarray            # (N, T+1): E(Y⁽ᵗ⁾)
    attention_before: np.ndarray    # (N, T): attention term at Y⁽ᵗ⁻¹⁾
    attention_after: np.ndarray     # (N, T): ... at U⁽ᵗ⁾
    ffn_before: np.ndarray          # (N, T): FFN term at U⁽ᵗ⁾
    ffn_after: np.ndarray           # (N, T): ... at Y⁽ᵗ⁾
    step_scales: np.ndarray         # (N, T): step scale accepted per layer (1 without the safeguard)
    pooled: np.ndarray              # (N, d): masked mean of Y⁽ᵀ⁾ (what the head sees)
    lengths: np.ndarray             # (N,) tokens per sample (after truncation)
    d_model: int
    safeguard: bool = False         # whole-layer descent by backtracking (the certified models' guarantee)
    accuracy: float | None = None   # on the accuracy examples (safeguard off)
    accuracy_as_trained: float | None = None   # released model only: before released_normalize_()
    sample_accuracy: float | None = None       # on these N samples, of the function plotted
    training: dict | None = None

    @property
    def formula(self) -> str:
        return self.key.split("/")[0]


@dataclass
class CurvesResult:
    dataset: str
    seed: int
    tolerance: float                # descent_tolerance of the model dtype
    lengths: np.ndarray             # (N,) tokens per evaluation sample (after truncation)
    full_lengths: np.ndarray        # (N,) tokens per evaluation sample (untruncated)
    settings: CurveSettings
    embeddings: str = ""            # name of the embedding table
    embedding_dim: int = 0
    inputs_pooled: np.ndarray | None = None                          # (N, d): masked mean of X
    majority_rate: float | None = None   # share of the most frequent label among the accuracy examples
    curves: dict[str, VariantCurves] = field(default_factory=dict)


# ----------------------------------------------------------------------------- data helpers
def select(examples: Sequence[TextExample], k: int | None, seed: int, stream: int) -> list[TextExample]:
    """A seeded random subset of k examples (`data.seeded_subset`; all, in order, when k is None or ≥ len)."""
    idx = seeded_subset(len(examples), k, seed, stream)
    return list(examples) if idx is None else [examples[i] for i in idx]


def _sub_batch(enc: EncodedBatch, idx) -> EncodedBatch:
    """Rows `idx` of an encoded batch, trimmed to their longest sequence: (b, n')."""
    ids, pad = enc.ids[idx], enc.padding_mask[idx]
    width = max(1, int((~pad).sum(1).max()))
    return EncodedBatch(ids[:, :width], pad[:, :width])


# ----------------------------------------------------------------------------- curves
_FIELDS = ("energies", "attention_before", "attention_after", "ffn_before", "ffn_after", "step_scales")


def _encoder(formula: str, relu: bool, d: int, depth: int, seed: int) -> UnfoldedTransformer:
    """The tied model of `formula` with seeded init (same weights with and without ReLU)."""
    torch.manual_seed(seed)
    return UnfoldedTransformer(ModelConfig.preset(formula, d_model=d, depth=depth, relu=relu))


def _energy_curves(encoder: UnfoldedTransformer, inputs: Callable[[EncodedBatch], torch.Tensor],
                   enc: EncodedBatch, batch_tokens: int, safeguard: bool = False,
                   readout: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None
                   ) -> dict[str, np.ndarray]:
    """Energies of every sample in original order: (N, T+1) and (N, T) arrays, pooled outputs and inputs.
    `readout` (states, padding mask) -> (b, d): a trained classifier's pooling and norm (default: the mean)."""
    lengths = (~enc.padding_mask).sum(1).numpy()
    parts: dict[str, list] = {k: [] for k in _FIELDS + ("pooled", "inputs_pooled")}
    order = []
    encoder.eval()
    with torch.no_grad():
        for idx in eval_batches(lengths, batch_size=len(lengths), max_tokens_sq=batch_tokens * 64):
            sub = _sub_batch(enc, torch.as_tensor(idx))
            x = inputs(sub)                                        # (b, n, d)
            out = encoder(x, sub.padding_mask, return_energies="steps", safeguard=safeguard)
            for k in _FIELDS:                                      # documented EncoderOutput fields
                parts[k].append(getattr(out, k).numpy())
            pooled = (readout or masked_mean)(out.hidden, sub.padding_mask)     # (b, d) the classifier's readout
            parts["pooled"].append(pooled.numpy())
            parts["inputs_pooled"].append(masked_mean(x, sub.padding_mask).numpy())
            order.append(idx)
    inverse = np.argsort(np.concatenate(order))
    return {k: np.concatenate(v)[inverse] for k, v in parts.items()}


def random_curves(formula: str, variant: str, embeddings: StaticEmbeddings, texts: Sequence[str],
                  settings: CurveSettings, seed: int = 0) -> tuple[VariantCurves, np.ndarray]:
    """Curves of the seeded random model of `formula` ("random": no ReLU, "random-relu") on `texts`, and the
    mean-pooled inputs (N, d)."""
    s = settings
    enc = embeddings.encode(list(texts), s.eval_max_length)        # (N, n)
    encoder = _encoder(formula, variant == "random-relu", embeddings.dim, s.depth, seed)
    curves = _energy_curves(encoder, embeddings.embed, enc, s.batch_tokens)
    inputs_pooled = curves.pop("inputs_pooled")
    key = f"{formula}/{variant}"
    return VariantCurves(key, RANDOM_LABELS[variant], **curves, lengths=(~enc.padding_mask).sum(1).numpy(),
                         d_model=embeddings.dim), inputs_pooled


def trained_curves(variant, loaded, texts: Sequence[str], labels: Sequence[int] | None,
                   settings: CurveSettings) -> VariantCurves:
    """Curves of a trained classifier on its own inputs X = input map(embeddings), with the safeguard if its
    recipe asks for it, and that function's accuracy on these samples. `variant`: a
    `paper.trained.TrainedVariant`; `loaded`: its weights (`paper.trained.load_trained`)."""
    clf, emb, spec, s = loaded.model, loaded.embeddings, variant.spec, settings
    enc = emb.encode(list(texts), s.eval_max_length)               # (N, n)
    curves = _energy_curves(clf.encoder, lambda sub: clf.project(clf.embedding(sub.ids)), enc, s.batch_tokens,
                            safeguard=spec.safeguard, readout=clf.readout)
    curves.pop("inputs_pooled")
    sample_accuracy = None
    if labels is not None:
        with torch.no_grad():
            logits = clf.head(torch.as_tensor(curves["pooled"]))   # (N, C): the head on the pooled outputs
        sample_accuracy = float((logits.argmax(-1).numpy() == np.asarray(labels)).mean())
    return VariantCurves(spec.key, spec.label, **curves, lengths=(~enc.padding_mask).sum(1).numpy(),
                         d_model=clf.encoder.config.d_model, safeguard=spec.safeguard, accuracy=variant.accuracy,
                         accuracy_as_trained=variant.accuracy_as_trained, sample_accuracy=sample_accuracy,
                         training=variant.training)


def assemble(texts: Sequence[str], embeddings: StaticEmbeddings, dataset: str, settings: CurveSettings,
             seed: int, curves: Sequence[VariantCurves], inputs_pooled: np.ndarray | None = None,
             majority_rate: float | None = None) -> CurvesResult:
    """One data set's result from its variants' curves (in the given order)."""
    texts = list(texts)
    enc = embeddings.encode(texts, settings.eval_max_length)      # (N, n)
    full = np.array([max(len(t), 1) for t in embeddings.tokenize_many(texts)])
    return CurvesResult(dataset, seed, descent_tolerance(torch.float32), (~enc.padding_mask).sum(1).numpy(), full,
                        settings, embeddings.name, embeddings.dim, inputs_pooled, majority_rate,
                        {c.key: c for c in curves})


def compute(eval_texts: Sequence[str], embeddings: StaticEmbeddings, dataset: str = "",
            settings: CurveSettings | None = None, seed: int = 0, trained: Sequence = (),
            progress: Callable[[str], None] | None = None, labels: Sequence[int] | None = None) -> CurvesResult:
    """Energy curves of the random variants of each formula and of each `trained` variant, one after the
    other (THEORY §7 items 5–6); `paper.reproduce` runs the same pieces in parallel.

    `trained`: `paper.trained.TrainedVariant`s; `labels` of the texts give their accuracy on these samples.
    `progress(stage)` is called once per curve set (`n_stages`). No file writing.
    """
    from .trained import load_trained
    s = settings or CurveSettings()
    note = progress or (lambda stage: None)
    curves, inputs_pooled = [], None
    for formula in s.formulas:
        for variant in RANDOM_VARIANTS:
            c, inputs_pooled = random_curves(formula, variant, embeddings, eval_texts, s, seed)
            curves.append(c)
            note(f"{dataset} {c.key}")
    for variant in trained:
        curves.append(trained_curves(variant, load_trained(variant.spec, variant.run_dir), eval_texts, labels, s))
        note(f"{dataset} {variant.spec.key}")
    return assemble(eval_texts, embeddings, dataset, s, seed, curves, inputs_pooled)


def n_stages(settings: CurveSettings, n_trained: int) -> int:
    """Progress units reported by `compute`: one per curve set."""
    return len(settings.formulas) * len(RANDOM_VARIANTS) + n_trained


# ----------------------------------------------------------------------------- statistics
def per_token(c: VariantCurves) -> np.ndarray:
    """Energies per token E(Y⁽ᵗ⁾)/n: (N, T+1)."""
    return c.energies / c.lengths[:, None]


def descent_scale(c: VariantCurves, tol: float) -> np.ndarray:
    """Each sample's total descent D = E(Y⁽⁰⁾) − min_t E(Y⁽ᵗ⁾) (N,), at least its round-off allowance."""
    E = c.energies                                                 # (N, T+1)
    return np.maximum(E[:, 0] - E.min(axis=1), tol * (1 + np.abs(E[:, 0])))


def change_share(c: VariantCurves, tol: float) -> np.ndarray:
    """Per-layer change as a share of the sample's total descent, (E(Y⁽ᵗ⁾) − E(Y⁽ᵗ⁻¹⁾)) / D: (N, T).
    Scale-free, so neither text length nor the energy's form sets it (−1: the whole descent in one step)."""
    return np.diff(c.energies, axis=1) / descent_scale(c, tol)[:, None]


def spread_ratio(pooled: np.ndarray) -> float:
    """RMS distance of pooled vectors (N, d) from their mean over the norm of the mean."""
    mean = pooled.mean(axis=0)                                     # (d,)
    return float(np.sqrt(((pooled - mean) ** 2).sum(axis=1).mean()) / max(np.linalg.norm(mean), 1e-30))


def beyond_whiskers(values: np.ndarray) -> int:
    """Number of entries of (N, T) outside their column's 1.5·IQR whiskers (the points a box plot calls fliers)."""
    return int(sum(len(box_stats(values[:, t])["fliers"]) for t in range(values.shape[1])))


def cross_terms(c: VariantCurves) -> tuple[np.ndarray, np.ndarray]:
    """What each sub-step does to the *other* term, per sample and layer (N, T) each:
    the attention step's change of the FFN term F(U⁽ᵗ⁾) − F(Y⁽ᵗ⁻¹⁾) and the FFN step's change of the
    attention term A(Y⁽ᵗ⁾) − A(U⁽ᵗ⁾). With each sub-step's own change they add up to E(Y⁽ᵗ⁾) − E(Y⁽ᵗ⁻¹⁾)."""
    E = c.energies                                                 # (N, T+1)
    ffn_at_input = E[:, :-1] - c.attention_before                  # F(Y⁽ᵗ⁻¹⁾) = E − A
    attention_at_output = E[:, 1:] - c.ffn_after                   # A(Y⁽ᵗ⁾) = E − F
    return c.ffn_before - ffn_at_input, attention_at_output - c.attention_after


def _length_correlation(values: np.ndarray, lengths: np.ndarray) -> float | None:
    """Pearson correlation of per-sample values with text length (None when either is constant)."""
    if np.ptp(values) == 0 or np.ptp(lengths) == 0:
        return None
    return float(np.corrcoef(values, lengths)[0, 1])


def curve_summary(c: VariantCurves, tol: float) -> dict:
    """Headline numbers of one variant: shares of lowering steps, rises per layer, energies (raw and per token)."""
    E = c.energies                                                 # (N, T+1)
    layer_ok = lowered(E[:, :-1], E[:, 1:], tol)                  # (N, T)
    rel_rise = (E[:, 1:] - E[:, :-1]) / (1.0 + np.abs(E[:, :-1]))  # (N, T)
    tok = per_token(c)                                             # (N, T+1)
    change = np.diff(tok, axis=1)                                  # (N, T)
    on_ffn, on_attention = (x / c.lengths[:, None] for x in cross_terms(c))  # (N, T) each, per token
    return {
        "label": c.label,
        "d_model": c.d_model,
        "n_curves": int(E.shape[0]),
        "n_layer_steps": int(layer_ok.size),
        "share_monotone": float(layer_ok.all(axis=1).mean()),
        "share_layer_steps_lowering": float(layer_ok.mean()),
        "rising_layer_steps": int((~layer_ok).sum()),
        "share_rising_per_layer": (~layer_ok).mean(axis=0).tolist(),
        "share_attention_steps_lowering": share_lowered(c.attention_before, c.attention_after, tol),
        "share_ffn_steps_lowering": share_lowered(c.ffn_before, c.ffn_after, tol),
        "safeguard": c.safeguard,
        "share_backtracked_layer_steps": float((c.step_scales < 1).mean()),
        "max_relative_layer_rise": float(rel_rise.max()),
        "mean_energy": E.mean(axis=0).tolist(),
        "median_energy": np.median(E, axis=0).tolist(),
        "whisker_shift": lowest_whisker(E),
        "median_energy_per_token": np.median(tok, axis=0).tolist(),
        "median_change_per_token": np.median(change, axis=0).tolist(),
        "median_change_share": np.median(change_share(c, tol), axis=0).tolist(),
        "length_correlation_per_token": _length_correlation(tok[:, -1], c.lengths),
        "median_own_changes_per_token": {
            "attention_step_on_attention_term": np.median((c.attention_after - c.attention_before)
                                                          / c.lengths[:, None], axis=0).tolist(),
            "ffn_step_on_ffn_term": np.median((c.ffn_after - c.ffn_before) / c.lengths[:, None], axis=0).tolist()},
        "median_cross_changes_per_token": {"attention_step_on_ffn_term": np.median(on_ffn, axis=0).tolist(),
                                           "ffn_step_on_attention_term": np.median(on_attention, axis=0).tolist()},
        "points_beyond_whiskers_per_token": beyond_whiskers(tok),
        "pooled_spread_ratio": spread_ratio(c.pooled),
        "accuracy": c.accuracy,
        "accuracy_as_trained": c.accuracy_as_trained,
        "sample_accuracy": c.sample_accuracy,
        "training": c.training,
    }


def summary(result: CurvesResult) -> dict:
    """JSON-serialisable numbers per "formula/variant" plus the data shape."""
    r = result
    return {
        "dataset": r.dataset,
        "embeddings": r.embeddings,
        "embedding_dim": r.embedding_dim,
        "n_samples": int(len(r.lengths)),
        "tokens_per_sample": {"mean": float(r.lengths.mean()), "max": int(r.lengths.max()),
                              "full_mean": float(r.full_lengths.mean()), "full_max": int(r.full_lengths.max())},
        "share_untruncated": float((r.full_lengths <= r.lengths).mean()),
        "majority_rate": r.majority_rate,
        "tolerance": r.tolerance,
        "inputs_pooled_spread_ratio": None if r.inputs_pooled is None else spread_ratio(r.inputs_pooled),
        "curves": {key: curve_summary(c, r.tolerance) for key, c in r.curves.items()},
    }
