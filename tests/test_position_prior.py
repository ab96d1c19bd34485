"""Position priors of an encoder (`position_prior=K`, docs/theory.md "Position priors"): every pair (i, j) of E_A
weighted by e^{p_h(k_i) + p_h(k_j)}, k = a token's rank among its sample's real tokens.

The weights are symmetric and positive, so the layer keeps one energy of all tokens and its MM step stays a descent
step. The cases are test_joint's adversarial ones (`cases(prior=True)`: far clusters, offsets up to 1e3, identical
tokens, n = 1, all-but-one padding, float32 and float64) with log-weights p drawn in ±3; the references are written
here from explicit pair differences and ranks counted one token at a time (`test_joint.pair_weights`), never the
library's key column. The step's formula with pair weights is checked in
`test_joint.py::test_the_joint_step_is_the_formula_of_theory` (its cases include priors).
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import close_tol, examples
from strategies import token_sets
from test_joint import (
    D64,
    cases,
    curve_float32_allowances,
    curve_term_scales,
    float32_allowance,
    not_raised,
    pair_attention_energy,
    rotated_energy,
    stack_of,
    term_scale,
)
from unfoldformer import energy as E
from unfoldformer.config import ModelConfig
from unfoldformer.descent import descent_tolerance
from unfoldformer.errors import ConfigError
from unfoldformer.model import UnfoldedTransformer
from unfoldformer.softmax import attention_pass


# ----------------------------------------------------------------------------- descent
@given(case=cases(prior=True))
@examples(1000)
def test_a_joint_layer_with_a_position_prior_never_raises_its_energy(case):
    """0 rises: by the model's own curve, and by an independent float64 evaluation (explicit pair differences,
    weights from ranks counted here) of every state the plain forward steps between."""
    (Y, X, pad), model = case
    tol = descent_tolerance(Y.dtype)
    with torch.no_grad():
        out = model(X, pad, return_energies=True)
        stack = stack_of(model, X, pad)
        if Y.dtype == D64:
            assert not_raised(out.layer_before, out.layer_after, tol, curve_term_scales(stack)).all()
        else:   # a plain float32 step may rise by its own rounding (docs/theory.md, "Rounding the state")
            assert (out.layer_after <= out.layer_before + curve_float32_allowances(stack)).all()
        Ys = stack.start()
        for ell in range(model.config.depth):
            f = stack.frame(ell)
            Yn = stack._joint(f, Ys, stack.anchor(ell), stack.valid, 1.0, None)
            before, after = rotated_energy(stack, ell, Ys), rotated_energy(stack, ell, Yn)
            if Y.dtype == D64:
                scale = torch.maximum(term_scale(stack, ell, Ys), term_scale(stack, ell, Yn))
                assert not_raised(before, after, tol, scale).all(), (before, after)
            else:
                assert (after <= before + float32_allowance(stack, ell, Yn, before)).all(), (before, after)
            Ys = stack.advance(ell, Yn)


@given(case=cases(layer="alternating", dtype=D64, prior=True))
@examples(300)
def test_the_alternating_layer_with_a_prior_descends_in_each_sub_step_and_with_the_safeguard(case):
    """The attention step lowers E_A + λ⁻¹½‖Y − X‖² (weighted pairs), the FFN step E_H; with the safeguard every
    layer lowers the whole layer energy (float64 states: the library's own rule with the terms' scale)."""
    (Y, X, pad), model = case
    tol = descent_tolerance(D64)
    with torch.no_grad():
        out = model(X, pad, return_energies="steps")
        guarded = model(X, pad, return_energies=True, safeguard=True)
        stack = stack_of(model, X, pad)
        scale = curve_term_scales_alternating(stack)
    assert (out.attention_after <= out.attention_before + tol * (1 + scale)).all()
    assert (out.ffn_after <= out.ffn_before + tol * (1 + scale)).all()
    assert not_raised(guarded.layer_before, guarded.layer_after, tol, scale).all()


def curve_term_scales_alternating(stack) -> torch.Tensor:
    """Σ|terms| of each layer's energy at the input of the plain forward's layers and after them: (B, depth)."""
    Y, scales = stack.start(), []
    for ell in range(stack.depth):
        f = stack.frame(ell)
        U = stack._attend(f, Y, stack.anchor(ell), stack.valid, 1.0, None)[0]
        Yn = stack._ffn(f, U, 1.0)[0]
        scales.append(torch.stack([term_scale(stack, ell, Z) for Z in (Y, U, Yn)]).amax(0))
        Y = stack.advance(ell, Yn)
    return torch.stack(scales, 1)


# ----------------------------------------------------------------------------- the pass and the energies
def _explicit_pass(C: torch.Tensor, s: torch.Tensor, valid: torch.Tensor, p: torch.Tensor):
    """log S_i = log Σ_{j≠i real} e^{p_i + p_j − ½ s_h²‖c_i − c_j‖²} and o_i (weights e^{p_j − z_ij}), in float64 from
    explicit differences: (B, n, H), (B, n, H, dh)."""
    Cd = C.to(D64).transpose(1, 2)                                          # (B, H, n, dh)
    z = 0.5 * s.to(D64)[None, :, None, None] ** 2 * (Cd[:, :, :, None] - Cd[:, :, None]).square().sum(-1)
    n = C.shape[1]
    pd = p.to(D64).transpose(1, 2)                                          # (B, H, n)
    logits = pd[:, :, :, None] + pd[:, :, None, :] - z                      # (B, H, n, n)
    keep = valid[:, None, None, :] & ~torch.eye(n, dtype=torch.bool)
    logits = logits.masked_fill(~keep, float("-inf"))
    log_mass = torch.logsumexp(logits, -1).transpose(1, 2)
    avg = (torch.softmax(logits, -1) @ Cd).transpose(1, 2)
    return log_mass, avg


@pytest.mark.parametrize("dtype", [torch.float32, D64])
@pytest.mark.parametrize("n", [1, 2, 7, 40])          # 40: the flash kernel; up to 32: the short-sequence pass
@pytest.mark.parametrize("fused", [None, False])
def test_the_pass_with_a_prior_is_the_weighted_softmax(dtype, n, fused):
    """log S_i and o_i of `attention_pass(prior=p)` against the explicit weighted sums, on tokens in clusters with
    an offset, padding on both sides, p in ±3. Round-off: the logits' error 4γR² + 2u max|p| (relative, on each
    weight) times the values' size."""
    g = torch.Generator().manual_seed(n)
    B, H, dh = 3, 2, 4
    centres = torch.randn(B, 3, H, dh, generator=g, dtype=D64) * 2
    C = centres[:, torch.randint(0, 3, (n,), generator=g)] + 0.3 * torch.randn(B, n, H, dh, generator=g, dtype=D64)
    C = (C + 50.0).to(dtype)                                                # a common offset
    valid = torch.ones(B, n, dtype=torch.bool)
    if n > 2:
        valid[1, -2:] = False
        valid[2, :2] = False
    p = (torch.rand(B, n, H, generator=g, dtype=D64) * 6 - 3).to(dtype)
    s = torch.tensor([0.7, 1.3], dtype=dtype)
    got = attention_pass(C, s, valid, fused=fused, prior=p)
    log_mass, avg = _explicit_pass(C, s, valid, p)
    u = torch.finfo(dtype).eps / 2
    a = ((C.to(D64) - C.to(D64).where(valid[..., None, None], 0).sum(1, keepdim=True) / valid.sum(1)[:, None, None,
         None]) * s.to(D64)[:, None])
    R2 = float(a.square().sum(-1).where(valid[..., None], 0).max())
    err = 4 * (dh + 4) * u * R2 * 1.01 + 2 * u * 3 + 64 * u
    has_other = (valid.sum(1, keepdim=True) - valid.to(torch.long)) > 0        # (B, n) another real token
    rows = (valid & has_other)[..., None]                                    # (B, n, 1)
    assert ((got.log_mass.to(D64) - log_mass).abs().where(rows, 0.0) <= err * (1 + log_mass.abs())).all()
    spread = float((C.to(D64) - 50.0).abs().max()) + 50.0
    assert ((got.average.to(D64) - avg).abs().where(rows[..., None], 0.0) <= 2 * err * spread).all()


