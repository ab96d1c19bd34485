"""Free per-head metrics (THEORY §3.8): query = key = c A_hᵀ, M_h = A_hᵀA_h, value map M_h/μ_h.

`ModelConfig.metric` picks the per-head map of anchored attention (alternating and joint layers):

- ``isotropic``  A_h = s_h I (one scale per head; §3.3, §3.7);
- ``diagonal``   A_h = diag(a_h) (Hyper-SET's per-head diagonal metric), μ_h = max_t a_ht² exactly;
- ``free``       any A_h ∈ ℝ^{k×k}, μ_h = `spectral_bound(A_h)` ≥ λ_max(A_hᵀA_h).

With μ_h ≥ λ_max(M_h) the preconditioned step (κ = λ'/(1 + γ), λ' = λ or λ/n, p = (x̃ + γr̃)/(1 + γ))

    c_i⁺ = c_i − α [κ Σ_j β_ij M_h (c_i − c_j) + (c_i − p_i)] / (κ μ_h d_i + 1),   d_i = Σ_j β_ij,

is THEORY's step divided through by 1 + γ. It descends the layer energy for α ∈ (0, 1] and any A_h,
because L ⊗ M ⪯ μ L ⊗ I ⪯ 2μ D ⊗ I: the Jacobi preconditioner (κμD + I) dominates half the majoriser's
Hessian κ L ⊗ M + I (docs/theory.md, "Positions and free metrics"). Isotropic A_h = s_h I gives M = μ I =
s² I and the step of §3.3 / §3.7 exactly.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .softmax import AttentionPass, attention_pass

__all__ = ["METRICS", "SAFETY", "SQUARINGS", "metric_bound", "metric_kernel_update", "metric_softmax_update",
           "round_up", "spectral_bound"]

METRICS = ("isotropic", "diagonal", "free")
#: Squarings of M in `spectral_bound`: (tr M^p)^{1/p} with p = 2^SQUARINGS overestimates λ_max by ≤ k^{1/p}.
SQUARINGS = 5
#: Relative margin on the float64 evaluation of (tr M^p)^{1/p} (docstring of `spectral_bound`).
SAFETY = 2.0 ** -20


def spectral_bound(A: Tensor) -> Tensor:
    """μ ≥ λ_max(AᵀA) = ‖A‖₂² for each of (…, k, k) maps A: (…,), in A's dtype, differentiable.

    The smaller of two upper bounds of λ_max(M), M = AᵀA PSD, times 1 + `SAFETY`:
    - trace powers: λ_max^p ≤ tr(M^p) ≤ k λ_max^p, so (tr M^p)^{1/p} ∈ [λ_max, k^{1/p} λ_max] (p = 2^SQUARINGS =
      32: exact for rank-1 M, within k^{1/32} ≤ 1.12 for k ≤ 32), evaluated by repeated squaring with the
      trace renormalised at every step (B₀ = M/τ₀, B_{j+1} = B_j²/τ_{j+1}, log tr M^{2^J} = Σ_j 2^{J−j} log τ_j),
      so nothing over- or underflows;
    - Gershgorin: λ_max ≤ max_i Σ_l |M_il| (exact for a diagonal M, so for A = s I or a diagonal A).
    Both in float64. Round-off: every B_j is PSD with trace 1, so each product's entries err by ≤ γ_k relative
    to (|B||B|)_il ≤ 1, the traces by ≤ kγ_k, the log-bound by ≤ Σ_j 2^{−j}·2kγ_k ≤ 4kγ_k; M's entries err by
    ≤ γ_k (|A|ᵀ|A|)_il ≤ γ_k ‖A‖_F² ≤ kγ_k λ_max, so the Gershgorin sum by ≤ k²γ_k λ_max + kγ_k·(its value).
    For k ≤ 64 all of these are below 2^-28 in float64, well inside the margin 2^-20; the result is rounded
    up (never to nearest) when cast to A's dtype. M = 0 gives the smallest normal number instead of 0."""
    M = A.to(torch.float64).transpose(-1, -2) @ A.to(torch.float64)           # (…, k, k) PSD
    tiny = torch.finfo(torch.float64).tiny
    tau = torch.diagonal(M, dim1=-2, dim2=-1).sum(-1).clamp_min(tiny)          # (…,) tr M
    log_bound = tau.log()
    B = M / tau[..., None, None]
    for j in range(1, SQUARINGS + 1):
        B = B @ B
        tau = torch.diagonal(B, dim1=-2, dim2=-1).sum(-1).clamp_min(tiny)      # tr B_{j−1}² ∈ [1/k, 1]
        log_bound = log_bound + tau.log() / 2 ** j
        B = B / tau[..., None, None]
    gershgorin = M.abs().sum(-1).amax(-1).clamp_min(tiny)                      # (…,) max_i Σ_l |M_il|
    mu = torch.minimum(log_bound.exp(), gershgorin) * (1 + SAFETY)
    return round_up(mu, A.dtype)


