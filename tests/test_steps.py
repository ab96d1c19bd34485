"""Descent steps (THEORY §3): Theorem A and its variants over many random cases, the SDPA
path, and the counterexamples of §3.6 (which must produce increases at a measured rate)."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import D64, assert_close, examples, rises
from unfoldformer import energy as E
from unfoldformer import steps as S

MANY = examples(1000)


@st.composite
def cases(draw, multihead=False):
    """Random states with norms from 1e-3 to 1e3, n = 1 included, random padding."""
    seed = draw(st.integers(0, 2**31 - 1))
    B, n = draw(st.integers(1, 3)), draw(st.integers(1, 7))
    H = draw(st.integers(1, 3)) if multihead else 1
    dh = draw(st.integers(1, 3))
    k = draw(st.integers(1, 4))
    log_norm = draw(st.floats(-3.0, 3.0))
    g = torch.Generator().manual_seed(seed)
    Y = torch.randn(B, n, H * dh, generator=g, dtype=D64) * 10**log_norm / (H * dh) ** 0.5
    pad = torch.rand(B, n, generator=g) < draw(st.sampled_from([0.0, 0.3, 1.0]))
    return dict(Y=Y, pad=pad, H=H, dh=dh, k=k, g=g)


def confined_factors(H, dh, k, g):
    """F_h = A_h U_hᵀ with U_h the h-th contiguous block: (H, k, H·dh)."""
    A = torch.randn(H, k, dh, generator=g, dtype=D64)
    F = torch.zeros(H, k, H * dh, dtype=D64)
    for h in range(H):
        F[h, :, h * dh:(h + 1) * dh] = A[h]
    return F


# ----------------------------------------------------------------------------- Theorem A
@MANY
@given(c=cases(), rho=st.sampled_from(["exp", "log"]), alpha=st.floats(1e-6, 1.999))
def test_theorem_a_single_head_psd_kernels(c, rho, alpha):
    F = torch.randn(c["k"], c["Y"].shape[-1], generator=c["g"], dtype=D64)
    before = E.attention_energy(c["Y"], F, rho, c["pad"])
    after = E.attention_energy(S.attention_step(c["Y"], F, rho, alpha, c["pad"]), F, rho, c["pad"])
    assert not rises(before, after).any()


@MANY
@given(c=cases(), rho=st.sampled_from(["linear", "lp", "truncated"]), alpha=st.floats(1e-6, 1.0))
def test_theorem_a_any_concave_rho_alpha_up_to_one(c, rho, alpha):
    F = torch.randn(c["k"], c["Y"].shape[-1], generator=c["g"], dtype=D64)
    before = E.attention_energy(c["Y"], F, rho, c["pad"])
    after = E.attention_energy(S.attention_step(c["Y"], F, rho, alpha, c["pad"]), F, rho, c["pad"])
    assert not rises(before, after).any()


@MANY
@given(c=cases(multihead=True), rho=st.sampled_from(["exp", "log"]), alpha=st.floats(1e-6, 1.0),
       rotate=st.booleans())
def test_certified_multihead_descends(c, rho, alpha, rotate):
    H, dh = c["H"], c["dh"]
    F = confined_factors(H, dh, c["k"], c["g"])
    U = None
    if rotate:  # a general orthonormal basis split into heads
        Q, _ = torch.linalg.qr(torch.randn(H * dh, H * dh, generator=c["g"], dtype=D64))
        U = Q.reshape(H * dh, H, dh).permute(1, 0, 2)                      # (H, d, dh)
        F = torch.einsum("hkd,hed->hke", F.reshape(H, -1, H, dh)[torch.arange(H), :, torch.arange(H)], U)
    before = E.attention_energy(c["Y"], F, rho, c["pad"])
    after = E.attention_energy(S.attention_step(c["Y"], F, rho, alpha, c["pad"], U), F, rho, c["pad"])
    assert not rises(before, after).any()


@MANY
@given(c=cases(multihead=True), rho=st.sampled_from(["exp", "log"]), alpha=st.floats(1e-6, 1.0),
       lam=st.floats(1e-3, 1e3), log_s=st.floats(-2, 1))
def test_anchored_attention_descends(c, rho, alpha, lam, log_s):
    H, d = c["H"], c["Y"].shape[-1]
    X = c["Y"] + torch.randn(c["Y"].shape, generator=c["g"], dtype=D64) * c["Y"].abs().mean()
    scales = 10 ** (log_s + 0.3 * torch.randn(H, generator=c["g"], dtype=D64))
    fac = S.isotropic_factors(scales, d)

    def energy(Z):
        return lam * E.attention_energy(Z, fac, rho, c["pad"]) + E.anchor_energy(Z, X, c["pad"])

    after = energy(S.anchored_attention_step(c["Y"], X, scales, lam, rho, alpha, c["pad"]))
    assert not rises(energy(c["Y"]), after).any()


@examples(300)
@given(c=cases(multihead=True), lam=st.floats(1e-3, 1e3), log_s=st.floats(-1, 0.5), alpha=st.floats(0.1, 1.0))
def test_anchored_exp_path_equals_pair_weight_formula(c, lam, log_s, alpha):
    """The exp path (anchor as an extra softmax key) equals the plain formula
    c_i ← (1 − α) c_i + α (ν Σ_j β_ij c_j + x_i) / (ν d_i + 1) evaluated with explicit pair weights."""
    from unfoldformer.rho import custom_rho
    Y = c["Y"] / c["Y"].abs().max().clamp_min(1e-12)               # moderate norms: explicit exp stays finite
    X = torch.randn(Y.shape, generator=c["g"], dtype=D64)
    scales = 10 ** (log_s + 0.3 * torch.randn(c["H"], generator=c["g"], dtype=D64))
    plain_exp = custom_rho(lambda z: -torch.exp(-z), lambda z: torch.exp(-z), name="exp-explicit")  # general branch
    fast = S.anchored_attention_step(Y, X, scales, lam, "exp", alpha, c["pad"])
    ref = S.anchored_attention_step(Y, X, scales, lam, plain_exp, alpha, c["pad"])
    assert_close(fast, ref, scale=max(1.0, float(X.abs().max())))


# ----------------------------------------------------------------------------- FFN steps
def bounded_symmetric(d, g, radius):
    Q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=D64))
    evals = (2 * torch.rand(d, generator=g, dtype=D64) - 1) * radius
    return (Q * evals) @ Q.T


@MANY
@given(c=cases(), eta=st.floats(1e-6, 1.0), relu=st.booleans(), radius=st.floats(0.0, 0.999))
def test_symmetric_ffn_descends_inside_the_spectrum_bound(c, eta, relu, radius):
    d = c["Y"].shape[-1]
    W_F, b = bounded_symmetric(d, c["g"], radius), torch.randn(d, generator=c["g"], dtype=D64)
    Y = c["Y"].abs() if relu else c["Y"]  # ι_{≥0} is finite only on Y ≥ 0
    before = E.symmetric_ffn_energy(Y, W_F, b, c["pad"], nonneg=relu)
    after = E.symmetric_ffn_energy(S.symmetric_ffn_step(Y, W_F, b, eta, relu, c["pad"]), W_F, b, c["pad"], nonneg=relu)
    assert not rises(before, after).any()


@examples(1500)
@given(c=cases(), alpha=st.floats(1e-6, 1.999), m=st.integers(1, 12), log_w=st.floats(-2, 2))
def test_tied_ffn_descends_for_any_weights(c, alpha, m, log_w):
    d = c["Y"].shape[-1]
    W1 = torch.randn(d, m, generator=c["g"], dtype=D64) * 10**log_w
    b = torch.randn(m, generator=c["g"], dtype=D64) * 10**log_w
    before = E.tied_ffn_energy(c["Y"], W1, b, c["pad"])
    after = E.tied_ffn_energy(S.tied_ffn_step(c["Y"], W1, b, alpha, c["pad"]), W1, b, c["pad"])
    assert not rises(before, after).any()


def test_steps_are_gradient_steps():
    g = torch.Generator().manual_seed(0)
    Y = torch.randn(2, 5, 4, generator=g, dtype=D64)
    W1, b = torch.randn(4, 6, generator=g, dtype=D64), torch.randn(6, generator=g, dtype=D64)
    assert torch.allclose(S.tied_ffn_step(Y, W1, b, 0.3), Y - 0.3 * E.tied_ffn_energy_grad(Y, W1, b))
    W_F = bounded_symmetric(4, g, 0.9)
    bb = torch.randn(4, generator=g, dtype=D64)
    assert torch.allclose(S.symmetric_ffn_step(Y, W_F, bb, 0.7, relu=False),
                          Y - 0.7 * E.symmetric_ffn_energy_grad(Y, W_F, bb))
    # attention: Y⁺ = Y − α D⁻¹ ∇E_A for M = I (single head, F = I)
    F = torch.eye(4, dtype=D64)
    beta = E.pair_weights(Y, F, "log")[:, 0]
    deg = beta.sum(-1, keepdim=True)
    expected = Y - 0.6 * E.attention_energy_grad(Y, F, "log") / deg
    assert torch.allclose(S.attention_step(Y, F, "log", 0.6), expected)


# ----------------------------------------------------------------------------- softmax / SDPA
def test_exp_step_is_softmax_with_key_norm_bias():
    g = torch.Generator().manual_seed(1)
    Y = torch.randn(2, 6, 4, generator=g, dtype=D64)
    F = torch.randn(3, 4, generator=g, dtype=D64)
    a = Y @ F.T                                                       # (B, n, k)
    soft = torch.softmax(a @ a.transpose(1, 2) - 0.5 * (a * a).sum(-1)[:, None, :], dim=-1)
    assert torch.allclose(S.attention_step(Y, F, "exp", 1.0, use_sdpa=False), soft @ Y)
    assert torch.allclose(S.attention_step(Y, F, "exp", 1.0, use_sdpa=True), soft @ Y)


@pytest.mark.parametrize("dtype", [torch.float32, D64])
def test_sdpa_path_equals_naive_path(dtype):
    g = torch.Generator().manual_seed(2)
    Y = torch.randn(3, 9, 8, generator=g).to(dtype)
    pad = torch.rand(3, 9, generator=g) < 0.3
    pad[2] = True
    F = confined_factors(2, 4, 3, g).to(dtype) * 0.7
    fast = S.attention_step(Y, F, "exp", 0.8, pad, use_sdpa=True)
    slow = S.attention_step(Y, F, "exp", 0.8, pad, use_sdpa=False)
    assert_close(fast, slow, scale=max(1.0, Y.abs().max().item()))


def test_padding_changes_nothing_for_real_tokens():
    g = torch.Generator().manual_seed(3)
    Y = torch.randn(1, 5, 4, generator=g, dtype=D64)
    junk = torch.cat([Y, 1e3 * torch.randn(1, 3, 4, generator=g, dtype=D64)], dim=1)
    pad = torch.tensor([[False] * 5 + [True] * 3])
    X = torch.randn_like(junk)
    F = confined_factors(2, 2, 2, g)
    W1, b = torch.randn(4, 5, generator=g, dtype=D64), torch.randn(5, generator=g, dtype=D64)
    for rho in ("exp", "log"):
        for sdpa in (True, False):
            out = S.attention_step(junk, F, rho, 1.0, pad, use_sdpa=sdpa)
            assert torch.allclose(out[:, :5], S.attention_step(Y, F, rho, 1.0, use_sdpa=sdpa))
            assert torch.equal(out[:, 5:], junk[:, 5:])  # padded tokens stay put
        out = S.anchored_attention_step(junk, X, torch.tensor([0.5, 2.0], dtype=D64), 3.0, rho, 1.0, pad)
        ref = S.anchored_attention_step(Y, X[:, :5], torch.tensor([0.5, 2.0], dtype=D64), 3.0, rho, 1.0)
        assert torch.allclose(out[:, :5], ref)
    assert torch.allclose(S.tied_ffn_step(junk, W1, b, 1.0, pad)[:, :5], S.tied_ffn_step(Y, W1, b, 1.0))


def test_subspaces_are_validated():
    Y = torch.randn(1, 3, 4, dtype=D64)
    F = torch.randn(2, 2, 4, dtype=D64)
    with pytest.raises(ValueError, match="orthonormal"):
        S.attention_step(Y, F, "exp", 1.0, subspaces=torch.ones(2, 4, 2, dtype=D64))
    with pytest.raises(ValueError, match="divisible"):
        S.attention_step(torch.randn(1, 3, 5, dtype=D64), torch.randn(2, 2, 5, dtype=D64))


# ----------------------------------------------------------------------------- counterexamples (§3.6)
TRIALS = 300


def _state(seed, n=6, d=4, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, n, d, generator=g, dtype=D64) * scale, g


def _exp_energy_metric(Y, M):
    """Σ_{i<j} −exp(−½ Δ M Δᵀ) for any (possibly indefinite) symmetric M."""
    diff = Y[:, :, None] - Y[:, None]                                  # (B, n, n, d)
    z = 0.5 * torch.einsum("bijd,de,bije->bij", diff, M, diff)
    return -0.5 * (torch.exp(-z).sum(dim=(1, 2)) - Y.shape[1])


def _indefinite_metric(seed):
    Y, g = _state(seed, scale=0.8)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=D64))
    M = (Q * torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=D64)) @ Q.T
    diff = Y[:, :, None] - Y[:, None]
    beta = torch.exp(-0.5 * torch.einsum("bijd,de,bije->bij", diff, M, diff))
    Y1 = beta @ Y / beta.sum(-1, keepdim=True)
    return rises(_exp_energy_metric(Y, M), _exp_energy_metric(Y1, M)).any()


def _no_key_norm_bias(seed):
    Y, g = _state(seed)
    Y = Y * torch.rand(1, 6, 1, generator=g, dtype=D64) * 2             # unequal norms
    F = torch.eye(4, dtype=D64)
    Y1 = torch.softmax(Y @ Y.transpose(1, 2), dim=-1) @ Y              # plain softmax, no bias
    return rises(E.attention_energy(Y, F), E.attention_energy(Y1, F)).any()


def _ffn_eigenvalue_below_minus_one(seed):
    Y, g = _state(seed)
    Q, _ = torch.linalg.qr(torch.randn(4, 4, generator=g, dtype=D64))
    W_F = (Q * torch.tensor([-1.5, 0.2, 0.5, -0.3], dtype=D64)) @ Q.T
    b = torch.randn(4, generator=g, dtype=D64)
    Y1 = S.symmetric_ffn_step(Y, W_F, b, 1.0, relu=False)
    return rises(E.symmetric_ffn_energy(Y, W_F, b), E.symmetric_ffn_energy(Y1, W_F, b)).any()


def _asymmetric_query_key(seed):
    """W_Q W_Kᵀ = S + K with K skew: the energy of the PSD part S can rise (rarely)."""
    Y, g = _state(seed)
    A = torch.randn(4, 4, generator=g, dtype=D64) / 2
    K = torch.randn(4, 4, generator=g, dtype=D64)
    G = A @ A.T + 2.5 * (K - K.T)                                      # bilinear logit form
    logits = Y @ G @ Y.transpose(1, 2) - 0.5 * ((Y @ A) ** 2).sum(-1)[:, None, :]
    Y1 = torch.softmax(logits, dim=-1) @ Y
    return rises(E.attention_energy(Y, A.T), E.attention_energy(Y1, A.T)).any()


def _norm_regularizer_under_plain_softmax(seed):
    """The paper's E_A + ½‖Y‖² with a plain softmax step (no key-norm bias)."""
    Y, g = _state(seed, scale=1.0)
    F = torch.randn(4, 4, generator=g, dtype=D64) / 2
    a = Y @ F.T
    Y1 = torch.softmax(a @ a.transpose(1, 2), dim=-1) @ Y

    def energy(Z):
        return E.attention_energy(Z, F) + E.norm_regularizer(Z)
    return rises(energy(Y), energy(Y1)).any()