@given(batch=token_sets(d=4, dtype=D64, max_n=7), table=st.lists(st.floats(-3, 3), min_size=6, max_size=6))
@examples(300)
def test_the_energy_paths_with_a_prior_are_the_weighted_pair_sum(batch, table):
    """E.attention_energy(prior=…) by the fused pass, the Gram path and explicit pair differences against the sum
    Σ_h Σ_{i<j} e^{p_i + p_j} e^{−z_ij} written here. Each path's round-off: 4γ_{k+4}R² relative on every weight
    (`energy.attention_error_bound`), R² = the largest squared feature after centring."""
    Y, _, pad = batch
    H = 2
    prior = torch.tensor(table, dtype=D64).reshape(H, 3)                     # (H, K = 3)
    valid = ~pad
    rank = (valid.cumsum(1) - 1).clamp(0, 2)
    p = prior.T[rank]                                                       # (B, n, H)
    scales = torch.tensor([0.5, 1.5], dtype=D64)
    F = torch.cat([scales[0] * torch.eye(4)[:2], scales[1] * torch.eye(4)[2:]]).reshape(H, 2, 4).to(D64)
    expected = -pair_attention_energy(Y, scales, "exp", valid, prior).neg()
    Yc = Y - Y.where(valid[..., None], 0).sum(1, keepdim=True) / valid.sum(1)[:, None, None]
    R2 = float((Yc.square() * 2.25).where(valid[..., None], 0).sum(-1).max())
    bound = 4 * 6 * (2.0 ** -53) * (R2 + 12) * 64 * expected.abs() + close_tol(D64, 1.0)
    for method in ("fused", "gram", "pairs"):
        got = E.attention_energy(Y, F, "exp", pad, method=method, prior=p)
        assert ((got - expected).abs() <= bound).all(), (method, got, expected)


