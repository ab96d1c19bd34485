"""The fused softmax pass (`softmax.py`): values and gradients of the kernel, the off-diagonal mass and
average, the precision gained by masking the diagonal."""
import pytest
import torch

from conftest import D64
from unfoldformer import energy as E
from unfoldformer.softmax import MASKED, attention_pass, logit_softmax, mass_energy, softmax_with_lse


def _case(seed: int, B=2, H=3, n=7, dh=4, scale=1.0, dtype=D64):
    g = torch.Generator().manual_seed(seed)
    C = torch.randn(B, n, H, dh, generator=g, dtype=dtype) * scale
    valid = torch.rand(B, n, generator=g) > 0.3
    valid[0] = True
    valid[1, :] = False
    valid[1, 2] = True                                               # a row with one real token: no pairs
    scales = torch.rand(H, generator=g, dtype=dtype) + 0.5
    return C, valid, scales


def _pairs(C, valid, scales):
    """z_ij (B, H, n, n) from explicit differences, and the mask of real off-diagonal pairs."""
    a = (C * scales[:, None]).transpose(1, 2)                       # (B, H, n, dh)
    z = 0.5 * (a[:, :, :, None] - a[:, :, None]).pow(2).sum(-1)     # (B, H, n, n)
    n = C.shape[1]
    pair = valid[:, None, :, None] & valid[:, None, None, :] & ~torch.eye(n, dtype=torch.bool)
    return z, pair


