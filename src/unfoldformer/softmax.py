"""One fused attention pass per state for ρ = exp: the MM step and the energy from it (THEORY §3.3, §5).

For ρ = exp the anchored step at Y and the attention energy at Y need the same n² quantities. Per
head h (features a_i = s_h c_i, c = the head's coordinates of y_i) and token i:

- the off-diagonal mass       S_i = Σ_{j≠i} e^{−z_ij},   z_ij = ½‖a_i − a_j‖²,
- the off-diagonal average    o_i = Σ_{j≠i} e^{−z_ij} c_j / S_i.

E_A = −½ Σ_h Σ_i S_i (each unordered pair once), and the step's weighted average follows from o_i
and S_i (`steps.anchored_softmax_update`). One softmax pass gives both: the logits
a_i·a_j − ½‖a_j‖² (augmented queries [a_i, 1], keys [a_j, −½‖a_j‖²]) differ from −z_ij by the row
constant ½‖a_i‖², so the softmax over j is o_i and log S_i = LSE_i − ½‖a_i‖².

For the energy the diagonal is masked (logit −1e30), never subtracted: counting it would give S_i as
(1 + S_i) − 1, which loses every digit once S_i is small (well-separated tokens). The mask is
(chunk × n), shared by the batch and the heads (views of one buffer), and queries run in chunks of
at most `_MASK_ELEMENTS / n`, so memory stays O(n) with gradients too. A step that needs no energy
uses the pass with the diagonal (`diagonal=True`: the mass d_i = 1 + S_i and its average, which
the step needs as they are, with no subtraction): no mask, one call. Padded keys get the logit
−1e30 through their key column, so they take no weight; padded queries are computed (finite, since
their rows are finite) and ignored by every caller.

On CPU (float32, float64) the pass is PyTorch's fused flash-attention kernel, which stores no n×n
weights and returns the row log-sum-exp; `_FusedSoftmax` makes that log-sum-exp differentiable (its
gradient enters the kernel's backward through a spare value column). On CUDA (float32, float16,
bfloat16) it is PyTorch's memory-efficient kernel (`_scaled_dot_product_efficient_attention` with
its log-sum-exp, the additive mask as its bias; `_EfficientSoftmax`, the same spare-column trick).
Elsewhere (float64 on CUDA, other devices) the same quantities come from explicit logits,
differentiated by autograd. `pass_kind` says which path a call takes.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["AttentionPass", "MASKED", "PRECISION_TARGET", "attention_pass", "exp_from_row_max", "key_bias",
           "logit_error_bound", "logit_softmax", "mass_energy", "masked_logit", "pass_kind", "softmax_with_lse"]

MASKED = -1e30               # logit of a masked pair: e^{MASKED − max} is exactly 0 in float32 and float64


def masked_logit(dtype: torch.dtype) -> float:
    """MASKED where `dtype` holds it; a quarter of the most negative finite value otherwise (float16), so
    two masks still add up to a finite logit and e^{logit − max} is exactly 0."""
    return max(MASKED, torch.finfo(dtype).min / 4)
_MASK_ELEMENTS = 1 << 20     # entries of one (chunk, n) diagonal mask: 4 MiB in float32
_FUSED_DTYPES = (torch.float32, torch.float64)
_EFFICIENT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
#: Sequences of at most this many tokens take the explicit pass on CPU (`_small_pass`), while its (B, H, n, n)
#: logits hold at most `SMALL_PASS_ENTRIES` entries (16 MiB in float32); longer ones the flash kernel.
SMALL_PASS_TOKENS = 32
SMALL_PASS_ENTRIES = 1 << 22
_ALIGN = 16                  # widths and mask rows padded to multiples of 16 entries (the kernel's alignment)


class AttentionPass(NamedTuple):
    """The softmax of one state, per token and head (block layout, heads contiguous)."""

    average: Tensor | None   # (B, n, H, dh) o_i, or None when only the energy was asked for
    log_mass: Tensor         # (B, n, H) log S_i = log Σ_{j≠i} e^{−z_ij} (about −1e30 when no other real token),
                             # or log d_i = log Σ_j e^{−z_ij} with `diagonal`
    diagonal: bool = False   # whether j = i is counted (then no energy can be read from it)


# ----------------------------------------------------------------------------- the fused kernel
def _fused(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False) -> tuple[Tensor, Tensor]:
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, attn_mask=mask, scale=1.0)


class _FusedSoftmax(torch.autograd.Function):
    """(softmax(q kᵀ + mask) v, logsumexp(q kᵀ + mask)) through the CPU flash kernel, both differentiable.

    The kernel's backward forms dS_ij = P_ij (g_i·v_j − D_i) with D_i = g_i·out_i. A gradient γ_i of
    the log-sum-exp adds P_ij γ_i, i.e. D_i → D_i − γ_i: the last value column is zero (callers pad
    v with it), so setting that column of g to 1 and of out to −γ gives exactly that.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False):
        out, lse = _fused(q, k, v, mask, causal)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.causal = causal
        return out, lse

    @staticmethod
    def backward(ctx, g_out: Tensor | None, g_lse: Tensor | None):
        q, k, v, mask, out, lse = ctx.saved_tensors
        g = torch.zeros_like(out) if g_out is None else g_out.clone()
        if g_lse is not None:
            out = out.clone()
            g[..., -1] = 1.0
            out[..., -1] = -g_lse
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            g, q, k, v, out, lse, 0.0, ctx.causal, attn_mask=mask, scale=1.0)
        return (*grads, None, None)