def round_up(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x (float64) in `dtype`, rounded towards +∞ (the cast rounds to nearest, which may go down)."""
    y = x.to(dtype)
    if dtype == torch.float64:
        return y
    below = y.detach().to(torch.float64) < x.detach()
    up = torch.nextafter(y.detach(), torch.full_like(y.detach(), float("inf")))
    return torch.where(below, y + (up - y.detach()), y)                        # value rounded up, gradient kept


def metric_bound(A: Tensor, kind: str) -> Tensor:
    """μ_h of per-head maps A (H, k, k): exact max a² for a diagonal map, `spectral_bound` for a free one."""
    if kind == "diagonal":                                                     # float64 square, rounded up
        return round_up(torch.diagonal(A, dim1=-2, dim2=-1).to(torch.float64).square().amax(-1), A.dtype)
    return spectral_bound(A)


def metric_softmax_update(C: Tensor, P: Tensor, A: Tensor, mu: Tensor, log_kappa: Tensor, valid: Tensor,
                          alpha: float = 1.0, attention: AttentionPass | None = None,
                          prior: Tensor | None = None) -> tuple[Tensor, AttentionPass]:
    """The step of the module doc for ρ = exp on head coordinates, and the off-diagonal pass it used.

    C, P (B, n, H, k): coordinates c_i and anchors p_i per head (heads contiguous); A (H, k, k) the maps,
    mu (H,) their bounds μ_h; log_kappa (H,) or (B, 1, H) log κ; `valid` (B, n). With the off-diagonal
    pass (S_i, o_i; β_ii = 1 split off, d_i = 1 + S_i): Σ_j β_ij M(c_i − c_j) = S_i M(c_i − o_i), so
        c_i⁺ = c_i − α [κ S_i M(c_i − o_i) + (c_i − p_i)] / (κ μ (1 + S_i) + 1).
    Returns c⁺ (B, n, H, k) and the pass. `prior` (B, n, H): a position prior's log-weights (pairs weighted by
    e^{p_i + p_j}; S_i and o_i from `softmax.attention_pass` with it; the self weight 1 stays: any self weight ≥ 0
    keeps the bound)."""
    if attention is None or attention.average is None or attention.diagonal:
        attention = attention_pass(C, None, valid, metric=A, prior=prior)
    kappa = log_kappa.to(C.dtype).exp()                                        # (H,) or (B, 1, H)
    S = attention.log_mass.exp()                                               # (B, n, H), 0 with no other token
    denom = kappa * mu.to(C.dtype) * (1 + S) + 1                               # (B, n, H)
    Ad = A.to(C.dtype)
    diff = torch.einsum("bnhk,hjk->bnhj", C - attention.average, Ad)           # (B, n, H, k) (c − o) Aᵀ
    pull = torch.einsum("bnhj,hjk->bnhk", diff, Ad)                            # (B, n, H, k) M (c − o)
    grad = (kappa * S)[..., None] * pull + (C - P)                             # (B, n, H, k)
    return C - (alpha / denom)[..., None] * grad, attention


def metric_kernel_update(C: Tensor, P: Tensor, A: Tensor, mu: Tensor, kappa: Tensor, valid: Tensor, rho,
                         alpha: float = 1.0) -> Tensor:
    """The same step for any ρ through the blocked kernel, on (B, H, n, k) coordinates and anchors; `kappa`
    (H,) or (B, H) (broadcast as (·, H, 1, 1)). Σ_j β_ij M(c_i − c_j) = M(d_i c_i − Σ_j β_ij c_j)."""
    from .kernels import weighted_average
    Ad = A.to(C.dtype)
    a = torch.einsum("bhnk,hjk->bhnj", C, Ad)                                  # (B, H, n, k) c Aᵀ
    num, deg = weighted_average(a, C, valid, rho)                              # (B, H, n, k), (B, H, n, 1)
    diff = torch.einsum("bhnk,hjk->bhnj", deg * C - num, Ad)
    pull = torch.einsum("bhnj,hjk->bhnk", diff, Ad)                            # M(d c − Σ β c)
    kappa = kappa.reshape(-1, C.shape[1], 1, 1) if kappa.dim() > 1 else kappa[:, None, None]
    denom = kappa * mu.to(C.dtype)[:, None, None] * deg + 1                    # (·, H, n, 1)
    return C - alpha * (kappa * pull + (C - P)) / denom
