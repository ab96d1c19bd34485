"""Anchored layers run in their own bases: heads as contiguous blocks, no projections (THEORY §3.3, §3.4).

An anchored layer with orthogonal basis Q (d × d, head h owning the columns U_h) acts on Y only
through its coordinates Ỹ = Y Q: head h's coordinates Y U_h are the h-th block of Ỹ (a view), and
the merge Σ_h Δ_h U_hᵀ becomes the concatenation of the Δ_h. Every energy term is invariant under
the change of basis — E_A has features s_h Ỹ_h, ½‖Y − X‖² = ½‖Ỹ − X̃‖², and with W̃ = Qᵀ W1,
E_H(Y) = ½‖Ỹ‖² − ½‖ReLU(Ỹ W̃ + b)‖² — so the whole stack runs in rotated coordinates with the same
parameters and the same result:

- X̃ = X Q once per forward (per distinct layer: once for tied layers);
- tied layers share one basis (Q_ℓ = Q_{ℓ+1}): the state stays in it and only the end maps it back
  (Q_{L+1} = I);
- untied: each layer's output turns into the next layer's basis by Q_ℓᵀ Q_{ℓ+1} (d × d per token).
  Folding that turn into the FFN's output weights would save the product but round differently from the
  traced forward, which needs the state in both bases; both forwards therefore run the same operations
  and return bit-identical hidden states, tied or untied (THEORY §3.10, "plain = traced");
- steps at α = 1 skip the arithmetic with α and 1 − α.

Padding: padded rows are zeroed once at the start (finite, whatever they held) and restored from X
once at the end (one `where`). In between they never feed real rows: as keys they carry the logit
−1e30 (`softmax.key_bias`), so they take no attention weight, and the FFN acts row by row.

`RotatedStack` runs the plain forward (`run`) and, for the traced forward and the safeguard in
`model.py`, one layer on a subset of rows in the layer's own basis (`trial`), sharing each state's
attention pass between the energy at that state and the step from it (ρ = exp).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F_nn
from torch import Tensor

from . import energy as E
from .descent import descent_tolerance
from .kernels import weighted_average
from .layers import (
    AnchoredAttention,
    EnergyTerms,
    LayerTrace,
    TiedFFN,
    UnfoldedLayer,
    length_weight,
    position_log_prior,
)
from .metrics import metric_kernel_update, metric_softmax_update, spectral_bound
from .positions import rope_tables, rotate_heads
from .rho import get_rho
from .softmax import AttentionPass, attention_pass, mass_energy
from .steps import anchored_attention_step, anchored_softmax_update, isotropic_factors, toward

__all__ = ["RotatedStack", "runs_rotated"]


def runs_rotated(layer: UnfoldedLayer) -> bool:
    """Whether `RotatedStack` runs this layer: anchored attention followed by the tied FFN or none."""
    return isinstance(layer.attention, AnchoredAttention) and (layer.ffn is None or isinstance(layer.ffn, TiedFFN))


class _Frame(NamedTuple):
    """One layer's operators in its own basis, computed once per forward."""

    Q: Tensor | None          # (d, d) orthogonal basis; None: contiguous heads (no learned basis)
    scales: Tensor            # (H,) s_h
    log_nu: Tensor            # (H,) log(λ s_h²)
    W1: Tensor | None         # (d, m) tied FFN weight in original coordinates; None without FFN
    W: Tensor | None          # (d, m) Qᵀ W1: the same weight in this basis
    b: Tensor | None          # (m,)
    layer: UnfoldedLayer
    A: Tensor | None = None   # (H, dh, dh) maps A_h of a diagonal or free metric (§3.8); None: isotropic
    mu: Tensor | None = None  # (H,) μ_h ≥ λ_max(A_hᵀA_h)
    K: Tensor | None = None   # (H, d, dh) the causal context's key map (keys="free"); None: keys = queries
    bias: Tensor | None = None  # (H, K) causal pair biases b_h(δ), δ = i − j (relative_bias=K); None: none
    prior: Tensor | None = None  # (H, K) an encoder's position prior p_h(k) (position_prior=K); None: none


