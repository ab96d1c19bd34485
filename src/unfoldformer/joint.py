"""The joint layer: one MM step on the whole layer energy (THEORY §3.7).

Layer energy, in the library's units (the anchored attention's E_A + λ⁻¹½‖Y − X‖², so that at γ = λ
the alternating and the joint layer share one energy):

    E(Y) = w E_A(Y) + λ⁻¹ (½‖Y − X‖² + γ E_H(Y)),   E_H = ½‖Y‖² − ½‖ReLU(Y W₁ + 1b)‖²,

λ E is THEORY's λ'E_A + ½‖Y − X‖² + γE_H with λ' = wλ (w = 1, or 1/n per sample with
`attention_norm="length"`). Both non-quadratic parts are majorised at the current state Y⁰: ρ concave
gives the Laplacian quadratic of §3.1 with β_ij = ρ'(z_ij(Y⁰)); −½‖ReLU(Y W₁ + b)‖² is concave, so it
lies below its tangent, −⟨R, Y − Y⁰⟩ with R = ReLU(Y⁰W₁ + b) W₁ᵀ (the tied FFN's output). The
majoriser separates per head block c = Y U_h with Hessian νL + (1 + γ)I (ν_h = λ' s_h²), and the
Jacobi step with P = νD + (1 + γ)I is

    c_i⁺ = (1 − α) c_i + α (ν Σ_j β_ij c_j + x̃_i + γ r̃_i) / (ν d_i + 1 + γ),   d_i = Σ_j β_ij,

which descends for α ∈ (0, 1] and any W₁, b, bases, scales, λ > 0, γ ≥ 0 (docs/theory.md, "Joint
layer"). It is the anchored step of §3.3 with the anchor p = (x̃ + γ r̃)/(1 + γ) and ν/(1 + γ) in place
of x̃ and ν, so the fused softmax pass (`steps.anchored_softmax_update`) computes it unchanged; other ρ
go through the blocked kernel (`kernels.weighted_average`). Attention and FFN both read Y⁰.

Energy curve: the step at Y⁽ᵗ⁾ computes the off-diagonal pass at Y⁽ᵗ⁾ (log S_i, hence E_A) and the
hidden layer ReLU(Y⁽ᵗ⁾W̃ + b) (hence E_H), so E(Y⁽ᵗ⁾) costs only sums; a tied model's curve needs one
more pass and hidden layer, at the last state (`JointStack.trial` carries them from layer to layer).
The safeguard (`safeguard=True`) still works for this layer but never shortens its step: every full step
already lowers E in exact arithmetic (and, with centred energies, under float64 evaluation). A float32 state
near a fixed point can still rise by its own rounding (docs/theory.md, "Rounding the state"); the safeguard
then keeps the previous state for that sample at once (scale 0), since a shorter step does not help.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F_nn
from torch import Tensor, nn

from . import energy as E
from .errors import ConfigError
from .layers import AnchoredAttention, EnergyTerms, LayerTrace, TiedFFN, UnfoldedLayer, _valid
from .rotated import RotatedStack, _Frame, _frame, _hidden, _row_squares
from .softmax import AttentionPass
from .steps import anchored_attention_step, head_values

__all__ = ["JointCarry", "JointLayer", "JointStack"]

#: θ₀ of a learned step size α = α_max (a + (1 − a) σ(θ)): σ(4) = 0.982, near the fixed step's α_max.
LEARNED_STEP_LOGIT = 4.0
#: a: the learned step size's floor, as a fraction of α_max.
LEARNED_STEP_FLOOR = 1e-3
#: Largest starting γ of learned step sizes: φ₀ = log(e^γ − 1) needs e^γ finite in float64 (γ < 709.78).
MAX_LEARNED_FFN_WEIGHT = 700.0


class JointLayer(UnfoldedLayer):
    """Anchored attention and the tied FFN as one MM step (module doc), in original coordinates.

    The step size is `attention.alpha` (certified range (0, 1]); `gamma` (γ ≥ 0) weights the FFN term;
    `ffn.alpha` is not used. `learn_steps`: α and γ are learned, α = α_max (a + (1 − a) σ(θ)) in
    [a α_max, α_max] (a = 10⁻³) and γ = softplus(φ) ≥ 0, inside the certified ranges for every θ, φ (one
    pair per layer; a tied model's steps share one, so its energy stays one function). The model runs this
    layer in its own basis (`JointStack`); this module is the reference for it."""

    def __init__(self, attention: AnchoredAttention, ffn: TiedFFN, gamma: float, learn_steps: bool = False,
                 causal: bool = False):
        super().__init__(attention, ffn)
        self.learn_steps = bool(learn_steps)
        self.causal = bool(causal)                 # token i sees j ≤ i: one MM step per token (§3.11, `causal.py`)
        if self.learn_steps:              # α ∈ [10⁻³ α_max, α_max], γ = softplus(φ) ≥ 0: certified for any θ, φ
            if not gamma > 0:
                raise ConfigError(f"learned step sizes need ffn_weight > 0 to start from, got {gamma:g}")
            if not gamma <= MAX_LEARNED_FFN_WEIGHT:     # φ₀ = log(e^γ − 1): e^γ overflows float64 beyond ~709.78
                raise ConfigError(f"learned step sizes need ffn_weight <= {MAX_LEARNED_FFN_WEIGHT:g} "
                                  f"(softplus start log(e^γ − 1) overflows beyond), got {gamma:g}")
            self.step_logit = nn.Parameter(torch.tensor(LEARNED_STEP_LOGIT))
            self.ffn_weight_raw = nn.Parameter(torch.tensor(math.log(math.expm1(gamma))))
        else:
            self._gamma = float(gamma)

    @property
    def gamma(self) -> float | Tensor:
        """γ ≥ 0: a float, or a learned 0-dim tensor softplus(φ) with `learn_steps` (0 where it underflows)."""
        return F_nn.softplus(self.ffn_weight_raw) if self.learn_steps else self._gamma

    def step_size(self) -> float | Tensor:
        """α: `attention.alpha`, or the learned α_max (a + (1 − a) σ(θ)) ∈ [a α_max, α_max], a = 10⁻³
        (α_max = `attention.alpha` ≤ 1): the floor keeps α > 0 where σ(θ) underflows (θ ≲ −88 in float32)."""
        alpha = self.attention.alpha
        if not self.learn_steps:
            return alpha
        # α_max (1 − (1 − a) σ(−θ)): the same number, written so that rounding never takes it above α_max
        return alpha * (1 - (1 - LEARNED_STEP_FLOOR) * torch.sigmoid(-self.step_logit))

    def anchor_mix(self, X: Tensor, R: Tensor) -> Tensor:
        """p = (X + γ R)/(1 + γ): the anchor of the equivalent anchored step."""
        gamma = self.gamma
        if not isinstance(gamma, Tensor):
            return X if gamma == 0 else torch.lerp(X, R, gamma / (1 + gamma))
        return torch.lerp(X, R, (gamma / (1 + gamma)).to(X.dtype))

    def forward(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None, scale: float = 1.0) -> Tensor:
        att, ffn = self.attention, self.ffn
        if self.causal:                                             # the causal step in the layer's basis
            from .causal import causal_joint_step
            f, valid = _frame(self, Y.dtype), _valid(Y, padding_mask)
            Yb, Xb = (Z.where(valid[..., None], 0.0) for Z in (Y, X.to(Y.dtype)))   # (B, n, d) padded rows zeroed
            if f.Q is not None:
                Yb, Xb = Yb @ f.Q, Xb @ f.Q
            out = causal_joint_step(f, Yb, Xb, valid, self.step_size() * scale, att.rotary)   # (B, n, d)
            return torch.where(valid[..., None], out if f.Q is None else out @ f.Q.T, Y)
        att._plain()
        R = F_nn.linear(torch.relu(F_nn.linear(Y, ffn.W1.T, ffn.b)), ffn.W1)        # (B, n, d) ReLU(YW1 + b)W1ᵀ
        valid = _valid(Y, padding_mask)
        return anchored_attention_step(Y, self.anchor_mix(X.to(Y.dtype), R), att.log_scale.exp(),
                                       att.sample_lam(valid) / (1 + self.gamma), att.rho, self.step_size() * scale,
                                       padding_mask, att.subspaces(), prior=att.log_prior(valid))

    def traced(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None, scale: float = 1.0,
               substeps: bool = True) -> LayerTrace:
        """One step: no intermediate state (U = Y⁺, its terms those at Y⁺)."""
        Y_new = self(Y, X, padding_mask, scale)
        at_output = self.energy_terms(Y_new, X, padding_mask)
        return LayerTrace(Y_new, Y_new, at_output if substeps else None, at_output)

    def ffn_energy(self, Y: Tensor, padding_mask: Tensor | None) -> Tensor:
        """(γ/λ) E_H(Y), (B,) float64."""
        return self.ffn.energy(Y, padding_mask) * (self.gamma / self.attention.lam)


class JointCarry(NamedTuple):
    """What a joint step at Y needs and the energy at Y reuses, computed once per state: the off-diagonal pass
    (ρ = exp), the FFN's output r̃ = ReLU(Ỹ W̃ + b) W̃ᵀ and the hidden layer's row squares. The hidden layer
    itself (B, n, m) is not kept: at most one is alive at a time, as in the plain forward."""

    attention: AttentionPass | None   # pass at Y (with its average when a step follows); None for other ρ
    ffn_output: Tensor | None         # (B, n, d) r̃; None when no step follows from Y
    hidden_squares: Tensor            # (B, n) ‖ReLU(ỹ_i W̃ + b)‖², float64


class JointStack(RotatedStack):
    """The joint layers of `model` in rotated bases (`rotated.py`): the same frames, anchors and bases."""

    def run(self) -> Tensor:
        Y = self.start()
        for ell in range(self.depth):
            f = self.frame(ell)
            Y = self._joint(f, Y, self.anchor(ell), self.valid, 1.0, None)
            Y = self.advance(ell, Y)
        return self.finish(Y)

    def _joint(self, f: _Frame, Y: Tensor, Xr: Tensor, valid: Tensor, scale: float,
               attention: AttentionPass | None, R: Tensor | None = None) -> Tensor:
        """The joint step (α·scale) in the layer's basis from Y (B, n, d): Y⁺.

        `R` (B, n, d): the FFN's output r̃ = ReLU(Ỹ W̃ + b) W̃ᵀ at Y (None: computed); `attention`: the pass at Y
        when already computed (ρ = exp: without a pass the step takes the one with the diagonal, which gives no
        energy)."""
        att = f.layer.attention
        alpha = f.layer.step_size() * scale
        if f.layer.causal:                                          # one MM step per token (§3.11, `causal.py`)
            from .causal import causal_joint_step
            return causal_joint_step(f, Y, Xr, valid, alpha, self.rotary)
        R = F_nn.linear(_hidden(Y, f), f.W) if R is None else R    # (B, n, d)
        P = f.layer.anchor_mix(Xr, R)                               # (B, n, d) (x̃ + γ r̃)/(1 + γ)
        log_nu = self.log_nu(f, valid, ffn_weight=True)            # (H,) or (B, 1, H): log(ν/(1 + γ)) or log κ
        H = att.H
        C, Pc = self.heads(Y, H), self.heads(P, H)                  # (B, n, H, dh) (rotated with rotary, §3.9)
        U, _ = self._anchored(f, C, Pc, valid, log_nu, alpha, attention)
        return self.unheads(U)

    def _carry(self, f: _Frame, Y: Tensor, valid: Tensor, step_follows: bool = True) -> JointCarry:
        hidden = _hidden(Y, f)                                      # (B, n, m), dropped on return
        R = F_nn.linear(hidden, f.W) if step_follows else None     # (B, n, d)
        return JointCarry(self._pass(f, Y, valid, average=step_follows), R, _row_squares(hidden))

    def _joint_terms(self, f: _Frame, Y: Tensor, Xr: Tensor, valid: Tensor, carry: JointCarry | None) -> EnergyTerms:
        """E_ℓ's terms at Y from the pass and hidden row squares at Y (None: computed): (w E_A + λ⁻¹½‖Y − X‖²,
        (γ/λ) E_H)."""
        # γ/λ in float64: a float32 γ (learned steps) over λ would round the quotient to float32, an error of
        # u₃₂·|(γ/λ)E_H| in the energy (above the float32 tolerance where E_H is large)
        scale = torch.as_tensor(f.layer.gamma, dtype=torch.float64) / torch.as_tensor(f.layer.attention.lam,
                                                                                       dtype=torch.float64)
        if carry is None:
            return self._terms(f, Y, Xr, valid, None, None, ffn_scale=scale)
        return self._terms(f, Y, Xr, valid, carry.attention, None, carry.hidden_squares, ffn_scale=scale)

    def trial(self, ell: int, Y: Tensor, rows: Tensor | None, carry: JointCarry | None, scale: float,
              substeps: bool, need_input: bool) -> LayerTrace:
        """Layer ℓ at step scale `scale` on `rows` (None: all) of Y, with E_ℓ at Y⁺ (and at Y: `need_input`).

        `carry`: pass, FFN output and hidden row squares at Y (reused); the trace's `output_pass` carries those at
        Y⁺ when the next layer is the same (tied), so every state's pass and hidden layer are computed once."""
        f = self.frame(ell)
        Xr = self.anchor(ell) if rows is None else self.anchor(ell)[rows]
        valid = self.valid if rows is None else self.valid[rows]
        carry = self._carry(f, Y, valid) if carry is None else carry
        Y_new = self._joint(f, Y, Xr, valid, scale, carry.attention, carry.ffn_output)
        reuse = self.tied and ell < self.depth - 1                  # the next step starts from Y_new
        if self.exact:                                              # the safeguard's float64 evaluations
            f64, X64 = self.frame64(ell), Xr.double()
            terms = lambda Z: self._joint_terms(f64, Z.double(), X64, valid, None)   # noqa: E731
            at_input, at_output = terms(Y) if need_input else None, terms(Y_new)
            out = self._carry(f, Y_new, valid) if reuse else None
        else:
            at_input = self._joint_terms(f, Y, Xr, valid, carry) if need_input else None
            out = self._carry(f, Y_new, valid, step_follows=reuse)
            at_output = self._joint_terms(f, Y_new, Xr, valid, out)
        return LayerTrace(Y_new, Y_new, at_output if substeps else None, at_output, at_input, carry,
                          out if reuse else None)


