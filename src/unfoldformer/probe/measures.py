"""Probe pretrained BERT-style encoders: how close is each layer to a descent step? (THEORY §6).

Implements the measures of THEORY §6 on Hugging Face encoders (BERT, MiniLM, RoBERTa and
other `encoder.layer[i].attention.self.{query,key,value}` models, DistilBERT, MPNet), using
the attention energy of §2 with ρ = −exp(−z) (§3.1), the certified value structure of §3.2
and the fast log-sum-exp energy of §5. Everything is returned as numbers; nothing is
plotted or written here (`probe.report` does that); loading lives in `probe.hf`.

Conventions (row vectors, as in PyTorch; x_i is token i of the layer's input). Head h of a
layer has query q_i = x_i W_Q[h]ᵀ + b_Q[h], key k_j = x_j W_K[h]ᵀ + b_K[h] with W_Q[h], W_K[h]
of shape (d_head, d), and adds ctx_h W_O[h]ᵀ to the output, W_O[h] (d, d_head) the head's
column block of the output projection. Then:

- logit form G_h = scale · W_Q[h]ᵀ W_K[h] (d × d), logit_ij = x_i G_h x_jᵀ (+ bias terms);
  S_h = ½(G_h + G_hᵀ), K_h = ½(G_h − G_hᵀ).
- **skew ratio** ‖K_h‖_F / ‖G_h‖_F ∈ [0, 1]: 0 iff the head is symmetric (W_Q = W_K gives 0).
- **negative eigen-mass** Σ|λ₋(S_h)| / Σ|λ(S_h)| ∈ [0, 1]: 0 iff S_h is PSD, 1 iff S_h is NSD.
- value map M_h = W_V[h]ᵀ W_O[h]ᵀ (d × d): token j contributes (x_j M_h) weighted by attention.
  The certified step (§3.2) has M_h = U_h U_hᵀ, an orthogonal projector of rank d_head.
  **value PSD distance** ‖M − P₊(M)‖_F / ‖M‖_F with P₊(M) = (sym M)₊ the nearest symmetric
  PSD matrix (Higham); **value-structure distance** min_{c ≥ 0, P} ‖M − cP‖_F / ‖M‖_F over
  orthogonal projectors P of rank d_head, in closed form
  sqrt(1 − (Σ_{top d_head} λ(sym M))₊² / (d_head ‖M‖²_F)) (Ky Fan), with c* = (Σ_top λ)₊ / d_head.
  Both are in [0, 1] and 0 for M = c·U Uᵀ.

Energies. Layer ℓ's own energy uses its heads' PSD parts: F_h = diag(√λ₊) Vᵀ from S_h = V diag(λ)
Vᵀ (at most 2·d_head rows, as rank S_h ≤ 2·d_head; the spectrum comes from a 2·d_head-sized
problem, `lowrank_sym_eigh`), so F_hᵀF_h = S_h⁺ and E_ℓ(Y) = Σ_h Σ_{i<j} −exp(−½‖(y_i −
y_j)F_hᵀ‖²) (each unordered pair once, `energy.attention_energy`). Its MM step is softmax of x_i
S_h⁺ x_jᵀ with the key-norm bias (§3.1). **Biases are ignored**: b_Q·k_j is a key-dependent logit
bias and x_i W_Q[h]ᵀ b_K[h] and b_Q·b_K are row constants (cancel in the softmax); none enters
E_ℓ. Relative position terms (MPNet's relative attention bias, BERT's `relative_key`) are ignored
too. Layer ℓ "lowers its own energy" on a sample when E_ℓ(Y⁽ℓ⁺¹⁾) < E_ℓ(Y⁽ℓ⁾), Y⁽ℓ⁾ =
`hidden_states[ℓ]` (a whole layer: attention, FFN, residuals, LayerNorms). Two fixed references
are evaluated at every hidden state 0..L: "mean-form", the one-head energy of the PSD part of the
average logit form over all layers and heads, and "mean-energy", (1/L) Σ_ℓ E_ℓ (all L·H PSD
heads).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..energy import attention_energy
from ..utils import torch_threads
from .hf import MINILM, UnsupportedModelError, layout, load_model, resolve_model_path

__all__ = ["EnergyAnalysis", "HeadMeasures", "LayerWeights", "MINILM", "ProbeResult", "UnsupportedModelError",
           "attention_weights", "energy_analysis", "head_measures", "iter_hidden_states", "layer_factors",
           "load_model", "logit_spectrum", "lowrank_sym_eigh", "negative_eigen_mass", "probe", "psd_factor",
           "random_baseline", "reference_factors", "resolve_model_path", "skew_ratio", "value_psd_distance",
           "value_structure_distance"]

# ----------------------------------------------------------------------------- weights
@dataclass
class LayerWeights:
    """One layer's attention weights per head (row convention, see the module docstring)."""

    W_q: Tensor  # (H, dh, d)
    W_k: Tensor  # (H, dh, d)
    W_v: Tensor  # (H, dh, d)
    W_o: Tensor  # (H, d, dh)
    b_q: Tensor  # (H, dh), ignored by the energies
    b_k: Tensor  # (H, dh), ignored by the energies
    scale: float

    def logit_forms(self) -> Tensor:
        """G_h = scale · W_Q[h]ᵀ W_K[h]: (H, d, d) float64."""
        return self.scale * self.W_q.transpose(1, 2) @ self.W_k

    def value_maps(self) -> Tensor:
        """M_h = W_V[h]ᵀ W_O[h]ᵀ: (H, d, d) float64."""
        return self.W_v.transpose(1, 2) @ self.W_o.transpose(1, 2)


