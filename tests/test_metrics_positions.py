"""Free per-head metrics (THEORY §3.8) and rotary positions (§3.9) in the certified stack.

Cases: the adversarial token sets of `strategies.token_sets` (far clusters, offsets up to 1e3, norms
1e-3…1e3, identical tokens, n = 1, all-but-one padding, float32 and float64) with random layers (joint, or
the alternating layer's attention step; ρ = exp or log; metric isotropic, diagonal or free, with maps of
any scale, rank-1 or with near-equal eigenvalues; positions none or rotary; α ∈ (0, 1], γ ∈ [0, 10]).
The independent references below are written from THEORY alone: the energy (pair sums over real tokens in
float64, rotations as complex multiplications) and the step formulas.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import close_tol, examples
from strategies import token_sets
from test_joint import curve_float32_allowances, float32_allowance, pair_weights
from unfoldformer import energy as E
from unfoldformer.baselines import RotaryEncoderLayer, StandardTransformer
from unfoldformer.config import ModelConfig
from unfoldformer.descent import descent_tolerance, lowered
from unfoldformer.errors import ConfigError
from unfoldformer.joint import JointLayer, JointStack
from unfoldformer.metrics import SAFETY, SQUARINGS, metric_bound, spectral_bound
from unfoldformer.model import UnfoldedTransformer
from unfoldformer.rotated import RotatedStack

D64 = torch.float64
DIMS = {2: (1,), 4: (1, 2), 6: (3,), 8: (1, 2, 4)}     # d -> head counts with an even head width


# ----------------------------------------------------------------------------- references from THEORY
def rotate_reference(C: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """RoPE (THEORY §3.9) as complex multiplication: pair t of token i times e^{±i·pos·θ_t}, θ_t = 10000^{−2t/k};
    C (B, n, H, k) float64."""
    B, n, H, k = C.shape
    z = torch.view_as_complex(C.to(D64).reshape(B, n, H, k // 2, 2).contiguous())
    theta = 10000.0 ** (-torch.arange(0, k, 2, dtype=D64) / k)
    angle = torch.arange(n, dtype=D64)[:, None] * theta * (-1 if inverse else 1)   # (n, k/2)
    return torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)[None, :, None]).reshape(B, n, H, k)


def maps_of(att) -> torch.Tensor:
    """A_h (H, k, k) in float64: s_h I for isotropic heads."""
    A = att.maps()
    if A is None:
        k = att.d // att.H
        return att.log_scale.exp().detach().to(D64)[:, None, None] * torch.eye(k, dtype=D64)
    return A.detach().to(D64)


def reference_energy(stack, ell: int, Yr: torch.Tensor, ffn: bool = True) -> torch.Tensor:
    """E_ℓ of a state in layer ℓ's basis, float64 (B,): λ' Σ_h Σ_{i<j real} ρ(½‖(R_i c_i − R_j c_j) A_hᵀ‖²) /λ
    + λ⁻¹ ½‖Y − X̃‖² + (γ/λ) E_H (γ/λ → 1 for the alternating layer; `ffn=False` leaves E_H out)."""
    f, valid = stack.frame(ell), stack.valid
    att = f.layer.attention
    B, n, d = Yr.shape
    H, k = att.H, d // att.H
    C = Yr.to(D64).reshape(B, n, H, k)
    if att.rotary:
        C = rotate_reference(C)
    a = torch.einsum("bnhk,hjk->bhnj", C, maps_of(att))             # (B, H, n, k) features
    z = 0.5 * ((a[:, :, :, None] - a[:, :, None]) ** 2).sum(-1)      # (B, H, n, n)
    rho = -torch.exp(-z) if att.rho == "exp" else torch.log(z + 2)
    rho = rho * pair_weights(f.prior, valid, H)                       # e^{p_i + p_j} with a position prior (§4e)
    pairs = (valid[:, :, None] & valid[:, None, :]).triu(1)[:, None]   # i < j, both real
    e_att = rho.where(pairs, 0.0).sum((1, 2, 3))
    if att.length_norm:
        e_att = e_att / valid.sum(1).to(D64)
    pad = ~valid
    out = e_att + E.anchor_energy(Yr.to(D64), stack.anchor(ell).to(D64), pad) / att.lam
    if ffn:
        w = f.layer.gamma / att.lam if isinstance(f.layer, JointLayer) else 1.0
        out = out + w * E.tied_ffn_energy(Yr.to(D64), f.W.detach().to(D64), f.b.detach().to(D64), pad)
    return out


def reference_step(model, Y: torch.Tensor, X: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """THEORY §3.8 in rotated coordinates (§3.9), original coordinates, float64: per head,
    c̃⁺_i = c̃_i − α[λ' Σ_j β_ij M(c̃_i − c̃_j) + (c̃_i − R_i x̃_i) + γ(c̃_i − R_i r̃_i)] / (λ' μ d_i + 1 + γ),
    c⁺_i = R_iᵀ c̃⁺_i; β_ij = ρ'(½‖(c̃_i − c̃_j)Aᵀ‖²) over real j (j = i included), d_i = Σ_j β_ij.
    Joint layer: γ = ffn_weight and r = ReLU(Y W₁ + b) W₁ᵀ; alternating layer: its attention step (γ = 0)."""
    lay = model.layers[0]
    att, ffn = lay.attention, lay.ffn
    joint = isinstance(lay, JointLayer)
    gamma = lay.gamma if joint else 0.0
    valid = ~pad
    B, n, d = Y.shape
    H, k = att.H, d // att.H
    Q = torch.eye(d, dtype=D64) if att.basis is None else att.basis.weight.detach().to(D64)
    R = torch.relu(Y @ ffn.W1.detach() + ffn.b.detach()) @ ffn.W1.detach().T if joint else torch.zeros_like(Y)
    A = maps_of(att)
    mu = att.mu().detach().to(D64) if att.maps() is not None else A[:, 0, 0] ** 2
    nreal = valid.sum(1).to(D64)
    lam = att.lam / (nreal if att.length_norm else torch.ones_like(nreal))       # (B,) λ'
    rot = (lambda T, inv=False: rotate_reference(T, inv)) if att.rotary else (lambda T, inv=False: T)
    coords = lambda T: (T.to(D64) @ Q).reshape(B, n, H, k)                        # noqa: E731
    c, x, r = rot(coords(Y)), rot(coords(X)), rot(coords(R))                      # (B, n, H, k)
    out = []
    for h in range(H):
        ch, xh, rh, M = c[:, :, h], x[:, :, h], r[:, :, h], A[h].T @ A[h]
        diff = ch[:, :, None] - ch[:, None]                                       # (B, n, n, k) c_i − c_j
        z = 0.5 * ((diff @ A[h].T) ** 2).sum(-1)
        beta = (torch.exp(-z) if att.rho == "exp" else 1 / (z + 2)) * (valid[:, :, None] & valid[:, None, :])
        pull = torch.einsum("bij,bijk->bik", beta, diff @ M)                     # Σ_j β_ij M(c_i − c_j)
        grad = lam[:, None, None] * pull + (ch - xh) + gamma * (ch - rh)
        denom = lam[:, None, None] * mu[h] * beta.sum(-1, keepdim=True) + 1 + gamma
        out.append(ch - att.alpha * grad / denom)
    new = rot(torch.stack(out, 2), True).reshape(B, n, d) @ Q.T
    return new.where(valid[..., None], Y)


# ----------------------------------------------------------------------------- cases
@st.composite
def models(draw, dtype, d: int, metric: str | None = None, positions: str | None = None, layer: str | None = None,
           prior: bool = False):
    """`prior`: ρ = exp with a position prior (docs/theory.md §4e) of 1–5 ranks, log-weights p in ±3."""
    metric = draw(st.sampled_from(["isotropic", "diagonal", "free"])) if metric is None else metric
    positions = draw(st.sampled_from(["none", "rotary"])) if positions is None else positions
    layer = draw(st.sampled_from(["joint", "alternating"])) if layer is None else layer
    overrides = dict(d_model=d, n_heads=draw(st.sampled_from(DIMS[d])), depth=2, tied=draw(st.booleans()),
                     rho=draw(st.sampled_from(["exp", "log"])), ffn_hidden=draw(st.sampled_from([1, 4, 16])),
                     learn_basis=draw(st.booleans()), anchor_weight=draw(st.floats(0.05, 20.0)),
                     alpha_attention=draw(st.sampled_from([1.0, draw(st.floats(1e-3, 1.0))])),
                     attention_norm=draw(st.sampled_from(["none", "length"])), layer=layer, metric=metric,
                     positions=positions)
    if layer == "joint":
        overrides["ffn_weight"] = draw(st.sampled_from([0.0, 1.0, draw(st.floats(0.0, 10.0))]))
    if prior:
        overrides.update(rho="exp", position_prior=draw(st.sampled_from([1, 2, 5])))
    seed = draw(st.integers(0, 2**31 - 1))
    shape = draw(st.sampled_from(["gaussian", "rank1", "close"]))
    scale = 10.0 ** draw(st.floats(-1.5, 0.7))
    w_scale, b_scale = draw(st.floats(0.05, 3.0)), draw(st.floats(0.0, 3.0))
    torch.manual_seed(seed)
    model = UnfoldedTransformer(ModelConfig.preset("certified-alternating", **overrides)).to(dtype)
    with torch.no_grad():
        for lay in model.layers:
            lay.ffn.W1.normal_().mul_(w_scale / math.sqrt(lay.ffn.W1.shape[1]))
            lay.ffn.b.uniform_(-1, 1).mul_(b_scale)
            att = lay.attention
            if metric == "isotropic":
                att.log_scale.add_(torch.randn_like(att.log_scale)).clamp_(-3, 1)
            elif metric == "diagonal":
                att.metric_diag.copy_(scale * torch.randn_like(att.metric_diag))
            else:
                A = att.metric_map
                kk = A.shape[-1]
                if shape == "gaussian":
                    A.copy_(scale * torch.randn_like(A))
                elif shape == "rank1":
                    A.copy_(scale * torch.randn(A.shape[0], kk, 1) @ torch.randn(A.shape[0], 1, kk))
                else:                                # orthogonal times eigenvalues 1 + 1e-6 t: near-identical
                    O = torch.linalg.qr(torch.randn(A.shape[0], kk, kk, dtype=D64))[0]
                    A.copy_((scale * O * (1 + 1e-6 * torch.arange(kk, dtype=D64))).to(dtype))
            if att.basis is not None:
                att.basis.parametrizations.weight.original.normal_()
            if prior:
                att.position_prior_table.uniform_(-0.1, 0.1)              # p = 30 θ in ±3
    return model.eval()


@st.composite
def cases(draw, dtype=None, **kind):
    dtype = draw(st.sampled_from([torch.float32, D64])) if dtype is None else dtype
    d = draw(st.sampled_from(sorted(DIMS)))
    return draw(token_sets(d=d, dtype=dtype, with_input=True, max_n=6)), draw(models(dtype, d, **kind))


def stack_of(model, X, pad):
    return (JointStack if isinstance(model.layers[0], JointLayer) else RotatedStack)(model, X, ~pad)


def metric_scale(model) -> float:
    """The largest eigenvalue bound of the heads' metrics (μ_h, or s_h²)."""
    att = model.layers[0].attention
    mu = att.mu()
    return float((att.log_scale.detach().exp() ** 2).max()) if mu is None else float(mu.detach().max())