# ----------------------------------------------------------------------------- behaviour
def _model(prior: int, layer: str = "joint", tied: bool = True, seed: int = 0) -> UnfoldedTransformer:
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("certified", d_model=8, n_heads=2, depth=2, ffn_hidden=16, layer=layer, tied=tied,
                             position_prior=prior)
    return UnfoldedTransformer(cfg).double().eval()


def test_a_zero_prior_is_the_model_without_one_to_the_bit():
    """The table starts at 0 (p = 0: every weight 1), so a new prior starts as the model without it."""
    plain, with_prior = _model(0), _model(4)
    state = {k: v for k, v in with_prior.state_dict().items() if "position_prior" not in k}
    assert plain.load_state_dict(state, strict=True) is not None
    X = torch.randn(3, 9, 8, dtype=D64)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[1, 5:] = True
    with torch.no_grad():
        a, b = plain(X, pad, return_energies=True), with_prior(X, pad, return_energies=True)
    assert torch.equal(a.hidden, b.hidden) and torch.equal(a.energies, b.energies)


@pytest.mark.parametrize("layer", ["joint", "alternating"])
def test_the_prior_reads_ranks_among_real_tokens_whichever_side_the_padding_is_on(layer):
    """The same real tokens padded on the left and on the right give the same states (to round-off)."""
    model = _model(3, layer)
    with torch.no_grad():
        for lay in model.layers:
            lay.attention.position_prior_table.uniform_(-0.1, 0.1)
    real = torch.randn(2, 5, 8, dtype=D64)
    right, left = torch.zeros(2, 8, 8, dtype=D64), torch.zeros(2, 8, 8, dtype=D64)
    right[:, :5], left[:, 3:] = real, real
    pad_right, pad_left = torch.zeros(2, 8, dtype=torch.bool), torch.zeros(2, 8, dtype=torch.bool)
    pad_right[:, 5:], pad_left[:, :3] = True, True
    with torch.no_grad():
        a, b = model(right, pad_right).hidden[:, :5], model(left, pad_left).hidden[:, 3:]
    assert (a - b).abs().max() <= close_tol(D64, float(real.abs().max()) * 50)
    with torch.no_grad():      # and the prior acts: a different table moves the states
        model.layers[0].attention.position_prior_table.add_(0.5)
        c = model(right, pad_right).hidden[:, :5]
    assert (a - c).abs().max() > 1e-3