def _split_rows(linear: torch.nn.Linear, H: int) -> tuple[Tensor, Tensor]:
    W = linear.weight.detach().to(torch.float64)                   # (H·dh, d)
    b = torch.zeros(W.shape[0], dtype=W.dtype) if linear.bias is None else linear.bias.detach().double()
    return W.reshape(H, -1, W.shape[1]), b.reshape(H, -1)          # (H, dh, d), (H, dh)


def attention_weights(model) -> list[LayerWeights]:
    """Per-layer, per-head attention weights of a supported model (float64 copies)."""
    H = int(model.config.num_attention_heads)
    out = []
    for q, k, v, o, owner in layout(model)[1]:
        W_q, b_q = _split_rows(q, H)
        W_k, b_k = _split_rows(k, H)
        W_v, _ = _split_rows(v, H)
        W_o = o.weight.detach().to(torch.float64)                  # (d, H·dh)
        W_o = W_o.reshape(W_o.shape[0], H, -1).transpose(0, 1)     # (H, d, dh)
        scale = float(getattr(owner, "scaling", W_q.shape[1] ** -0.5))
        out.append(LayerWeights(W_q, W_k, W_v, W_o, b_q, b_k, scale))
    return out


# ----------------------------------------------------------------------------- head measures
def _ratio(num: Tensor, den: Tensor) -> Tensor:
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.full_like(num, float("nan")))


def skew_ratio(G: Tensor) -> Tensor:
    """‖½(G − Gᵀ)‖_F / ‖G‖_F for (..., d, d) -> (...); NaN for a zero form."""
    K = 0.5 * (G - G.transpose(-1, -2))
    return _ratio(torch.linalg.matrix_norm(K), torch.linalg.matrix_norm(G))


def negative_eigen_mass(lam: Tensor) -> Tensor:
    """Σ|λ₋| / Σ|λ| from eigenvalues (..., m) -> (...); NaN when all are 0."""
    return _ratio(lam.clamp_max(0).abs().sum(-1), lam.abs().sum(-1))


def lowrank_sym_eigh(P: Tensor, Q: Tensor, c: float = 1.0) -> tuple[Tensor, Tensor]:
    """Eigenpairs of S = (c/2)(P Qᵀ + Q Pᵀ), P, Q (..., d, r), through a (2r × 2r) problem.

    Returns λ (..., m) ascending and V (..., d, m), m = min(d, 2r); the remaining d − m
    eigenvalues of S are 0. (A = [P Q] = Q_A R, S = Q_A (R J Rᵀ) Q_Aᵀ, J = (c/2)[[0, I], [I, 0]].)
    """
    r = P.shape[-1]
    Qa, R = torch.linalg.qr(torch.cat([P, Q], -1))                 # (..., d, m), (..., m, 2r)
    J = torch.zeros(2 * r, 2 * r, dtype=P.dtype, device=P.device)
    J[:r, r:] = J[r:, :r] = 0.5 * c * torch.eye(r, dtype=P.dtype, device=P.device)
    lam, W = torch.linalg.eigh(R @ J @ R.transpose(-1, -2))        # (..., m), (..., m, m)
    return lam, Qa @ W