def one_step(model, Y, X, pad):
    """(stack, state in the layer's basis, the layer's step from it: the whole joint layer or the alternating
    layer's attention step)."""
    stack = stack_of(model, X, pad)
    f = stack.frame(0)
    Yr = (Y if f.Q is None else Y @ f.Q).where(~pad[..., None], 0.0)
    if isinstance(f.layer, JointLayer):
        return stack, Yr, stack._joint(f, Yr, stack.anchor(0), stack.valid, 1.0, None)
    return stack, Yr, stack._attend(f, Yr, stack.anchor(0), stack.valid, 1.0, None)[0]


# ----------------------------------------------------------------------------- the bound μ
@st.composite
def maps(draw):
    k = draw(st.integers(1, 32))
    H = draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    scale = 10.0 ** draw(st.floats(-6, 6))
    shape = draw(st.sampled_from(["gaussian", "rank1", "close", "identity", "diagonal", "zero_rows"]))
    if shape == "gaussian":
        A = torch.randn(H, k, k, generator=g, dtype=D64)
    elif shape == "rank1":
        A = torch.randn(H, k, 1, generator=g, dtype=D64) @ torch.randn(H, 1, k, generator=g, dtype=D64)
    elif shape == "close":                                   # singular values 1 + 1e-9 t (near-equal eigenvalues)
        O = torch.linalg.qr(torch.randn(H, k, k, generator=g, dtype=D64))[0]
        A = O * (1 + 1e-9 * torch.arange(k, dtype=D64))
    elif shape == "identity":
        A = torch.eye(k, dtype=D64).repeat(H, 1, 1)
    elif shape == "diagonal":
        A = torch.diag_embed(torch.randn(H, k, generator=g, dtype=D64))
    else:
        A = torch.randn(H, k, k, generator=g, dtype=D64)
        A[:, : k // 2] = 0
    return (scale * A).to(draw(st.sampled_from([torch.float32, D64])))


@given(A=maps())
@examples(2000)
def test_the_spectral_bound_never_underestimates(A):
    """λ_max(AᵀA) ≤ μ ≤ min(k^{1/32}, Gershgorin's overestimate) λ_max (1 + margin), λ_max by eigvalsh in
    float64 of the same (rounded) A. eigvalsh of the float64 product M = AᵀA errs by ≤ c k ε₆₄ ‖M‖₂ (backward
    stable) plus M's own rounding k γ_k λ_max (the bound's docstring): below 4 k² ε₆₄ λ_max for k ≤ 32, the
    relative slack the comparison allows."""
    mu = spectral_bound(A)
    A64 = A.to(D64)
    lam = torch.linalg.eigvalsh(A64.mT @ A64)[..., -1]
    k = A.shape[-1]
    slack = 4 * k * k * torch.finfo(D64).eps
    assert mu.dtype == A.dtype
    assert (mu.to(D64) >= lam * (1 - slack)).all(), (mu, lam)
    upper = (k ** (1 / 2 ** SQUARINGS)) * (1 + SAFETY) * (1 + slack) * (1 + torch.finfo(A.dtype).eps)
    assert (mu.to(D64) <= lam.clamp_min(torch.finfo(D64).tiny) * upper).all(), (mu, lam)


def test_the_bound_is_exact_on_rank_one_and_diagonal_maps():
    """(tr M^p)^{1/p} = λ_max for rank 1; Gershgorin = max a² for a diagonal map: only the margin remains.
    The diagonal metric's μ is max a² itself (rounded up), and the bound is differentiable."""
    u, v = torch.randn(2, 16, 1, dtype=D64), torch.randn(2, 1, 16, dtype=D64)
    A = u @ v
    lam = torch.linalg.eigvalsh(A.mT @ A)[..., -1]
    assert torch.allclose(spectral_bound(A) / lam, torch.full_like(lam, 1 + SAFETY), rtol=1e-12, atol=0)
    a = torch.randn(3, 8, dtype=D64, requires_grad=True)
    assert torch.allclose(spectral_bound(torch.diag_embed(a)), a.square().amax(-1) * (1 + SAFETY), rtol=1e-15)
    assert torch.equal(metric_bound(torch.diag_embed(a), "diagonal"), a.square().amax(-1))
    spectral_bound(torch.diag_embed(a)).sum().backward()
    assert torch.isfinite(a.grad).all() and (a.grad != 0).any()


# ----------------------------------------------------------------------------- the theorem
@given(case=cases(positions="none"))
@examples(1500)
def test_free_metrics_never_raise_the_energy(case):
    _never_rises(case)


@given(case=cases(positions="rotary"))
@examples(1500)
def test_rotary_attention_never_raises_the_energy(case):
    _never_rises(case)


@given(case=cases(prior=True))
@examples(1000)
def test_metrics_and_rotary_attention_with_a_position_prior_never_raise_the_energy(case):
    """Isotropic, diagonal and free metrics, rotary or not, joint or alternating, with pair weights e^{p_i + p_j}:
    the metric step's bound uses D + B ⪰ 0, which positive symmetric weights keep (docs/theory.md §4e)."""
    _never_rises(case)


def _never_rises(case):
    """0 rises of the layer energy (joint: the whole layer; alternating: E_A + anchor under its attention step)
    by the model's own numbers and by an independent float64 evaluation (`reference_energy`) of one step
    from an arbitrary state; float32 with the derived allowance of `test_joint.float32_allowance` (curvature
    and logit size taken with μ_h in place of s_h², THEORY §3.8)."""
    (Y, X, pad), model = case
    joint = isinstance(model.layers[0], JointLayer)
    tol = descent_tolerance(Y.dtype)
    energy = lambda s, ell, Z: reference_energy(s, ell, Z, ffn=joint)   # noqa: E731
    with torch.no_grad():
        out = model(X, pad, return_energies=True if joint else "steps")
        before, after = (out.layer_before, out.layer_after) if joint else (out.attention_before, out.attention_after)
        if Y.dtype == D64:
            assert lowered(before, after, tol).all()
        else:   # a plain float32 step may rise by its own rounding (docs/theory.md, "Rounding the state")
            allowances = curve_float32_allowances(stack_of(model, X, pad), energy, metric_scale(model))   # (B, depth)
            assert (after <= before + allowances).all(), (before, after)
        stack, Yr, Y_new = one_step(model, Y, X, pad)
        before, after = energy(stack, 0, Yr), energy(stack, 0, Y_new)
    if Y.dtype == D64:
        assert lowered(before, after, tol).all(), (before, after)
    else:
        allowance = float32_allowance(stack, 0, Y_new, before, energy=energy, metric_scale=metric_scale(model))
        assert (after <= before + allowance).all(), (before, after)


@given(case=cases(dtype=D64))
@examples(1500)
def test_the_step_is_the_formula_of_theory(case):
    """The plain and traced steps (fused pass or blocked kernel) equal `reference_step` (n × n weights, float64).
    Round-off as in `test_joint`: entries of size M = max(|Y|, |X|, |R|), logits of size μ(2M)²d lose ε of it."""
    (Y, X, pad), model = case
    with torch.no_grad():
        expected = reference_step(model, Y, X, pad)
        stack, Yr, plain = one_step(model, Y, X, pad)
        f = stack.frame(0)
        ffn = model.layers[0].ffn
        R = torch.relu(Y @ ffn.W1 + ffn.b) @ ffn.W1.T
    M = max(float(Y.abs().max()), float(X.abs().max()), float(R.abs().max()), 1.0)
    logit = metric_scale(model) * (2 * M) ** 2 * Y.shape[-1]
    tol = close_tol(D64, M * (1 + logit))
    got = [plain]
    if isinstance(f.layer, JointLayer):
        got.append(stack.trial(0, Yr, None, None, 1.0, False, True).output)
    for g in got:
        back = g if f.Q is None else g @ f.Q.T
        assert ((back - expected).abs().where(~pad[..., None], 0.0) <= tol).all()


@given(case=cases(dtype=D64, metric="isotropic", positions="rotary", layer="joint"))
@examples(1000)
def test_rotary_joint_step_is_relative_rope_on_values(case):
    """THEORY §3.9's closed form for isotropic heads, α = 1: c_i⁺ = (ν Σ_j β_ij R_iᵀR_j c_j + x̃_i + γ r̃_i) /
    (ν d_i + 1 + γ), β_ij = e^{−½ s²‖R_i c_i − R_j c_j‖²} (ρ = exp) or 1/(z + 2) (log), then lerp for α < 1."""
    (Y, X, pad), model = case
    lay = model.layers[0]
    att, ffn, gamma = lay.attention, lay.ffn, lay.gamma
    valid = ~pad
    B, n, d = Y.shape
    H, k = att.H, d // att.H
    with torch.no_grad():
        Q = torch.eye(d, dtype=D64) if att.basis is None else att.basis.weight
        R = torch.relu(Y @ ffn.W1 + ffn.b) @ ffn.W1.T
        s = att.log_scale.exp()
        nreal = valid.sum(1).to(D64)
        c, x, r = ((T @ Q).reshape(B, n, H, k) for T in (Y, X, R))
        rc = rotate_reference(c)
        theta = 10000.0 ** (-torch.arange(0, k, 2, dtype=D64) / k)
        new = []
        for h in range(H):
            z = 0.5 * s[h] ** 2 * ((rc[:, :, None, h] - rc[:, None, :, h]) ** 2).sum(-1)
            beta = (torch.exp(-z) if att.rho == "exp" else 1 / (z + 2)) * (valid[:, :, None] & valid[:, None, :])
            # R_iᵀ R_j c_j = rotation of c_j by (j − i)θ: pairwise complex factor e^{i (j − i) θ_t}
            rel = (torch.arange(n)[None, :] - torch.arange(n)[:, None]).to(D64)[..., None] * theta   # (n, n, k/2)
            cj = torch.view_as_complex(c[:, :, h].reshape(B, n, k // 2, 2).contiguous())           # (B, n, k/2)
            seen = torch.view_as_real(cj[:, None] * torch.polar(torch.ones_like(rel), rel)).reshape(B, n, n, k)
            nu = (att.lam * s[h] ** 2 / (nreal if att.length_norm else torch.ones_like(nreal)))[:, None, None]
            target = (nu * torch.einsum("bij,bijk->bik", beta, seen) + x[:, :, h] + gamma * r[:, :, h]) / (
                nu * beta.sum(-1, keepdim=True) + 1 + gamma)
            new.append(torch.lerp(c[:, :, h], target, att.alpha))
        expected = (torch.stack(new, 2).reshape(B, n, d) @ Q.T).where(valid[..., None], Y)
        _, _, plain = one_step(model, Y, X, pad)
    M = max(float(Y.abs().max()), float(X.abs().max()), float(R.abs().max()), 1.0)
    tol = close_tol(D64, M * (1 + float(s.max()) ** 2 * (2 * M) ** 2 * d))
    back = plain if att.basis is None else plain @ Q.T
    assert ((back - expected).abs().where(valid[..., None], 0.0) <= tol).all()


# ----------------------------------------------------------------------------- special cases
@pytest.mark.parametrize("metric", ["diagonal", "free"])
@pytest.mark.parametrize("layer", ["joint", "alternating"])
def test_an_isotropic_map_reproduces_the_isotropic_step(metric, layer):
    """A_h = s_h I (diagonal a_h = s_h 1, or free) gives the isotropic layer. Diagonal: μ = s² (rounded up), the
    same step to round-off. Free: μ = s²(1 + SAFETY) (Gershgorin, exact for a diagonal M, times the margin),
    which shrinks the step c⁺ − c by a factor within [1/(1 + SAFETY), 1]: |Δ| ≤ SAFETY |c⁺ − c| + round-off."""
    torch.manual_seed(3)
    common = dict(d_model=16, n_heads=4, depth=1, ffn_hidden=32, layer=layer)
    iso = UnfoldedTransformer(ModelConfig.preset("certified", **common)).double().eval()
    other = UnfoldedTransformer(ModelConfig.preset("certified", metric=metric, **common)).double().eval()
    with torch.no_grad():
        iso.layers[0].attention.log_scale.uniform_(-1, 0.5)
        s = iso.layers[0].attention.log_scale.exp()
        state = {key: v for key, v in iso.state_dict().items() if "log_scale" not in key}
        other.load_state_dict(state, strict=False)
        if metric == "diagonal":
            other.layers[0].attention.metric_diag.copy_(s[:, None].expand(4, 4))
        else:
            other.layers[0].attention.metric_map.copy_(s[:, None, None] * torch.eye(4, dtype=D64))
        X = torch.randn(3, 9, 16, dtype=D64) * 2
        pad = torch.zeros(3, 9, dtype=torch.bool)
        pad[1, 5:] = True
        a, b = iso(X, pad).hidden, other(X, pad).hidden
    scale = max(float(X.abs().max()), float(a.abs().max()), 1.0)
    extra = 0.0 if metric == "diagonal" else SAFETY * float((a - X).abs().max())
    assert ((a - b).abs() <= close_tol(D64, scale) + extra).all()
    if metric == "free":
        assert not torch.equal(a, b)          # the margin is there, and the comparison's slack accounts for it


def test_rotary_with_one_token_is_position_free():
    """n = 1: R_0 = I, so the rotary model computes exactly what the position-free one does."""
    torch.manual_seed(4)
    for metric in ("isotropic", "free"):
        cfg = dict(d_model=16, n_heads=4, depth=2, ffn_hidden=32, metric=metric)
        rot = UnfoldedTransformer(ModelConfig.preset("certified", positions="rotary", **cfg)).eval()
        plain = UnfoldedTransformer(ModelConfig.preset("certified", **cfg)).eval()
        plain.load_state_dict(rot.state_dict())
        X = torch.randn(2, 1, 16)
        with torch.no_grad():
            assert torch.equal(rot(X).hidden, plain(X).hidden)


@pytest.mark.parametrize("kind", ["certified", "certified", "standard"])
def test_padding_does_not_change_real_tokens(kind):
    """Positions are absolute indices and the library pads on the right: appending padded tokens (any values)
    leaves every real token's output unchanged (rotary, all three layer kinds), up to the chunking of sums."""
    torch.manual_seed(5)
    cfg = ModelConfig.preset("certified-alternating" if kind == "certified" else kind, d_model=16, n_heads=4, depth=2,
                             ffn_hidden=32, positions="rotary",
                             **({"metric": "free"} if kind != "standard" else {}))
    model = (StandardTransformer(cfg) if kind == "standard" else UnfoldedTransformer(cfg)).double().eval()
    X = torch.randn(2, 7, 16, dtype=D64)
    junk = torch.randn(2, 5, 16, dtype=D64) * 100
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[:, 7:] = True
    with torch.no_grad():
        short = model(X).hidden
        long = model(torch.cat([X, junk], 1), pad).hidden[:, :7]
    assert torch.allclose(short, long, rtol=0, atol=close_tol(D64, float(short.abs().max()) * 10))


def test_the_standard_rotary_block_is_rope_on_queries_and_keys():
    """One block against the formula softmax((R_i q_i)·(R_j k_j)/√k) v_j per head (float64), then W_O and the
    pre-LN MLP of `nn.TransformerEncoderLayer` (same parameters)."""
    torch.manual_seed(6)
    block = RotaryEncoderLayer(16, 4, 32, dropout=0.0, activation="gelu", batch_first=True,
                               norm_first=True).double().eval()
    x = torch.randn(2, 6, 16, dtype=D64)
    with torch.no_grad():
        att = block.self_attn
        h = block.norm1(x)
        q, k, v = (h @ att.in_proj_weight.T + att.in_proj_bias).reshape(2, 6, 3, 4, 4).unbind(2)
        q, k = rotate_reference(q), rotate_reference(k)
        w = torch.softmax(torch.einsum("bihk,bjhk->bhij", q, k) / 2.0, -1)
        o = att.out_proj(torch.einsum("bhij,bjhk->bihk", w, v).reshape(2, 6, 16))
        y = x + o
        expected = y + block.linear2(torch.nn.functional.gelu(block.linear1(block.norm2(y))))
        got = block(x)
    assert torch.allclose(got, expected, rtol=0, atol=close_tol(D64, 10 * float(expected.abs().max())))


def test_position_and_metric_fields_are_checked():
    with pytest.raises(ConfigError, match="rotary positions apply"):
        ModelConfig.preset("crate", positions="rotary")
    with pytest.raises(ConfigError, match="even head width"):
        ModelConfig.preset("certified", d_model=12, n_heads=4, positions="rotary")
    with pytest.raises(ConfigError, match="max_positions does not apply"):
        ModelConfig.preset("standard", positions="sinusoidal", max_positions=64)
    with pytest.raises(ConfigError, match="metric"):
        ModelConfig.preset("certified", metric="cholesky")
    with pytest.raises(ConfigError, match="metric does not apply"):
        ModelConfig.preset("standard", metric="free")
    assert ModelConfig.preset("energy-transformer", positions="learned").max_positions == 512
    with pytest.raises(ValueError, match="rotated stack|rotated.py"):
        lay = UnfoldedTransformer(ModelConfig.preset("certified", d_model=8, n_heads=2,
                                                     metric="free")).layers[0]
        lay(torch.randn(1, 3, 8), torch.randn(1, 3, 8), None)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_absolute_positions_are_added_to_the_encoders_input(kind):
    """The classifier's encoder input is embedding + P[:n] (P: the learned table, or g·sin/cos(i ω_t) with
    ω_t = 10000^{−2t/d}, written out here, and its learned gain g, which starts at RMS 0.02 per entry like the
    learned table and receives a gradient); sequences longer than a learned table are refused."""
    from unfoldformer.classifier import SequenceClassifier, build_encoder
    torch.manual_seed(7)
    cfg = ModelConfig.preset("certified", d_model=8, n_heads=2, depth=1, ffn_hidden=8, positions=kind,
                             **({"max_positions": 6} if kind == "learned" else {}))
    clf = SequenceClassifier(build_encoder(cfg), torch.randn(20, 8), 8, project=False).double()
    ids = torch.randint(1, 20, (2, 5))
    seen = {}
    clf.encoder.register_forward_hook(lambda mod, args, out: seen.update(x=args[0]))   # returns None: output kept
    clf(ids)
    if kind == "learned":
        P = clf.positions.table[:5].detach().double()
    else:
        i, t = torch.arange(5, dtype=D64)[:, None], torch.arange(4, dtype=D64)
        angle = i * 10000.0 ** (-2 * t / 8)
        P = torch.stack([torch.sin(angle), torch.cos(angle)], -1).reshape(5, 8)
        assert float(clf.positions.gain) == pytest.approx(0.02 * 2 ** 0.5, rel=2.0 ** -24)   # created in float32
        P = clf.positions.gain.detach() * P
    assert torch.allclose(seen["x"], clf.embedding(ids).double() + P, rtol=0, atol=close_tol(D64, 10))
    if kind == "sinusoidal":
        logits, _ = clf(ids)
        logits.sum().backward()
        assert clf.positions.gain.grad is not None and float(clf.positions.gain.grad) != 0.0
    if kind == "learned":
        with pytest.raises(ConfigError, match="max_positions"):
            clf(torch.randint(1, 20, (1, 7)))