def _alpha_beyond_two(seed):
    """α = 2.6 > 2 breaks descent even for a PSD kernel (ρ = exp)."""
    Y, g = _state(seed)
    F = torch.randn(4, 4, generator=g, dtype=D64)
    Y1 = S.attention_step(Y, F, "exp", 2.6, certified=False)      # outside the theorem, on purpose
    return rises(E.attention_energy(Y, F), E.attention_energy(Y1, F)).any()


#: THEORY §3.6, what breaks descent: the share of TRIALS fixed seeds whose energy rises, as measured
#: (float64, these seeds), and the band the test accepts (about ±50 %, never down to 0).
COUNTEREXAMPLES = {
    "indefinite metric": (_indefinite_metric, 0.860, (0.60, 0.98)),
    "no key-norm bias": (_no_key_norm_bias, 0.177, (0.08, 0.30)),
    "W_F eigenvalue -1.5": (_ffn_eigenvalue_below_minus_one, 0.477, (0.30, 0.70)),
    "asymmetric W_Q W_K^T": (_asymmetric_query_key, 0.013, (0.003, 0.05)),
    "1/2|Y|^2 under a plain softmax": (_norm_regularizer_under_plain_softmax, 0.133, (0.06, 0.25)),
    "alpha = 2.6 > 2": (_alpha_beyond_two, 0.020, (0.005, 0.06)),
}


@pytest.mark.parametrize("name", list(COUNTEREXAMPLES))
def test_counterexample_rises_at_its_measured_rate(name):
    trial, measured, (low, high) = COUNTEREXAMPLES[name]
    rate = sum(bool(trial(seed)) for seed in range(TRIALS)) / TRIALS
    print(f"{name}: energy rises in {rate:.1%} of {TRIALS} trials (measured when written: {measured:.1%})")
    assert low <= rate <= high