def _frame(layer: UnfoldedLayer, dtype: torch.dtype) -> _Frame:
    """The layer's operators in its own basis. Without autograd (evaluation, inference) they are computed once
    and reused while the layer's parameters and buffers are unchanged: the key holds each tensor's storage and
    version counter, which every in-place update (optimizer step, `load_state_dict`, `.to()`) changes, so a
    stale frame is never returned. With autograd they are always recomputed (the graph must reach them)."""
    state = _state(layer)
    if torch.is_grad_enabled() or any(t.is_inference() for t in state):   # inference tensors have no version
        return _build_frame(layer, dtype)
    key = tuple((t.data_ptr(), t._version, t.device) for t in state)
    cache = layer.__dict__.setdefault("_frame_cache", {})          # dtype -> (key, frame); not in the state dict
    if dtype not in cache or cache[dtype][0] != key:
        cache[dtype] = (key, _build_frame(layer, dtype))
    return cache[dtype][1]


def _frames(layers, dtype: torch.dtype) -> list[_Frame]:
    """Every layer's frame (`_frame`). With autograd and several free-metric layers (untied), their bounds μ_h come
    from one `metrics.spectral_bound` call over all their maps stacked: the same per-head values (every head's
    squarings are its own), one batched pass and its backward instead of one per layer (half the time at 4 × 4
    heads of 32 × 32)."""
    free = [layer for layer in layers if getattr(layer.attention, "metric", None) == "free"]
    if not torch.is_grad_enabled() or len(free) < 2:
        return [_frame(layer, dtype) for layer in layers]
    maps = [layer.attention.maps() for layer in free]
    bounds = dict(zip(map(id, free), spectral_bound(torch.cat(maps)).split([A.shape[0] for A in maps])))
    return [_build_frame(layer, dtype, bounds.get(id(layer))) for layer in layers]


def _state(layer: UnfoldedLayer) -> list[Tensor]:
    return [*layer.parameters(), *(b for b in layer.buffers() if b is not None)]


def _build_frame(layer: UnfoldedLayer, dtype: torch.dtype, mu: Tensor | None = None) -> _Frame:
    """`mu`: the layer's μ_h when already computed (`_frames`)."""
    att, ffn = layer.attention, layer.ffn
    Q = None if att.basis is None else att.basis.weight.to(dtype)
    W1 = None if ffn is None else ffn.W1.to(dtype)
    W = W1 if (W1 is None or Q is None) else Q.T @ W1               # (d, m)
    b = None if ffn is None else ffn.b.to(dtype)
    A = att.maps()
    mu = None if A is None else (att.mu() if mu is None else mu).to(dtype)
    K = getattr(att, "key_map", None)
    bias = att.pair_bias() if hasattr(att, "pair_bias") else None
    prior = att.prior() if hasattr(att, "prior") else None
    return _Frame(Q, att.scales().to(dtype), att.log_nu().to(dtype), W1, W, b, layer,
                  None if A is None else A.to(dtype), mu, None if K is None else K.to(dtype),
                  None if bias is None else bias.to(dtype), None if prior is None else prior.to(dtype))


def _hidden(Y: Tensor, f: _Frame) -> Tensor:
    """ReLU(Y W̃ + b): (B, n, d) -> (B, n, m), one `addmm`, the same arithmetic with and without autograd. The ReLU
    acts in place on the product (autograd allows it: the product's backward does not read its output). Carrying the
    bias as one more input column instead (inference until 2026-12-05) costs two more operations per layer and was
    no faster (docs/results/speed.md, "Where users run it")."""
    B, n, d = Y.shape
    return torch.addmm(f.b, Y.reshape(B * n, d), f.W).relu_().view(B, n, -1)


def sample_log_nu(f: _Frame, valid: Tensor) -> Tensor:
    """log ν_h: (H,), or (B, 1, H) per sample with length normalisation (ν_h = λ s_h²/n, THEORY §3.7)."""
    if not f.layer.attention.length_norm:
        return f.log_nu
    return f.log_nu - valid.sum(1).clamp_min(1).to(f.log_nu.dtype).log()[:, None, None]