@pytest.mark.parametrize("n", [6, 40])
def test_the_gradient_reaches_the_prior(n):
    """d(loss)/dθ of the table by autograd equals central finite differences (float64), through the short-sequence
    pass (n = 6) and the flash kernel's backward (n = 40)."""
    model = _model(4, tied=False)
    with torch.no_grad():
        for lay in model.layers:
            lay.attention.position_prior_table.uniform_(-0.07, 0.07)
    X = torch.randn(2, n, 8, dtype=D64, generator=torch.Generator().manual_seed(1))
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[1, n - 2:] = True
    table = model.layers[0].attention.position_prior_table

    def loss():
        out = model(X, pad, return_energies=True)
        return (out.hidden.where(~pad[..., None], 0.0).square().sum() * 0.01 + out.energies[:, -1].sum() * 0.001)

    with torch.enable_grad():
        (grad,) = torch.autograd.grad(loss(), table)
    eps = 1e-6
    fd = torch.zeros_like(table)
    with torch.no_grad():
        for idx in [(0, 0), (1, 1), (0, 3), (1, 2)]:
            table[idx] += eps
            up = loss()
            table[idx] -= 2 * eps
            down = loss()
            table[idx] += eps
            fd[idx] = (up - down) / (2 * eps)
            assert abs(float(grad[idx] - fd[idx])) <= 1e-6 * (1 + abs(float(fd[idx]))), (idx, grad[idx], fd[idx])
    assert float(grad.abs().max()) > 1e-4


def test_the_prior_is_refused_where_it_does_not_apply():
    with pytest.raises(ConfigError, match="rho='exp'"):
        ModelConfig.preset("certified", rho="log", position_prior=4)
    with pytest.raises(ConfigError, match="integer >= 0"):
        ModelConfig.preset("certified", position_prior=-1)
    with pytest.raises(ConfigError, match="must be of type int"):
        ModelConfig.preset("certified", position_prior=True)
    with pytest.raises(ConfigError, match="relative_bias"):
        ModelConfig.preset("certified-causal", position_prior=4)
    with pytest.raises(ConfigError, match="does not apply"):
        ModelConfig.preset("standard", position_prior=4)
    C = torch.randn(1, 3, 2, 4)
    with pytest.raises(ValueError, match="off-diagonal"):
        attention_pass(C, None, torch.ones(1, 3, dtype=torch.bool), diagonal=True, prior=torch.zeros(1, 3, 2))


def test_configs_saved_before_the_field_load_without_a_prior(tmp_path):
    """A saved config without `position_prior` builds the model without one; one with it round-trips, table too."""
    old = ModelConfig.preset("certified", d_model=8, n_heads=2).to_dict()
    old.pop("position_prior")
    cfg = ModelConfig.from_dict(old)
    assert cfg.position_prior == 0
    assert not any("position_prior" in k for k in UnfoldedTransformer(cfg).state_dict())
    model = _model(3)
    with torch.no_grad():
        model.layers[0].attention.position_prior_table.uniform_(-1, 1)
    model.save_pretrained(tmp_path / "m")
    back = UnfoldedTransformer.from_pretrained(tmp_path / "m").double()
    assert back.config.position_prior == 3
    assert torch.equal(back.layers[0].attention.position_prior_table, model.layers[0].attention.position_prior_table)
    X = torch.randn(2, 6, 8, dtype=D64)
    with torch.no_grad():
        assert torch.equal(back(X).hidden, model(X).hidden)


def test_the_model_energy_reads_the_prior():
    """`model.energy` (the layer module's reference, `energy.attention_energy`) equals the curve's first entry."""
    model = _model(3)
    with torch.no_grad():
        model.layers[0].attention.position_prior_table.uniform_(-0.1, 0.1)
        X = torch.randn(2, 7, 8, dtype=D64)
        pad = torch.zeros(2, 7, dtype=torch.bool)
        pad[0, :2] = True
        out = model(X, pad, return_energies=True)
        ref = model.energy(X, X, pad)
    scale = float(out.energies.abs().max()) + 1
    assert ((out.energies[:, 0] - ref).abs() <= close_tol(D64, scale * 10)).all()
    assert math.isfinite(float(ref.sum()))
