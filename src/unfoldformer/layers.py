"""Unfolded layers as nn.Modules: parameterised descent steps and their energies (THEORY §3, §7.1).

A layer is an attention step followed by an FFN step. Each module exposes the energy its own
step descends — attention modules `energy(Y, X, padding_mask)` (X the anchor), FFN modules
`energy(Y, padding_mask)` — so the layer energy `UnfoldedLayer.energy(Y, X, padding_mask)` is
their sum:

- `AnchoredAttention` (§3.3): isotropic heads s_h U_hᵀ on a learned orthogonal basis;
  energy E_A + λ⁻¹ ½‖Y − X‖².
- `MetricAttention` (§3.1–3.2): per-head PSD metric F_hᵀF_h (F_h = A_h U_hᵀ); energy E_A.
- `SymmetricFFN` (F1, §3.4): W_F = sym(S) with its spectrum kept inside (−r, r), r < 1,
  by parameterisation (eigen-clip or spectral scaling) at every forward, so it holds
  during training; energy E_F (smooth part; the indicator ι_{≥0} is left out, since the
  inputs of the first layer are not non-negative).
- `TiedFFN` (F2): W2 = W1ᵀ; energy E_H.

`UnfoldedLayer` runs the two sub-steps; `traced` also returns the energy terms at its input's
successors (named `EnergyTerms`), which the model's energy curve and safeguard use. Anchored layers
with the tied FFN (or none) run inside the model in their own bases instead (`rotated.py`), with the
same parameters and results; these modules stay the reference for them.

`padding_mask` is a bool (B, n) tensor in which **True marks padding**. `scale` (a float in
[0, 1]) multiplies the step size; the safeguard uses it. Step sizes and λ are checked on
construction with the config's messages (`contracts.check_positive`, `contracts.check_step`):
with `certified=True` (the default) a step outside its certified range is refused, so a stack
built from these modules by hand keeps its certificate or says why not. For a layer with
defaults and `nn.TransformerEncoderLayer` conventions, use `unfoldformer.CertifiedEncoderLayer`.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from . import energy as E
from .bases import orthogonal_basis
from .contracts import check_positive, check_step
from .errors import ConfigError
from .rho import get_rho
from .steps import anchored_attention_step, attention_step, isotropic_factors, symmetric_ffn_step, tied_ffn_step


def _head_subspaces(basis: nn.Module | None, H: int, d: int) -> Tensor | None:
    """Columns of the orthogonal basis split into H heads: (H, d, d/H), or None for contiguous blocks."""
    if basis is None:
        return None
    return basis.weight.reshape(d, H, d // H).permute(1, 0, 2)   # (H, d, dh)


def length_weight(valid: Tensor) -> Tensor:
    """1/n per sample, n = its real tokens (at least 1): (B, n) bool -> (B,) float64 (THEORY §3.7)."""
    return 1.0 / valid.sum(1).clamp_min(1).to(torch.float64)


def _valid(Y: Tensor, padding_mask: Tensor | None) -> Tensor:
    return torch.ones(Y.shape[:2], dtype=torch.bool, device=Y.device) if padding_mask is None else ~padding_mask


#: b = RELATIVE_BIAS_SCALE · θ: Adam moves each θ by about the learning rate per step, so the scale lets a bias
#: reach a few units (a head that prefers one offset by e^b) within a few hundred steps at lr 1e-3.
RELATIVE_BIAS_SCALE = 10.0
#: p = POSITION_PRIOR_SCALE · θ for an encoder's position prior: 30, so that p can move by ~9 in 300 steps at lr
#: 1e-3 (a token among ~500 needs a weight e^p of several hundred to be read by all; on ListOps 10 gave 40.8 %,
#: 30 gave 46.4 %, docs/results/fresh.md).
POSITION_PRIOR_SCALE = 30.0


def position_log_prior(prior: Tensor, valid: Tensor) -> Tensor:
    """Each token's log-weight p_h(k) (B, n, H) from a prior table (H, K), k = the token's rank among its sample's
    real tokens (0 = the first real token, whichever side the padding is on; ranks ≥ K share row K − 1). Padded
    tokens get a value too, which every caller ignores (their keys stay masked)."""
    rank = (valid.cumsum(1) - 1).clamp(0, prior.shape[1] - 1)     # (B, n)
    return prior.T[rank]                                           # (B, n, H)


class AnchoredAttention(nn.Module):
    """Certified anchored multi-head attention: y ← MM step on ½‖Y − X‖² + λ E_A (THEORY §3.3).

    `length_norm`: the attention term weighted by 1/n (n = the sample's real tokens), i.e. λ/n per sample.
    `metric` (THEORY §3.8, `metrics.py`): isotropic heads s_h I (parameter `log_scale`), a diagonal map
    diag(a_h) (`metric_diag` (H, dh)) or a free map A_h (`metric_map` (H, dh, dh)), each starting at
    s_h = dh^{-1/4}. `keys="free"` (causal layers only, `causal.py`): a key map K_h (`key_map` (H, d, dh), in the
    layer's basis) for the context, starting at the tied keys (c A_hᵀ). `relative_bias=K` (causal layers only):
    pair biases b_h(δ) = `RELATIVE_BIAS_SCALE`·θ_h(δ) for offsets δ = 0 … K − 1 (`relative_bias_table` (H, K), 0 at
    first: the layer starts as the one without). `position_prior=K` (encoders, ρ = exp): log-weights
    p_h(k) = `POSITION_PRIOR_SCALE`·θ_h(k) (30) per head for the real-token positions k = 0 … K − 1
    (`position_prior_table` (H, K), 0 at first; later positions share p_h(K − 1)); every pair (i, j) of E_A is
    weighted by e^{p_h(i) + p_h(j)}, symmetric, so the layer keeps one energy of all tokens and its step stays
    certified (docs/theory.md, "Position priors"). `rotary` (THEORY §3.9, `positions.py`):
    RoPE on queries, keys and values (the model runs it in `rotated.py`; this module's energy rotates too, its
    step refuses)."""

    def __init__(self, d: int, n_heads: int, rho: str, lam: float, alpha: float, learn_basis: bool,
                 basis_map: str = "exp", length_norm: bool = False, metric: str = "isotropic",
                 rotary: bool = False, *, certified: bool = True, keys: str = "tied", relative_bias: int = 0,
                 position_prior: int = 0):
        super().__init__()
        check_positive("anchor_weight", lam)
        check_step("alpha_attention", alpha, "anchored", certified=certified)
        self.d, self.H, self.rho, self.lam, self.alpha = d, n_heads, rho, lam, alpha
        self.length_norm, self.metric, self.rotary = length_norm, metric, rotary
        dh = d // n_heads
        s0 = dh ** -0.25
        if metric == "isotropic":
            self.log_scale = nn.Parameter(torch.full((n_heads,), math.log(s0)))  # s_h = dh^{-1/4}
        elif metric == "diagonal":
            self.metric_diag = nn.Parameter(torch.full((n_heads, dh), s0))
        else:
            self.metric_map = nn.Parameter(s0 * torch.eye(dh).repeat(n_heads, 1, 1))
        if keys == "free":                    # causal only: the context's key map K_h (H, d, dh), from the tied one
            blocks = torch.eye(d).reshape(d, n_heads, dh).permute(1, 0, 2)    # (H, d, dh) head h's coordinates
            self.key_map = nn.Parameter(s0 * blocks)
        if relative_bias:                     # causal only: θ_h(δ), δ = i − j; b = RELATIVE_BIAS_SCALE · θ
            self.relative_bias_table = nn.Parameter(torch.zeros(n_heads, relative_bias))
        if position_prior:                    # encoders: θ_h(k), k = rank among real tokens; p = scale · θ
            if get_rho(rho).name != "exp":
                raise ConfigError(f"position_prior needs rho='exp' (the prior rides in the fused pass's key column), "
                                  f"got rho={rho!r}")
            self.position_prior_table = nn.Parameter(torch.zeros(n_heads, position_prior))
        self.basis = orthogonal_basis(d, basis_map) if learn_basis else None

    def pair_bias(self) -> Tensor | None:
        """b_h(δ) (H, K) of a causal layer's relative bias; None without one."""
        table = getattr(self, "relative_bias_table", None)
        return None if table is None else RELATIVE_BIAS_SCALE * table

    def prior(self) -> Tensor | None:
        """p_h(k) (H, K) of an encoder's position prior; None without one."""
        table = getattr(self, "position_prior_table", None)
        return None if table is None else POSITION_PRIOR_SCALE * table

    def log_prior(self, valid: Tensor) -> Tensor | None:
        """Each token's log-weight (B, n, H) (`position_log_prior`); None without a position prior."""
        prior = self.prior()
        return None if prior is None else position_log_prior(prior, valid)

    def maps(self) -> Tensor | None:
        """A_h (H, dh, dh) of a diagonal or free metric; None for isotropic heads."""
        if self.metric == "isotropic":
            return None
        return torch.diag_embed(self.metric_diag) if self.metric == "diagonal" else self.metric_map

    def mu(self) -> Tensor | None:
        """μ_h ≥ λ_max(A_hᵀA_h) (H,) (`metrics.metric_bound`); None for isotropic heads."""
        from .metrics import metric_bound
        A = self.maps()
        return None if A is None else metric_bound(A, self.metric)

    def scales(self) -> Tensor:
        """s_h (H,) of isotropic heads; ones for a diagonal or free metric (the map carries the scale)."""
        if self.metric == "isotropic":
            return self.log_scale.exp()
        return torch.ones(self.H, dtype=self.maps().dtype, device=self.maps().device)

    def log_nu(self) -> Tensor:
        """log ν_h = log(λ s_h²) (H,); log λ for a diagonal or free metric (the step takes μ_h apart)."""
        return math.log(self.lam) + 2 * self.scales().log()

    def subspaces(self) -> Tensor | None:
        return _head_subspaces(self.basis, self.H, self.d)

    def factors(self) -> Tensor:
        """F_h = A_h U_hᵀ (H, dh, d) (A_h = s_h I for isotropic heads)."""
        A = self.maps()
        if A is None:
            return isotropic_factors(self.log_scale.exp(), self.d, self.subspaces())  # (H, dh, d)
        U = self.subspaces()
        if U is None:
            eye = torch.eye(self.d, dtype=A.dtype, device=A.device)
            U = eye.reshape(self.d, self.H, self.d // self.H).permute(1, 0, 2)     # (H, d, dh)
        return A @ U.transpose(1, 2)                               # (H, dh, d)

    def rotate(self, Y: Tensor, inverse: bool = False) -> Tensor:
        """Y (B, n, d) with every head's coordinates rotated by R_i (`positions.rotate_heads`), in original
        coordinates: Σ_h R_i(y_i U_h) U_hᵀ."""
        from .positions import rope_tables, rotate_heads
        B, n, d = Y.shape
        U = self.subspaces()
        C = Y if U is None else Y @ self.basis.weight.to(Y.dtype)  # (B, n, d) head blocks contiguous
        C = rotate_heads(C.view(B, n, self.H, d // self.H), rope_tables(n, d // self.H, Y.dtype, Y.device),
                         inverse).reshape(B, n, d)
        return C if U is None else C @ self.basis.weight.to(Y.dtype).T

    def _plain(self) -> None:
        if self.metric != "isotropic" or self.rotary:
            raise ValueError("this module's step is the isotropic, position-free reference; a diagonal or "
                             "free metric and rotary positions run in the model (rotated.py)")

    def sample_lam(self, valid: Tensor) -> float | Tensor:
        """λ, or λ/n per sample (B,) with length normalisation."""
        return self.lam * length_weight(valid) if self.length_norm else self.lam

    def forward(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> Tensor:
        self._plain()
        valid = _valid(Y, padding_mask)
        return anchored_attention_step(Y, X, self.log_scale.exp(), self.sample_lam(valid), self.rho, self.alpha * scale,
                                       padding_mask, self.subspaces(), certified=False, prior=self.log_prior(valid))

    def energy(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None) -> Tensor:
        Z = self.rotate(Y) if self.rotary else Y                   # E_A of the rotated coordinates (§3.9)
        prior = self.log_prior(_valid(Y, padding_mask))            # (B, n, H) or None
        e_attention = E.attention_energy(Z, self.factors(), self.rho, padding_mask, prior=prior)   # (B,) float64
        if self.length_norm:
            e_attention = e_attention * length_weight(_valid(Y, padding_mask))
        return e_attention + E.anchor_energy(Y, X, padding_mask) / self.lam


class MetricAttention(nn.Module):
    """MM attention with PSD metrics M_h = F_hᵀF_h, F_h = A_h U_hᵀ (THEORY §3.1–3.2).

    One head (the `paper` preset): F = A acts on all d coordinates, value = identity.
    """

    def __init__(self, d: int, n_heads: int, rho: str, alpha: float, learn_basis: bool, basis_map: str = "exp", *,
                 certified: bool = True):
        super().__init__()
        check_step("alpha_attention", alpha, "metric", get_rho(rho), certified=certified)
        self.d, self.H, self.rho, self.alpha = d, n_heads, rho, alpha
        dh = d // n_heads
        self.A = nn.Parameter(torch.empty(n_heads, dh, dh))
        for h in range(n_heads):
            nn.init.xavier_normal_(self.A.data[h])
        self.basis = orthogonal_basis(d, basis_map) if learn_basis else None

    def subspaces(self) -> Tensor | None:
        return _head_subspaces(self.basis, self.H, self.d)

    def factors(self) -> Tensor:
        U = self.subspaces()
        if U is None:
            eye = torch.eye(self.d, dtype=self.A.dtype, device=self.A.device)
            U = eye.reshape(self.d, self.H, self.d // self.H).permute(1, 0, 2)  # (H, d, dh)
        return self.A @ U.transpose(1, 2)                          # (H, dh, d)

    def forward(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> Tensor:
        return attention_step(Y, self.factors(), self.rho, self.alpha * scale, padding_mask,
                              self.subspaces(), certified=False)   # ModelConfig checked α when certified

    def energy(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None) -> Tensor:
        return E.attention_energy(Y, self.factors(), self.rho, padding_mask)


def bounded_symmetric(S: Tensor, bound: float, method: str = "clip") -> Tensor:
    """Symmetric matrix with spectrum inside [−bound, bound] built from a free S (d, d).

    `clip`: eigen-clip of sym(S); `scale`: sym(S) · bound / max(‖sym(S)‖₂, bound).
    """
    sym = 0.5 * (S + S.T)
    if method == "clip":
        evals, evecs = torch.linalg.eigh(sym)
        return (evecs * evals.clamp(-bound, bound)) @ evecs.T
    if method == "scale":
        norm = torch.linalg.matrix_norm(sym, ord=2)
        return sym * (bound / torch.maximum(norm, torch.as_tensor(bound, dtype=sym.dtype)))
    raise ValueError(f"unknown spectrum method {method!r}; valid: clip, scale")


class BoundedSymmetric(nn.Module):
    """Parametrization S ↦ W_F with spec(W_F) ⊂ [−bound, bound] (see `bounded_symmetric`)."""

    def __init__(self, bound: float, method: str):
        super().__init__()
        self.bound, self.method = bound, method

    def forward(self, S: Tensor) -> Tensor:
        return bounded_symmetric(S, self.bound, self.method)


class SymmetricFFN(nn.Module):
    """(F1) Y⁺ = ReLU((1−η)Y + η(Y W_F + 1b)), W_F symmetric with spec(W_F) ⊂ [−r, r], r < 1.

    W_F is a parametrization of a free matrix S, so the bound holds after every optimizer
    step; inside `parametrize.cached()` (the model's forward) it is computed once.
    """

    def __init__(self, d: int, eta: float, relu: bool, bound: float, method: str, *, certified: bool = True):
        super().__init__()
        check_step("alpha_ffn", eta, "symmetric", certified=certified)
        self.eta, self.relu = eta, relu
        self.W_F = nn.Parameter(nn.init.xavier_normal_(torch.empty(d, d)))
        parametrize.register_parametrization(self, "W_F", BoundedSymmetric(bound, method))
        self.b = nn.Parameter(nn.init.xavier_normal_(torch.empty(1, d)).reshape(d))

    @property
    def S(self) -> nn.Parameter:
        """The free matrix behind W_F."""
        return self.parametrizations.W_F.original

    def forward(self, Y: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> Tensor:
        return symmetric_ffn_step(Y, self.W_F, self.b, self.eta * scale, self.relu, padding_mask, certified=False)

    def energy(self, Y: Tensor, padding_mask: Tensor | None) -> Tensor:
        return E.symmetric_ffn_energy(Y, self.W_F, self.b, padding_mask)


class SpectralCap(nn.Module):
    """Parametrisation W = V / max(1, ‖V‖₂): every W has spectral norm ≤ 1 (up to the rounding of ‖V‖₂,
    a few units of the dtype's round-off), and W = V wherever ‖V‖₂ ≤ 1.

    What decides boundedness is τ = max over unit v of ‖ReLU(v W1)‖ ≤ σ = ‖W1‖₂: along v, E_H ≈ −½(τ_v² − 1)t²,
    so E_H is unbounded below iff τ > 1 and the layer energy λE iff γ(τ² − 1) > 1. The cap bounds σ, hence τ:
    ‖ReLU(y W1 + b)‖ ≤ ‖y‖ + ‖b‖, E_H ≥ −‖y‖‖b‖ − ½‖b‖² per token, linear below, which the anchor ½‖Y − X‖²
    dominates, so E is bounded below and has a minimum. It is sufficient, not necessary: τ is the maximum of a
    convex function over the sphere (no closed form; ascent gives only lower bounds, which certify nothing),
    and the preset's W1 at initialisation has σ = 1.48 but τ ≥ 1.18–1.25 (seeds 0–2, 512 ascents each), so
    the cap shrinks W1 by up to σ/τ ≈ 1.2 more than boundedness needs."""

    def forward(self, V: Tensor) -> Tensor:
        norm = torch.linalg.matrix_norm(V, ord=2)                    # σ_max(V), differentiable (SVD)
        return V / norm.clamp_min(1.0)


class TiedFFN(nn.Module):
    """(F2) Y⁺ = (1−α)Y + α ReLU(Y W1 + 1b) W1ᵀ: a standard FFN with W2 = W1ᵀ plus a residual.

    `bound="spectral"`: W1 is parametrised by `SpectralCap` (‖W1‖₂ ≤ 1); `ffn.W1` is then the capped weight
    everywhere it is read, and the state dict stores the free V (`parametrizations.W1.original`)."""

    def __init__(self, d: int, hidden: int, alpha: float, *, certified: bool = True, bound: str = "none"):
        super().__init__()
        check_step("alpha_ffn", alpha, "tied", certified=certified)
        self.alpha = alpha
        self.W1 = nn.Parameter(torch.randn(d, hidden) / math.sqrt(hidden))
        self.b = nn.Parameter(torch.zeros(hidden))
        if bound == "spectral":
            parametrize.register_parametrization(self, "W1", SpectralCap())
        elif bound != "none":
            raise ValueError(f"bound must be none or spectral, got {bound!r}")

    def forward(self, Y: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> Tensor:
        return tied_ffn_step(Y, self.W1, self.b, self.alpha * scale, padding_mask, certified=False)

    def step_and_energy(self, Y: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> tuple[Tensor, Tensor]:
        """The step and E_H at its input from one shared ReLU(Y W1 + 1b)."""
        return tied_ffn_step(Y, self.W1, self.b, self.alpha * scale, padding_mask, return_energy=True,
                             certified=False)

    def energy(self, Y: Tensor, padding_mask: Tensor | None) -> Tensor:
        return E.tied_ffn_energy(Y, self.W1, self.b, padding_mask)


class EnergyTerms(NamedTuple):
    """The two terms of a layer's energy at one state, each (B,) float64."""

    attention: Tensor   # attention term (with the anchor λ⁻¹½‖Y − X‖² for anchored attention)
    ffn: Tensor         # FFN term (0 without an FFN)

    @property
    def total(self) -> Tensor:
        return self.attention + self.ffn

    def put(self, rows: Tensor, other: EnergyTerms) -> EnergyTerms:
        """A copy with `rows` replaced by `other` (which holds only those rows)."""
        return EnergyTerms(*(mine.index_copy(0, rows, theirs) for mine, theirs in zip(self, other)))

    def take(self, rows: Tensor) -> EnergyTerms:
        return EnergyTerms(*(t[rows] for t in self))


class LayerTrace(NamedTuple):
    """A layer applied to a batch, with its energy terms: U = attention step at Y, Y⁺ = FFN step at U."""

    middle: Tensor                       # U (B, n, d)
    output: Tensor                       # Y⁺ (B, n, d)
    at_middle: EnergyTerms | None        # E_ℓ terms at U (None unless the sub-step energies were asked for)
    at_output: EnergyTerms               # E_ℓ terms at Y⁺
    at_input: EnergyTerms | None = None  # E_ℓ terms at Y, when the layer computed them
    input_pass: object | None = None     # the attention pass at Y the step used (`softmax.AttentionPass`), if any
    output_pass: object | None = None    # the attention pass at Y⁺, for the next step from Y⁺ to reuse
    advanced: Tensor | None = None       # Y⁺ already in the next layer's basis (rotated untied stacks), if computed


class UnfoldedLayer(nn.Module):
    """One layer: U = attention step at Y, then Y⁺ = FFN step at U (alternating minimisation, §3.5)."""

    def __init__(self, attention: nn.Module, ffn: nn.Module | None):
        super().__init__()
        self.attention, self.ffn = attention, ffn

    def forward(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> Tensor:
        U = self.attention(Y, X, padding_mask, scale)
        return self.ffn(U, padding_mask, scale) if self.ffn is not None else U

    def traced(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None, scale: float = 1.0,
               substeps: bool = True) -> LayerTrace:
        """The step and the energy terms at Y⁺ and (`substeps`) at U; the tied FFN shares its hidden layer
        with E_H(U)."""
        U = self.attention(Y, X, padding_mask, scale)
        at_middle = None
        if not substeps:
            Y_new = self.ffn(U, padding_mask, scale) if self.ffn is not None else U
        else:
            if isinstance(self.ffn, TiedFFN):
                Y_new, ffn_u = self.ffn.step_and_energy(U, padding_mask, scale)
            else:
                Y_new = self.ffn(U, padding_mask, scale) if self.ffn is not None else U
                ffn_u = self.ffn_energy(U, padding_mask)
            at_middle = EnergyTerms(self.attention.energy(U, X, padding_mask), ffn_u)
        return LayerTrace(U, Y_new, at_middle, self.energy_terms(Y_new, X, padding_mask))

    def ffn_energy(self, Y: Tensor, padding_mask: Tensor | None) -> Tensor:
        if self.ffn is None:
            return torch.zeros(Y.shape[0], dtype=torch.float64, device=Y.device)
        return self.ffn.energy(Y, padding_mask)

    def energy_terms(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None) -> EnergyTerms:
        """E_ℓ's attention and FFN terms at Y (anchored at X), each (B,) float64."""
        return EnergyTerms(self.attention.energy(Y, X, padding_mask), self.ffn_energy(Y, padding_mask))

    def energy(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None) -> Tensor:
        """E_ℓ(Y) as (B,) float64."""
        return self.energy_terms(Y, X, padding_mask).total
