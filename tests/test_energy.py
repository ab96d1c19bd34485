"""Energy terms (THEORY §2, §3.1, §5): independent computations, gradients, majoriser, padding, errors."""
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import close_tol
from unfoldformer import energy as E
from unfoldformer.rho import RHO_FAMILY, get_rho

D64 = torch.float64


def naive_attention_energy(Y, F, rho, valid):
    """Straight from the definition: each unordered real pair once, explicit differences."""
    r = get_rho(rho)
    out = []
    for b in range(Y.shape[0]):
        total = torch.zeros((), dtype=D64)
        idx = [i for i in range(Y.shape[1]) if valid[b, i]]
        for h in range(F.shape[0]):
            for i, j in itertools.combinations(idx, 2):
                diff = (Y[b, i] - Y[b, j]) @ F[h].T
                total = total + r(0.5 * diff @ diff)
        out.append(total)
    return torch.stack(out)


def random_case(seed, B=3, n=6, d=5, H=2, k=3, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    Y = torch.randn(B, n, d, generator=g, dtype=D64) * scale
    F = torch.randn(H, k, d, generator=g, dtype=D64) / d**0.5
    mask = torch.rand(B, n, generator=g) < 0.3
    return Y, F, mask


@pytest.mark.parametrize("rho", sorted(RHO_FAMILY))
def test_attention_energy_equals_pairwise_definition(rho):
    Y, F, mask = random_case(0)
    ours = E.attention_energy(Y, F, rho, mask)
    assert ours.dtype == D64 and ours.shape == (3,)
    assert torch.allclose(ours, naive_attention_energy(Y, F, rho, ~mask), rtol=1e-12, atol=1e-12)


def test_pair_convention_each_unordered_pair_once():
    Y, F, _ = random_case(1, B=1, n=5, H=2)
    r = get_rho("log")
    a = torch.einsum("bnd,hkd->bhnk", Y, F)
    z = 0.5 * (a[:, :, :, None] - a[:, :, None]).pow(2).sum(-1)  # (B, H, n, n)
    ordered = r(z).sum()
    assert torch.allclose(ordered, 2 * E.attention_energy(Y, F, "log").sum() + 5 * 2 * r(torch.tensor(0.0)))


@pytest.mark.parametrize("chunk", [1, 2, 5, 64])
def test_chunking_changes_nothing(chunk):
    Y, F, mask = random_case(2, n=11)
    for rho in ("exp", "log"):
        full = E.attention_energy(Y, F, rho, mask)
        assert torch.allclose(E.attention_energy(Y, F, rho, mask, chunk_size=chunk), full, rtol=1e-13)


@pytest.mark.parametrize("rho", sorted(RHO_FAMILY))
def test_attention_gradient_closed_form_equals_autograd(rho):
    Y, F, mask = random_case(3)
    Yr = Y.clone().requires_grad_(True)
    (auto,) = torch.autograd.grad(E.attention_energy(Yr, F, rho, mask).sum(), Yr)
    closed = E.attention_energy_grad(Y, F, rho, mask)
    assert torch.allclose(closed, auto, rtol=1e-10, atol=1e-10)


def test_other_gradients_closed_form_equal_autograd():
    g = torch.Generator().manual_seed(4)
    Y = torch.randn(2, 5, 4, generator=g, dtype=D64)
    S = torch.randn(4, 4, generator=g, dtype=D64)
    W_F, b = 0.5 * (S + S.T), torch.randn(4, generator=g, dtype=D64)
    W1, b1 = torch.randn(4, 7, generator=g, dtype=D64), torch.randn(7, generator=g, dtype=D64)
    X = torch.randn(2, 5, 4, generator=g, dtype=D64)
    cases = [
        (lambda Z: E.symmetric_ffn_energy(Z, W_F, b), E.symmetric_ffn_energy_grad(Y, W_F, b)),
        (lambda Z: E.tied_ffn_energy(Z, W1, b1), E.tied_ffn_energy_grad(Y, W1, b1)),
        (lambda Z: E.anchor_energy(Z, X), Y - X),
        (lambda Z: E.norm_regularizer(Z), Y),
    ]
    for fn, closed in cases:
        Yr = Y.clone().requires_grad_(True)
        (auto,) = torch.autograd.grad(fn(Yr).sum(), Yr)
        assert torch.allclose(closed, auto, rtol=1e-10, atol=1e-10)


def test_ffn_energies_equal_definitions():
    g = torch.Generator().manual_seed(5)
    Y = torch.randn(1, 3, 4, generator=g, dtype=D64)
    S = torch.randn(4, 4, generator=g, dtype=D64)
    W_F, b = 0.5 * (S + S.T), torch.randn(4, generator=g, dtype=D64)
    y = Y[0]
    expected = 0.5 * torch.trace(y @ (torch.eye(4, dtype=D64) - W_F) @ y.T) - (y * b).sum()
    assert torch.allclose(E.symmetric_ffn_energy(Y, W_F, b)[0], expected)
    assert E.symmetric_ffn_energy(Y, W_F, b, nonneg=True)[0] == float("inf")
    assert torch.isfinite(E.symmetric_ffn_energy(Y.abs(), W_F, b, nonneg=True)[0])
    W1, b1 = torch.randn(4, 6, generator=g, dtype=D64), torch.randn(6, generator=g, dtype=D64)
    expected = 0.5 * (y**2).sum() - 0.5 * torch.relu(y @ W1 + b1).pow(2).sum()
    assert torch.allclose(E.tied_ffn_energy(Y, W1, b1)[0], expected)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**31), rho=st.sampled_from(sorted(RHO_FAMILY)),
       log_scale=st.floats(-3, 1), step=st.floats(0.0, 3.0))