def psd_factor(lam: Tensor, V: Tensor) -> Tensor:
    """F = diag(√λ₊) Vᵀ, so FᵀF = V diag(λ₊) Vᵀ: (..., m), (..., d, m) -> (..., m, d)."""
    return lam.clamp_min(0).sqrt()[..., None] * V.transpose(-1, -2)


def value_psd_distance(M: Tensor, lam: Tensor, V: Tensor) -> Tensor:
    """‖M − (sym M)₊‖_F / ‖M‖_F (nearest symmetric PSD matrix); λ, V eigenpairs of sym M."""
    F = psd_factor(lam, V)                                         # (..., m, d)
    return _ratio(torch.linalg.matrix_norm(M - F.transpose(-1, -2) @ F), torch.linalg.matrix_norm(M))


def value_structure_distance(M: Tensor, lam: Tensor, rank: int) -> tuple[Tensor, Tensor]:
    """(min_{c≥0,P} ‖M − cP‖_F / ‖M‖_F over rank-`rank` orthogonal projectors, best c), (...) each.

    λ: the nonzero-candidate eigenvalues of sym M (..., m); the other d − m are 0. By Ky Fan the best
    P spans the top `rank` eigenvectors, c* = (Σ_top λ)₊ / rank, and for c* > 0

        ‖M − c*P‖² = ‖skew M‖² + Σ_rest λ² + Σ_top (λ − mean_top λ)²,

    a sum of non-negative terms: no cancellation, so a value map that is a scaled projector up to
    round-off gets a distance at round-off level (the equal form ‖M‖² − (Σ_top λ)²/rank cancels).
    """
    d = M.shape[-1]
    full = torch.cat([lam, lam.new_zeros(*lam.shape[:-1], max(0, d - lam.shape[-1]))], -1).sort(-1).values
    top, rest = full[..., -rank:], full[..., :-rank]                # (..., rank), (..., d − rank)
    total = top.sum(-1)
    skew = 0.5 * (M - M.transpose(-1, -2))
    spread = (top - top.mean(-1, keepdim=True)).pow(2).sum(-1)
    dist2 = torch.linalg.matrix_norm(skew).pow(2) + rest.pow(2).sum(-1) + spread
    norm = torch.linalg.matrix_norm(M)
    dist = torch.where(total > 0, _ratio(dist2.sqrt(), norm), _ratio(norm, norm))
    return dist, total.clamp_min(0) / rank


@dataclass
class HeadMeasures:
    """Per-head measures, each (L, H) float64 (definitions in the module docstring)."""

    skew_ratio: np.ndarray
    negative_mass: np.ndarray
    value_psd_distance: np.ndarray
    value_structure_distance: np.ndarray
    value_scale: np.ndarray  # c* of the nearest scaled projector
    logit_norm: np.ndarray   # ‖G_h‖_F


def logit_spectrum(w: LayerWeights) -> tuple[Tensor, Tensor]:
    """Eigenpairs of S_h = sym(G_h) per head: λ (H, m), V (H, d, m), m = min(d, 2·dh)."""
    return lowrank_sym_eigh(w.W_q.transpose(1, 2), w.W_k.transpose(1, 2), w.scale)


def head_measures(weights: Sequence[LayerWeights]) -> HeadMeasures:
    rows = []
    for w in weights:
        G, M = w.logit_forms(), w.value_maps()                     # (H, d, d) each
        lam_s, _ = logit_spectrum(w)                               # (H, m)
        lam_m, V_m = lowrank_sym_eigh(w.W_v.transpose(1, 2), w.W_o)  # sym(W_Vᵀ W_Oᵀ)
        dist, scale = value_structure_distance(M, lam_m, w.W_q.shape[1])
        rows.append([skew_ratio(G), negative_eigen_mass(lam_s), value_psd_distance(M, lam_m, V_m),
                     dist, scale, torch.linalg.matrix_norm(G)])
    cols = [torch.stack(c).numpy() for c in zip(*rows)]            # each (L, H)
    return HeadMeasures(*cols)


