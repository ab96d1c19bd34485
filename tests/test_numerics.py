"""Every fast path equals its formula on adversarial token sets (tests/strategies.py), float32 and float64,
with tolerances from the error bounds of docs/theory.md, "Numerics of the fast paths" (THEORY §3.10).

The references are float64 pair-difference formulas on the same rounded inputs (`as_float64`), so a
tolerance covers only the fast path's own evaluation error:

- `pass_bound`: the fused pass and the Gram-form distances err by at most 4 γ_{k+4} R² in the logits
  (`softmax.logit_error_bound`; R² = max ‖a_i − mean‖² over real tokens), in the dtype the path ran in
  (float64 where the inputs' dtype would exceed `PRECISION_TARGET`), plus the final rounding to the
  inputs' dtype: close_tol(dtype, |quantity|).
- a weight w_ij = ρ'(z_ij) then errs relatively by κ_ρ·δz with κ_ρ = sup |ρ''/ρ'| (exp 1, log 1/c = ½), and
  a weighted average of vectors c_j by at most 2 (e^{κ δz} − 1) max_j ‖c_j − o_i‖ (weights' relative errors
  η move a convex combination by ≤ 2η times the spread).
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import D64, close_tol, examples
from strategies import as_float64, token_sets
from unfoldformer.config import ModelConfig
from unfoldformer.descent import descent_tolerance
from unfoldformer.kernels import weighted_average
from unfoldformer.model import UnfoldedTransformer
from unfoldformer.rho import get_rho
from unfoldformer.softmax import PRECISION_TARGET, attention_pass, logit_error_bound, mass_energy
from unfoldformer.steps import attention_step, isotropic_factors

KAPPA = {"exp": 1.0, "log": 0.5}                                     # sup |ρ''/ρ'| of the default ρ


def pass_bound(a_centred: torch.Tensor, valid: torch.Tensor, dtype: torch.dtype) -> float:
    """The logits' error bound of the path that ran for centred features a (B, n, H, k) (module doc)."""
    radius_sq = float((a_centred.double() ** 2).sum(-1).where(valid[..., None], 0.0).max())
    bound = float(logit_error_bound(torch.tensor(radius_sq), a_centred.shape[-1], dtype))
    if dtype != D64 and bound > PRECISION_TARGET:
        bound = float(logit_error_bound(torch.tensor(radius_sq), a_centred.shape[-1], D64))
    return bound