def test_majorizer_bounds_energy_and_touches_it(seed, rho, log_scale, step):
    Y0, F, mask = random_case(seed, scale=10**log_scale)
    g = torch.Generator().manual_seed(seed + 1)
    Y = Y0 + step * torch.randn(Y0.shape, generator=g, dtype=D64) * 10**log_scale
    upper = E.attention_majorizer(Y, Y0, F, rho, mask)
    exact = E.attention_energy(Y, F, rho, mask)
    assert (upper >= exact - 1e-9 * (1 + exact.abs())).all()
    assert torch.allclose(E.attention_majorizer(Y0, Y0, F, rho, mask), E.attention_energy(Y0, F, rho, mask))


@pytest.mark.parametrize("rho", ["exp", "log", "linear"])
def test_majorizer_gradient_touches_at_anchor(rho):
    Y0, F, mask = random_case(6)
    Yr = Y0.clone().requires_grad_(True)
    (g_major,) = torch.autograd.grad(E.attention_majorizer(Yr, Y0, F, rho, mask).sum(), Yr)
    assert torch.allclose(g_major, E.attention_energy_grad(Y0, F, rho, mask), rtol=1e-10, atol=1e-10)


def test_padding_removes_tokens_from_every_sum():
    Y, F, _ = random_case(7, B=1, n=4)
    extra = torch.cat([Y, 100 * torch.randn(1, 3, Y.shape[-1], dtype=D64)], dim=1)
    mask = torch.tensor([[False] * 4 + [True] * 3])
    X = torch.randn_like(extra)
    W1, b1 = torch.randn(Y.shape[-1], 3, dtype=D64), torch.randn(3, dtype=D64)
    for fn in (lambda Z, m: E.attention_energy(Z, F, "exp", m), lambda Z, m: E.norm_regularizer(Z, m),
               lambda Z, m: E.tied_ffn_energy(Z, W1, b1, m),
               lambda Z, m: E.anchor_energy(Z, X[:, : Z.shape[1]] if m is None else X, m)):
        assert torch.allclose(fn(extra, mask), fn(Y, None))