def _efficient(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, causal: bool = False):
    return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, 0.0, causal, scale=1.0)


def _efficient_backward(g, q, k, v, bias, out, lse, seed, offset, causal: bool = False):
    return torch.ops.aten._scaled_dot_product_efficient_attention_backward(
        g, q, k, v, bias, out, lse, seed, offset, 0.0, [True, True, True, False], causal, scale=1.0)


def _pad_to(x: Tensor, dim: int, multiple: int) -> Tensor:
    """x with zeros appended along `dim` up to a multiple of `multiple` (x itself if it is one)."""
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_zeros(shape)], dim)


class _EfficientSoftmax(torch.autograd.Function):
    """(softmax(q kᵀ + mask) v, logsumexp(q kᵀ + mask)) through the CUDA memory-efficient kernel.

    Widths are padded with zero columns to a multiple of `_ALIGN` (zeros change no logit and no used
    output column; the last value column stays zero for the log-sum-exp gradient, as in
    `_FusedSoftmax`); the mask is expanded to (B, H, c, n) and stored with rows padded to `_ALIGN`
    (the kernel's alignment), read through a view. The kernel may return the log-sum-exp with the
    query axis padded: it is cut to c, and passed whole to the backward.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool = False):
        B, H, c, w = q.shape
        n = k.shape[2]
        qp, kp, vp = (_pad_to(t, -1, _ALIGN) for t in (q, k, v))   # (B, H, ·, w') zero columns added
        bias = None
        if mask is not None:
            bias = _pad_to(mask.expand(B, H, c, n), -1, _ALIGN)[..., :n]   # (B, H, c, n) aligned rows
        out, lse, seed, offset = _efficient(qp, kp, vp, bias, causal)
        ctx.save_for_backward(qp, kp, vp, bias, out, lse, seed, offset)
        ctx.width, ctx.causal = w, causal
        return out[..., :w], lse[..., :c]

    @staticmethod
    def backward(ctx, g_out: Tensor | None, g_lse: Tensor | None):
        qp, kp, vp, bias, out, lse, seed, offset = ctx.saved_tensors
        w, c = ctx.width, qp.shape[2]
        g = torch.zeros_like(out)
        if g_out is not None:
            g[..., :w] = g_out
        if g_lse is not None:                                      # D_i → D_i − γ_i through the zero column
            out = out.clone()
            g[..., -1] = 1.0
            out[..., -1] = -g_lse[..., :c]
        gq, gk, gv = _efficient_backward(g, qp, kp, vp, bias, out, lse, seed, offset, ctx.causal)[:3]
        return gq[..., :w], gk[..., :w], gv[..., :w], None, None


def pass_kind(device_type: str, dtype: torch.dtype) -> str:
    """Which path `softmax_with_lse` takes by default: "cpu-flash", "cuda-efficient" or "explicit"."""
    if device_type == "cpu" and dtype in _FUSED_DTYPES:
        return "cpu-flash"
    if device_type == "cuda" and dtype in _EFFICIENT_DTYPES and torch.backends.cuda.mem_efficient_sdp_enabled():
        return "cuda-efficient"
    return "explicit"


def softmax_with_lse(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *,
                     fused: bool | None = None, causal: bool = False) -> tuple[Tensor, Tensor]:
    """(softmax(q kᵀ + mask) v, logsumexp(q kᵀ + mask)), scale 1, both differentiable.

    q (B, H, c, w), k and v (B, H, n, w) with equal widths and **v's last column zero**; mask (1, 1, c, n)
    additive, or None. Returns (B, H, c, w) and (B, H, c). `fused`: the device's fused kernel (default
    where one runs, `pass_kind`); False: explicit logits. `causal`: query i sees keys j ≤ i only (square
    q kᵀ; the kernels' own causal mode, no mask tensor).
    """
    kind = pass_kind(q.device.type, q.dtype)
    if fused is None:
        fused = kind != "explicit"
    if fused and kind == "cpu-flash":
        return _FusedSoftmax.apply(q, k, v, None if mask is None else mask.to(q.dtype), causal)
    if fused and kind == "cuda-efficient":
        return _EfficientSoftmax.apply(q, k, v, None if mask is None else mask.to(q.dtype), causal)
    if fused:
        raise ValueError(f"no fused attention kernel for {q.dtype} on {q.device.type}")
    logits = q @ k.transpose(-1, -2)                               # (B, H, c, n)
    logits = logits if mask is None else logits + mask
    if causal:                                                     # (c, n) j > i masked
        later = torch.ones(logits.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        logits = logits.masked_fill(later, masked_logit(logits.dtype))
    return torch.softmax(logits, dim=-1) @ v, torch.logsumexp(logits, dim=-1)


# ----------------------------------------------------------------------------- one pass per state
def key_bias(valid: Tensor, dtype: torch.dtype) -> Tensor:
    """0 for real keys, MASKED for padded ones: (B, n) bool (True = real) -> (B, n, 1, 1) (of the last key column)."""
    bias = torch.zeros(valid.shape, dtype=dtype, device=valid.device).masked_fill(~valid, masked_logit(dtype))
    return bias[..., None, None]


def _diagonal_band(rows: int, n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """E (rows, 2n) with MASKED at (i, n + i): its column slice E[:c, n − s : 2n − s] is the (c, n) mask of the
    query chunk starting at s (MASKED at (i, s + i)), a view, so every chunk shares one O(rows · n) buffer."""
    band = torch.zeros(rows, 2 * n, dtype=dtype, device=device)
    band[torch.arange(rows, device=device), n + torch.arange(rows, device=device)] = masked_logit(dtype)
    return band


#: Largest first-order bound on the logits' round-off (`logit_error_bound`) the pass accepts in the
#: inputs' dtype; above it the pass runs in float64 (docs/theory.md, "Numerics of the fast paths").
PRECISION_TARGET = 2.0 ** -10


def logit_error_bound(radius_sq: Tensor, k: int, dtype: torch.dtype) -> Tensor:
    """4 γ_{k+4} R²: a first-order bound on |fl(ℓ_ij) − ℓ_ij| (hence on the error of log S_i, of each z_ij, and
    on the relative error of each weight e^{−z_ij}) for Gram-form logits of centred features with
    max ‖a_i‖² = R² (`radius_sq`), width k, in `dtype` (u = eps/2, γ_m = m u / (1 − m u)).

    The features a = fl(fl(c − mean)·s) carry 2u relative per entry, which moves z_ij by at most
    ‖a_i − a_j‖·2u(‖a_i‖ + ‖a_j‖) ≤ 8u R². The logit q_i·k_j is a dot product of length k + 1 with
    Σ|q||k| ≤ ‖a_i‖‖a_j‖ + ½‖a_j‖² ≤ 3R²/2 (error γ_{k+1}·3R²/2); its key entry ½‖a_j‖² carries γ_k R²/2, and
    so does the ½‖a_i‖² subtracted from the LSE; the LSE's own rounding is u(|LSE| + log n) ≤ u(R²/2 + log n).
    Together ≤ (3/2 + 1/2 + 1/2 + 1/2) γ_{k+1} R² + 8u R² + u log n ≤ 4 γ_{k+4} R² + u log n; the u log n
    (≤ 1e-6 in float32 for n ≤ 10⁶) is below every tolerance that uses the bound. The same bound covers the
    Gram form of z_ij in `kernels.py` (rows [−a_i, ½‖a_i‖², 1], columns [a_j, 1, ½‖a_j‖²])."""
    u = torch.finfo(dtype).eps / 2
    gamma = (k + 4) * u / (1 - (k + 4) * u)
    return 4 * gamma * radius_sq


def attention_pass(C: Tensor, scales: Tensor | None, valid: Tensor, *, diagonal: bool = False,
                   average: bool = True, rows: int | None = None, fused: bool | None = None,
                   metric: Tensor | None = None, prior: Tensor | None = None) -> AttentionPass:
    """S_i and o_i (module doc) of every token and head, from head coordinates C (B, n, H, dh).

    `scales` (H,): features a = s_h c (None: a = c); `valid` (B, n) True = real token. The features are
    centred on the mean of the real tokens first, a_i = s_h (c_i − mean) (the difference first, exact for
    a common offset): z_ij does not change, and the logits lose the common part of the a_i, which would
    otherwise cost digits (the logits' round-off grows with max ‖a_i‖², `logit_error_bound`). Where that
    bound exceeds `PRECISION_TARGET` (tokens in groups far apart, large norms) the pass runs in float64 and
    its results are rounded back to C's dtype (docs/theory.md, "Numerics of the fast paths").
    `diagonal`: count j = i (d_i and its average, one call without a mask; for steps, not energies).
    With `average=False` only the log mass (the values are then the keys, which saves building them).
    `rows`: queries per chunk (default: a (chunk, n) mask of at most `_MASK_ELEMENTS` entries).
    `metric` (H, dh, dh): free per-head maps A_h (THEORY §3.8), features a_i = (c_i − mean) A_hᵀ (then
    `scales` must be None); the values stay c.
    `prior` (B, n, H): log-weights p_i of a position prior (`layers.AnchoredAttention`, position_prior): every pair
    is weighted by e^{p_i + p_j}, so S_i = Σ_{j≠i} e^{p_i + p_j − z_ij} and o_i is the average with weights
    e^{p_j − z_ij} (off-diagonal passes only). p_j rides in the key column and p_i is added to the log mass: no
    n × n tensor, the same kernels. Padded tokens' entries are ignored (their keys stay masked). Each logit carries
    p_j's rounding too, so the precision test adds 2u·max|p| to the bound.
    """
    B, n, H, dh = C.shape
    if prior is not None and diagonal:
        raise ValueError("a pass with a position prior is off-diagonal: the step keeps the self pair's weight 1")
    all_real = bool(valid.all())                                   # no padding: no masking or counting needed
    weights = valid.to(C.dtype)                                    # (B, n)
    mean = torch.bmm(weights[:, None, :], C.reshape(B, n, H * dh)).view(B, 1, H, dh)
    # (B, 1, H, dh) mean of the real c_i (over n without padding: the same quotient as over the count n)
    mean = mean / (float(n) if all_real else weights.sum(1).clamp_min(1.0)[:, None, None, None])
    s = torch.ones(H, 1, dtype=C.dtype, device=C.device) if scales is None else scales.to(C.dtype)[:, None]
    if metric is None:
        a = (C - mean) * s                                         # (B, n, H, dh) s_h (c_i − mean)
    else:
        a = torch.einsum("bnhk,hjk->bnhj", C - mean, metric.to(C.dtype))   # (B, n, H, dh) (c_i − mean) A_hᵀ
    half = 0.5 * torch.linalg.vector_norm(a, dim=-1, keepdim=True).square()   # (B, n, H, 1) ½‖a_i − mean‖²
    if C.dtype != torch.float64 and n > 1:
        # R² = max ‖a_i‖² and max|p| over the real tokens (all of them without padding), read once: the bound
        # is a handful of scalar operations, done in Python
        radius_sq = 2 * float((half if all_real else half.where(valid[..., None, None], 0.0)).detach().max())
        bound = logit_error_bound(radius_sq, dh, C.dtype)
        if prior is not None:                                      # + u|p_j| in the key column, u|p_i| on the mass
            p_real = prior if all_real else prior.where(valid[..., None], 0.0)
            bound = bound + torch.finfo(C.dtype).eps * float(p_real.detach().abs().max())
        if bound > PRECISION_TARGET:
            wide = attention_pass(C.double(), None if scales is None else scales.double(), valid, diagonal=diagonal,
                                  average=average, rows=rows, fused=fused,
                                  metric=None if metric is None else metric.double(),
                                  prior=None if prior is None else prior.double())
            avg = None if wide.average is None else wide.average.to(C.dtype)
            return AttentionPass(avg, wide.log_mass.clamp_min(masked_logit(C.dtype)).to(C.dtype), diagonal)
    # (B, n, H, 1) −½‖a_j‖² (+ p_j), MASKED for padded keys (without padding no bias: 0 − x is −x)
    key_column = -half if all_real else key_bias(valid, C.dtype) - half
    if prior is not None:
        key_column = key_column + prior.to(C.dtype)[..., None]     # + p_j
    if fused is None and n <= SMALL_PASS_TOKENS and B * H * n * n <= SMALL_PASS_ENTRIES \
            and pass_kind(C.device.type, C.dtype) == "cpu-flash":
        return _small_pass(C, a, half, key_column, valid, diagonal, average, prior, all_real)
    q = torch.cat([a, torch.ones_like(half)], dim=-1)              # (B, n, H, dh + 1)
    k = torch.cat([a, key_column], dim=-1)                         # (B, n, H, dh + 1)
    if average:
        v = torch.cat([C, torch.zeros_like(half)], dim=-1)         # (B, n, H, dh + 1), last column 0 (_FusedSoftmax)
    elif torch.is_grad_enabled() and a.requires_grad:
        v = torch.cat([a, torch.zeros_like(half)], dim=-1)         # a differentiable LSE needs the zero column
    else:
        v = k                                                      # values unused: any tensor of the keys' shape
    rows = n if diagonal else max(1, min(n, _MASK_ELEMENTS // n if rows is None else int(rows)))
    band = None if diagonal else _diagonal_band(rows, n, C.dtype, C.device)   # (rows, 2n)
    outs, lses = [], []
    for s in range(0, n, rows):
        e = min(n, s + rows)
        mask = None if diagonal else band[None, None, : e - s, n - s: 2 * n - s]   # (1, 1, c, n) view at (i, s + i)
        out, lse = softmax_with_lse(q[:, s:e].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                                    fused=fused)                   # (B, H, c, dh + 1), (B, H, c)
        outs.append(out.transpose(1, 2)[..., :dh] if average else None)
        lses.append(lse.transpose(1, 2))
    log_mass = (torch.cat(lses, dim=1) if len(lses) > 1 else lses[0]) - half[..., 0]   # (B, n, H)
    if prior is not None:
        log_mass = log_mass + prior.to(C.dtype)                    # + p_i
    avg = (torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]) if average else None
    return AttentionPass(avg, log_mass, diagonal)


class _LogitSoftmax(torch.autograd.Function):
    """(softmax(ℓ) v, logsumexp(ℓ)) from explicit logits ℓ (…, c, n) and values v (…, n, w): one softmax kernel
    (its exponential stays on the fast path for masked entries, which a separate exp or logsumexp leaves: measured
    6–7× slower per call on them), the log-sum-exp read from it as m_i − log max_j P_ij (P_ij = e^{ℓ_ij − m_i}/S_i
    peaks at 1/S_i ∈ [1/n, 1], so no underflow; one rounding more than the sum), and the backward written out:
    dℓ_ij = P_ij (g_i·v_j − g_i·out_i + γ_i) for gradients g of the average and γ of the log-sum-exp,
    dv = Pᵀ g (an output without a gradient is skipped, not filled with zeros). Four n × n passes each way, against
    about ten each through autograd."""

    @staticmethod
    def forward(ctx, logits: Tensor, v: Tensor):
        P = torch.softmax(logits, dim=-1)                          # (…, c, n)
        out = P @ v                                                # (…, c, w)
        lse = logits.amax(-1) - P.amax(-1).log()                   # (…, c)
        ctx.save_for_backward(P, v, out)
        ctx.set_materialize_grads(False)                           # a missing gradient arrives as None
        return out, lse

    @staticmethod
    def backward(ctx, g_out: Tensor | None, g_lse: Tensor | None):
        P, v, out = ctx.saved_tensors
        if g_out is None:                                          # only the log-sum-exp: dℓ = P γ, no dv
            return (None if g_lse is None else P * g_lse[..., None]), None
        shift = (g_out * out).sum(-1, keepdim=True)                # (…, c, 1) g_i·out_i
        if g_lse is not None:
            shift = shift - g_lse[..., None]                       # − γ_i
        d_logits = (g_out @ v.transpose(-1, -2)).sub_(shift).mul_(P)   # (…, c, n)
        return d_logits, (P.transpose(-1, -2) @ g_out if ctx.needs_input_grad[1] else None)


def logit_softmax(logits: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """(softmax(ℓ) v, logsumexp(ℓ)) from explicit logits ℓ (…, c, n) and values v (…, n, w), both differentiable
    (`_LogitSoftmax`): masked entries carry `masked_logit` (weight exactly 0; a row with every entry masked averages
    all values, its log-sum-exp about MASKED)."""
    return _LogitSoftmax.apply(logits, v)


def exp_from_row_max(logits: Tensor, *, in_place: bool = False) -> tuple[Tensor, Tensor]:
    """(e^{ℓ − m} floored, m): the exponentials of logits (…, n) shifted by their row maximum m (…, 1), taken
    without autograd (the softmax and the log-sum-exp do not depend on it); `in_place` reuses the logits' buffer.

    Shifted logits below ½ log(tiny) are raised to it before the exponential: the CPU's vectorised exp leaves its
    fast path for results that underflow or are subnormal (measured 11–32× slower per call), and a weight below
    √tiny (1e-19 in float32) next to the row's largest, 1, changes no sum in this dtype; the square root keeps the
    products with the values out of the subnormal range too (a floor at log(tiny) + 1 made some forwards 40 %
    slower through subnormal products). Masked entries come out at that floor, not 0: callers zero them."""
    top = logits.detach().amax(-1, keepdim=True)
    floor = 0.5 * math.log(torch.finfo(logits.dtype).tiny)
    if in_place:
        return logits.sub_(top).clamp_(min=floor).exp_(), top
    return (logits - top).clamp(min=floor).exp(), top


def _small_pass(C: Tensor, a: Tensor, half: Tensor, key_column: Tensor, valid: Tensor, diagonal: bool, average: bool,
                prior: Tensor | None, all_real: bool) -> AttentionPass:
    """The pass of short sequences from explicit logits a_i·a_j − ½‖a_j‖² (B, H, n, n): the same quantities as the
    flash kernel, which at these lengths ran slower at 2 threads than at 1 (B 64, 4 heads, n 16: 0.33 ms at 1
    thread, 0.73 ms at 2, inside a 4-layer forward; docs/results/speed.md), with one batched product for the
    logits and one for the average. The row maximum m_i is a constant of the gradient (the softmax and the
    log-sum-exp do not depend on it), so it is taken without autograd; without autograd the n × n buffer is
    reused in place (`exp_from_row_max`). Padded keys and j = i get the logit MASKED as in the kernel's pass (a row
    with no other real key: log S_i ≈ MASKED). `key_column` (B, n, H, 1): the keys' term of the logits, as the kernel's
    pass builds it (−½‖a_j‖² + p_j, MASKED for padded keys); `prior` (B, n, H): p_i, added to the log mass;
    `all_real`: whether `valid` is all True."""
    B, n, H, dh = C.shape
    padded = not all_real
    at = a.transpose(1, 2).reshape(B * H, n, dh)                   # (B·H, n, dh)
    key_term = key_column[..., 0].transpose(1, 2)                  # (B, H, n)
    logits = torch.baddbmm(key_term.reshape(B * H, 1, n), at, at.transpose(1, 2))   # (B·H, n, n) a_i·a_j + that
    if not diagonal:
        logits.diagonal(dim1=1, dim2=2).fill_(masked_logit(C.dtype))   # j = i (the product's backward needs no output)
    logits = logits.view(B, H, n, n)
    in_place = not (torch.is_grad_enabled() and logits.requires_grad)
    # the masked entries (padded keys, j = i) are set to exactly 0 after the exponential, as in the kernel
    weights, top = exp_from_row_max(logits, in_place=in_place)     # (B, H, n, n) e^{ℓ_ij − m_i}, (B, H, n, 1)
    if in_place:
        if not diagonal:
            weights.diagonal(dim1=-2, dim2=-1).zero_()
        if padded:
            weights.mul_(valid[:, None, None, :].to(C.dtype))
    else:
        if padded or not diagonal:
            weights = weights * _small_pass_keep(valid, diagonal, C.dtype)   # (B, 1, n, n) zeros where masked
    # (B, H, n, 1); 0 only in a row with no other real key, whose log mass is then about MASKED
    total = weights.sum(-1, keepdim=True).clamp_min(torch.finfo(C.dtype).tiny)
    log_mass = (top + total.log())[..., 0].transpose(1, 2) - half[..., 0]   # (B, n, H) LSE_i − ½‖a_i‖²
    if prior is not None:
        log_mass = log_mass + prior.to(C.dtype)                    # + p_i
    avg = None
    if average:
        avg = ((weights @ C.transpose(1, 2)) / total).transpose(1, 2)   # (B, n, H, dh) o_i
    return AttentionPass(avg, log_mass, diagonal)


def _small_pass_keep(valid: Tensor, diagonal: bool, dtype: torch.dtype) -> Tensor:
    """1 where key j counts for query i, 0 for padded keys (and j = i without the diagonal): (B, 1, n, n)."""
    n = valid.shape[1]
    keep = valid[:, None, None, :].to(dtype).expand(-1, 1, n, n)
    return keep if diagonal else keep * (1 - torch.eye(n, dtype=dtype, device=valid.device))


def mass_energy(attention: AttentionPass, valid: Tensor) -> Tensor:
    """E_A = −½ Σ_h Σ_{i real} S_i from an off-diagonal pass (log S_i (B, n, H)) and `valid` (B, n): (B,) float64."""
    if attention.diagonal:
        raise ValueError("the energy needs the off-diagonal pass (diagonal=False)")
    log_mass = attention.log_mass
    mass = torch.exp(log_mass.to(torch.float64)).sum(-1)          # (B, n)
    return -0.5 * torch.where(valid, mass, 0.0).sum(-1)