def _step_log_nu(f: _Frame, valid: Tensor, ffn_weight: bool) -> Tensor:
    """`sample_log_nu`, less log(1 + γ) with `ffn_weight` (`RotatedStack.log_nu`)."""
    log_nu = sample_log_nu(f, valid)
    if not ffn_weight:
        return log_nu
    gamma = f.layer.gamma
    return log_nu - (torch.log1p(gamma) if isinstance(gamma, Tensor) else math.log1p(gamma))


def block_factors(f: _Frame, d: int) -> Tensor:
    """The factors (H, dh, d) of contiguous heads in a layer's basis: s_h I, or A_h on head h's block."""
    if f.A is None:
        return isotropic_factors(f.scales, d)
    H, dh, _ = f.A.shape
    factors = f.A.new_zeros(H, dh, H, dh)
    factors[torch.arange(H), :, torch.arange(H)] = f.A                        # (H, dh, H, dh) A_h on block h
    return factors.reshape(H, dh, d)


def _change(Q_from: Tensor | None, Q_to: Tensor | None) -> Tensor | None:
    """Q_fromᵀ Q_to (d, d), the change from one basis to another; None stands for the identity."""
    if Q_from is None:
        return Q_to
    return Q_from.T if Q_to is None else Q_from.T @ Q_to


def _row_squares(x: Tensor) -> Tensor:
    """‖x_i‖² per row, accumulated in float64 (a float32 row sum errs by up to k·u‖x_i‖², which the energies'
    differences cannot afford: descent.py): (B, n, k) -> (B, n) float64."""
    return torch.linalg.vector_norm(x, dim=-1, dtype=torch.float64).square()


def _total(rows: Tensor, valid: Tensor) -> Tensor:
    """Σ over real rows in float64: (B, n) -> (B,)."""
    return rows.to(torch.float64).where(valid, 0.0).sum(-1)