def test_fused_kernel_values_and_gradients_equal_explicit_logits():
    """Both outputs and the gradients through both (the log-sum-exp's enters the kernel's backward
    through the spare value column) equal the explicit-logit computation."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(2, 3, 6, 5, generator=g, dtype=D64, requires_grad=True) for _ in range(2))
    v0 = torch.randn(2, 3, 6, 4, generator=g, dtype=D64, requires_grad=True)
    mask = torch.zeros(1, 1, 6, 6, dtype=D64)
    mask[0, 0, torch.arange(6), torch.arange(6)] = MASKED
    mask[..., 2] = MASKED                                            # a masked key column as well
    w_out, w_lse = torch.randn(2, 3, 6, 4, generator=g, dtype=D64), torch.randn(2, 3, 6, generator=g, dtype=D64)
    results = []
    for fused in (True, False):
        v = torch.cat([v0, torch.zeros_like(v0[..., :1])], dim=-1)
        out, lse = softmax_with_lse(q, k, v, mask, fused=fused)
        loss = (out[..., :4] * w_out).sum() + (lse.sin() * w_lse).sum()
        results.append([out.detach(), lse.detach(), *torch.autograd.grad(loss, (q, k, v0))])
    for fused, explicit in zip(*results):
        assert torch.allclose(fused, explicit, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows,fused", [(None, None), (None, True), (1, True), (3, True)])
def test_attention_pass_equals_the_pair_definition(rows, fused):
    """log S_i = log Σ_{j≠i, real} e^{−z_ij} and o_i = Σ_{j≠i} e^{−z_ij} c_j / S_i, in query chunks of any size;
    with the diagonal, log d_i = log Σ_{j real} e^{−z_ij} and its average (real queries). n = 7: the default is
    the explicit pass of short sequences, `fused=True` the flash kernel."""
    C, valid, scales = _case(1)
    res = attention_pass(C, scales, valid, rows=rows, fused=fused)
    z, pair = _pairs(C, valid, scales)
    weights = torch.where(pair, torch.exp(-z), 0.0)                 # (B, H, n, n)
    mass = weights.sum(-1).transpose(1, 2)                           # (B, n, H)
    has_pairs = valid[..., None] & (valid.sum(1) > 1)[:, None, None]
    assert torch.allclose(res.log_mass.exp()[has_pairs.expand_as(mass)], mass[has_pairs.expand_as(mass)],
                          rtol=1e-12, atol=0)
    alone = (valid & (valid.sum(1, keepdim=True) == 1))[..., None].expand_as(mass)
    assert alone.any() and (res.log_mass[alone] < -1e29).all()      # no other real token: zero mass
    average = (weights @ C.transpose(1, 2)) / weights.sum(-1, keepdim=True).clamp_min(1e-300)   # (B, H, n, dh)
    got = res.average.transpose(1, 2)
    sel = has_pairs.transpose(1, 2)[..., None].expand_as(got)
    assert torch.allclose(got[sel], average[sel], rtol=1e-12, atol=1e-12)
    expected = -0.5 * torch.where(pair, torch.exp(-z), 0.0).sum(dim=(1, 2, 3))
    assert torch.allclose(mass_energy(res, valid), expected, rtol=1e-12, atol=0)
    full = attention_pass(C, scales, valid, diagonal=True, fused=fused)
    eye = torch.eye(C.shape[1], dtype=torch.bool)
    weights = torch.where(pair | (eye & valid[:, None, :, None]), torch.exp(-z), 0.0)   # j = i counted
    real = valid[..., None].expand_as(mass)
    assert torch.allclose(full.log_mass[real], weights.sum(-1).transpose(1, 2).log()[real], rtol=1e-12, atol=1e-12)
    average = ((weights @ C.transpose(1, 2)) / weights.sum(-1, keepdim=True).clamp_min(1e-300)).transpose(1, 2)
    sel = real[..., None].expand_as(average)
    assert torch.allclose(full.average[sel], average[sel], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="off-diagonal"):
        mass_energy(full, valid)


def test_masking_the_diagonal_keeps_precision_for_well_separated_tokens():
    """Float32 states whose tokens are far apart (‖a‖² ≈ 32, off-diagonal mass per row ≈ 1e-4 of the
    diagonal's): the fused energy stays within 1e-5 of the float64 reference, while subtracting the
    diagonal term from a sum that includes it loses most digits."""
    g = torch.Generator().manual_seed(2)
    Y = torch.randn(2, 64, 32, generator=g) * (64 / 32) ** 0.5      # ‖y‖² ≈ 64, ‖a‖² = ½‖y‖² ≈ 32
    F = torch.eye(32)[None] * 0.5**0.5
    exact = E.attention_energy(Y.double(), F.double(), method="gram")
    fused = E.attention_energy(Y, F)
    assert ((fused - exact).abs() <= 1e-5 * exact.abs()).all()
    a = (Y @ F[0].T)[:, :, None, :]                                  # (B, n, 1, k) one head, float32
    half = 0.5 * a.pow(2).sum(-1)                                    # (B, n, 1)
    q = torch.cat([a, torch.ones_like(half[..., None])], -1).transpose(1, 2)
    k = torch.cat([a, -half[..., None]], -1).transpose(1, 2)
    _, lse = softmax_with_lse(q, k, torch.cat([a, torch.zeros_like(half[..., None])], -1).transpose(1, 2),
                              torch.zeros(1, 1, 64, 64))             # the diagonal included
    with_diagonal = -0.5 * (torch.exp(lse.transpose(1, 2).double() - half.double()) - 1).sum(dim=(1, 2))
    assert ((with_diagonal - exact).abs() > 1e-2 * exact.abs()).all()


def test_padded_energy_groups_equal_per_sample_energies():
    """Length groups (real tokens moved to the front, rows cut to their group's longest) change nothing,
    whatever the positions of the padded tokens."""
    g = torch.Generator().manual_seed(3)
    lengths = [1, 3, 40, 38, 17, 0, 40, 9]
    Y = torch.randn(len(lengths), 40, 6, generator=g, dtype=D64)
    pad = torch.ones(len(lengths), 40, dtype=torch.bool)
    for b, length in enumerate(lengths):
        pad[b, torch.randperm(40, generator=g)[:length]] = False     # real tokens anywhere
    F = torch.randn(2, 3, 6, generator=g, dtype=D64) / 3
    grouped = E.attention_energy(Y, F, "exp", pad)
    single = torch.stack([E.attention_energy(Y[b:b + 1, ~pad[b]], F, "exp", method="gram")[0]
                          if lengths[b] else torch.zeros((), dtype=D64) for b in range(len(lengths))])
    assert torch.allclose(grouped, single, rtol=1e-12, atol=1e-14)
    assert torch.allclose(grouped, E.attention_energy(Y, F, "exp", pad, method="gram"), rtol=1e-12, atol=1e-14)


# ----------------------------------------------------------------------------- softmax from explicit logits
def _logit_rows(dtype, n=9):
    """Adversarial rows of logits (3, 8, n), MASKED entries marked: spread (scale 50: most weights underflow),
    offset (+1e4), tiny (1e-30), identical, one unmasked entry, the diagonal unmasked only, a fully masked row (the
    last)."""
    g = torch.Generator().manual_seed(7)
    base = torch.randn(3, 8, n, generator=g, dtype=D64)
    rows = [base[:, 0] * 50, base[:, 1] + 1e4, base[:, 2] * 1e-30, torch.full_like(base[:, 3], 2.5), base[:, 4],
            base[:, 5], base[:, 6], base[:, 7]]
    logits = torch.stack(rows, 1)                                   # (3, 8, n)
    masked = torch.rand(3, 8, n, generator=g) < 0.4
    masked[:, 4] = True
    masked[:, 4, 3] = False                                         # one unmasked entry
    masked[:, 5] = ~torch.eye(8, n, dtype=torch.bool)[5]            # only j = 5
    masked[:, 7] = True                                             # nothing visible
    masked[:, :7, 0] = False                                        # every other row sees key 0
    return logits.masked_fill(masked, MASKED).to(dtype), masked


@pytest.mark.parametrize("dtype", [D64, torch.float32])
def test_logit_softmax_values_are_the_weighted_sums(dtype):
    """out_i = Σ_j e^{ℓ_ij} v_j / Σ_j e^{ℓ_ij} and lse_i = log Σ_j e^{ℓ_ij} over the unmasked entries, against
    explicit float64 sums of the same (stored) logits. Bound: each weight e^{ℓ_ij − m_i} errs by ≤ u(|ℓ_ij − m_i| +
    2) relative (the rounded difference, the exponential), which summed over the row is ≤ u(n/e + 2n) of S_i ≥ 1;
    the sum adds γ_n, the reciprocal and the log one u each, the final subtraction u|lse|: |Δlse| ≤ (3n + 8)u(1 +
    |lse|), |Δout| ≤ (4n + 8)u max|v|. Masked entries get weight exactly 0; a row with nothing visible stays finite."""
    logits, masked = _logit_rows(dtype)
    n = logits.shape[-1]
    g = torch.Generator().manual_seed(8)
    v = torch.randn(3, n, 5, generator=g, dtype=D64).to(dtype)
    out, lse = logit_softmax(logits, v)
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
    ld, vd = logits.double()[:, :7], v.double()
    keep = ~masked[:, :7]
    m = ld.where(keep, -torch.inf).amax(-1, keepdim=True)           # (3, 7, 1) over the unmasked entries
    w = torch.where(keep, torch.exp(ld - m), 0.0)                   # (3, 7, n)
    S = w.sum(-1)
    want_lse, want_out = m[..., 0] + S.log(), (w @ vd) / S[..., None]
    u = torch.finfo(dtype).eps / 2
    assert ((lse[:, :7].double() - want_lse).abs() <= (3 * n + 8) * u * (1 + want_lse.abs())).all()
    assert float((out[:, :7].double() - want_out).abs().max()) <= (4 * n + 8) * u * float(vd.abs().max())
    P = torch.softmax(logits, -1)                                   # what the function averages with
    assert bool((P[:, :7][masked[:, :7]] == 0).all())


def test_logit_softmax_gradients_are_the_finite_differences():
    """The written-out backward against finite differences: both outputs, the average alone, the log-sum-exp alone
    (the branches with one incoming gradient missing). Rows with something visible (a fully masked row's logits
    all round to MASKED, which finite differences cannot move)."""
    logits, _ = _logit_rows(D64)
    logits = logits[:, 3:7].clone().requires_grad_(True)           # identical, one entry, the diagonal, random
    g = torch.Generator().manual_seed(9)
    v = torch.randn(3, logits.shape[-1], 4, generator=g, dtype=D64, requires_grad=True)
    w_out, w_lse = torch.randn(3, 4, 4, generator=g, dtype=D64), torch.randn(3, 4, generator=g, dtype=D64)

    def both(L, V):                                                 # one call, both outputs used
        out, lse = logit_softmax(L, V)
        return (out * w_out).sum() + (lse.sin() * w_lse).sum()

    for f in (both, lambda L, V: logit_softmax(L, V)[0], lambda L, V: logit_softmax(L, V)[1]):
        assert torch.autograd.gradcheck(f, (logits, v), eps=1e-6, atol=1e-8, rtol=1e-6)
