"""The causal joint step: one MM step per token on its conditional energy (THEORY §3.11).

A decoder layer reads its input Ȳ (B, n, d) and the decoder's input X. Token i's conditional energy given the
context Ȳ_{≤i}, in the library's units (THEORY's divided by λ, as in `joint.py`):

    E_i(y | Ȳ) = w_i Σ_h Σ_{j≤i, real} ρ(½ s_h² ‖(y − ȳ_j) U_h‖²) + λ⁻¹ (½‖y − x_i‖² + γ E_H(y)),

w_i = 1/m_i with `attention_norm="length"` (m_i = the real tokens j ≤ i, i included), else 1; E_H on the one
row y. Linearising ρ at Ȳ and −½‖ReLU(·)‖² at ȳ_i gives one isotropic quadratic per token and head, whose
Jacobi step (ν_{h,i} = λ s_h² w_i, β_ij = ρ'(z_ij(Ȳ)), d_i = Σ_{j≤i} β_ij)

    c_i⁺ = (1 − α) c̄_i + α (ν Σ_{j≤i} β_ij c̄_j + x̃_i + γ r̃_i) / (ν d_i + 1 + γ)

lowers E_i for every token, any weights, α ∈ (0, 1]. It is the anchored step of `steps.anchored_softmax_update`
with the anchor p = (x̃ + γ r̃)/(1 + γ), ν/(1 + γ), and the causal pass *with* the diagonal (β_ii = ρ'(0) is
the self pair ȳ_i, part of E_i): target = p + σ(log ν' + log d_i)(o_i − p), o_i the causal average.

ρ = exp: the pass is causal softmax attention with q = k = v per head and the key-norm bias, folded into one
extra coordinate (q̃_i = [a_i, 1], k̃_j = [a_j, −½‖a_j‖²]) so the device's fused kernel runs in its causal mode
with scale 1 and no n × n mask (`softmax.softmax_with_lse(..., causal=True)`); log d_i = LSE_i − ½‖a_i‖².
Other ρ: the n × n weights ρ'(z_ij) of each head, masked (O(n²) memory per head; the blocked kernel of
`kernels.py` writes only a block's rows in its backward because K is symmetric, which a causal mask breaks).

Features are centred on each sample's first real token (a causal choice: a shift of every a_j leaves every
z_ij unchanged, and token i's result depends on tokens j ≤ i only), and the pass runs in float64 where the
float32 Gram-form logits' bound exceeds `softmax.PRECISION_TARGET` (THEORY §3.10).

Maps and free keys (`metric="free"` or `"diagonal"`, `keys="tied"` or `"free"`; no rotary). Token i's energy
with per-head maps A_h and keys k_j of the context, E_i(y) = w_i Σ_h Σ_{j≤i} ρ(½‖c_h(y) A_hᵀ − k^h_j‖²) + λ⁻¹(…),
with k_j = c̄_j A_hᵀ (tied: THEORY §3.8's metric, query = key) or k_j = ȳ_j K_h (free: any key map K_h of the
whole input state — the context is held fixed, so the keys are constants of E_i). Linearising ρ at Ȳ gives per
head Σ_j β_ij ½‖c A_hᵀ − k_j‖², Hessian d_i A_hᵀA_h ⪯ μ_h d_i I (μ_h ≥ λ_max(A_hᵀA_h), `metrics.spectral_bound`),
so with ν' = λ w_i/(1 + γ) the preconditioned step c_i⁺ = c̄_i − α[ν'(d_i q_i − Σ_j β_ij k_j) A_h + c̄_i − p_i] /
(ν' μ_h d_i + 1), q_i = c̄_i A_hᵀ, descends the separable quadratic majoriser, hence E_i, for α ∈ (0, 1] and any
A_h, K_h (a gradient step of length ≤ 1/L on a quadratic whose Hessian is ⪯ L I). Its full-α target is
(1 − g_i) p_i + g_i (c̄_i − (q_i − o_i) A_h/μ_h), o_i = Σ_j β_ij k_j / d_i, g_i = σ(log ν' μ_h d_i): for ρ = exp the
same fused causal pass with queries q and keys k (`mapped_targets`). Isotropic A_h = s_h I with tied keys is the
step above exactly. The value a head writes is its keys mapped back through A_h, so free keys let a head select
by one part of the context's state (a position) and copy another (a character) — what q = k = v cannot
(docs/results/lm.md, "Why the certified decoder trailed without relative biases").

Relative biases (`relative_bias=K`, any keys and metric): token i's energy weights its pair with j by
π_ij = e^{b_h(i − j)} > 0 (b_h(δ) learned per head for δ < K, larger offsets sharing b_h(K − 1)),
E_i(y) = w_i Σ_h Σ_{j≤i} π_ij ρ(½‖q_i(y) − k_j‖²) + λ⁻¹(…). Constant positive weights leave π_ij ρ concave, so
the majoriser is the one above with β_ij = π_ij ρ'(z_ij), and every token's step still lowers its energy. A head
can then prefer an offset (the previous token) whatever the distance of the states. The pass runs from explicit
logits a_i·k_j − ½‖k_j‖² + b_h(i − j) (B, H, q, n), whose gradient reaches b (the fused kernel's backward gives
none for an additive mask).

`conditional_energies` evaluates E_i in float64 from explicit differences y − ȳ_j (chunked over query rows).
The sequence energy G(Y) = Σ_i E_i(y_i | Y) is its sum with y = ȳ = Y: a measurement, not certified.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F_nn
from torch import Tensor

from .descent import descent_tolerance, lowered
from .positions import rope_tables, rotate_heads
from .rho import Rho, get_rho
from .rotated import _Frame, _frame, _hidden
from .softmax import PRECISION_TARGET, key_bias, logit_error_bound, logit_softmax, masked_logit, softmax_with_lse
from .steps import toward

__all__ = ["DecoderOutput", "causal_joint_step", "causal_log_weight", "causal_targets", "causal_trace",
           "conditional_energies", "mapped_targets", "pair_bias_rows", "visible_counts"]

_CHUNK_ELEMENTS = 1 << 22       # float64 entries of one (B, c, n, d) block of pair differences: 32 MiB


def visible_counts(valid: Tensor) -> Tensor:
    """m_i: the real tokens j ≤ i, at least 1: (B, n) bool -> (B, n) in valid's device, int64."""
    return valid.long().cumsum(1).clamp_min(1)


