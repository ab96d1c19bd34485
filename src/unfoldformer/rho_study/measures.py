"""Measures of the ρ study: what an attention step's kernel does, and how token diversity and energy
evolve over repeated steps (THEORY §3.1, §3.3, §4). Pure functions on tensors; nothing is written.

Attention at a state Y, per head h and real query i (a_i = y_i F_hᵀ, z_ij = ½‖a_i − a_j‖²):
P_ij = ρ'(z_ij) / Σ_j' ρ'(z_ij') over real keys j, the row-normalised weights the step applies
(`energy.pair_weights`, the same weights as the blocked kernel). From P:
- `entropy`: −Σ_j P_ij log P_ij / log n_i (1 = uniform over the sequence, 0 = one key), rows with n_i ≥ 2;
- `self_weight`: P_ii;
- `nearest_share[k]`: Σ of P_ij over the k other tokens nearest to i in z (rows with n_i − 1 ≥ k),
  beside `nearest_uniform[k]` = k / n_i, what a uniform row would give;
- `anchor_share` (anchored attention): 1 / (ν d_i + 1), ν = λ s_h², d_i = Σ_j ρ'(z_ij): the share of the
  update that goes to the token's own input x_i;
- the weight against distance: n_i·P_ij (1 = the uniform weight) binned by z_ij, j ≠ i.

Token diversity of one sequence Y (n real tokens, float64):
- `cosine`: mean cosine similarity over pairs i ≠ j (1 = all tokens parallel);
- `effective_rank`: exp(−Σ p_k log p_k), p = σ / Σσ over the singular values of Y (Roy & Vetterli, 2007);
- `spread`: mean_i ‖y_i − ȳ‖, the mean distance to the sequence mean (0 = collapsed).
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .. import energy as E
from ..rho import Rho

__all__ = ["AttentionStats", "Dynamics", "attention_stats", "bootstrap_mean_ci", "diversity", "run_dynamics",
           "row_weights", "Z_BINS"]

#: Bin edges of z for the weight-against-distance curves (log-spaced, 1e-3 … 1e3, plus 0).
Z_BINS = np.concatenate([[0.0], np.logspace(-3, 3, 25)])
NEAREST = (1, 5, 10)


def row_weights(Y: Tensor, factors: Tensor, rho: str | Rho, padding_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """(P, z): row-normalised step weights and pair distances, both (B, H, n, n) float64; 0 off real pairs."""
    Yd, F = Y.to(torch.float64), factors.to(torch.float64)
    beta = E.pair_weights(Yd, F, rho, padding_mask)                # (B, H, n, n)
    a = E.head_features(Yd, F)                                     # (B, H, n, k)
    sq = (a * a).sum(-1)                                           # (B, H, n)
    z = E.pair_distances(a, a, sq, sq)                             # (B, H, n, n)
    deg = beta.sum(-1, keepdim=True)                               # (B, H, n, 1)
    return beta / deg.clamp_min(torch.finfo(torch.float64).tiny), z


@dataclass
class AttentionStats:
    """Accumulated kernel statistics over batches (means over real rows of every head)."""

    entropy: list[float] = field(default_factory=list)
    self_weight: list[float] = field(default_factory=list)
    nearest_share: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in NEAREST})
    nearest_uniform: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in NEAREST})
    anchor_share: list[float] = field(default_factory=list)
    z_median: list[float] = field(default_factory=list)
    bin_weight: np.ndarray = field(default_factory=lambda: np.zeros(len(Z_BINS) - 1))
    bin_count: np.ndarray = field(default_factory=lambda: np.zeros(len(Z_BINS) - 1))

    def summary(self) -> dict:
        mean = lambda v: float(np.mean(v)) if len(v) else None          # noqa: E731
        with np.errstate(invalid="ignore", divide="ignore"):
            curve = np.where(self.bin_count > 0, self.bin_weight / self.bin_count, np.nan)
        return {"entropy": mean(self.entropy), "entropy_quartiles": _quartiles(self.entropy),
                "self_weight": mean(self.self_weight),
                "nearest_share": {k: mean(v) for k, v in self.nearest_share.items()},
                "nearest_uniform": {k: mean(v) for k, v in self.nearest_uniform.items()},
                "anchor_share": mean(self.anchor_share), "z_median": mean(self.z_median),
                "weight_by_z": {"z_edges": Z_BINS.tolist(), "relative_weight": curve.tolist(),
                                "pairs": self.bin_count.tolist()}}


def _quartiles(values) -> list[float] | None:
    return np.percentile(values, [25, 50, 75]).tolist() if len(values) else None


def attention_stats(stats: AttentionStats, Y: Tensor, factors: Tensor, rho: str | Rho,
                    padding_mask: Tensor | None, nu: Tensor | None = None) -> None:
    """Add one batch: Y (B, n, d), factors (H, k, d); `nu` (H,) = λ s_h² for anchored attention."""
    P, z = row_weights(Y, factors, rho, padding_mask)              # (B, H, n, n)
    B, H, n, _ = P.shape
    valid = torch.ones(B, n, dtype=torch.bool) if padding_mask is None else ~padding_mask
    lengths = valid.sum(1)                                         # (B,)
    rows = valid[:, None, :].expand(B, H, n)                       # (B, H, n) real queries
    size = lengths[:, None, None].expand(B, H, n).to(torch.float64)
    pair = valid[:, None, :, None] & valid[:, None, None, :]       # (B, 1, n, n)
    eye = torch.eye(n, dtype=torch.bool)
    plogp = torch.where(P > 0, P * torch.log(P.clamp_min(1e-300)), torch.zeros((), dtype=P.dtype))
    ent = -plogp.sum(-1) / torch.log(size.clamp_min(2))            # (B, H, n)
    stats.entropy += ent[rows & (size >= 2)].tolist()
    stats.self_weight += P.diagonal(dim1=-2, dim2=-1)[rows].tolist()
    others = torch.where(pair & ~eye, z, torch.full((), math.inf, dtype=z.dtype))   # (B, H, n, n)
    order = others.argsort(-1)                                     # nearest other tokens first
    ranked = P.gather(-1, order)                                   # (B, H, n, n)
    for k in NEAREST:
        if k >= n:
            continue
        ok = rows & (size - 1 >= k)
        stats.nearest_share[k] += ranked[..., :k].sum(-1)[ok].tolist()
        stats.nearest_uniform[k] += (k / size)[ok].tolist()
    if nu is not None:
        beta = E.pair_weights(Y.to(torch.float64), factors.to(torch.float64), rho, padding_mask)
        deg = beta.sum(-1)                                         # (B, H, n)
        stats.anchor_share += (1.0 / (nu.to(torch.float64)[None, :, None] * deg + 1.0))[rows].tolist()
    off = (pair & ~eye).expand(B, H, n, n)
    for b in range(B):                                             # per-sequence median of its head distances
        zb = z[b][off[b]]
        if zb.numel():
            stats.z_median.append(float(zb.median()))
    rel = (P * size[..., None])[off].numpy()                       # n_i P_ij, 1 = uniform
    idx = np.clip(np.searchsorted(Z_BINS, z[off].numpy(), side="right") - 1, 0, len(Z_BINS) - 2)
    stats.bin_weight += np.bincount(idx, weights=rel, minlength=len(Z_BINS) - 1)
    stats.bin_count += np.bincount(idx, minlength=len(Z_BINS) - 1)


def diversity(Y: Tensor, padding_mask: Tensor | None) -> dict[str, Tensor]:
    """Per sequence (B,) float64: mean pairwise cosine similarity, effective rank, mean distance to the mean."""
    Yd = Y.to(torch.float64)
    B, n, _ = Yd.shape
    valid = torch.ones(B, n, dtype=torch.bool) if padding_mask is None else ~padding_mask
    w = valid.to(torch.float64)[..., None]                         # (B, n, 1)
    Yd = Yd * w                                                    # padded rows = 0 (no effect on σ)
    count = w.sum((1, 2))                                          # (B,)
    unit = Yd / Yd.norm(dim=-1, keepdim=True).clamp_min(1e-300)    # (B, n, d)
    total = unit.sum(1).pow(2).sum(-1)                             # Σ_ij cos_ij over real pairs, i = j included
    cosine = (total - count) / (count * (count - 1)).clamp_min(1)
    cosine = torch.where(count >= 2, cosine, torch.full_like(cosine, math.nan))
    # singular values of Y directly (padded rows add 0): a Gram matrix's zero eigenvalue comes out at ±u σ_max²,
    # whose square root √u σ_max would enter the entropy as a spurious direction (~1e-7 of the effective rank)
    sigma = torch.linalg.svdvals(Yd)                               # (B, min(n, d))
    p = sigma / sigma.sum(-1, keepdim=True).clamp_min(1e-300)
    erank = torch.exp(-(torch.where(p > 0, p * torch.log(p.clamp_min(1e-300)), torch.zeros((), dtype=p.dtype))).sum(-1))
    mean = Yd.sum(1, keepdim=True) / count.clamp_min(1)[:, None, None]   # (B, 1, d)
    spread = ((Yd - mean).norm(dim=-1) * w[..., 0]).sum(1) / count.clamp_min(1)
    return {"cosine": cosine, "effective_rank": erank, "spread": spread}


@dataclass
class Dynamics:
    """Per sequence and state t = 0 … T: diversity measures and the energy the steps descend, (N, T + 1)."""

    cosine: list[np.ndarray] = field(default_factory=list)
    effective_rank: list[np.ndarray] = field(default_factory=list)
    spread: list[np.ndarray] = field(default_factory=list)
    energy: list[np.ndarray] = field(default_factory=list)

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: np.concatenate(v, 0) for k, v in vars(self).items() if v}

    def summary(self, times: tuple[int, ...]) -> dict:
        """Means per t of the diversity measures and of the spread retained spread(t) / spread(0); with energies,
        the change in units of the first step's, (E(t) − E(0)) / |E(1) − E(0)| (−1 at t = 1), the relative
        change (E(T) − E(0)) / |E(0)| and the share of sentences whose energy never rises (1e-6 relative
        allowance)."""
        a = self.arrays()
        retained = a["spread"] / np.where(a["spread"][:, :1] > 0, a["spread"][:, :1], np.nan)
        curve = lambda v: np.nanmean(v, 0).tolist()                     # noqa: E731
        out = {"cosine": curve(a["cosine"]), "effective_rank": curve(a["effective_rank"]),
               "spread": curve(a["spread"]), "spread_retained": curve(retained),
               "at": {int(t): {"cosine": float(np.nanmean(a["cosine"][:, t])),
                               "effective_rank": float(np.nanmean(a["effective_rank"][:, t])),
                               "spread_retained": float(np.nanmean(retained[:, t]))}
                      for t in times if t < a["cosine"].shape[1]}}
        e = a["energy"]
        if np.isnan(e).all():
            return out
        tol = 1e-6 * (1 + np.abs(e[:, :-1]))
        first = e[:, 1:2] - e[:, :1]                                   # the first step's change E(1) − E(0)
        out.update(energy_by_first_step=curve((e - e[:, :1]) / np.where(np.abs(first) > 0, np.abs(first), np.nan)),
                   relative_energy_change=float(np.mean((e[:, -1] - e[:, 0]) / np.abs(e[:, 0]).clip(1e-300))),
                   energy_monotone_share=float(np.mean(np.all(np.diff(e, axis=1) <= tol, axis=1))))
        return out


def run_dynamics(dyn: Dynamics, X: Tensor, padding_mask: Tensor | None, steps: int,
                 step: Callable[[Tensor, int], Tensor], energy: Callable[[Tensor, int], Tensor] | None) -> None:
    """Add one batch: Y⁽⁰⁾ = X, Y⁽ᵗ⁺¹⁾ = step(Y⁽ᵗ⁾, t) for t < `steps`; energy(Y, t) is the energy the step
    t descends, evaluated at Y⁽ᵗ⁾ (for t = `steps` with the last step's energy); None: not recorded (NaN)."""
    Y = X
    cols: dict[str, list[np.ndarray]] = {"cosine": [], "effective_rank": [], "spread": [], "energy": []}
    for t in range(steps + 1):
        for key, value in diversity(Y, padding_mask).items():
            cols[key].append(value.numpy())
        cols["energy"].append(np.full(Y.shape[0], np.nan) if energy is None
                              else energy(Y, min(t, steps - 1)).detach().to(torch.float64).numpy())
        if t < steps:
            Y = step(Y, t)
    for key, values in cols.items():
        getattr(dyn, key).append(np.stack(values, 1))


def bootstrap_mean_ci(values: np.ndarray, seed: int, resamples: int = 2000) -> tuple[float, float, float]:
    """(mean, 2.5 %, 97.5 %) of a sample's mean by the percentile bootstrap (NaNs dropped)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, (resamples, v.size))].mean(1)
    return float(v.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))