def _centred(C: torch.Tensor, scales: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """s_h (c_i − mean) in float64 (B, n, H, k): the features whose radius the bound takes."""
    w = valid.double()[:, :, None, None]
    mean = (C.double() * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1.0)
    return (C.double() - mean) * scales.double()[:, None]


def _pairs(C: torch.Tensor, scales: torch.Tensor, valid: torch.Tensor):
    """z_ij = ½ s_h² ‖c_i − c_j‖² (B, H, n, n) in float64 from pair differences (taken before scaling: relative
    error a few u64 whatever the offset), and the mask of real off-diagonal pairs."""
    c = C.double().transpose(1, 2)                                   # (B, H, n, k)
    z = 0.5 * scales.double()[None, :, None, None] ** 2 * (c[:, :, :, None] - c[:, :, None]).pow(2).sum(-1)
    n = C.shape[1]
    pair = valid[:, None, :, None] & valid[:, None, None, :] & ~torch.eye(n, dtype=torch.bool)
    return z, pair


def _heads(d: int) -> int:
    return 2 if d % 2 == 0 else 1


@examples(1000)
@given(batch=token_sets(), average=st.booleans())
def test_fused_pass_equals_the_pair_formula(batch, average):
    """log S_i = log Σ_{j≠i real} e^{−z_ij}, E_A = −½ Σ S_i and o_i = Σ_{j≠i} e^{−z_ij} c_j / S_i on far clusters,
    offsets, large, tiny and identical tokens, n = 1 and all-but-one padding, within the derived bound."""
    Y, _, pad = batch
    B, n, d = Y.shape
    H, valid = _heads(d), ~pad
    C = Y.view(B, n, H, d // H)
    scales = torch.linspace(0.5, 1.5, H, dtype=Y.dtype)
    res = attention_pass(C, scales, valid, average=average)
    z, pair = _pairs(C, scales, valid)
    ref = torch.logsumexp(torch.where(pair, -z, -torch.inf), dim=-1).transpose(1, 2)   # (B, n, H)
    has = valid[..., None] & torch.isfinite(ref)                     # real queries with another real token
    assert (res.log_mass[~has & valid[..., None]] < -1e29).all()     # no other real token: mass 0
    bound = pass_bound(_centred(C, scales, valid), valid, Y.dtype)
    if has.any():
        err = (res.log_mass.double() - ref).abs()[has]
        assert (err <= bound + close_tol(Y.dtype, 1.0) * ref.abs()[has].clamp_min(1.0)).all()
    e_ref = -0.5 * torch.where(has, ref.exp(), 0.0).sum((1, 2))
    e_tol = math.expm1(bound + close_tol(Y.dtype, 1.0) * max(1.0, float(ref[has].abs().max()) if has.any() else 1.0))
    assert ((mass_energy(res, valid) - e_ref).abs() <= e_tol * e_ref.abs() + 1e-300).all()
    if average and has.any():
        w = torch.where(pair, torch.exp(-(z - z.where(pair, torch.inf).amin(-1, keepdim=True))), 0.0)
        V = C.double().transpose(1, 2)                               # (B, H, n, k)
        o_ref = (w @ V) / w.sum(-1, keepdim=True).clamp_min(1e-300)  # (B, H, n, k)
        spread = float((V[:, :, :, None] - V[:, :, None]).norm(dim=-1).max())
        tol = 2 * math.expm1(2 * bound) * spread + close_tol(Y.dtype, float(V.abs().max()))
        err = (res.average.double().transpose(1, 2) - o_ref).norm(dim=-1).transpose(1, 2)   # (B, n, H)
        assert (err[has] <= tol).all()


@pytest.mark.parametrize("rho", sorted(KAPPA))
@examples(500)
@given(batch=token_sets())
def test_kernel_sums_equal_the_pair_formula(rho, batch):
    """The blocked kernel's average Σ_j ρ'(z_ij) c_j / Σ_j ρ'(z_ij) over real keys (centred features, float64
    where the bound asks for it) equals the float64 pair formula within 2 (e^{κ_ρ δz} − 1)·spread.
    (lp and truncated are not in this test: their weights are not Lipschitz in z near the floor / the
    threshold τ, so no bound on δz bounds them; `benchmarks/numerics_check.py` measures their steps.)"""
    Y, _, pad = batch
    B, n, d = Y.shape
    H, valid = _heads(d), ~pad
    C = Y.view(B, n, H, d // H)
    scales = torch.linspace(0.5, 1.5, H, dtype=Y.dtype)
    a = (C * scales[:, None]).transpose(1, 2)                        # (B, H, n, k)
    num, deg = weighted_average(a, C.transpose(1, 2), valid, get_rho(rho))
    z, _ = _pairs(C, scales, valid)
    w = get_rho(rho).derivative(z) * valid[:, None, None, :]          # (B, H, n, n) real keys, self included
    V = C.double().transpose(1, 2)
    o_ref = (w @ V) / w.sum(-1, keepdim=True)
    bound = pass_bound(_centred(C, scales, valid), valid, Y.dtype)
    spread = float((V[:, :, :, None] - V[:, :, None]).norm(dim=-1).max()) if n > 1 else 0.0
    tol = 2 * math.expm1(KAPPA[rho] * bound) * spread + close_tol(Y.dtype, float(V.abs().max()))
    err = ((num / deg).double() - o_ref).norm(dim=-1)                # (B, H, n)
    assert (err.transpose(1, 2)[valid] <= tol).all()


@pytest.mark.parametrize("rho", sorted(KAPPA))
@examples(500)
@given(batch=token_sets())
def test_attention_step_fast_path_equals_the_float64_dense_step(rho, batch):
    """`attention_step`'s fast path (SDPA for exp, the blocked kernel otherwise) in the inputs' dtype equals the
    dense float64 step on the same rounded inputs: the move y⁺ − y is an average minus y, so it errs by the
    average's bound plus the output's rounding at |y| (close_tol(dtype, max |Y|))."""
    Y, _, pad = batch
    B, n, d = Y.shape
    H = _heads(d)
    scales = torch.linspace(0.5, 1.5, H, dtype=Y.dtype)
    fac = isotropic_factors(scales, d)
    out = attention_step(Y, fac, rho, 1.0, pad)
    Y64 = as_float64(batch).Y
    ref = attention_step(Y64, fac.double(), rho, 1.0, pad, use_sdpa=False)
    C = Y.view(B, n, H, d // H)
    bound = pass_bound(_centred(C, scales, ~pad), ~pad, Y.dtype)
    V = C.double()
    spread = float((V[:, :, None] - V[:, None]).norm(dim=-1).max()) if n > 1 else 0.0
    # Beyond the logits' bound: each path sums n weighted keys for the numerator and n weights for the
    # denominator in its own dtype (the dense float64 reference at the uncentred |c|), each sum erring by at
    # most γ_n ≈ n·u of Σ|terms| ≤ (max |c|)·Σβ, so the quotient by 2n·u·max|c| per path, 4n·u for the two;
    # the output y + α(avg − y) adds 2u|y|: (2n + 1)·eps·max|Y| in all (u = eps/2). Measured: a float64 case
    # at |Y| ≈ 700 differed by 1.08e-11 where close_tol alone allowed 9.8e-12 (under load, 2 threads).
    summation = (2 * n + 1) * torch.finfo(Y.dtype).eps * float(Y64.abs().max())
    tol = 2 * math.expm1(KAPPA[rho] * 2 * bound) * spread + close_tol(Y.dtype, float(Y64.abs().max())) + summation
    assert float((out.double() - ref).abs().max()) <= tol


def _certified(seed: int, dtype: torch.dtype, heads: int, learn_basis: bool, depth: int = 3,
               tied: bool = True, alpha_ffn: float = 1.0) -> UnfoldedTransformer:
    """A certified model (d = 8) with strong FFNs (W1 × 3, b ~ N(0, 0.3)) in `dtype`."""
    torch.manual_seed(seed)
    cfg = ModelConfig.preset("certified-alternating", d_model=8, n_heads=heads, depth=depth, ffn_hidden=16,
                             learn_basis=learn_basis, anchor_weight=0.5, tied=tied, alpha_ffn=alpha_ffn)
    model = UnfoldedTransformer(cfg).to(dtype)
    with torch.no_grad():
        for layer in model.layers:
            layer.ffn.W1.mul_(3.0)
            layer.ffn.b.normal_(0.0, 0.3)
        for name, param in model.named_parameters():   # a basis off the identity (exp(0) = I at init)
            if "basis" in name:
                param.add_(0.3 * torch.randn_like(param))
    return model


@examples(300)
@given(batch=token_sets(d=8, max_norm=1e2, max_offset=1e2), heads=st.sampled_from([1, 2]),
       learn_basis=st.booleans(), seed=st.integers(0, 3), tied=st.booleans(), alpha_ffn=st.sampled_from([1.0, 0.5]))
def test_plain_forward_equals_the_traced_forward(batch, heads, learn_basis, seed, tied, alpha_ffn):
    """model(x) and model(x, return_energies=True) compute the same function: every step reads the same
    off-diagonal pass (the self term in closed form) and both turn the state from one layer's basis into
    the next (untied) and back to original coordinates by the same products (`rotated.RotatedStack.run` /
    `trial` + `advance`; untied with α_ffn = 1 the FFN's output weight taken into the next basis,
    `next_weight`), so the hidden states are equal to the bit, learned bases off the identity, tied
    or untied, on any input and any CPU (the same operations in one process)."""
    Y, _, pad = batch
    model = _certified(seed, Y.dtype, heads, learn_basis, tied=tied, alpha_ffn=alpha_ffn)
    with torch.no_grad():
        plain = model(Y, pad).hidden
        traced = model(Y, pad, return_energies=True).hidden
    assert torch.equal(plain, traced)


def _exact_energy(model64: UnfoldedTransformer, Y: torch.Tensor, X: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
    """E(Y) of a tied certified model in float64 from pair differences (THEORY §3.3–3.4), (B,): written here
    from the formulas, independent of the library's energy code."""
    att, ffn = model64.layers[0].attention, model64.layers[0].ffn
    valid = ~pad
    a = torch.einsum("bnd,hkd->bhnk", Y, att.factors())              # (B, H, n, k)
    z = 0.5 * (a[:, :, :, None] - a[:, :, None]).pow(2).sum(-1)       # (B, H, n, n)
    n = Y.shape[1]
    pair = valid[:, None, :, None] & valid[:, None, None, :] & torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
    rows = valid[..., None]
    hidden = torch.relu(Y @ ffn.W1 + ffn.b)
    return (torch.where(pair, -torch.exp(-z), 0.0).sum((1, 2, 3))
            + 0.5 * torch.where(rows, (Y - X) ** 2, 0.0).sum((1, 2)) / att.lam
            + 0.5 * torch.where(rows, Y ** 2, 0.0).sum((1, 2)) - 0.5 * torch.where(rows, hidden ** 2, 0.0).sum((1, 2)))


@examples(1000)
@given(batch=token_sets(d=8, max_n=12, max_norm=10.0, max_offset=10.0), heads=st.sampled_from([1, 2]),
       seed=st.integers(0, 3))
def test_safeguard_accepts_no_layer_that_rises_under_an_independent_float64_evaluation(batch, heads, seed):
    """The safeguard decides on float64 evaluations of the states (float32 states included), so a layer it
    accepts does not raise E under an independent float64 evaluation at the returned states beyond
    `descent_tolerance(dtype)·(1 + |E|)` — the last layer of a tied depth-3 model, whose input state is the
    output of the same model at depth 2 (same parameters, same decisions). Fixed bases (learn_basis off):
    the returned states are then the states the safeguard evaluated, with no change of basis between."""
    Y, _, pad = batch
    full = _certified(seed, Y.dtype, heads, False, depth=3)
    short = _certified(seed, Y.dtype, heads, False, depth=2)
    short.load_state_dict(full.state_dict())
    model64 = copy.deepcopy(full).double()
    with torch.no_grad():
        prev = short(Y, pad, safeguard=True).hidden
        out = full(Y, pad, safeguard=True)
        X = as_float64(batch).Y
        before = _exact_energy(model64, prev.double(), X, pad)
        after = _exact_energy(model64, out.hidden.double(), X, pad)
    accepted = out.step_scales[:, -1] > 0
    tol = descent_tolerance(Y.dtype)
    assert not (accepted & (after > before + tol * (1 + before.abs()))).any()