def random_baseline(w: LayerWeights, seed: int = 0) -> dict[str, float]:
    """Mean of each head measure for i.i.d. Gaussian weights shaped like layer `w` (chance level)."""
    gen = torch.Generator().manual_seed(seed)
    rand = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (w.W_q, w.W_k, w.W_v, w.W_o)]
    hm = head_measures([LayerWeights(*rand, w.b_q, w.b_k, w.scale)])
    return {k: float(np.nanmean(v)) for k, v in vars(hm).items()}


# ----------------------------------------------------------------------------- energies
def layer_factors(w: LayerWeights) -> Tensor:
    """Factors of layer ℓ's own energy: F_h with F_hᵀF_h = S_h⁺, (H, k, d) float64, where
    k ≤ min(d, 2·dh) is the largest number of positive eigenvalues of any head (zero rows of
    the clipped negative part are dropped; heads with fewer keep some zero rows)."""
    lam, V = logit_spectrum(w)                                     # (H, m) ascending, (H, d, m)
    k = max(1, int((lam > 0).sum(-1).max()))
    return psd_factor(lam[:, -k:], V[:, :, -k:])


def reference_factors(weights: Sequence[LayerWeights]) -> Tensor:
    """The fixed 'mean-form' reference: F with FᵀF = PSD part of the mean G over all layers
    and heads, (1, k, d) float64, k = number of positive eigenvalues."""
    G = torch.cat([w.logit_forms() for w in weights]).mean(0)      # (d, d)
    lam, V = torch.linalg.eigh(0.5 * (G + G.T))                    # (d,), (d, d)
    k = max(1, int((lam > 0).sum()))
    return psd_factor(lam[-k:], V[:, -k:])[None]


def iter_hidden_states(model, tokenizer, texts: Sequence[str], max_length: int = 128,
                       batch_size: int = 32) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (hidden states (L+1, B, n, d), padding_mask (B, n), True = padding) per batch."""
    device = next(model.parameters()).device
    for s in range(0, len(texts), batch_size):
        enc = tokenizer(list(texts[s:s + batch_size]), padding=True, truncation=True,
                        max_length=max_length, return_tensors="pt").to(device)
        with torch.no_grad():
            out = model(**enc, output_hidden_states=True)
        yield torch.stack(out.hidden_states), ~enc["attention_mask"].bool()


@dataclass
class EnergyAnalysis:
    """Energies per sample, float64. layer (N, L, L+1): E_ℓ(Y⁽ᵗ⁾), layer ℓ's own energy at
    hidden state t; reference (N, L+1): the mean-form energy at Y⁽ᵗ⁾; lengths (N,) real tokens."""

    layer: np.ndarray
    reference: np.ndarray
    lengths: np.ndarray

    @property
    def own_in(self) -> np.ndarray:
        return np.diagonal(self.layer, 0, 1, 2)                    # E_ℓ(Y⁽ℓ⁾): (N, L)

    @property
    def own_out(self) -> np.ndarray:
        return np.diagonal(self.layer, 1, 1, 2)                    # E_ℓ(Y⁽ℓ⁺¹⁾): (N, L)

    @property
    def mean_energy(self) -> np.ndarray:
        """(1/L) Σ_ℓ E_ℓ(Y⁽ᵗ⁾), the 'mean-energy' reference: (N, L+1)."""
        return self.layer.mean(1)

    @property
    def references(self) -> dict[str, np.ndarray]:
        """Both fixed references by name, each (N, L+1)."""
        return {"mean-form": self.reference, "mean-energy": self.mean_energy}

    @property
    def own_decreased(self) -> np.ndarray:
        return self.own_out < self.own_in                          # (N, L)

    @property
    def own_relative_change(self) -> np.ndarray:
        """(E_ℓ(Y⁽ℓ⁺¹⁾) − E_ℓ(Y⁽ℓ⁾)) / |E_ℓ(Y⁽ℓ⁾)|, negative = descent: (N, L)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return (self.own_out - self.own_in) / np.abs(self.own_in)