class RotatedStack:
    """The anchored stack of `model` on input X (B, n, d) with `valid` (B, n) (True = real), in rotated bases.

    `exact`: the traced forward's energies are float64 evaluations of the states (the layers' operators as
    stored, converted to float64 exactly; the steps stay in X's dtype), for the safeguard (`model.py`)."""

    def __init__(self, model, X: Tensor, valid: Tensor, exact: bool = False):
        self.tied, self.depth = model.config.tied, model.config.depth
        self.frames = _frames(model.layers, X.dtype)
        self.exact = exact and X.dtype != torch.float64
        self.frames64 = _frames(model.layers, torch.float64) if self.exact else self.frames
        self.exp = get_rho(self.frames[0].layer.attention.rho).softmax
        self.rotary = self.frames[0].layer.attention.rotary
        self._rope: dict[torch.dtype, tuple[Tensor, Tensor]] = {}
        self.X, self.valid = X, valid
        self._next_weights: dict[int, Tensor | None] = {}            # `next_weight`, per layer, once per forward
        self._priors: dict[int, Tensor] = {}                        # `token_prior` of the whole batch, per frame
        self._log_nus: dict[tuple[int, bool], Tensor] = {}          # `log_nu` of the whole batch, per frame and kind
        # Padded rows never feed real rows (as keys they get the logit −1e30, the FFN is row-wise), so they
        # may hold anything in between: zeroed here to stay finite, restored from X by `finish`.
        X0 = X.where(valid[..., None], 0.0)                          # (B, n, d)
        self.anchors = [X0 if f.Q is None else X0 @ f.Q for f in self.frames]   # (B, n, d) X̃ per distinct layer

    def rot(self, C: Tensor, inverse: bool = False) -> Tensor:
        """R_i c_i per token and head, C (B, n, H, dh) (R_iᵀ c_i with `inverse`); C itself without rotary positions
        (THEORY §3.9: every step and energy of a rotary stack works on the rotated coordinates)."""
        if not self.rotary:
            return C
        if C.dtype not in self._rope:
            self._rope[C.dtype] = rope_tables(C.shape[1], C.shape[-1], C.dtype, C.device)
        return rotate_heads(C, self._rope[C.dtype], inverse)

    def heads(self, Y: Tensor, H: int) -> Tensor:
        """(B, n, d) -> (B, n, H, dh) rotated head coordinates."""
        B, n, d = Y.shape
        return self.rot(Y.view(B, n, H, d // H))

    def unheads(self, C: Tensor) -> Tensor:
        """(B, n, H, dh) rotated head coordinates -> (B, n, d) in the layer's basis."""
        B, n, H, dh = C.shape
        return self.rot(C, inverse=True).reshape(B, n, H * dh)

    def _anchored(self, f: _Frame, C: Tensor, P: Tensor, valid: Tensor, log_nu: Tensor, alpha: float | Tensor,
                  attention: AttentionPass | None) -> tuple[Tensor, AttentionPass | None]:
        """The anchored step on head coordinates C towards anchors P (B, n, H, dh): isotropic heads (§3.3, log ν =
        log(λ' s²)) or a diagonal / free metric (§3.8, log κ = log λ'), ρ = exp from the fused pass, other ρ from
        the blocked kernel. Returns the new coordinates (B, n, H, dh) and the pass (ρ = exp)."""
        att = f.layer.attention
        if self.exp:
            prior = self.token_prior(f, valid)                     # (B, n, H) or None
            if f.A is None:
                return anchored_softmax_update(C, P, f.scales, log_nu, valid, alpha, attention, certified=False,
                                               prior=prior)
            return metric_softmax_update(C, P, f.A, f.mu, log_nu, valid, alpha, attention, prior=prior)
        H = att.H
        Ct, Pt = C.transpose(1, 2), P.transpose(1, 2)              # (B, H, n, dh)
        nu = log_nu.exp()
        if f.A is not None:
            U = metric_kernel_update(Ct, Pt, f.A, f.mu, nu.reshape(-1, H) if nu.dim() > 1 else nu, valid,
                                     get_rho(att.rho), alpha)
            return U.transpose(1, 2), None
        num, deg = weighted_average(f.scales[None, :, None, None] * Ct, Ct, valid, get_rho(att.rho))
        nu = nu.reshape(-1, H)[:, :, None, None] if nu.dim() > 1 else nu[:, None, None]
        target = (nu * num + Pt) / (nu * deg + 1)                   # (B, H, n, dh)
        U = toward(Ct, target, alpha)
        return U.transpose(1, 2), None

    def token_prior(self, f: _Frame, valid: Tensor) -> Tensor | None:
        """Each token's position-prior log-weight (B, n, H) for the rows `valid` (B, n); None without a prior. For
        the whole batch it is computed once per frame and forward (a tied stack's every step and energy share it)."""
        if f.prior is None:
            return None
        if valid is not self.valid:                                 # a subset of rows (the safeguard's retries)
            return position_log_prior(f.prior, valid)
        if id(f) not in self._priors:
            self._priors[id(f)] = position_log_prior(f.prior, valid)
        return self._priors[id(f)]

    def log_nu(self, f: _Frame, valid: Tensor, ffn_weight: bool = False) -> Tensor:
        """`sample_log_nu` (H,) or (B, 1, H) for the rows `valid`, less log(1 + γ) with `ffn_weight` (the joint step's
        ν/(1 + γ)). For the whole batch it is computed once per frame and forward, as `token_prior`: with length
        normalisation it is seven operations on (B, n) that every layer of a tied stack would repeat."""
        if valid is not self.valid:                                 # a subset of rows (the safeguard's retries)
            return _step_log_nu(f, valid, ffn_weight)
        key = (id(f), ffn_weight)
        if key not in self._log_nus:
            self._log_nus[key] = _step_log_nu(f, valid, ffn_weight)
        return self._log_nus[key]

    def frame(self, ell: int) -> _Frame:
        return self.frames[0 if self.tied else ell]

    def frame64(self, ell: int) -> _Frame:
        return self.frames64[0 if self.tied else ell]

    def anchor(self, ell: int) -> Tensor:
        return self.anchors[0 if self.tied else ell]

    # ------------------------------------------------------------------ plain forward
    def run(self) -> Tensor:
        """All layers, each in its own basis, then into original coordinates: the operations of the traced
        forward (`trial`, `advance`), so both return the same hidden states to the bit."""
        Y = self.anchors[0]
        for ell in range(self.depth):
            f = self.frame(ell)
            U, _ = self._attend(f, Y, self.anchor(ell), self.valid, 1.0, None)
            W_next = self.next_weight(ell, 1.0)
            if W_next is not None:                                   # the FFN's output straight into the next basis
                Y = F_nn.linear(_hidden(U, f), W_next)               # (B, n, d)
            else:
                Y = self.advance(ell, self._ffn(f, U, 1.0)[0])
        return self.finish(Y)

    def next_weight(self, ell: int, scale: float) -> Tensor | None:
        """Layer ℓ's FFN output weight in the next layer's basis, Q_{ℓ+1}ᵀ W1 (d, m) (W1 after the last layer: original
        coordinates), for untied layers whose FFN step is the FFN's output (α·scale = 1): then Y⁺ Q_ℓᵀ Q_{ℓ+1} =
        ReLU(Ũ W̃ + b)(Q_{ℓ+1}ᵀ W1)ᵀ, one (d, m) product per layer and forward instead of a (d, d) product per
        token. None for tied layers, where no turn is needed, or where the step mixes in U (α·scale < 1)."""
        f = self.frame(ell)
        if self.tied or f.W1 is None or f.layer.ffn.alpha * scale != 1:
            return None
        if ell not in self._next_weights:
            Q_next = None if ell == self.depth - 1 else self.frame(ell + 1).Q
            if f.Q is None and Q_next is None:                       # no turn at all (`_change` is the identity)
                self._next_weights[ell] = None
            else:
                self._next_weights[ell] = f.W1 if Q_next is None else Q_next.T @ f.W1
        return self._next_weights[ell]

    def finish(self, Y: Tensor) -> Tensor:
        """Original-coordinate output with the padded rows of X restored: (B, n, d)."""
        return torch.where(self.valid[..., None], Y, self.X)

    # ------------------------------------------------------------------ the two sub-steps
    def _attend(self, f: _Frame, Y: Tensor, Xr: Tensor, valid: Tensor, scale: float,
                attention: AttentionPass | None) -> tuple[Tensor, AttentionPass | None]:
        """The anchored step (α·scale) in the layer's basis: (B, n, d), and the attention pass at Y (ρ = exp)."""
        att = f.layer.attention
        alpha = att.alpha * scale
        if not self.exp and f.A is None and not self.rotary:
            return anchored_attention_step(Y, Xr, f.scales, att.sample_lam(valid), att.rho, alpha, ~valid,
                                           certified=False), None
        C, Xc = self.heads(Y, att.H), self.heads(Xr, att.H)         # (B, n, H, dh) (rotated with rotary)
        U, attention = self._anchored(f, C, Xc, valid, self.log_nu(f, valid), alpha, attention)
        return self.unheads(U), attention

    def _ffn(self, f: _Frame, U: Tensor, scale: float) -> tuple[Tensor, Tensor | None]:
        """Y⁺ = (1 − α) U + α ReLU(U W̃ + b) W̃ᵀ in the layer's basis, and the hidden layer (B, n, m)."""
        if f.W is None:
            return U, None
        hidden = _hidden(U, f)                                       # (B, n, m)
        Y = F_nn.linear(hidden, f.W)                                 # (B, n, d)
        alpha = f.layer.ffn.alpha * scale
        if alpha != 1:
            Y = torch.lerp(U, Y, float(alpha))
        return Y, hidden

    # ------------------------------------------------------------------ traced forward
    def start(self) -> Tensor:
        return self.anchors[0]

    def advance(self, ell: int, Y: Tensor, advanced: Tensor | None = None) -> Tensor:
        """A state from layer ℓ's basis into layer ℓ + 1's (original coordinates after the last); `advanced`: the
        same state already there (`next_weight`), which is then returned."""
        if advanced is not None:
            return advanced
        if self.tied and ell < self.depth - 1:
            return Y
        turn = _change(self.frame(ell).Q, None if ell == self.depth - 1 else self.frame(ell + 1).Q)
        return Y if turn is None else Y @ turn

    def trial(self, ell: int, Y: Tensor, rows: Tensor | None, carry: AttentionPass | None, scale: float,
              substeps: bool, need_input: bool) -> LayerTrace:
        """Layer ℓ at step scale `scale` on `rows` (None: all) of Y, in its own basis, with its energy terms.

        `carry`: the attention pass at Y (reused, not recomputed); `need_input`: also E_ℓ's terms at Y."""
        f = self.frame(ell)
        Xr = self.anchor(ell) if rows is None else self.anchor(ell)[rows]
        valid = self.valid if rows is None else self.valid[rows]
        if carry is None and need_input and self.exp and not self.exact:   # one pass for E_ℓ at Y and the step
            carry = self._pass(f, Y, valid, average=True)
        U, in_pass = self._attend(f, Y, Xr, valid, scale, carry)
        Y_new, hidden = self._ffn(f, U, scale)
        W_next = self.next_weight(ell, scale)
        advanced = None if W_next is None else F_nn.linear(hidden, W_next)   # (B, n, d) Y⁺ in the next basis
        reuse = self.exp and self.tied and ell < self.depth - 1       # the next step starts from Y_new
        if self.exact:                                               # energies: float64 from the states
            f64, X64 = self.frame64(ell), Xr.double()
            terms = lambda Z: self._terms(f64, Z.double(), X64, valid, None, None)   # noqa: E731
            at_input = terms(Y) if need_input else None
            at_middle = terms(U) if substeps else None
            out_pass = self._pass(f, Y_new, valid, average=True) if reuse else None
            return LayerTrace(U, Y_new, at_middle, terms(Y_new), at_input, in_pass, out_pass, advanced)
        at_input = self._terms(f, Y, Xr, valid, in_pass, None) if need_input else None
        at_middle = self._terms(f, U, Xr, valid, None, hidden) if substeps else None
        out_pass = self._pass(f, Y_new, valid, average=reuse)
        at_output = self._terms(f, Y_new, Xr, valid, out_pass, None)
        return LayerTrace(U, Y_new, at_middle, at_output, at_input, in_pass, out_pass if reuse else None, advanced)

    def _pass(self, f: _Frame, Y: Tensor, valid: Tensor, average: bool) -> AttentionPass | None:
        if not self.exp:
            return None
        C = self.heads(Y, f.layer.attention.H)                      # (B, n, H, dh)
        return attention_pass(C, f.scales if f.A is None else None, valid, average=average, metric=f.A,
                              prior=self.token_prior(f, valid))

    def _terms(self, f: _Frame, Y: Tensor, Xr: Tensor, valid: Tensor, attention: AttentionPass | None,
               hidden: Tensor | None, hidden_squares: Tensor | None = None, ffn_scale: float | Tensor = 1.0
               ) -> EnergyTerms:
        """E_ℓ's terms at Y (this basis): E_A (/n with length normalisation) + λ⁻¹½‖Y − X‖² and `ffn_scale`·E_H,
        squares summed per row then in float64.

        `attention`: the pass at Y (computed when None); `hidden`: ReLU(Y W̃ + b) when known, or its row squares
        `hidden_squares` (B, n). A float64 evaluation whose E_A round-off bound (`energy.attention_error_bound`)
        exceeds a quarter of the tolerance the energy is judged with (the states' dtype) takes E_A from explicit
        pair differences for those samples instead (`_exact_attention`)."""
        att = f.layer.attention
        B, n, d = Y.shape
        exact = Y.dtype == torch.float64                            # float64 evaluation: its error is bounded below
        C = None
        if self.exp:
            attention = attention if attention is not None else self._pass(f, Y, valid, average=False)
            e_attention = mass_energy(attention, valid)
            slopes = -e_attention.detach()                          # Σ_{i<j} e^{−z_ij} = |E_A|
        else:
            C = self.heads(Y, att.H)                                # (B, n, H, dh) rotated coordinates (rotary)
            Z = E.centred_states(C.reshape(B, n, d), valid)         # (B, n, d)
            e_attention, slopes = E.gram_attention_energy(Z, block_factors(f, d), get_rho(att.rho), valid,
                                                          slopes=exact)
        weight = length_weight(valid) if att.length_norm else None  # 1/n (THEORY §3.7)
        anchor = 0.5 * _total(_row_squares(Y - Xr), valid) / att.lam
        if f.W is None:
            e_ffn = torch.zeros_like(e_attention)
        else:
            if hidden_squares is None:
                hidden_squares = _row_squares(_hidden(Y, f) if hidden is None else hidden)   # (B, n)
            e_ffn = 0.5 * (_total(_row_squares(Y), valid) - _total(hidden_squares, valid)) * ffn_scale
        if exact:
            e_attention = self._exact_attention(f, Y, C, valid, e_attention, slopes, weight, anchor + e_ffn)
        if weight is not None:
            e_attention = e_attention * weight
        return EnergyTerms(e_attention + anchor, e_ffn)

    def _exact_attention(self, f: _Frame, Y: Tensor, C: Tensor | None, valid: Tensor, e_attention: Tensor,
                         slopes: Tensor, weight: Tensor | None, rest: Tensor) -> Tensor:
        """E_A with the samples whose float64 round-off bound 4γ_{k+4}R²·Σρ' (times w) exceeds
        ¼·descent_tolerance(states' dtype)·(1 + |E|) recomputed from explicit pair differences (tokens spread
        far apart, with some pairs close: the Gram form's u·R² then outweighs the tolerance; docs/theory.md,
        "Numerics of the fast paths"). `C`: Y's head coordinates (B, n, H, dh) when known. (B,) float64."""
        att = f.layer.attention
        B, n, d = Y.shape
        if n < 2:
            return e_attention
        C = self.heads(Y, att.H) if C is None else C                # (B, n, H, dh) rotated coordinates
        w = 1.0 if weight is None else weight
        bound = w * E.attention_error_bound(_radius_sq(f, C, valid), slopes, C.shape[-1])   # (B,)
        total = (w * e_attention + rest).detach()
        far = bound > 0.25 * descent_tolerance(self.X.dtype) * (1 + total.abs())
        if not bool(far.any()):
            return e_attention
        rows = far.nonzero()[:, 0]
        exact = E.pair_difference_energy(C.reshape(B, n, d)[rows], block_factors(f, d), att.rho, valid[rows],
                                         self.token_prior(f, valid[rows]))
        return e_attention.index_put((rows,), exact)


def _radius_sq(f: _Frame, C: Tensor, valid: Tensor) -> Tensor:
    """R² = max over heads and real tokens of ‖a_i − mean‖², the features a = s_h c (or c A_hᵀ) that the pass and
    the Gram form centre, from head coordinates C (B, n, H, dh) with the layer's block-diagonal factors applied
    per head (B·n·d work, not a d × d product): (B,) float64."""
    real = valid[..., None, None]                                    # (B, n, 1, 1)
    Cd = C.to(torch.float64).where(real, 0.0)
    mean = Cd.sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp_min(1)   # (B, 1, H, dh)
    Cc = (Cd - mean).detach()
    if f.A is None:
        a = Cc * f.scales.detach().to(torch.float64)[:, None]        # (B, n, H, dh) s_h (c_i − mean)
    else:
        a = torch.einsum("bnhk,hjk->bnhj", Cc, f.A.detach().to(torch.float64))   # (c_i − mean) A_hᵀ
    return a.square().sum(-1).where(valid[..., None], 0.0).amax(dim=(1, 2))   # (B,)
