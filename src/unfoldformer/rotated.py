"""Anchored layers run in their own bases: heads as contiguous blocks, no projections (THEORY §3.3, §3.4).

An anchored layer with orthogonal basis Q (d × d, head h owning the columns U_h) acts on Y only
through its coordinates Ỹ = Y Q: head h's coordinates Y U_h are the h-th block of Ỹ (a view), and
the merge Σ_h Δ_h U_hᵀ becomes the concatenation of the Δ_h. Every energy term is invariant under
the change of basis — E_A has features s_h Ỹ_h, ½‖Y − X‖² = ½‖Ỹ − X̃‖², and with W̃ = Qᵀ W1,
E_H(Y) = ½‖Ỹ‖² − ½‖ReLU(Ỹ W̃ + b)‖² — so the whole stack runs in rotated coordinates with the same
parameters and the same result:

- X̃ = X Q once per forward (per distinct layer: once for tied layers);
- tied layers share one basis (Q_ℓ = Q_{ℓ+1}): the state stays in it and only the end maps it back
  (Q_{L+1} = I), by the same product in the plain and the traced forward (bit-identical results);
- untied: the plain forward folds the change of basis from layer ℓ to layer ℓ + 1 into the FFN's weights,
      Ỹ_{ℓ+1} = (1 − α) Ũ Q_ℓᵀ Q_{ℓ+1} + α ReLU(Ũ Q_ℓᵀ W1 + b) (Q_{ℓ+1}ᵀ W1)ᵀ,
  which for α = 1 costs two d × m weight products per forward and nothing per token; the traced forward
  needs the state in both bases and applies Q_ℓᵀ Q_{ℓ+1} after (round-off apart);
- steps at α = 1 skip the arithmetic with α and 1 − α.

Padding: padded rows are zeroed once at the start (finite, whatever they held) and restored from X
once at the end (one `where`). In between they never feed real rows: as keys they carry the logit
−1e30 (`softmax.key_bias`), so they take no attention weight, and the FFN acts row by row.

`RotatedStack` runs the plain forward (`run`) and, for the traced forward and the safeguard in
`model.py`, one layer on a subset of rows in the layer's own basis (`trial`), sharing each state's
attention pass between the energy at that state and the step from it (ρ = exp).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F_nn
from torch import Tensor

from . import energy as E
from .layers import AnchoredAttention, EnergyTerms, LayerTrace, TiedFFN, UnfoldedLayer, length_weight
from .rho import get_rho
from .softmax import AttentionPass, attention_pass, mass_energy
from .steps import anchored_attention_step, anchored_softmax_update, isotropic_factors

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
    W_bias: Tensor | None     # (d + 1, m) [W̃; b], for products without autograd


def _frame(layer: UnfoldedLayer, dtype: torch.dtype) -> _Frame:
    att, ffn = layer.attention, layer.ffn
    Q = None if att.basis is None else att.basis.weight.to(dtype)
    W1 = None if ffn is None else ffn.W1.to(dtype)
    W = W1 if (W1 is None or Q is None) else Q.T @ W1               # (d, m)
    b = None if ffn is None else ffn.b.to(dtype)
    W_bias = None if W is None else torch.cat([W, b[None]], dim=0).detach()   # (d + 1, m)
    return _Frame(Q, att.log_scale.exp().to(dtype), att.log_nu().to(dtype), W1, W, b, layer, W_bias)


def _hidden(Y: Tensor, f: _Frame) -> Tensor:
    """ReLU(Y W̃ + b): (B, n, d) -> (B, n, m). The ReLU acts in place on the product (autograd allows it:
    the product's backward does not read its output). Without autograd the bias rides along as one more
    input column, so the (B, n, m) product is written once instead of over a copy of the bias."""
    B, n, d = Y.shape
    if torch.is_grad_enabled() and (Y.requires_grad or f.W.requires_grad or f.b.requires_grad):
        return torch.addmm(f.b, Y.reshape(B * n, d), f.W).relu_().view(B, n, -1)
    Y1 = torch.cat([Y.reshape(B * n, d), Y.new_ones(B * n, 1)], dim=1)      # (B·n, d + 1)
    return torch.mm(Y1, f.W_bias).relu_().view(B, n, -1)


def sample_log_nu(f: _Frame, valid: Tensor) -> Tensor:
    """log ν_h: (H,), or (B, 1, H) per sample with length normalisation (ν_h = λ s_h²/n, THEORY §3.7)."""
    if not f.layer.attention.length_norm:
        return f.log_nu
    return f.log_nu - valid.sum(1).clamp_min(1).to(f.log_nu.dtype).log()[:, None, None]


def _change(Q_from: Tensor | None, Q_to: Tensor | None) -> Tensor | None:
    """Q_fromᵀ Q_to (d, d), the change from one basis to another; None stands for the identity."""
    if Q_from is None:
        return Q_to
    return Q_from.T if Q_to is None else Q_from.T @ Q_to


def _row_squares(x: Tensor) -> Tensor:
    """‖x_i‖² per row in x's precision: (B, n, k) -> (B, n)."""
    return torch.linalg.vector_norm(x, dim=-1).square()


def _total(rows: Tensor, valid: Tensor) -> Tensor:
    """Σ over real rows in float64: (B, n) -> (B,)."""
    return rows.to(torch.float64).where(valid, 0.0).sum(-1)


class RotatedStack:
    """The anchored stack of `model` on input X (B, n, d) with `valid` (B, n) (True = real), in rotated bases.

    `exact`: the traced forward's energies are float64 evaluations of the states (the layers' operators as
    stored, converted to float64 exactly; the steps stay in X's dtype), for the safeguard (`model.py`)."""

    def __init__(self, model, X: Tensor, valid: Tensor, exact: bool = False):
        self.tied, self.depth = model.config.tied, model.config.depth
        self.frames = [_frame(layer, X.dtype) for layer in model.layers]
        self.exact = exact and X.dtype != torch.float64
        self.frames64 = [_frame(layer, torch.float64) for layer in model.layers] if self.exact else self.frames
        self.exp = get_rho(self.frames[0].layer.attention.rho).softmax
        self.X, self.valid = X, valid
        self._exits: dict[int, tuple[Tensor | None, Tensor | None]] = {}
        # Padded rows never feed real rows (as keys they get the logit −1e30, the FFN is row-wise), so they
        # may hold anything in between: zeroed here to stay finite, restored from X by `finish`.
        X0 = X.where(valid[..., None], 0.0)                          # (B, n, d)
        self.anchors = [X0 if f.Q is None else X0 @ f.Q for f in self.frames]   # (B, n, d) X̃ per distinct layer

    def frame(self, ell: int) -> _Frame:
        return self.frames[0 if self.tied else ell]

    def frame64(self, ell: int) -> _Frame:
        return self.frames64[0 if self.tied else ell]

    def anchor(self, ell: int) -> Tensor:
        return self.anchors[0 if self.tied else ell]

    # ------------------------------------------------------------------ plain forward
    def run(self) -> Tensor:
        """All layers. Tied: each in the one basis, then into original coordinates — the operations of the traced
        forward (`trial`, `advance`), so both return the same hidden states to the bit. Untied: each FFN writes
        the next layer's basis through its folded output weights (`_exit`), which saves a d × d product per
        layer and rounds differently from the traced forward's `advance` (same function to round-off)."""
        Y = self.anchors[0]
        for ell in range(self.depth):
            f = self.frame(ell)
            U, _ = self._attend(f, Y, self.anchor(ell), self.valid, 1.0, None)
            if self.tied:
                Y = self.advance(ell, self._ffn(f, U, 1.0, f.W, None)[0])
            else:
                Y, _ = self._ffn(f, U, 1.0, *self._exit(ell))
        return self.finish(Y)

    def finish(self, Y: Tensor) -> Tensor:
        """Original-coordinate output with the padded rows of X restored: (B, n, d)."""
        return torch.where(self.valid[..., None], Y, self.X)

    def _exit(self, ell: int) -> tuple[Tensor | None, Tensor | None]:
        """(W_out (d, m), turn (d, d) or None) mapping layer ℓ's FFN into the next basis: Q_nextᵀ W1, Q_ℓᵀ Q_next."""
        f = self.frame(ell)
        last = ell == self.depth - 1
        if not last and self.tied:
            return f.W, None
        if ell not in self._exits:
            nxt = None if last else self.frame(ell + 1).Q
            W_out = f.W1 if (f.W1 is None or nxt is None) else nxt.T @ f.W1       # (d, m)
            needs_turn = f.W is None or f.layer.ffn.alpha != 1
            self._exits[ell] = (W_out, _change(f.Q, nxt) if needs_turn else None)
        return self._exits[ell]

    # ------------------------------------------------------------------ the two sub-steps
    def _attend(self, f: _Frame, Y: Tensor, Xr: Tensor, valid: Tensor, scale: float,
                attention: AttentionPass | None) -> tuple[Tensor, AttentionPass | None]:
        """The anchored step (α·scale) in the layer's basis: (B, n, d), and the attention pass at Y (ρ = exp)."""
        att = f.layer.attention
        alpha = att.alpha * scale
        if not self.exp:
            return anchored_attention_step(Y, Xr, f.scales, att.sample_lam(valid), att.rho, alpha, ~valid,
                                           certified=False), None
        B, n, d = Y.shape
        C, Xc = Y.view(B, n, att.H, d // att.H), Xr.view(B, n, att.H, d // att.H)   # (B, n, H, dh) views
        U, attention = anchored_softmax_update(C, Xc, f.scales, sample_log_nu(f, valid), valid, alpha, attention,
                                               certified=False)
        return U.reshape(B, n, d), attention

    def _ffn(self, f: _Frame, U: Tensor, scale: float, W_out: Tensor | None,
             turn: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Y⁺ = (1 − α) U·turn + α ReLU(U W̃ + b) W_outᵀ (turn None: identity), and the hidden layer (B, n, m)."""
        if f.W is None:
            return (U if turn is None else U @ turn), None
        hidden = _hidden(U, f)                                       # (B, n, m)
        Y = F_nn.linear(hidden, W_out)                               # (B, n, d)
        alpha = f.layer.ffn.alpha * scale
        if alpha != 1:
            Y = torch.lerp(U if turn is None else U @ turn, Y, float(alpha))
        return Y, hidden

    # ------------------------------------------------------------------ traced forward
    def start(self) -> Tensor:
        return self.anchors[0]

    def advance(self, ell: int, Y: Tensor) -> Tensor:
        """A state from layer ℓ's basis into layer ℓ + 1's (original coordinates after the last)."""
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
        Y_new, hidden = self._ffn(f, U, scale, f.W, None)
        reuse = self.exp and self.tied and ell < self.depth - 1       # the next step starts from Y_new
        if self.exact:                                               # energies: float64 from the states
            f64, X64 = self.frame64(ell), Xr.double()
            terms = lambda Z: self._terms(f64, Z.double(), X64, valid, None, None)   # noqa: E731
            at_input = terms(Y) if need_input else None
            at_middle = terms(U) if substeps else None
            out_pass = self._pass(f, Y_new, valid, average=True) if reuse else None
            return LayerTrace(U, Y_new, at_middle, terms(Y_new), at_input, in_pass, out_pass)
        at_input = self._terms(f, Y, Xr, valid, in_pass, None) if need_input else None
        at_middle = self._terms(f, U, Xr, valid, None, hidden) if substeps else None
        out_pass = self._pass(f, Y_new, valid, average=reuse)
        at_output = self._terms(f, Y_new, Xr, valid, out_pass, None)
        return LayerTrace(U, Y_new, at_middle, at_output, at_input, in_pass, out_pass if reuse else None)

    def _pass(self, f: _Frame, Y: Tensor, valid: Tensor, average: bool) -> AttentionPass | None:
        if not self.exp:
            return None
        B, n, d = Y.shape
        H = f.layer.attention.H
        return attention_pass(Y.view(B, n, H, d // H), f.scales, valid, average=average)

    def _terms(self, f: _Frame, Y: Tensor, Xr: Tensor, valid: Tensor,
               attention: AttentionPass | None, hidden: Tensor | None) -> EnergyTerms:
        """E_ℓ's terms at Y (this basis): E_A (/n with length normalisation) + λ⁻¹½‖Y − X‖² and E_H, squares
        summed per row then in float64.

        `attention`: the pass at Y (computed when None); `hidden`: ReLU(Y W̃ + b) when known."""
        att = f.layer.attention
        if self.exp:
            attention = attention if attention is not None else self._pass(f, Y, valid, average=False)
            e_attention = mass_energy(attention, valid)
        else:
            factors = isotropic_factors(f.scales, Y.shape[-1])
            e_attention = E.attention_energy(Y, factors, att.rho, ~valid, check_finite=False)
        if att.length_norm:
            e_attention = e_attention * length_weight(valid)        # E_A / n (THEORY §3.7)
        e_attention = e_attention + 0.5 * _total(_row_squares(Y - Xr), valid) / att.lam
        if f.W is None:
            return EnergyTerms(e_attention, torch.zeros_like(e_attention))
        if hidden is None:
            hidden = _hidden(Y, f)                                   # (B, n, m)
        e_ffn = 0.5 * (_total(_row_squares(Y), valid) - _total(_row_squares(hidden), valid))
        return EnergyTerms(e_attention, e_ffn)
