"""The causal joint layer (THEORY §3.11): causality, the step's formula, per-token descent, G, the cache.

The reference below is written from §3.11 alone, in float64, from explicit pair differences c_i − c_j (not the
library's Gram forms, kernels or frames): the step, the per-token conditional energies E_i(y | Ȳ) and the
majoriser's curvature p per token and head.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import unfoldformer as uf
from conftest import examples
from strategies import token_sets
from unfoldformer.decoder import extend, prefill
from unfoldformer.softmax import logit_error_bound

D, H = 8, 2
U64 = torch.finfo(torch.float64).eps / 2

# ρ and ρ' written out (independent of rho.py)
RHOS = {"exp": (lambda z: -torch.exp(-z), lambda z: torch.exp(-z)),
        "log": (lambda z: torch.log(z + 2), lambda z: 1 / (z + 2))}


def _layer(seed: int, rho: str = "exp", gamma: float = 1.0, lam: float = 1.0, norm: str = "length",
           dtype=torch.float64) -> uf.CertifiedDecoderLayer:
    torch.manual_seed(seed)
    layer = uf.CertifiedDecoderLayer(D, H, 16, rho=rho, lam=lam, ffn_weight=gamma, attention_norm=norm)
    with torch.no_grad():                                           # away from the initialisation: any weights
        for p in layer.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return layer.to(dtype)


def _parts(layer):
    j = layer.layer
    att, ffn = j.attention, j.ffn
    Q = att.basis.weight.double() if att.basis is not None else torch.eye(D, dtype=torch.float64)
    return dict(Q=Q, s=att.log_scale.exp().double(), W1=ffn.W1.double(), b=ffn.b.double(), lam=att.lam,
                gamma=float(j.gamma), alpha=float(j.step_size()), norm=att.length_norm, rho=att.rho)


def _heads(Z, Q):
    B, n, _ = Z.shape
    return (Z.double() @ Q).view(B, n, H, D // H)                  # (B, n, H, dh)


def _seen(valid):
    n = valid.shape[1]
    return torch.ones(n, n, dtype=torch.bool).tril()[None] & valid[:, None, :]   # (B, i, j): j ≤ i, j real


def _visible(valid):
    return valid.long().cumsum(1).clamp_min(1).double()           # (B, n) m_i


def reference_step(layer, Ybar, X, valid):
    """§3.11's step in float64 from pair differences: (Y⁺ (B, n, d), p (B, n, H) curvature, diameter²·s²)."""
    P = _parts(layer)
    rho_d = RHOS[P["rho"]][1]
    C, Xc = _heads(Ybar, P["Q"]), _heads(X, P["Q"])               # (B, n, H, dh)
    W = P["Q"].T @ P["W1"]                                         # the FFN in the basis
    R = (torch.relu(C.flatten(2) @ W + P["b"]) @ W.T).view_as(C)   # (B, n, H, dh) r̃
    diff = C[:, :, None] - C[:, None, :]                           # (B, i, j, H, dh)
    z = 0.5 * P["s"].square() * diff.square().sum(-1)              # (B, i, j, H)
    beta = torch.where(_seen(valid)[..., None], rho_d(z), 0.0)
    nu = P["lam"] * P["s"].square() / (_visible(valid)[..., None] if P["norm"] else 1.0)   # (B, n, H)
    num = torch.einsum("bijh,bjhk->bihk", beta, C)
    deg = beta.sum(2)                                              # (B, n, H)
    g, a = P["gamma"], P["alpha"]
    t = (nu[..., None] * num + Xc + g * R) / (nu * deg + 1 + g)[..., None]
    out = ((1 - a) * C + a * t).flatten(2) @ P["Q"].T              # (B, n, d)
    out = torch.where(valid[..., None], out, Ybar.double())
    spread = torch.where(_seen(valid)[..., None], z, 0.0).amax()   # max ½ s²‖c_i − c_j‖² over visible pairs
    return out, (nu * deg + 1 + g) / P["lam"], float(spread.detach())


def reference_energy(layer, Y, context, X, valid):
    """(E_i(y_i | context) (B, n), Σ|terms| (B, n)) in float64 (library units: THEORY's / λ)."""
    P = _parts(layer)
    rho = RHOS[P["rho"]][0]
    diff = _heads(Y, P["Q"])[:, :, None] - _heads(context, P["Q"])[:, None, :]   # (B, i, j, H, dh)
    vals = torch.where(_seen(valid)[..., None], rho(0.5 * P["s"].square() * diff.square().sum(-1)), 0.0)
    w = 1 / _visible(valid) if P["norm"] else 1.0
    Yd, Xd = Y.double(), X.double()
    hidden = torch.relu(Yd @ P["W1"] + P["b"])
    anchor, y_sq, h_sq = 0.5 * (Yd - Xd).square().sum(-1), 0.5 * Yd.square().sum(-1), 0.5 * hidden.square().sum(-1)
    E = w * vals.sum((2, 3)) + (anchor + P["gamma"] * (y_sq - h_sq)) / P["lam"]
    S = w * vals.abs().sum((2, 3)) + (anchor + P["gamma"] * (y_sq + h_sq)) / P["lam"]
    return torch.where(valid, E, 0.0), torch.where(valid, S, 0.0)


