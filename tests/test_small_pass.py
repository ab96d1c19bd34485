"""The explicit pass of short sequences (`softmax._small_pass`, issue 38): which path a call takes, and that it
gives the pair definition's masses, averages and gradients on adversarial tokens, in float64 and float32."""
import pytest
import torch

from conftest import D64
from unfoldformer import softmax as SM
from unfoldformer.softmax import attention_pass, logit_error_bound


def _tokens(kind: str, n: int, dtype=D64, B=2, H=2, dh=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    C = torch.randn(B, n, H, dh, generator=g, dtype=D64)
    if kind == "clustered":                                          # two tight groups far apart
        C = 0.01 * C + 3.0 * (torch.arange(n) % 2).to(D64)[None, :, None, None]
    elif kind == "offset":
        C = C + 1000.0
    elif kind == "large":
        C = 6.0 * C
    elif kind == "tiny":
        C = 1e-6 * C
    elif kind == "identical":
        C = C[:, :1].expand(B, n, H, dh).clone()
    valid = torch.ones(B, n, dtype=torch.bool)
    if kind == "all-but-one-padded":
        valid[1, 1:] = False
    scales = torch.rand(H, generator=g, dtype=D64) + 0.5
    return C.to(dtype), valid, scales.to(dtype)


def _pair_reference(C, valid, scales, diagonal):
    """log-mass and average from explicit pair differences z_ij = ½‖s(c_i − c_j)‖², float64 (B, n, H), (B, n, H, dh)."""
    C, scales = C.double(), scales.double()
    a = (C * scales[:, None]).transpose(1, 2)                       # (B, H, n, dh)
    z = 0.5 * (a[:, :, :, None] - a[:, :, None]).pow(2).sum(-1)     # (B, H, n, n)
    n = C.shape[1]
    keep = valid[:, None, None, :].expand_as(z)
    if not diagonal:
        keep = keep & ~torch.eye(n, dtype=torch.bool)
    w = torch.where(keep, torch.exp(-z), 0.0)                       # (B, H, n, n)
    mass = w.sum(-1)
    avg = (w @ C.transpose(1, 2)) / mass[..., None]
    return mass.log().transpose(1, 2), avg.transpose(1, 2)


def _rows_with_mass(valid, diagonal):
    """(B, n) real queries that have at least one real key besides themselves (all real queries with the diagonal)."""
    return valid if diagonal else valid & (valid.sum(1, keepdim=True) > 1)


def _calls(monkeypatch):
    calls = {"flash": 0, "small": 0}
    flash, small = SM._fused, SM._small_pass

    def counting_flash(*args, **kwargs):
        calls["flash"] += 1
        return flash(*args, **kwargs)

    def counting_small(*args, **kwargs):
        calls["small"] += 1
        return small(*args, **kwargs)
    monkeypatch.setattr(SM, "_fused", counting_flash)
    monkeypatch.setattr(SM, "_small_pass", counting_small)
    return calls


@pytest.mark.parametrize("n,fused,expected", [(1, None, "small"), (SM.SMALL_PASS_TOKENS, None, "small"),
                                              (SM.SMALL_PASS_TOKENS + 1, None, "flash"), (8, True, "flash")])
def test_short_sequences_take_the_explicit_pass_and_longer_ones_the_kernel(monkeypatch, n, fused, expected):
    calls = _calls(monkeypatch)
    C, valid, scales = _tokens("plain", n)
    attention_pass(C, scales, valid, fused=fused)
    attention_pass(C.float(), scales.float(), valid, fused=fused, diagonal=True)
    assert calls[expected] == 2 and calls["small" if expected == "flash" else "flash"] == 0


def test_a_pass_whose_logits_would_exceed_the_cap_takes_the_kernel(monkeypatch):
    calls = _calls(monkeypatch)
    monkeypatch.setattr(SM, "SMALL_PASS_ENTRIES", 2 * 2 * 8 * 8 - 1)   # B·H·n² of the case, less one
    C, valid, scales = _tokens("plain", 8)
    attention_pass(C, scales, valid)
    assert calls == {"flash": 1, "small": 0}


KINDS = ["plain", "clustered", "offset", "large", "tiny", "identical", "all-but-one-padded"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [1, 2, 16])
@pytest.mark.parametrize("diagonal", [False, True])
def test_the_explicit_pass_equals_the_pair_definition_in_float64(kind, n, diagonal):
    """Float64 throughout, sums of at most 16 terms: both sides agree to round-off (1e-12 relative, the
    average's scale max|c|; tiny tokens: all weights ≈ 1, so the same bound)."""
    C, valid, scales = _tokens(kind, n)
    got = attention_pass(C, scales, valid, diagonal=diagonal)
    log_mass, avg = _pair_reference(C, valid, scales, diagonal)
    rows = _rows_with_mass(valid, diagonal)
    if not rows.any():
        assert (got.log_mass[valid] < -1e29).all()                 # no other real token: zero mass
        return
    sel = rows[..., None].expand_as(log_mass)
    assert torch.allclose(got.log_mass[sel], log_mass[sel], rtol=1e-12, atol=1e-12)
    scale = C.abs().max()
    assert ((got.average - avg).abs()[sel[..., None].expand_as(avg)] <= 1e-12 * (1 + scale)).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("diagonal", [False, True])
def test_the_explicit_pass_in_float32_is_within_its_error_bound(kind, diagonal):
    """Float32 against the float64 pair definition. Each logit errs by at most δ = logit_error_bound(R², dh) + 2u
    (the Gram-form bound covers a_i·a_j − ½‖a_j‖²; 2u for the exp), so each weight by a relative e^{2δ} − 1 ≤ 4δ
    after the row shift, the row sum of n terms by a further γ_n: |Δ log S_i| ≤ 4δ + (n + 2)u. The average
    Σ w_ij c_j / Σ w_ij moves by at most 2·4δ·max|c_j − c_k| ≤ 16δ max|c| under those weight errors, plus the
    product's and division's rounding (n + 2)u max|c|."""
    n = 16
    C64, valid, scales64 = _tokens(kind, n)
    C, scales = C64.float(), scales64.float()
    got = attention_pass(C, scales, valid, diagonal=diagonal)
    assert got.log_mass.dtype == torch.float32
    log_mass, avg = _pair_reference(C, valid, scales, diagonal)     # the float32 inputs, exactly, in float64
    u = torch.finfo(torch.float32).eps / 2
    centred = (C64 - C64.mean(1, keepdim=True)) * scales64[:, None]
    radius_sq = centred.square().sum(-1).max()
    delta = float(logit_error_bound(radius_sq, C.shape[-1], torch.float32)) + 2 * u
    rows = _rows_with_mass(valid, diagonal)
    sel = rows[..., None].expand_as(log_mass)
    assert ((got.log_mass.double() - log_mass).abs()[sel] <= 4 * delta + (n + 2) * u).all()
    scale = float(C64.abs().max())
    err = (got.average.double() - avg).abs()[sel[..., None].expand_as(avg)]
    assert (err <= (16 * delta + (n + 2) * u) * scale).all()


@pytest.mark.parametrize("diagonal", [False, True])
def test_gradients_through_the_explicit_pass_equal_the_kernels(diagonal):
    """Float64: the explicit pass (autograd through its logits) and the flash kernel (its own backward, the
    log-sum-exp's gradient through the spare value column) give the same gradients in C and the scales, with
    padding and a one-token sample."""
    C, valid, scales = _tokens("all-but-one-padded", 9)
    valid[0, 3] = False
    w = torch.Generator().manual_seed(5)
    w_avg = torch.randn(C.shape, generator=w, dtype=D64)
    grads = []
    for fused in (None, True):
        Cg, sg = C.clone().requires_grad_(), scales.clone().requires_grad_()
        res = attention_pass(Cg, sg, valid, diagonal=diagonal, fused=fused)
        keep = _rows_with_mass(valid, diagonal)[..., None]
        loss = (res.average * w_avg).where(keep[..., None], 0.0).sum() + res.log_mass.sin().where(keep, 0.0).sum()
        grads.append(torch.autograd.grad(loss, (Cg, sg)))
    for small, kernel in zip(*grads):
        assert torch.allclose(small, kernel, rtol=1e-10, atol=1e-10)


def test_the_pass_gives_the_same_numbers_with_and_without_autograd():
    """The in-place branch (no autograd) does the same operations as the differentiable one: equal to the bit."""
    C, valid, scales = _tokens("plain", 12, dtype=torch.float32)
    with torch.no_grad():
        plain = attention_pass(C, scales, valid)
    Cg = C.clone().requires_grad_()
    traced = attention_pass(Cg, scales, valid)
    assert torch.equal(plain.log_mass, traced.log_mass.detach())
    assert torch.equal(plain.average, traced.average.detach())


@pytest.mark.parametrize("dtype,garbage", [(torch.float32, 1e16), (D64, 1e150)])
@pytest.mark.parametrize("diagonal", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_padded_keys_take_exactly_no_weight_whatever_they_hold(dtype, garbage, diagonal, grad):
    """Real rows give the same bits whether the padded rows hold zeros or huge values (their weights are set to 0
    after the exponential, not left at its floor √tiny, which huge values would turn into visible mass), on
    the in-place path and on the differentiable one."""
    C, valid, scales = _tokens("plain", 12, dtype=dtype)
    valid[:, 8:] = False
    zeros, huge = C.clone(), C.clone()
    zeros[:, 8:] = 0.0
    huge[:, 8:] = garbage
    a, b = (attention_pass(x.requires_grad_(grad), scales, valid, diagonal=diagonal) for x in (zeros, huge))
    rows = _rows_with_mass(valid, diagonal)
    assert torch.equal(a.log_mass[rows], b.log_mass[rows])
    assert torch.equal(a.average[rows], b.average[rows])
