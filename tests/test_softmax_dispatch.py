"""Which fused kernel `softmax_with_lse` takes per device and dtype, and the CUDA memory-efficient
wrapper's logic (padding, mask alignment, the log-sum-exp gradient through the spare value column),
run on CPU against an emulation of the kernel's documented contract (no GPU needed)."""
import pytest
import torch

from conftest import D64
from unfoldformer import softmax as SM
from unfoldformer.softmax import MASKED, attention_pass, pass_kind, softmax_with_lse


@pytest.mark.parametrize("device,dtype,kind", [
    ("cpu", torch.float32, "cpu-flash"), ("cpu", torch.float64, "cpu-flash"), ("cpu", torch.float16, "explicit"),
    ("cuda", torch.float32, "cuda-efficient"), ("cuda", torch.float16, "cuda-efficient"),
    ("cuda", torch.bfloat16, "cuda-efficient"), ("cuda", torch.float64, "explicit"), ("mps", torch.float32, "explicit"),
])
def test_pass_kind_per_device_and_dtype(device, dtype, kind):
    assert pass_kind(device, dtype) == kind


def test_cuda_path_follows_the_mem_efficient_switch():
    enabled = torch.backends.cuda.mem_efficient_sdp_enabled()
    try:
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        assert pass_kind("cuda", torch.float32) == "explicit"
    finally:
        torch.backends.cuda.enable_mem_efficient_sdp(enabled)


def _causal_bias(c, n, causal):
    return torch.zeros(c, n).masked_fill(torch.ones(c, n, dtype=torch.bool).triu(1), float("-inf")) if causal else 0


def _emulated_efficient(q, k, v, bias, causal=False):
    """The kernel's contract: widths and bias rows aligned, log-sum-exp with the query axis padded to 32."""
    assert q.shape[-1] % SM._ALIGN == 0 and v.shape[-1] % SM._ALIGN == 0
    if bias is not None:
        assert bias.shape == (*q.shape[:3], k.shape[2]) and bias.stride(-2) % SM._ALIGN == 0
    logits = q @ k.transpose(-1, -2) + (0 if bias is None else bias)      # (B, H, c, n)
    logits = logits + _causal_bias(q.shape[2], k.shape[2], causal)
    lse = torch.logsumexp(logits, -1)                                     # (B, H, c)
    c = q.shape[2]
    padded = torch.cat([lse, lse.new_full((*lse.shape[:2], -c % 32), float("inf"))], -1)
    return torch.softmax(logits, -1) @ v, padded, torch.tensor(0), torch.tensor(0)


def _emulated_backward(g, q, k, v, bias, out, lse, seed, offset, causal=False):
    """dS = P ∘ (g vᵀ − D), D_i = g_i·out_i (the kernel's backward), from the saved log-sum-exp."""
    c = q.shape[2]
    logits = q @ k.transpose(-1, -2) + (0 if bias is None else bias) + _causal_bias(c, k.shape[2], causal)
    P = torch.exp(logits - lse[..., :c, None])                     # (B, H, c, n)
    dS = P * (g @ v.transpose(-1, -2) - (g * out).sum(-1, keepdim=True))
    return dS @ k, dS.transpose(-1, -2) @ q, P.transpose(-1, -2) @ g, None


@pytest.fixture
def as_cuda(monkeypatch):
    """CPU tensors take the CUDA branch, with the kernel emulated."""
    monkeypatch.setattr(SM, "pass_kind", lambda device, dtype: "cuda-efficient")
    monkeypatch.setattr(SM, "_efficient", _emulated_efficient)
    monkeypatch.setattr(SM, "_efficient_backward", _emulated_backward)


@pytest.mark.parametrize("with_mask", [True, False])
def test_cuda_wrapper_values_and_gradients_equal_explicit_logits(as_cuda, with_mask):
    """Odd widths (5 → padded to 16), c = 6 (log-sum-exp padded to 32), a broadcast (1, 1, c, n) mask:
    both outputs and the gradients through both equal explicit logits (float64: same sums, round-off only)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 6, 5, generator=g, dtype=D64, requires_grad=True)
    k = torch.randn(2, 3, 9, 5, generator=g, dtype=D64, requires_grad=True)
    v0 = torch.randn(2, 3, 9, 4, generator=g, dtype=D64, requires_grad=True)
    mask = torch.zeros(1, 1, 6, 9, dtype=D64)
    mask[0, 0, torch.arange(6), torch.arange(6)] = MASKED
    mask[..., 7] = MASKED
    mask = mask if with_mask else None
    w_out, w_lse = torch.randn(2, 3, 6, 4, generator=g, dtype=D64), torch.randn(2, 3, 6, generator=g, dtype=D64)
    results = []
    for fused in (True, False):
        v = torch.cat([v0, torch.zeros_like(v0[..., :1])], dim=-1)
        out, lse = softmax_with_lse(q, k, v, mask, fused=fused)
        assert out.shape == (2, 3, 6, 5) and lse.shape == (2, 3, 6)
        loss = (out[..., :4] * w_out).sum() + (lse.sin() * w_lse).sum()
        results.append([out.detach(), lse.detach(), *torch.autograd.grad(loss, (q, k, v0))])
    for fused, explicit in zip(*results):
        assert torch.allclose(fused, explicit, rtol=1e-12, atol=1e-12)


def test_attention_pass_through_the_cuda_wrapper_equals_the_cpu_kernel(as_cuda, monkeypatch):
    """The whole pass (chunks with the diagonal band as mask, padding, centring) is path-independent
    (float64, same sums in another order: round-off ≪ 1e-12; the gradient sums n terms more: 1e-10)."""
    g = torch.Generator().manual_seed(3)
    C = torch.randn(2, 11, 3, 4, generator=g, dtype=D64, requires_grad=True)
    valid = torch.rand(2, 11, generator=g) > 0.3
    valid[:, 0] = True
    scales = torch.rand(3, generator=g, dtype=D64) + 0.5
    got = attention_pass(C, scales, valid, rows=4)
    grad_got = torch.autograd.grad((got.average.sin().sum() + got.log_mass.where(valid[..., None], 0.0).sum()), C)[0]
    monkeypatch.setattr(SM, "pass_kind", lambda device, dtype: "cpu-flash")
    ref = attention_pass(C, scales, valid, rows=4)
    grad_ref = torch.autograd.grad((ref.average.sin().sum() + ref.log_mass.where(valid[..., None], 0.0).sum()), C)[0]
    real = valid[..., None]
    assert torch.allclose(got.log_mass.where(real, 0.0), ref.log_mass.where(real, 0.0), rtol=1e-12, atol=1e-12)
    assert torch.allclose(got.average, ref.average, rtol=1e-12, atol=1e-12)
    assert torch.allclose(grad_got, grad_ref, rtol=1e-10, atol=1e-10)


def test_fused_on_a_device_without_a_kernel_is_an_error(monkeypatch):
    monkeypatch.setattr(SM, "pass_kind", lambda device, dtype: "explicit")
    q = torch.zeros(1, 1, 2, 3)
    with pytest.raises(ValueError, match="no fused attention kernel"):
        softmax_with_lse(q, q, q, None, fused=True)