def test_all_padding_row_has_zero_energy_and_n1_has_no_pairs():
    Y, F, _ = random_case(8, B=2, n=3)
    mask = torch.tensor([[True, True, True], [False, True, True]])
    assert E.attention_energy(Y, F, "exp", mask).tolist() == [0.0, 0.0]
    assert E.attention_energy(Y[:, :1], F, "log").tolist() == [0.0, 0.0]


def test_float32_input_is_accumulated_in_float64():
    """Float32 states: features in float32, pairwise terms and sums in float64 — accurate to
    the state's own rounding level, far better than a float32 accumulation."""
    Y, F, _ = random_case(9, n=300, scale=3.0)
    exact = E.attention_energy(Y.float().double(), F.float().double(), "exp")
    e32 = E.attention_energy(Y.float(), F.float(), "exp")
    assert e32.dtype == D64
    # each term −exp(−z_ij) carries the float32 error of its features, ~eps32·z_ij relative, and all
    # terms share one sign: |e32 − exact| ≤ close_tol(float32, max z) · |exact|
    a64 = torch.einsum("bnd,hkd->bhnk", Y.float().double(), F.float().double())
    max_z = float(2 * (a64 * a64).sum(-1).max())
    assert ((e32 - exact).abs() <= close_tol(torch.float32, max_z) * exact.abs()).all()
    a = torch.einsum("bnd,hkd->bhnk", Y.float(), F.float())
    z = 0.5 * (a[:, :, :, None] - a[:, :, None]).pow(2).sum(-1)             # float32 throughout
    naive32 = -0.5 * (torch.exp(-z).sum(dim=(1, 2, 3)) - 2 * 300)
    assert (e32 - exact).abs().max() <= (naive32.double() - exact).abs().max()


def test_exp_energy_is_finite_for_huge_and_tiny_norms():
    for scale in (1e-6, 1e6):
        Y, F, _ = random_case(10, scale=scale)
        e = E.attention_energy(Y, F, "exp")
        assert torch.isfinite(e).all()
        assert (e <= 0).all() and (e >= -0.5 * 6 * 5 * 2).all()


@pytest.mark.parametrize("bad, message", [
    (lambda Y, F: (Y[0], F), "shape (B, n, d)"),
    (lambda Y, F: (Y.long(), F), "floating"),
    (lambda Y, F: (Y, F[..., :-1]), "d="),
    (lambda Y, F: (Y.index_fill(1, torch.tensor([0]), float("nan")), F), "NaN"),
    (lambda Y, F: (Y[:, :0], F), "empty"),
])
def test_bad_input_gets_clear_errors(bad, message):
    Y, F, _ = random_case(11)
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace(")", r"\)")):
        E.attention_energy(*bad(Y, F))


def test_bad_masks_and_rho_names():
    Y, F, _ = random_case(12)
    with pytest.raises(TypeError, match="bool"):
        E.attention_energy(Y, F, "exp", torch.zeros(3, 6))
    with pytest.raises(ValueError, match=r"\(B, n\)"):
        E.attention_energy(Y, F, "exp", torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="valid names: exp, log"):
        E.attention_energy(Y, F, "gauss")


@pytest.mark.parametrize("bad,finite", [(None, True), (float("nan"), False), (float("inf"), False),
                                        (-float("inf"), False), ("both", False), ("overflow", True)])
def test_all_finite_is_the_elementwise_test(bad, finite):
    """The one-sum shortcut agrees with isfinite(t).all(): NaN and ±Inf entries (also +Inf with −Inf,
    whose sum is NaN) are caught, and finite entries whose sum overflows still count as finite."""
    t = torch.ones(3, 50, 4)
    if bad == "both":
        t[0, 1, 2], t[2, 3, 1] = float("inf"), -float("inf")
    elif bad == "overflow":
        t = torch.full((3, 50, 4), 3e38)                                # float32: the sum is +Inf
    elif bad is not None:
        t[1, 7, 3] = bad
    assert E.all_finite(t) is finite is bool(torch.isfinite(t).all())