def causal_log_weight(valid: Tensor, dtype: torch.dtype) -> Tensor:
    """log w_i = −log m_i (B, n) (length normalisation over the visible tokens)."""
    return -visible_counts(valid).to(dtype).log()


def pair_bias_rows(table: Tensor, n: int, q: int) -> Tensor:
    """b_h(i − j) (H, q, n) for the last q query rows i of n tokens and every key j, from the table b_h(δ) (H, K)
    (offsets ≥ K − 1 share its last entry; j > i gets b_h(0), masked by the caller). A Toeplitz matrix: the rows
    are overlapping windows of one vector w_k = b(n − 1 − k) (H, 2n − 1), row i = w[n − 1 − i : 2n − 1 − i], so the
    table is gathered 2n − 1 times instead of n·q (and its gradient scattered as often)."""
    k = torch.arange(2 * n - 1, device=table.device)
    w = table[:, (n - 1 - k).clamp(0, table.shape[1] - 1)]        # (H, 2n − 1)
    return w.unfold(-1, n, 1).flip(-2)[:, n - q:]                  # (H, q, n): row i, entry j = w[n − 1 − i + j]


def _visible(valid: Tensor, q: int) -> Tensor:
    """(B, 1, q, n) bool: key j is real and j ≤ i, for the last q query rows i of n tokens (`valid` (B, n))."""
    n = valid.shape[1]
    i = torch.arange(n - q, n, device=valid.device)[:, None]
    return (torch.arange(n, device=valid.device)[None, :] <= i) & valid[:, None, None, :]