def joint_energy_reference(Y: Tensor, X: Tensor, layer: JointLayer, padding_mask: Tensor | None) -> Tensor:
    """The joint layer's energy from `energy.py` alone, in float64 (original coordinates): (B,)."""
    att, ffn = layer.attention, layer.ffn
    Yd, Xd = Y.double(), X.double()
    factors = att.factors().double()
    Zd = att.rotate(Yd) if att.rotary else Yd                     # rotary: E_A of R_i c_i (THEORY §3.9)
    prior = att.log_prior(_valid(Y, padding_mask))                # (B, n, H) or None
    e_attention = E.attention_energy(Zd, factors, att.rho, padding_mask, method="gram",
                                     prior=None if prior is None else prior.double())
    if att.length_norm:
        e_attention = e_attention / _valid(Y, padding_mask).sum(1).clamp_min(1).double()
    e_ffn = E.tied_ffn_energy(Yd, ffn.W1.double(), ffn.b.double(), padding_mask)
    return e_attention + (E.anchor_energy(Yd, Xd, padding_mask) + layer.gamma * e_ffn) / att.lam


def head_coordinates(Y: Tensor, layer: JointLayer) -> Tensor:
    """Y's coordinates per head (B, H, n, dh) in the layer's basis."""
    return head_values(Y, layer.attention.H, layer.attention.subspaces())