def _batch_energies(states: Tensor, mask: Tensor, own: Sequence[Tensor], ref: Tensor):
    """(B, L, L+1) layer energies and (B, L+1) reference energies of one batch."""
    layer = torch.stack([torch.stack([attention_energy(Y, F, "exp", mask) for Y in states], 1)
                         for F in own], 1)                         # (B, L, L+1)
    return layer, torch.stack([attention_energy(Y, ref, "exp", mask) for Y in states], 1)


def energy_analysis(model, tokenizer, texts: Sequence[str], *, max_length: int = 128,
                    batch_size: int = 32, weights: Sequence[LayerWeights] | None = None,
                    progress: Callable[[int], None] | None = None) -> EnergyAnalysis:
    """Every layer's own energy and the fixed reference at every hidden state, per text.

    Texts are batched in order of length (less padding); results are in the input order.
    """
    weights = attention_weights(model) if weights is None else weights
    own = [layer_factors(w) for w in weights]                      # L × (H, k, d)
    ref = reference_factors(weights)                               # (1, d, d)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    parts = []
    for states, mask in iter_hidden_states(model, tokenizer, [texts[i] for i in order],
                                           max_length, batch_size):
        parts.append((*_batch_energies(states, mask, own, ref), (~mask).sum(1)))
        if progress is not None:
            progress(states.shape[1])
    inverse = np.argsort(order)
    layer, reference, lengths = (torch.cat(p).numpy()[inverse] for p in zip(*parts))
    return EnergyAnalysis(layer, reference, lengths)


# ----------------------------------------------------------------------------- summary
@dataclass
class ProbeResult:
    model_class: str
    heads: HeadMeasures
    energy: EnergyAnalysis
    seconds: float
    notes: list[str] = field(default_factory=list)
    baseline: dict[str, float] = field(default_factory=dict)  # measures of random weights

    def summary(self) -> dict:
        """Headline numbers as plain Python (JSON-ready; NaN stays NaN)."""
        e, rel = self.energy, self.energy.own_relative_change
        per_layer = [{"layer": l, "share_decreased": float(e.own_decreased[:, l].mean()),
                      "mean_relative_change": float(np.nanmean(rel[:, l])),
                      "median_relative_change": float(np.nanmedian(rel[:, l]))}
                     for l in range(e.own_in.shape[1])]
        refs = {k: {"mean": v.mean(0).tolist(), "median": np.median(v, 0).tolist(),
                    "share_decreased_per_step": (np.diff(v, axis=1) < 0).mean(0).tolist()}
                for k, v in e.references.items()}
        heads = {k: getattr(self.heads, k).tolist() for k in HeadMeasures.__dataclass_fields__}
        return {"model_class": self.model_class, "samples": int(e.own_in.shape[0]),
                "seconds": self.seconds, "notes": self.notes, "per_layer": per_layer,
                "reference": refs, "heads": heads, "random_baseline": self.baseline}


def probe(model, texts: Sequence[str], tokenizer=None, *, max_length: int = 128,
          batch_size: int = 32, progress: Callable[[int], None] | None = None,
          num_threads: int | None = 1) -> ProbeResult:
    """Load (if needed) and probe a model: per-head measures and per-layer energies on `texts`.

    `model`: a local folder, 'minilm' or a loaded PreTrainedModel (then pass `tokenizer`
    unless its `name_or_path` folder holds one); `progress(k)` is called after each batch of
    k texts; `num_threads` CPU threads for torch during the probe (restored afterwards).
    """
    start = time.perf_counter()
    model, tokenizer = load_model(model, tokenizer)
    note = layout(model)[2]
    with torch_threads(num_threads):
        weights = attention_weights(model)
        heads, baseline = head_measures(weights), random_baseline(weights[0])
        energy = energy_analysis(model, tokenizer, texts, max_length=max_length,
                                 batch_size=batch_size, weights=weights, progress=progress)
    notes = ["biases b_Q, b_K ignored in the energies"] + ([note] if note else [])
    if getattr(model.config, "position_embedding_type", "absolute") != "absolute":
        notes.append("relative position terms ignored")
    seconds = time.perf_counter() - start
    return ProbeResult(type(model).__name__, heads, energy, seconds, notes, baseline)