def _first_real(C: Tensor, valid: Tensor) -> Tensor:
    """Each sample's first real row of C (B, n, H, k): (B, 1, H, k) (row 0 where none is real)."""
    first = valid.to(torch.int8).argmax(1)                          # (B,)
    return C[torch.arange(C.shape[0], device=C.device), first][:, None]


def _features(C: Tensor, scales: Tensor, valid: Tensor) -> Tensor:
    """a = s_h (c − c_first) (B, n, H, dh): the same z_ij, the common part removed causally."""
    return (C - _first_real(C, valid)) * scales.to(C.dtype)[:, None]


def _needs_float64(a: Tensor, valid: Tensor, k: Tensor | None = None) -> bool:
    """Whether the float32 Gram-form logits of queries `a` (and keys `k`, default the queries) may err beyond
    `softmax.PRECISION_TARGET` (THEORY §3.10)."""
    if a.dtype == torch.float64 or a.shape[1] < 2:
        return False
    radius_sq = max(float((z.detach() * z.detach()).sum(-1).where(valid[..., None], 0.0).max())
                    for z in ((a,) if k is None else (a, k)))
    return float(logit_error_bound(torch.tensor(radius_sq), a.shape[-1], a.dtype)) > PRECISION_TARGET


def _softmax_average(a: Tensor, k: Tensor, V: Tensor, valid: Tensor, last_only: bool) -> tuple[Tensor, Tensor]:
    """ρ = exp: (o_i (B, q, H, w), log d_i (B, q, H)) over j ≤ i, β_ij = exp(−½‖a_i − k_j‖²), values V_j; a, k
    (B, n, H, dh) queries and keys (the same tensor for tied keys), V the keys' values; q = n (or 1: the last token,
    every key; then the keys may be fewer than the queries)."""
    half = 0.5 * a.square().sum(-1, keepdim=True)                   # (B, n, H, 1) ½‖a_i‖²
    half_k = half if k is a else 0.5 * k.square().sum(-1, keepdim=True)   # (B, n, H, 1) ½‖k_j‖²
    q = torch.cat([a, torch.ones_like(half)], dim=-1)              # (B, n, H, dh + 1) [a_i, 1]
    kk = torch.cat([k, key_bias(valid, k.dtype) - half_k], dim=-1)  # (B, n, H, dh + 1) [k_j, −½‖k_j‖²]
    v = torch.cat([V, torch.zeros_like(half_k)], dim=-1)           # (B, n, H, w + 1) last column 0 (LSE gradient)
    if last_only:
        q, half = q[:, -1:], half[:, -1:]                          # the new token sees every key: no mask at all
    out, lse = softmax_with_lse(q.transpose(1, 2), kk.transpose(1, 2), v.transpose(1, 2), None,
                                causal=not last_only)             # (B, H, q, w + 1), (B, H, q)
    return out.transpose(1, 2)[..., :-1], lse.transpose(1, 2) - half[..., 0]