settings = dict(rho=st.sampled_from(["exp", "log"]), gamma=st.sampled_from([0.0, 1.0, 3.0]),
                lam=st.sampled_from([0.5, 1.0, 2.0]), norm=st.sampled_from(["length", "none"]),
                seed=st.integers(0, 2**16))


@examples(300)
@given(batch=token_sets(d=D, dtype=torch.float64, with_input=True), **settings)
def test_step_equals_the_formula_in_float64(batch, rho, gamma, lam, norm, seed):
    Ybar, X, pad = batch
    layer = _layer(seed, rho, gamma, lam, norm)
    with torch.no_grad():
        got = layer(Ybar, anchor=X, tgt_key_padding_mask=pad)
    want, _, spread = reference_step(layer, Ybar, X, ~pad)
    # Each weight's logit errs by at most 4γ_{k+4}R² (softmax.logit_error_bound, R² ≤ 2·spread after centring on a
    # visible token), moving a weighted average by at most 2·that·(its diameter); plus 64 units of round-off.
    scale = 1.0 + float(Ybar.abs().max()) + float(X.abs().max())
    eps_w = float(logit_error_bound(torch.tensor(2 * spread + 1.0), D // H, torch.float64))
    tol = (64 * U64 + 2 * eps_w) * scale * 4
    assert (got - want).abs().max() <= tol


@examples(300)
@given(batch=token_sets(d=D, with_input=True), **settings)
def test_every_token_descends_its_conditional_energy(batch, rho, gamma, lam, norm, seed):
    """E_i(y_i⁺ | Ȳ) ≤ E_i(ȳ_i | Ȳ) for every token, float32 and float64, adversarial Ȳ and X.

    Tolerance (THEORY §3.10 (i)): E_i ≤ Q_i, Q_i(ȳ) = E_i(ȳ), and Q_i(y) = Q_i(t) + ½ Σ_h p_h ‖y_h − t_h‖² with t the
    exact step (α = 1), so a computed step t + δ rises by at most ½ Σ_h p_h ‖δ_h‖²; δ is measured against the float64
    reference. The float64 evaluations err by at most 64 u₆₄ Σ|terms|."""
    Ybar, X, pad = batch
    layer = _layer(seed, rho, gamma, lam, norm, dtype=Ybar.dtype)
    valid = ~pad
    with torch.no_grad():
        Y_new = layer(Ybar, anchor=X, tgt_key_padding_mask=pad)
    exact, p, _ = reference_step(layer, Ybar, X, valid)
    delta = _heads(Y_new.double() - exact, _parts(layer)["Q"])      # (B, n, H, dh)
    rise_bound = 0.5 * (p * delta.square().sum(-1)).sum(-1)         # (B, n)
    before, s0 = reference_energy(layer, Ybar, Ybar, X, valid)
    after, s1 = reference_energy(layer, Y_new, Ybar, X, valid)
    assert bool((after <= before + rise_bound + 64 * U64 * (s0 + s1)).all())


def test_model_energies_equal_the_reference_and_every_token_descends():
    layer = _layer(3, gamma=2.0)
    decoder = uf.CertifiedDecoder(layer, 3, tied=True)
    torch.manual_seed(1)
    X = torch.randn(3, 9, D, dtype=torch.float64)
    pad = torch.zeros(3, 9, dtype=torch.bool)
    pad[0, :3] = True                                               # left padding
    pad[1, 6:] = True                                               # right padding
    with torch.no_grad():
        out = decoder(X, tgt_key_padding_mask=pad, return_energies=True)
        Y, valid = X, ~pad
        for ell in range(3):                                        # the tied layer from each state
            Y_new = layer(Y, anchor=X, tgt_key_padding_mask=pad)
            before, _ = reference_energy(layer, Y, Y, X, valid)
            after, _ = reference_energy(layer, Y_new, Y, X, valid)
            g_after, _ = reference_energy(layer, Y_new, Y_new, X, valid)
            torch.testing.assert_close(out.token_before[:, ell], before, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(out.token_after[:, ell], after, rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(out.sequence_after[:, ell], g_after.sum(1), rtol=1e-10, atol=1e-10)
            Y = Y_new
        torch.testing.assert_close(out.hidden, Y, rtol=0, atol=1e-12)
    # G: the sum of the per-token energies at one state, the tied curve continuous from layer to layer
    torch.testing.assert_close(out.sequence_before, out.token_before.sum(-1))
    torch.testing.assert_close(out.sequence_before[:, 1:], out.sequence_after[:, :-1])
    assert bool(out.token_lowered(tol=0.0).all()) and out.token_descent_share(tol=0.0) == 1.0
    assert bool((out.token_before[pad[:, None].expand_as(out.token_before)] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("rho", ["exp", "log"])
def test_causality(dtype, rho):
    """Changing tokens after position i leaves every output up to i unchanged (to round-off)."""
    torch.manual_seed(0)
    cfg = uf.ModelConfig.preset("certified-causal", d_model=D, n_heads=H, depth=3, ffn_hidden=16, tied=False, rho=rho)
    model = uf.UnfoldedTransformer(cfg).to(dtype)
    x = torch.randn(2, 10, D, dtype=dtype)
    for i in (0, 4, 8):
        other = x.clone()
        other[:, i + 1:] = 5 * torch.randn(2, 9 - i, D, dtype=dtype)
        with torch.no_grad():
            a, b = model(x).hidden, model(other).hidden
        # the same operations on the same rows: any difference is the path choice (float64 for far tokens), each
        # within a few units of round-off of the outputs' scale per layer
        tol = 0.0 if dtype == torch.float64 else 32 * torch.finfo(dtype).eps * float(a.abs().max()) * 3
        assert (a[:, : i + 1] - b[:, : i + 1]).abs().max() <= tol
        assert (a[:, i + 1:] - b[:, i + 1:]).abs().max() > 1e-3       # the later outputs did change


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("tied,positions", [(True, "none"), (False, "none"), (True, "rotary")])
def test_cache_equals_the_full_forward(dtype, tied, positions):
    torch.manual_seed(2)
    cfg = uf.ModelConfig.preset("certified-causal", d_model=D, n_heads=H, depth=3, ffn_hidden=16, tied=tied,
                                positions=positions)
    model = uf.UnfoldedTransformer(cfg).to(dtype)
    x = torch.randn(2, 12, D, dtype=dtype)
    with torch.no_grad():
        full = model(x).hidden
        first, cache = prefill(model, x[:, :4])
        rows = [first] + [extend(model, cache, x[:, t: t + 1]) for t in range(4, 12)]
    assert cache.length == 12
    # the same sums in another order (one query against all keys): a few units of round-off per layer
    tol = 32 * torch.finfo(dtype).eps * (1 + float(full.abs().max())) * cfg.depth
    assert (torch.cat(rows, dim=1) - full).abs().max() <= tol


def test_refusals():
    with pytest.raises(uf.ConfigError, match="causal does not apply"):
        uf.ModelConfig.preset("certified-alternating", causal=True)   # the alternating layer has no causal step
    with pytest.raises(uf.ConfigError, match="no rotary path"):
        uf.ModelConfig.preset("certified-causal", metric="free", positions="rotary")
    model = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified-causal", d_model=D, n_heads=H, depth=2))
    with pytest.raises(uf.ConfigError, match="by construction"):
        model(torch.randn(1, 3, D), safeguard=True)
    with pytest.raises(uf.ConfigError, match="causal by construction"):
        uf.CertifiedDecoder(uf.CertifiedDecoderLayer(D, H, 16), 2)(torch.randn(1, 3, D), is_causal=False)
    with pytest.raises(uf.ConfigError, match="causal UnfoldedTransformer"):
        prefill(uf.UnfoldedTransformer(uf.ModelConfig.preset("certified", d_model=D, n_heads=H)),
                torch.randn(1, 3, D))


@pytest.mark.parametrize("stack,layer", [(uf.CertifiedDecoder, uf.CertifiedDecoderLayer),
                                         (uf.CertifiedEncoder, uf.CertifiedEncoderLayer)])
def test_untied_copies_are_independent(stack, layer):
    """Every copy's basis is its own: a deep copy shared the first one's cached basis weight inside the forward."""
    model = stack(layer(D, H, 16), 2, tied=False)
    x = torch.randn(2, 5, D)
    model(x).square().sum().backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def test_gradients_flow_and_save_load(tmp_path):
    decoder = uf.CertifiedDecoder(uf.CertifiedDecoderLayer(D, H, 16), 2, tied=False)
    x = torch.randn(2, 5, D, requires_grad=True)
    decoder(x).square().sum().backward()
    assert float(x.grad.norm()) > 0
    again = uf.CertifiedDecoder.from_pretrained(decoder.save_pretrained(tmp_path / "dec"))
    with torch.no_grad():
        torch.testing.assert_close(again(x), decoder(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_fused_pass_equals_explicit_logits(dtype):
    """The fused kernel's causal mode (no mask tensor) against explicit masked logits: values, LSE, gradients."""
    from unfoldformer.softmax import softmax_with_lse
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 5, dtype=dtype, requires_grad=True) for _ in range(3))
    v0 = torch.cat([v, torch.zeros(2, 3, 7, 1, dtype=dtype)], -1)  # last value column 0 (the LSE's gradient path)
    q1, k1 = (torch.cat([t, torch.ones(2, 3, 7, 1, dtype=dtype)], -1) for t in (q, k))
    results = []
    for fused in (True, False):
        out, lse = softmax_with_lse(q1, k1, v0, None, fused=fused, causal=True)
        grads = torch.autograd.grad((out[..., :-1].sin().sum() + lse.square().sum()), (q, k, v))
        results.append((out, lse, *grads))
    tol = dict(rtol=0, atol=64 * torch.finfo(dtype).eps * 10)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **tol)
    # the last query sees all keys, the first only itself
    torch.testing.assert_close(results[0][0][:, :, 0, :-1], v[:, :, 0], **tol)
