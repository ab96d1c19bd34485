"""The joint MM layer (THEORY §3.7, docs/theory.md "Joint layer"): whole-layer descent by construction.

Every case draws an adversarial token set (`strategies.token_sets`: far clusters, offsets up to 1e3, norms
1e-3…1e3, identical tokens, n = 1, all-but-one padding, float32 and float64), a random layer (every ρ:
exp, log, lp, linear, truncated; tied or untied, α ∈ (0, 1], γ ∈ [0, 10] or both learned (α = α_max σ(θ),
γ = softplus(φ), θ ∈ [−8, 8], φ ∈ [−6, 3]), attention_norm none or length, W₁ free or capped at ‖W₁‖₂ ≤ 1
(`ffn_bound`), learned basis or contiguous
heads, λ, scales, W₁ of any norm, bias) and checks the step against THEORY's formula and its energy.
The independent evaluation is written here in float64 from explicit pair differences (never the library's
Gram path) on the very states the model stepped between, in
the layer's own basis (contiguous heads s_h, W̃ = QᵀW₁, X̃ = XQ: the energy the rotated stack descends;
for float64 states it is the original-coordinate energy to round-off, checked in
`test_the_energy_is_the_original_coordinates_energy`).
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import close_tol, examples
from strategies import RHOS, token_sets
from unfoldformer import energy as E
from unfoldformer.config import ModelConfig
from unfoldformer.descent import descent_tolerance, lowered
from unfoldformer.errors import ConfigError
from unfoldformer.joint import LEARNED_STEP_FLOOR, LEARNED_STEP_LOGIT, JointLayer, JointStack
from unfoldformer.model import UnfoldedTransformer
from unfoldformer.rho import get_rho
from unfoldformer.rotated import RotatedStack

D64 = torch.float64
DIMS = {1: (1,), 2: (1, 2), 4: (1, 2), 6: (2, 3), 8: (2, 4)}     # d -> head counts that divide it


# ----------------------------------------------------------------------------- cases
@st.composite
def layers(draw, dtype: torch.dtype, d: int, layer: str = "joint", prior: bool = False):
    """A random model of one layer kind on width d (depth 2: tied, or untied with two bases). `prior`: ρ = exp
    with a position prior of 1–5 positions, log-weights p drawn in ±3 (pair weights e^{p_i + p_j} up to e^6)."""
    rho = "exp" if prior else draw(st.sampled_from(RHOS))
    overrides = dict(d_model=d, n_heads=draw(st.sampled_from(DIMS[d])), depth=2, tied=draw(st.booleans()),
                     rho=rho, ffn_hidden=draw(st.sampled_from([1, 4, 16])), learn_basis=draw(st.booleans()),
                     anchor_weight=draw(st.floats(0.05, 20.0)),
                     alpha_attention=draw(st.sampled_from([1.0, draw(st.floats(1e-3, 1.0))])),
                     attention_norm=draw(st.sampled_from(["none", "length"])), layer=layer,
                     ffn_bound=draw(st.sampled_from(["none", "spectral"])))
    learned = None
    if layer == "joint":
        overrides["ffn_weight"] = draw(st.sampled_from([0.0, 1.0, draw(st.floats(0.0, 10.0))]))
        if overrides["ffn_weight"] > 0 and draw(st.booleans()):   # learned α = α_max σ(θ), γ = softplus(φ)
            overrides["learn_steps"] = True
            learned = draw(st.floats(-8.0, 8.0)), draw(st.floats(-6.0, 3.0))
    else:
        overrides["alpha_ffn"] = overrides["alpha_attention"]
    if prior:
        overrides["position_prior"] = draw(st.sampled_from([1, 2, 5]))
        prior_scale = draw(st.sampled_from([0.01, 0.1]))            # θ in ±scale, p = 30 θ
    seed = draw(st.integers(0, 2**31 - 1))
    w_scale, b_scale = draw(st.floats(0.05, 3.0)), draw(st.floats(0.0, 3.0))
    log_scale = draw(st.floats(-2.0, 1.0))
    torch.manual_seed(seed)
    model = UnfoldedTransformer(ModelConfig.preset("certified-alternating", **overrides)).to(dtype)
    with torch.no_grad():
        for lay in model.layers:
            m = lay.ffn.W1.shape[1]
            free_w1(lay.ffn).normal_().mul_(w_scale / math.sqrt(m))
            lay.ffn.b.uniform_(-1, 1).mul_(b_scale)
            lay.attention.log_scale.add_(torch.randn_like(lay.attention.log_scale)).clamp_(-3, 1).add_(log_scale / 2)
            if lay.attention.basis is not None:
                lay.attention.basis.parametrizations.weight.original.normal_()
            if learned is not None:
                lay.step_logit.fill_(learned[0]), lay.ffn_weight_raw.fill_(learned[1])
            if prior:
                lay.attention.position_prior_table.uniform_(-prior_scale, prior_scale)
    return model.eval()


def number(x) -> float:
    """A step size or weight as a float: fixed (a float) or learned (a 0-dim tensor)."""
    return float(x.detach()) if isinstance(x, torch.Tensor) else float(x)


def free_w1(ffn) -> torch.Tensor:
    """The stored weight behind `ffn.W1`: W1 itself, or V of the spectral cap (W1 = V / max(1, ‖V‖₂))."""
    return ffn.parametrizations.W1.original if hasattr(ffn, "parametrizations") else ffn.W1


@st.composite
def cases(draw, layer: str = "joint", dtype: torch.dtype | None = None, prior: bool = False):
    dtype = draw(st.sampled_from([torch.float32, D64])) if dtype is None else dtype
    d = draw(st.sampled_from(sorted(DIMS)))
    batch = draw(token_sets(d=d, dtype=dtype, with_input=True, max_n=6))
    return batch, draw(layers(dtype, d, layer, prior))


def stack_of(model, X, pad):
    cls = JointStack if isinstance(model.layers[0], JointLayer) else RotatedStack
    return cls(model, X, ~pad)


def pair_attention_energy(Yd: torch.Tensor, scales: torch.Tensor, rho: str, valid: torch.Tensor,
                          prior: torch.Tensor | None = None) -> torch.Tensor:
    """Σ_h Σ_{i<j} w_ij ρ(½ s_h²‖c_i − c_j‖²) over real pairs, contiguous heads, from explicit pair differences in
    float64 (never the library's Gram path): (B, n, d) -> (B,). w_ij = 1, or e^{p_h(k_i) + p_h(k_j)} with a
    position prior table `prior` (H, K) and k_i the rank of token i among its sample's real tokens (`pair_weights`)."""
    B, n, d = Yd.shape
    H = scales.shape[0]
    C = Yd.reshape(B, n, H, d // H).transpose(1, 2)                       # (B, H, n, dh)
    diff = C[:, :, :, None] - C[:, :, None]                               # (B, H, n, n, dh) c_i − c_j
    z = 0.5 * scales.to(D64)[None, :, None, None] ** 2 * diff.pow(2).sum(-1)   # (B, H, n, n)
    pair = valid[:, None, :, None] & valid[:, None, None, :] & torch.ones(n, n, dtype=torch.bool).triu(1)
    return torch.where(pair, pair_weights(prior, valid, H) * get_rho(rho).value(z), 0.0).sum((1, 2, 3))


def pair_weights(prior: torch.Tensor | None, valid: torch.Tensor, H: int) -> torch.Tensor:
    """e^{p_h(k_i) + p_h(k_j)} (B, H, n, n) of a position prior table (H, K) (1 without one), the ranks k counted
    here one token at a time (k_i = real tokens before i, capped at K − 1)."""
    B, n = valid.shape
    if prior is None:
        return torch.ones(B, H, n, n, dtype=D64)
    p = torch.zeros(B, H, n, dtype=D64)
    table = prior.detach().to(D64)
    for b in range(B):
        k = 0
        for i in range(n):
            if valid[b, i]:
                p[b, :, i] = table[:, min(k, table.shape[1] - 1)]
                k += 1
    return torch.exp(p[:, :, :, None] + p[:, :, None, :])


def rotated_energy(stack, ell: int, Yr: torch.Tensor) -> torch.Tensor:
    """E_ℓ of a state in layer ℓ's basis written out here in float64 (pair differences): (B,).

    E = w E_A + λ⁻¹(½‖Ỹ − X̃‖² + γ E_H), E_A with contiguous heads s_h (exact Gram path for ρ = exp),
    E_H with W̃ = QᵀW₁; γ/λ → 1 for the alternating layer (its energy E_A + λ⁻¹½‖Y − X‖² + E_H)."""
    f, valid = stack.frame(ell), stack.valid
    att = f.layer.attention
    Yd = Yr.to(D64)
    e_att = pair_attention_energy(Yd, f.scales.detach(), att.rho, valid, f.prior)
    if att.length_norm:
        e_att = e_att / valid.sum(1).to(D64)
    ffn_weight = number(f.layer.gamma) / att.lam if isinstance(f.layer, JointLayer) else 1.0
    real = valid[..., None]
    hidden = torch.relu(Yd @ f.W.detach().to(D64) + f.b.detach().to(D64))   # (B, n, m)
    e_ffn = 0.5 * (Yd.square().where(real, 0.0).sum((1, 2)) - hidden.square().where(real, 0.0).sum((1, 2)))
    anchor = 0.5 * (Yd - stack.anchor(ell).to(D64)).square().where(real, 0.0).sum((1, 2))
    return e_att + anchor / att.lam + ffn_weight * e_ffn


def term_scale(stack, ell: int, Yr: torch.Tensor) -> torch.Tensor:
    """Σ|terms| of E_ℓ at a state in layer ℓ's basis, float64: (B,). E_A's pair terms share one sign (ρ = exp:
    all < 0, log: all > 0), so |w E_A| is their absolute sum; the anchor is a sum of squares; E_H =
    ½‖Ỹ‖² − ½‖ReLU(ỸW̃ + b)‖² contributes both squares. An energy evaluated in float64 errs by at most
    k·u·Σ|terms| (k ≲ n·d + 10 ≤ 10³ operations per term here, u = 2⁻⁵³), far below descent_tolerance(f64) =
    1e-12 ≈ 4,500 u per unit of Σ|terms|; |E| alone is no scale when E is a small difference of large terms
    (tokens at 1e3: ½‖Ỹ‖² ≈ 1e6 while E ≈ 0.7)."""
    f, valid = stack.frame(ell), stack.valid
    att, pad = f.layer.attention, ~stack.valid
    Yd = Yr.to(D64).where(valid[..., None], 0.0)
    e_att = pair_attention_energy(Yd, f.scales.detach(), att.rho, valid, f.prior).abs()
    if att.length_norm:
        e_att = e_att / valid.sum(1).to(D64)
    ffn_weight = number(f.layer.gamma) / att.lam if isinstance(f.layer, JointLayer) else 1.0
    hidden = torch.relu(Yd @ f.W.detach().to(D64) + f.b.detach().to(D64)).where(valid[..., None], 0.0)
    squares = 0.5 * (Yd.square().sum((1, 2)) + hidden.square().sum((1, 2)))
    return e_att + E.anchor_energy(Yd, stack.anchor(ell).to(D64), pad) / att.lam + ffn_weight * squares


def curve_term_scales(stack) -> torch.Tensor:
    """term_scale at the larger of each layer step's two states (before and after, in the layer's own
    basis), replaying the joint stack's plain forward: (B, depth)."""
    Y, scales = stack.start(), []
    for ell in range(stack.depth):
        before = term_scale(stack, ell, Y)
        Y = stack._joint(stack.frame(ell), Y, stack.anchor(ell), stack.valid, 1.0, None)
        scales.append(torch.maximum(before, term_scale(stack, ell, Y)))
        Y = stack.advance(ell, Y)
    return torch.stack(scales, 1)


def curve_float32_allowances(stack, energy=None, metric_scale: float | None = None) -> torch.Tensor:
    """`float32_allowance` for each layer step of the stack's plain forward, replayed: the joint layer, or the
    alternating layer's attention step and then its FFN step into the next layer: (B, depth). `energy` and
    `metric_scale` as in `float32_allowance`."""
    energy = rotated_energy if energy is None else energy
    Y, allowances = stack.start(), []
    for ell in range(stack.depth):
        f = stack.frame(ell)
        joint = isinstance(f.layer, JointLayer)
        if joint:
            Y_new = stack._joint(f, Y, stack.anchor(ell), stack.valid, 1.0, None)
        else:
            Y_new = stack._attend(f, Y, stack.anchor(ell), stack.valid, 1.0, None)[0]
        allowances.append(float32_allowance(stack, ell, Y_new, energy(stack, ell, Y), energy=energy,
                                            metric_scale=metric_scale))
        Y = stack.advance(ell, Y_new if joint else stack._ffn(f, Y_new, 1.0)[0])
    return torch.stack(allowances, 1)


def not_raised(before: torch.Tensor, after: torch.Tensor, tol: float, scale: torch.Tensor) -> torch.Tensor:
    """after ≤ before + tol·(1 + Σ|terms|): the descent rule with the evaluation's own scale."""
    return after <= before + tol * (1 + scale)


def float32_allowance(stack, ell: int, Y_new: torch.Tensor, energy_scale: torch.Tensor, energy=None,
                      metric_scale: float | None = None) -> torch.Tensor:
    """Allowance for E evaluated (exactly) at a float32 state computed by float32 arithmetic: (B,).

    The exact step from the (exact) input state descends; the computed state differs from it by δ.
    Taylor at the computed state Y⁺ = Y* + δ: E(Y⁺) ≤ E(Y*) + ‖∇E(Y⁺)‖_F ‖δ‖_F + ½ Λ ‖δ‖², Λ the largest
    positive curvature of E: ρ concave (ρ'' ≤ 0) leaves ρ'·∇²z ⪯ s_h² L ⪯ 2 s_h² n I for E_A (ρ' ≤ 1),
    the anchor and ½‖Y‖² of E_H add (1 + γ)/λ, and −½‖ReLU(·)‖² only negative curvature.
    ‖δ‖ per entry ≤ 64 u · M with M = the largest magnitude entering the step (|c|, |x̃|, |r̃|): 64 units of
    round-off cover the products and sums behind one entry (conftest.close_tol's rule), and the softmax
    weights' float32 logit error u·‖a − mean‖² (THEORY §3.10) moves the average by at most that relative
    amount of the values' spread, also ≤ M. The library's own rule descent_tolerance·(1 + |E|) is added.
    `energy` (stack, ell, Y) -> (B,): the float64 energy (default `rotated_energy`); `metric_scale`: the
    largest eigenvalue bound of the heads' metrics (default max s_h²; μ_h for a free metric, THEORY §3.8),
    which takes s² in the curvature and the logit size."""
    energy = rotated_energy if energy is None else energy
    u = torch.finfo(torch.float32).eps / 2
    f = stack.frame(ell)
    Yd = Y_new.detach().to(D64).requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(energy(stack, ell, Yd).sum(), Yd)
    valid = stack.valid[..., None]
    R = torch.relu(Y_new.to(D64) @ f.W.detach().to(D64) + f.b.detach().to(D64)) @ f.W.detach().to(D64).T
    M = torch.stack([Y_new.to(D64).abs(), stack.anchor(ell).to(D64).abs(), R.abs()]).amax(0)
    M = M.where(valid, 0.0).flatten(1).amax(1)                       # (B,)
    s_sq = float(f.scales.detach().max()) ** 2 if metric_scale is None else float(metric_scale)
    logit = s_sq * (2 * M) ** 2 * Y_new.shape[-1]                   # ≥ ‖a − mean‖²
    if f.prior is not None:                                          # + |p_j| in the key column, + |p_i| after the LSE
        logit = logit + 2 * float(f.prior.detach().abs().max())
    delta = 64 * u * M * (1 + u * logit) * math.sqrt(Y_new.shape[1] * Y_new.shape[2])   # ‖δ‖_F bound
    g = grad.where(valid, 0.0).flatten(1).norm(dim=1)
    gamma = number(f.layer.gamma) if isinstance(f.layer, JointLayer) else f.layer.attention.lam
    w_max = 1.0 if f.prior is None else math.exp(2 * float(f.prior.detach().abs().max()))   # largest pair weight
    curvature = 2 * s_sq * Y_new.shape[1] * w_max + (1 + gamma) / f.layer.attention.lam
    return g * delta + 0.5 * curvature * delta ** 2 + descent_tolerance(torch.float32) * (1 + energy_scale.abs())


# ----------------------------------------------------------------------------- the theorem
@given(case=cases())
@examples(2000)
def test_the_joint_layer_never_raises_its_energy(case):
    """0 rises of the whole-layer energy: by the model's numbers (its own curve, from X, and one step from
    an arbitrary state Y) and by an independent float64 evaluation of the states it produced."""
    (Y, X, pad), model = case
    tol = descent_tolerance(Y.dtype)
    with torch.no_grad():
        out = model(X, pad, return_energies=True)
        stack = stack_of(model, X, pad)
        curve_scale = curve_term_scales(stack)                                   # (B, depth)
        if Y.dtype == D64:                                                     # the model's own numbers
            assert not_raised(out.layer_before, out.layer_after, tol, curve_scale).all()
        else:   # a plain float32 step may rise by its own rounding (docs/theory.md, "Rounding the state")
            assert (out.layer_after <= out.layer_before + curve_float32_allowances(stack)).all()
        guarded = model(X, pad, safeguard=True)          # the safeguard takes every full step (never halves)
        assert (guarded.step_scales == 1).all() if Y.dtype == D64 else (guarded.step_scales % 1 == 0).all()
        f = stack.frame(0)
        Yr = Y.where(~pad[..., None], 0.0)
        Yr = Yr if f.Q is None else Yr @ f.Q                                    # the state in the layer's basis
        trace = stack.trial(0, Yr, None, None, 1.0, False, True)
        step_scale = torch.maximum(term_scale(stack, 0, Yr), term_scale(stack, 0, trace.output))
        assert not_raised(trace.at_input.total, trace.at_output.total, tol, step_scale).all()
        before, after = rotated_energy(stack, 0, Yr), rotated_energy(stack, 0, trace.output)
    if Y.dtype == D64:
        # float64 states, float64 arithmetic: the library's rule, relative to Σ|terms| (term_scale)
        assert not_raised(before, after, tol, step_scale).all(), (before, after)
    else:
        assert (after <= before + float32_allowance(stack, 0, trace.output, before)).all(), (before, after)


@given(case=st.one_of(cases(dtype=D64), cases(dtype=D64, prior=True)))
@examples(2000)
def test_the_joint_step_is_the_formula_of_theory(case):
    """c_i⁺ = (1 − α)c_i + α(ν Σ_j β_ij c_j + x̃_i + γ r̃_i)/(ν d_i + 1 + γ) per head, written out in float64
    with the n × n weights β_ij = ρ'(½ s_h²‖c_i − c_j‖²) over real pairs; padded rows stay. With a position prior
    (docs/theory.md §4e) the pairs j ≠ i carry e^{p_i + p_j} and the self pair keeps ρ'(0) = 1.
    Both passes of the model agree with it: the plain forward's (diagonal counted) and the traced one's
    (diagonal masked, self term in closed form)."""
    (Y, X, pad), model = case
    lay: JointLayer = model.layers[0]
    att, ffn = lay.attention, lay.ffn
    valid = ~pad
    B, n, d = Y.shape
    H, dh = att.H, d // att.H
    with torch.no_grad():
        Q = torch.eye(d, dtype=D64) if att.basis is None else att.basis.weight
        R = torch.relu(Y @ ffn.W1 + ffn.b) @ ffn.W1.T                         # (B, n, d)
        s = att.log_scale.exp()
        nreal = valid.sum(1).to(D64)                                            # (B,)
        prior = att.prior()                                                     # (H, K) or None
        w = pair_weights(prior, valid, H).where(~torch.eye(n, dtype=torch.bool), 1.0)   # (B, H, n, n) self: 1
        expected = Y.clone()
        for h in range(H):
            Uh = Q[:, h * dh:(h + 1) * dh]                                      # (d, dh)
            c, x, r = Y @ Uh, X @ Uh, R @ Uh                                    # (B, n, dh)
            z = 0.5 * s[h] ** 2 * ((c[:, :, None] - c[:, None]) ** 2).sum(-1)   # (B, n, n)
            beta = w[:, h] * get_rho(att.rho).derivative(z)                   # e^{p_i + p_j} ρ'(z_ij)
            beta = beta * (valid[:, :, None] & valid[:, None, :])
            nu = att.lam * s[h] ** 2 / (nreal if att.length_norm else torch.ones_like(nreal))
            nu = nu[:, None, None]
            gamma, alpha = number(lay.gamma), number(lay.step_size())          # fixed, or learned (σ, softplus)
            target = (nu * beta @ c + x + gamma * r) / (nu * beta.sum(-1, keepdim=True) + 1 + gamma)
            c_new = (1 - alpha) * c + alpha * target
            expected = expected + (c_new - c) @ Uh.T
        expected = expected.where(valid[..., None], Y)
        stack = stack_of(model, X, pad)
        f = stack.frame(0)
        Yr = (Y if f.Q is None else Y @ f.Q).where(valid[..., None], 0.0)
        plain = stack._joint(f, Yr, stack.anchor(0), stack.valid, 1.0, None)
        traced = stack.trial(0, Yr, None, None, 1.0, False, True).output
        module = lay(Y, X, pad)
    # Round-off: entries of magnitude M = max(|Y|, |X|, |R|); the fused pass's logits lose eps·‖a − mean‖²
    # (THEORY §3.10), which moves a softmax average by that relative amount of the values (≤ 2M).
    M = max(float(Y.abs().max()), float(X.abs().max()), float(R.abs().max()), 1.0)
    logit = float(s.max()) ** 2 * (2 * M) ** 2 * d                             # + 2 max|p| with a prior (§4e)
    logit += 0.0 if prior is None else 2 * float(prior.detach().abs().max())
    tol = close_tol(D64, M * (1 + logit))
    for got in (plain, traced):
        back = got if f.Q is None else got @ f.Q.T
        assert ((back - expected).abs().where(valid[..., None], 0.0) <= tol).all()
    assert ((module - expected).abs() <= tol).all()


@given(case=cases(dtype=D64))
@examples(2000)
def test_the_curve_from_the_steps_own_pass_is_the_energy(case):
    """E(Y⁽ℓ⁾) read from each step's own pass and hidden layer (plus the last state's evaluation) equals a
    separate `energy.py` evaluation of the same states, and the model's curve equals them layer by layer."""
    (Y, X, pad), model = case
    with torch.no_grad():
        stack = stack_of(model, X, pad)
        f = stack.frame(0)
        Yr = (Y if f.Q is None else Y @ f.Q).where(~pad[..., None], 0.0)
        trace = stack.trial(0, Yr, None, None, 1.0, False, True)
        ref_in, ref_out = rotated_energy(stack, 0, Yr), rotated_energy(stack, 0, trace.output)
        out = model(X, pad, return_energies=True)
        Ys, states = stack.start(), []                                          # the model's own states
        carry = None
        for ell in range(model.config.depth):
            t = stack.trial(ell, Ys, None, carry, 1.0, False, True)
            states.append((t.at_input.total, t.at_output.total, rotated_energy(stack, ell, Ys),
                           rotated_energy(stack, ell, t.output), torch.cat([Ys, t.output])))
            carry = t.output_pass
            Ys = stack.advance(ell, t.output)
    # Both sides sum the same terms in float64 from float64 states: each result is within 64 eps of the
    # sum of its terms' magnitudes (conftest.close_tol). Magnitudes, entries of size ≤ M (states, anchor):
    # E_A ≤ H n² (1 + log(2 + z_max)) (|ρ| ≤ 1 for exp, log(z + 2) for log), z_max ≤ s²(2M)²d, and the fused
    # pass's logits carry eps·z_max into it (THEORY §3.10); anchor ≤ n d (2M)²/λ; (γ/λ) E_H ≤ (γ/λ) n
    # (d M² + m h²) with h ≤ d M max|W̃| + max|b| the hidden entries.
    def tol(Z, ell=0):
        f = stack.frame(ell)
        M = max(float(Z.abs().max()), float(stack.anchor(ell).abs().max()), 1.0)
        lay = f.layer
        n, d, m, H = Z.shape[1], Z.shape[2], f.W.shape[1], lay.attention.H
        z_max = float(f.scales.detach().max()) ** 2 * (2 * M) ** 2 * d
        h = d * M * float(f.W.detach().abs().max()) + float(f.b.detach().abs().max())
        e_attention = H * n * n * (1 + math.log(2 + z_max)) * (1 + z_max)
        ffn = number(lay.gamma) / lay.attention.lam * n * (d * M * M + m * h * h)
        return close_tol(D64, e_attention + n * d * (2 * M) ** 2 / lay.attention.lam + ffn)

    assert ((trace.at_input.total - ref_in).abs() <= tol(Yr)).all()
    assert ((trace.at_output.total - ref_out).abs() <= tol(trace.output)).all()
    for ell, (own_in, own_out, r_in, r_out, both) in enumerate(states):
        assert ((own_in - r_in).abs() <= tol(both, ell)).all()
        assert ((own_out - r_out).abs() <= tol(both, ell)).all()
        assert torch.equal(out.layer_before[:, ell], own_in) and torch.equal(out.layer_after[:, ell], own_out)


# ----------------------------------------------------------------------------- the counterexample
def _rises(layer: str, trials: int, seed: int) -> tuple[int, int]:
    """(rising layer steps, layer steps) of `trials` random float64 models (depth 4, d 16, 4 heads, both ρ,
    both attention_norm values, α ∈ (0, 1], W₁ up to twice its initial scale, random bias) on random
    padded inputs, by the model's curve; the same cases (seeded) for both layer kinds."""
    g = torch.Generator().manual_seed(seed)
    rises = steps = 0
    for t in range(trials):
        torch.manual_seed(seed + t)
        alpha = float(torch.rand(1, generator=g)) * 0.999 + 1e-3
        cfg = ModelConfig.preset("certified-alternating", d_model=16, n_heads=4, depth=4, ffn_hidden=32, layer=layer,
                                 rho=["exp", "log"][t % 2], alpha_attention=alpha,
                                 attention_norm=["none", "length"][(t // 2) % 2],
                                 **({"ffn_weight": 1.0} if layer == "joint" else {"alpha_ffn": alpha}))
        model = UnfoldedTransformer(cfg).double().eval()
        with torch.no_grad():
            model.layers[0].ffn.W1.mul_(float(torch.rand(1, generator=g)) * 2)
            model.layers[0].ffn.b.uniform_(-1, 1)
            X = torch.randn(2, 12, 16, generator=g, dtype=D64) * 2
            pad = torch.zeros(2, 12, dtype=torch.bool)
            pad[1, 6:] = True
            out = model(X, pad, return_energies=True)
        rises += int((~lowered(out.layer_before, out.layer_after, descent_tolerance(D64))).sum())
        steps += out.layer_before.numel()
    return rises, steps


def test_the_alternating_layer_rises_on_the_same_cases():
    """Same energy (γ = λ: E_A + λ⁻¹½‖Y − X‖² + E_H), same cases: the alternating layer rises on a
    measured share of its layer steps, the joint one on none. Measured at seed 0: alternating 52 of
    320 layer steps (16.3 %), joint 0; the band allows half to twice the measured share."""
    alternating, steps = _rises("alternating", 40, 0)
    joint, _ = _rises("joint", 40, 0)
    assert joint == 0
    measured = 52 / 320
    assert 0.5 * measured <= alternating / steps <= 2 * measured, alternating / steps


def test_the_energy_is_the_original_coordinates_energy():
    """In float64 the energy the rotated stack descends is the layer's energy in original coordinates."""
    torch.manual_seed(0)
    cfg = ModelConfig.preset("certified", d_model=8, n_heads=2, depth=2, ffn_hidden=16, tied=False)
    model = UnfoldedTransformer(cfg).double().eval()
    X = torch.randn(3, 5, 8, dtype=D64)
    pad = torch.tensor([[False] * 5, [False, False, True, True, True], [False] + [True] * 4])
    with torch.no_grad():
        stack = stack_of(model, X, pad)
        for ell in range(2):
            f = stack.frame(ell)
            Y = torch.randn(3, 5, 8, dtype=D64).where(~pad[..., None], 0.0)
            module = model.layer(ell).energy(Y, X, pad)
            rotated = rotated_energy(stack, ell, Y @ f.Q)
            assert torch.allclose(module, rotated, rtol=1e-12, atol=1e-12)


def test_the_safeguard_never_backtracks_a_joint_layer():
    torch.manual_seed(1)
    model = UnfoldedTransformer(ModelConfig.preset("certified", d_model=16, n_heads=4, depth=4,
                                                   ffn_hidden=32)).eval()
    X = torch.randn(4, 12, 16) * 3
    pad = torch.zeros(4, 12, dtype=torch.bool)
    pad[2:, 7:] = True
    with torch.no_grad():
        plain = model(X, pad, return_energies=True)
        guarded = model(X, pad, safeguard=True)
    # float32 states: the safeguard decides on float64 evaluations of the states (model.py) and keeps every
    # full step; float64: the same path as the plain curve, so the same numbers
    assert (guarded.step_scales == 1).all() and torch.equal(plain.hidden, guarded.hidden)
    model, X = model.double(), X.double()
    with torch.no_grad():
        plain, guarded = model(X, pad, return_energies=True), model(X, pad, safeguard=True)
    assert (guarded.step_scales == 1).all() and torch.equal(plain.energies, guarded.energies)


@pytest.mark.parametrize("tied", [True, False])
def test_plain_and_traced_forwards_compute_the_same_function(tied):
    torch.manual_seed(2)
    cfg = ModelConfig.preset("certified", d_model=16, n_heads=4, depth=3, ffn_hidden=32, tied=tied)
    model = UnfoldedTransformer(cfg).double().eval()
    X = torch.randn(3, 9, 16, dtype=D64)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, 5:] = True
    pad[2, 1:] = True
    with torch.no_grad():
        plain, traced = model(X, pad).hidden, model(X, pad, return_energies=True).hidden
        Y = X
        for ell in range(3):
            Y = model.layer(ell)(Y, X, pad)
    assert torch.equal(plain, traced)                        # the same operations: bit-identical
    assert torch.allclose(plain, Y, rtol=0, atol=close_tol(D64, 10))
    assert torch.equal(plain[pad], X[pad])


# ----------------------------------------------------------------------------- learned step sizes
@pytest.mark.parametrize("tied", [True, False])
def test_learned_step_sizes_train_inside_their_certified_ranges(tied):
    """`learn_steps`: α = α_max (a + (1 − a) σ(θ)) and γ = softplus(φ) are parameters (one pair per layer,
    shared by a tied model's steps) that the loss reaches, start near the fixed layer (α ≈ 0.982 α_max,
    γ = ffn_weight) and stay in [a α_max, α_max] and [0, ∞) after an optimiser step that moves θ and φ as
    far as float32 goes (σ(θ) and softplus(φ) may underflow to 0); the layers still descend."""
    torch.manual_seed(3)
    cfg = ModelConfig.preset("certified", d_model=16, n_heads=4, depth=3, ffn_hidden=32, tied=tied,
                             alpha_attention=0.8, ffn_weight=2.0, learn_steps=True)
    model = UnfoldedTransformer(cfg)
    pairs = [(lay.step_logit, lay.ffn_weight_raw) for lay in model.layers]
    assert len(pairs) == (1 if tied else 3)
    for lay in model.layers:
        a = LEARNED_STEP_FLOOR
        expected = 0.8 * (a + (1 - a) * torch.sigmoid(torch.tensor(LEARNED_STEP_LOGIT)).item())
        assert math.isclose(float(lay.step_size().detach()), expected, rel_tol=1e-6)
        assert math.isclose(float(lay.gamma.detach()), 2.0, rel_tol=1e-6)
    X = torch.randn(3, 9, 16)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, 4:] = True
    model(X, pad).hidden.square().sum().backward()
    for theta, phi in pairs:
        assert theta.grad is not None and phi.grad is not None
        assert float(theta.grad) != 0 and float(phi.grad) != 0
    before = [(number(t), number(p)) for t, p in pairs]
    torch.optim.SGD([w for pair in pairs for w in pair], lr=1.0).step()
    assert all(number(t) != t0 and number(p) != p0 for (t, p), (t0, p0) in zip(pairs, before))
    tol = descent_tolerance(torch.float32)
    for theta, phi in [(-200.0, -200.0), (200.0, 50.0), (-200.0, 50.0), (200.0, -200.0)]:   # σ, softplus at 0 / 1
        with torch.no_grad():
            for t, p in pairs:
                t.fill_(theta), p.fill_(phi)
            out = model(X, pad, return_energies=True)
        for lay in model.layers:
            alpha, gamma = float(lay.step_size().detach()), float(lay.gamma.detach())
            high = float(torch.tensor(0.8))                      # α_max as the float32 parameters hold it
            # the floor 1 − fl(1 − a): float32 rounds 1 − a by u/2 ≈ 3e-8, i.e. 3e-5 of the floor a = 1e-3
            assert high * LEARNED_STEP_FLOOR * (1 - 1e-4) <= alpha <= high and gamma >= 0
        assert torch.isfinite(out.hidden).all()
        assert (out.layer_after <= out.layer_before + tol * (1 + out.layer_before.abs())).all()


def test_learned_step_sizes_are_refused_where_they_do_not_apply():
    with pytest.raises(ConfigError, match="learn_steps does not apply"):
        ModelConfig.preset("certified-alternating", learn_steps=True)               # the alternating layer
    with pytest.raises(ConfigError, match="needs ffn_weight > 0"):
        ModelConfig.preset("certified", learn_steps=True, ffn_weight=0.0)
    assert ModelConfig.preset("certified").learn_steps is False


# ----------------------------------------------------------------------------- the bounded variant
@examples(200)
@given(scale=st.floats(1e-3, 1e3), shape=st.sampled_from([(1, 1), (4, 16), (16, 4), (8, 8)]),
       dtype=st.sampled_from([torch.float32, D64]), seed=st.integers(0, 2**31 - 1))
def test_the_spectral_cap_bounds_the_ffn_weight_and_keeps_small_ones(scale, shape, dtype, seed):
    """`ffn_bound="spectral"`: W1 = V / max(1, ‖V‖₂) has ‖W1‖₂ ≤ 1 up to the rounding of the division and of
    the SVD (σ_max computed to a few u relative: bound 1 + 32u), and equals V exactly when ‖V‖₂ ≤ 1."""
    torch.manual_seed(seed)
    model = UnfoldedTransformer(ModelConfig.preset("certified", d_model=shape[0], n_heads=1, depth=1,
                                                   ffn_hidden=shape[1], ffn_bound="spectral")).to(dtype)
    ffn = model.layers[0].ffn
    with torch.no_grad():
        V = free_w1(ffn)
        V.normal_().mul_(scale / math.sqrt(shape[1]))
        W = ffn.W1
        sigma_v = float(torch.linalg.matrix_norm(V.double(), ord=2))
        sigma_w = float(torch.linalg.matrix_norm(W.double(), ord=2))
    u = torch.finfo(dtype).eps / 2
    assert sigma_w <= 1 + 32 * u
    if sigma_v <= 1 - 32 * u:
        assert torch.equal(W, V)
    else:
        assert sigma_w == pytest.approx(1.0, abs=32 * u)


@examples(200)
@given(seed=st.integers(0, 2**31 - 1), stretch=st.floats(1.5, 10.0), t=st.floats(1.0, 1e3))
def test_the_capped_ffn_energy_is_bounded_below_and_the_free_one_is_not(seed, stretch, t):
    """With ‖W1‖₂ ≤ 1, ‖ReLU(yW1 + b)‖ ≤ ‖y‖ + ‖b‖, so E_H(y) ≥ −‖y‖‖b‖ − ½‖b‖² per token (float64). Along
    the top right-singular direction of a free W1 stretched by σ = `stretch` > 1 (v with v W1 = σ u, u ≥ 0
    chosen so ReLU keeps it), E_H(t v) = ½t² − ½‖ReLU(tσu + b)‖² falls below that bound for large t: the
    cap is what keeps E bounded."""
    torch.manual_seed(seed)
    d, m = 6, 12
    pad = torch.zeros(1, 1, dtype=torch.bool)
    for bound in ("spectral", "none"):
        model = UnfoldedTransformer(ModelConfig.preset("certified", d_model=d, n_heads=1, depth=1,
                                                       ffn_hidden=m, ffn_bound=bound)).double()
        ffn = model.layers[0].ffn
        with torch.no_grad():
            u = torch.rand(m, dtype=D64)
            u = u / u.norm()                                            # a nonnegative unit direction of R^m
            v = torch.randn(d, dtype=D64)
            v = v / v.norm()
            free_w1(ffn).copy_(stretch * torch.outer(v, u))             # V = σ v uᵀ: ‖V‖₂ = σ
            ffn.b.normal_()
            y = (t * v)[None, None]                                     # (1, 1, d)
            e_h = float(ffn.energy(y, pad))
            floor = -t * float(ffn.b.norm()) - 0.5 * float(ffn.b.norm()) ** 2
        if bound == "spectral":
            assert e_h >= floor - 1e-12 * (t * t + floor ** 2 + 1)
        else:
            expected = 0.5 * t * t - 0.5 * float(torch.relu(t * stretch * u + ffn.b.detach()).pow(2).sum())
            assert e_h == pytest.approx(expected, rel=1e-12, abs=1e-12)
            # ReLU is 1-Lipschitz and ReLU(tσu) = tσu, so ‖ReLU(tσu + b)‖ ≥ tσ − ‖b‖ and
            # E_H ≤ ½t² − ½(tσ − ‖b‖)², below the floor once ½(σ² − 1)t² > t‖b‖(σ + 1)
            beta = float(ffn.b.detach().norm())
            if t * stretch > beta and 0.5 * (stretch ** 2 - 1) * t * t > t * beta * (stretch + 1) + 1:
                assert e_h < floor


def test_a_capped_model_saves_and_loads_the_free_weight():
    """The state dict of a capped model holds V (not W1) and loads into a fresh model of the same config to
    the same function; a config field of its own, refused where no tied FFN runs."""
    cfg = ModelConfig.preset("certified", d_model=8, n_heads=2, depth=2, ffn_hidden=16, ffn_bound="spectral",
                             tied=False)
    torch.manual_seed(0)
    model = UnfoldedTransformer(cfg)
    with torch.no_grad():
        for lay in model.layers:
            free_w1(lay.ffn).mul_(4.0)
    state = model.state_dict()
    assert "layers.0.ffn.parametrizations.W1.original" in state and "layers.0.ffn.W1" not in state
    fresh = UnfoldedTransformer(cfg)
    fresh.load_state_dict(state)
    x = torch.randn(2, 5, 8)
    assert torch.equal(fresh(x).hidden, model(x).hidden)
    with pytest.raises(ConfigError, match="ffn_bound must be one of none, spectral"):
        ModelConfig.preset("certified-alternating", ffn_bound="frobenius")
    with pytest.raises(ConfigError, match="ffn_bound does not apply"):
        ModelConfig.preset("standard", ffn_bound="spectral")


def test_the_demo_shows_the_joint_layer_never_rising_beside_the_alternating_one(capsys):
    """`unfoldformer demo` defaults to the joint layer: its curves never rise with the safeguard off, and it runs
    the alternating layer of the same size on the same inputs for contrast (whose whole layers can rise)."""
    from unfoldformer.cli import main
    from unfoldformer.cli.demo import energy_trace

    assert main(["demo", "--batch", "4", "--tokens", "12", "--depth", "4"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("preset certified:") and "safeguard=False" in printed
    assert "share of samples whose curve never rises: 100.0%" in printed
    assert "the alternating layer (preset certified-alternating) on the same inputs, no safeguard" in printed
    joint = energy_trace(ModelConfig.preset("certified", depth=6), 8, 32, seed=0)
    assert joint["share_curves_never_rising"] == 1.0 and joint["other_preset"] == "certified-alternating"
    alternating = energy_trace(ModelConfig.preset("certified-alternating", depth=6), 8, 32, seed=0, contrast=False)
    assert joint["other_share_curves_never_rising"] == alternating["share_curves_never_rising"]
    assert "other_preset" not in alternating