def _dense_average(a: Tensor, k: Tensor, V: Tensor, valid: Tensor, rho: Rho, last_only: bool,
                   bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Other ρ: (Σ_j β_ij V_j / d_i, log d_i) from the masked n × n weights ρ'(½‖a_i − k_j‖²) of each head, times
    e^{b_h(i − j)} with a `bias` (H, q, n)."""
    at, kt, Vt = a.transpose(1, 2), k.transpose(1, 2), V.transpose(1, 2)   # (B, H, n, ·)
    rows = at[:, :, -1:] if last_only else at                      # (B, H, q, dh)
    sq_q, sq_k = rows.square().sum(-1), kt.square().sum(-1)        # (B, H, q), (B, H, n)
    z = (0.5 * (sq_q[..., None] + sq_k[:, :, None, :]) - rows @ kt.transpose(-1, -2)).clamp_min(0)
    seen = _visible(valid, rows.shape[2])                          # (B, 1, q, n)
    beta = rho.derivative(z) if bias is None else rho.derivative(z) * bias.to(z.dtype).exp()
    beta = torch.where(seen, beta, 0.0)                            # (B, H, q, n)
    deg = beta.sum(-1, keepdim=True)                               # (B, H, q, 1)
    avg = (beta @ Vt) / deg.clamp_min(torch.finfo(a.dtype).tiny)  # (B, H, q, w)
    return avg.transpose(1, 2), deg[..., 0].clamp_min(torch.finfo(a.dtype).tiny).log().transpose(1, 2)


def pair_logit_bias(bias: Tensor, valid: Tensor, dtype: torch.dtype) -> Tensor:
    """The pair biases b_h(i − j) (H, q, n) with the causal and padding mask folded in: MASKED where key j is padded
    or later than query i, (B, H, q, n), or (1, H, q, n) when every token is real."""
    q = bias.shape[1]
    seen = _visible(valid[:1] if bool(valid.all()) else valid, q)  # (B or 1, 1, q, n)
    return torch.where(seen, bias.to(dtype), masked_logit(dtype))


def _biased_softmax_average(a: Tensor, k: Tensor, V: Tensor, valid: Tensor, bias: Tensor,
                            last_only: bool) -> tuple[Tensor, Tensor]:
    """ρ = exp with pair biases (H, q, n): (o_i, log d_i), β_ij = e^{b_h(i − j) − ½‖a_i − k_j‖²}, from explicit
    logits a_i·k_j − ½‖k_j‖² + b_h(i − j) (B, H, q, n), masked (`pair_logit_bias`), through one softmax kernel
    (`softmax.logit_softmax`)."""
    rows = (a[:, -1:] if last_only else a).transpose(1, 2)         # (B, H, q, dh)
    kt, Vt = k.transpose(1, 2), V.transpose(1, 2)                  # (B, H, n, ·)
    (B, H, q, dh), n = rows.shape, kt.shape[2]
    base = pair_logit_bias(bias, valid, a.dtype) - 0.5 * kt.square().sum(-1)[:, :, None, :]   # (B, H, q, n)
    logits = torch.baddbmm(base.reshape(B * H, q, n), rows.reshape(B * H, q, dh),
                           kt.reshape(B * H, n, dh).transpose(1, 2)).view(B, H, q, n)
    avg, lse = logit_softmax(logits, Vt)                           # (B, H, q, w), (B, H, q)
    return avg.transpose(1, 2), (lse - 0.5 * rows.square().sum(-1)).transpose(1, 2)


def _average(a: Tensor, k: Tensor, V: Tensor, valid: Tensor, r: Rho, last_only: bool,
             bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    if r.softmax:
        if bias is not None:
            return _biased_softmax_average(a, k, V, valid, bias, last_only)
        return _softmax_average(a, k, V, valid, last_only)
    return _dense_average(a, k, V, valid, r, last_only, bias)


def causal_targets(C: Tensor, P: Tensor, scales: Tensor, log_nu: Tensor, valid: Tensor, rho: str | Rho, *,
                   last_only: bool = False, bias: Tensor | None = None) -> Tensor:
    """t_i = (ν' Σ_{j≤i} β_ij c_j + p_i)/(ν' d_i + 1) per token and head (module doc), the step's full-α target.

    C (B, n, H, dh) head coordinates of the layer's input (rotated with rotary positions), P (B, q, H, dh) the
    anchors p, `scales` (H,) s_h, `log_nu` log ν' broadcastable to (B, q, H), `valid` (B, n) True = real.
    `last_only`: only the last token's target (q = 1; it sees every key), for generation with a cache. `bias`
    (H, q, n): pair biases b_h(i − j) (`pair_bias_rows`), or None.
    """
    r = get_rho(rho)
    a = _features(C, scales, valid)                                # (B, n, H, dh)
    Cw = C
    if _needs_float64(a, valid):                                   # far groups, large norms: the pass in float64
        a, Cw = _features(C.double(), scales.double(), valid), C.double()
    avg, log_deg = _average(a, a, Cw, valid, r, last_only, bias)   # (B, q, H, dh), (B, q, H)
    gate = torch.sigmoid(log_nu.to(log_deg.dtype) + log_deg)[..., None]   # (B, q, H, 1) ν'd/(ν'd + 1)
    return torch.lerp(P.to(avg.dtype), avg, gate).to(C.dtype)


def mapped_targets(C: Tensor, keys: Tensor | None, P: Tensor, A: Tensor, mu: Tensor, log_nu: Tensor, valid: Tensor,
                   rho: str | Rho, *, last_only: bool = False, bias: Tensor | None = None) -> Tensor:
    """The full-α target with per-head maps A_h (queries q_i = c_i A_hᵀ) and context keys k_j (module doc,
    "Maps and free keys"): t_i = (1 − g_i) p_i + g_i (c_i − (q_i − o_i) A_h / μ_h), o_i = Σ_{j≤i} β_ij k_j / d_i,
    β_ij = ρ'(½‖q_i − k_j‖²), g_i = σ(log ν' + log μ_h + log d_i).

    C (B, n, H, dh) the layer input's head coordinates, keys (B, n, H, dh) the context's keys ȳ_j K_h (free keys)
    or None (tied keys: the queries c_j A_hᵀ), P (B, q, H, dh), A (H, dh, dh), mu (H,), log_nu log(λ w_i/(1 + γ))
    broadcastable to (B, q, H), `bias` (H, q, n) pair biases or None."""
    r = get_rho(rho)
    n, q_rows = C.shape[1], P.shape[1]
    Cq = C[:, n - q_rows:]                                         # (B, q, H, dh) the query rows
    queries = torch.einsum("bnhk,hlk->bnhl", C, A)                 # (B, n, H, dh) c_i A_hᵀ
    tied = keys is None
    shift = _first_real(queries if tied else keys, valid)          # (B, 1, H, dh): z_ij unchanged, o shifted
    a = queries - shift
    k = a if tied else keys - shift
    if _needs_float64(a, valid, None if tied else k):
        a = a.double()
        k = a if tied else k.double()
    avg, log_deg = _average(a, k, k, valid, r, last_only, bias)    # (B, q, H, dh) o_i − shift, (B, q, H)
    gap = (a[:, n - q_rows:] - avg).to(C.dtype)                    # (B, q, H, dh) q_i − o_i (shift-free)
    mapped = Cq - torch.einsum("bqhl,hlk->bqhk", gap, A) / mu[:, None]   # c_i − (q_i − o_i) A_h / μ_h
    log_gate = log_nu.to(log_deg.dtype) + mu.log().to(log_deg.dtype) + log_deg
    gate = torch.sigmoid(log_gate)[..., None].to(C.dtype)          # (B, q, H, 1)
    return torch.lerp(P, mapped, gate)


def conditional_energies(Y: Tensor, context: Tensor, X: Tensor, queries, keys, W: Tensor | None,
                         b: Tensor | None, lam: float, gamma: float | Tensor, rho: str | Rho, valid: Tensor,
                         length_norm: bool, bias: Tensor | None = None) -> Tensor:
    """E_i(y_i | context) for every token, (B, n) float64 (0 at padded rows); module doc.

    Y, context, X (B, n, d) in one basis (a layer's); `queries` maps the states Y (B, n, d) to their query
    features (B, n, H, dh) (s_h c, rotated with rotary positions, or c A_hᵀ), `keys` the context to its keys (the
    same map for tied keys, ȳ K_h for free ones); W (d, m), b (m,) the tied FFN in that basis (None: no FFN);
    `bias` (H, n, n) pair biases b_h(i − j) (the pair weights e^b), or None. Every operand is converted to float64;
    attention terms from explicit differences q_i − k_j."""
    r = get_rho(rho)
    Yd, Cd, Xd = Y.double(), context.double(), X.double()
    a_new, a_ctx = queries(Yd), keys(Cd)                           # (B, n, H, dh)
    B, n, H, dh = a_new.shape
    seen = valid[:, None, :] & torch.ones(n, n, dtype=torch.bool, device=Y.device).tril()   # (B, n, n) j ≤ i, real
    step = max(1, _CHUNK_ELEMENTS // max(1, B * n * H * dh))
    weights = None if bias is None else bias.double().exp().permute(1, 2, 0)   # (n, n, H) e^{b_h(i − j)}
    attention = []
    for s0 in range(0, n, step):
        e0 = min(n, s0 + step)
        diff = a_new[:, s0:e0, None] - a_ctx[:, None, :]           # (B, c, n, H, dh) y_i − ȳ_j per head
        z = 0.5 * diff.square().sum(-1)                            # (B, c, n, H)
        vals = r.value(z) if weights is None else weights[s0:e0] * r.value(z)
        vals = torch.where(seen[:, s0:e0, :, None], vals, 0.0)
        attention.append(vals.sum((-1, -2)))                       # (B, c)
    e_attention = torch.cat(attention, dim=1)                      # (B, n)
    if length_norm:
        e_attention = e_attention / visible_counts(valid).double()
    rest = 0.5 * (Yd - Xd).square().sum(-1)                        # (B, n) ½‖y_i − x_i‖²
    if W is not None:
        hidden = torch.relu(Yd @ W.double() + b.double())          # (B, n, m)
        g = gamma.double() if isinstance(gamma, Tensor) else float(gamma)
        rest = rest + g * 0.5 * (Yd.square().sum(-1) - hidden.square().sum(-1))
    return torch.where(valid, e_attention + rest / lam, 0.0)


def causal_joint_step(f: _Frame, Y: Tensor, Xr: Tensor, valid: Tensor, alpha: float | Tensor, rotary: bool, *,
                      last_only: bool = False) -> Tensor:
    """One causal joint layer (frame `f`, α) in its basis: Y (B, n, d) the layer's input, Xr (B, q, d) the query
    rows' anchors (q = n, or 1 with `last_only`: the last token only, for a cache) -> (B, q, d)."""
    layer = f.layer
    H, (B, n, d) = layer.attention.H, Y.shape
    dh = d // H
    Yq = Y[:, -1:] if last_only else Y                             # (B, q, d) the query rows
    q = Yq.shape[1]
    R = F_nn.linear(_hidden(Yq, f), f.W)                           # (B, q, d) r̃ = ReLU(ỹ W̃ + b) W̃ᵀ
    P = layer.anchor_mix(Xr, R).reshape(B, q, H, dh)               # (B, q, H, dh) (x̃ + γ r̃)/(1 + γ)
    C = Y.reshape(B, n, H, dh)                                     # (B, n, H, dh)
    tables = rope_tables(n, dh, Y.dtype, Y.device) if rotary else None
    rows = None if tables is None else (tables[0][n - q:], tables[1][n - q:])
    if tables is not None:                                         # rotated coordinates (THEORY §3.9)
        C, P = rotate_heads(C, tables), rotate_heads(P, rows)
    gamma = layer.gamma
    log_nu = f.log_nu - (torch.log1p(gamma) if isinstance(gamma, Tensor) else math.log1p(gamma))   # (H,)
    if layer.attention.length_norm:                                # ν_{h,i} = λ s_h²/m_i
        log_nu = log_nu + causal_log_weight(valid, Y.dtype)[:, n - q:, None]                # (B, q, H)
    bias = None if f.bias is None else pair_bias_rows(f.bias, n, q)   # (H, q, n) b_h(i − j)
    if f.A is not None:                                            # maps A_h, tied or free keys (no rotary)
        keys = None if f.K is None else torch.einsum("bnd,hdk->bnhk", Y, f.K)   # (B, n, H, dh) ȳ_j K_h
        target = mapped_targets(C, keys, P, f.A, f.mu, log_nu, valid, layer.attention.rho, last_only=last_only,
                                bias=bias)
    else:
        target = causal_targets(C, P, f.scales, log_nu, valid, layer.attention.rho, last_only=last_only, bias=bias)
    new = toward(C[:, n - q:], target, alpha)                      # (B, q, H, dh)
    if rows is not None:
        new = rotate_heads(new, rows, inverse=True)
    return new.reshape(B, q, d)


@dataclass
class DecoderOutput:
    """A causal stack's forward with `return_energies=True`. B = batch, n = tokens, T = depth; energies float64.

    Args:
        hidden (`Tensor` (B, n, d)): the final states (padded rows: the input's).
        token_before (`Tensor` (B, T, n)): E_ℓ,i(ȳ_i | Ȳ), token i's conditional energy under layer ℓ at its input.
        token_after (`Tensor` (B, T, n)): E_ℓ,i(y⁺_i | Ȳ) at its output, the same context: never above
            `token_before` (certified, THEORY §3.11), up to round-off (`token_lowered`).
        sequence_before, sequence_after (`Tensor` (B, T)): G_ℓ(Y) = Σ_i E_ℓ,i(y_i | Y), the context moving with the
            states, at the layer's input and output: a **measurement, not certified**.
        valid (`Tensor` (B, n) bool): True = real token.
    """

    hidden: Tensor
    token_before: Tensor
    token_after: Tensor
    sequence_before: Tensor
    sequence_after: Tensor
    valid: Tensor

    def token_lowered(self, tol: float | None = None) -> Tensor:
        """(B, T, n) bool: layer ℓ did not raise token i's conditional energy beyond tol·(1 + |E|) (default: the
        states' `descent_tolerance`); True at padded tokens."""
        tol = descent_tolerance(self.hidden.dtype) if tol is None else tol
        return lowered(self.token_before, self.token_after, tol) | ~self.valid[:, None, :]

    def token_descent_share(self, tol: float | None = None) -> float:
        """Share of real tokens whose conditional energy no layer raised."""
        every = self.token_lowered(tol).all(1)                     # (B, n)
        return float(every[self.valid].double().mean()) if bool(self.valid.any()) else 1.0


def _layer_energies(f64: _Frame, Z: Tensor, context: Tensor, Xr: Tensor, valid: Tensor) -> Tensor:
    """E_i(z_i | context) (B, n) float64 for the layer of frame `f64` (its float64 operators) in its basis."""
    att = f64.layer.attention

    def queries(W: Tensor) -> Tensor:                               # (B, n, d) -> (B, n, H, dh) query features
        B, n, d = W.shape
        C = W.reshape(B, n, att.H, d // att.H)
        if f64.A is not None:
            return torch.einsum("bnhk,hlk->bnhl", C, f64.A)          # c A_hᵀ
        C = rotate_heads(C, rope_tables(n, d // att.H, W.dtype, W.device)) if att.rotary else C
        return C * f64.scales[:, None]                             # s_h c

    def keys(W: Tensor) -> Tensor:
        return queries(W) if f64.K is None else torch.einsum("bnd,hdk->bnhk", W, f64.K)   # ȳ K_h

    n = Z.shape[1]
    bias = None if f64.bias is None else pair_bias_rows(f64.bias, n, n)   # (H, n, n)
    return conditional_energies(Z, context, Xr, queries, keys, f64.W, f64.b, att.lam, f64.layer.gamma, att.rho,
                                valid, att.length_norm, bias)


def causal_trace(stack, depth: int) -> DecoderOutput:
    """The causal forward of a `joint.JointStack` with every token's conditional energy before and after every
    layer and the measured sequence energy, evaluated in float64 from the states (operators converted exactly)."""
    Y, valid = stack.start(), stack.valid
    names = ("token_before", "token_after", "sequence_before", "sequence_after")
    out = {name: [] for name in names}
    for ell in range(depth):
        f = stack.frame(ell)
        f64, Xr = _frame(f.layer, torch.float64), stack.anchor(ell)
        Y_new = stack._joint(f, Y, Xr, valid, 1.0, None)
        energies = lambda Z, context: _layer_energies(f64, Z, context, Xr, valid)   # noqa: B023, E731
        before = energies(Y, Y)                                    # (B, n)
        out["token_before"].append(before)
        out["token_after"].append(energies(Y_new, Y))
        out["sequence_before"].append(before.sum(1))
        out["sequence_after"].append(energies(Y_new, Y_new).sum(1))
        Y = stack.advance(ell, Y_new)
    return DecoderOutput(stack.finish(Y), *(torch.stack(out[k], dim=1) for k in names), valid)
