"""Energy terms, batched, in float64 (THEORY §2, §3.1, §5).

Shapes: Y and X are (B, n, d); attention factors F are (H, k, d) so that head h has
z^h_ij = ½‖(y_i − y_j) F_hᵀ‖² and metric M_h = F_hᵀ F_h (PSD by construction).

**Pair convention: each unordered pair once.** E_A(Y) = Σ_h Σ_{i<j} ρ(z^h_ij); the
ordered sum Σ_{i,j} equals 2·E_A + n·H·ρ(0). The diagonal is masked, never subtracted.

`padding_mask` is a bool (B, n) tensor in which **True marks padding** (PyTorch's
key_padding_mask convention). Padded tokens are removed from every sum; a row that is
all padding has energy 0.

Pairwise distances come from Gram matrices (never O(n²·d) pair differences) of states **centred on
the real tokens' mean first** (`centred_states`, THEORY §3.10 (ii)): z_ij depends only on differences,
and the Gram form ½‖a_i‖² + ½‖a_j‖² − a_i·a_j of uncentred features cancels at u·max‖a_i‖² — u times the
squared common offset — where that of centred ones errs by u·(spread)² only. Queries
are processed in chunks (memory O(n · chunk)), and ρ = −exp(−z) goes through
log-sum-exp: Σ_{j≠i} exp(−z_ij) = exp(LSE_{j≠i}(a_i·a_j − ½‖a_j‖²) − ½‖a_i‖²). For ρ = exp
that log-sum-exp comes by default from one fused attention pass with the diagonal masked
(`softmax_attention_energy`, padding-aware); `method="gram"` keeps the explicit Gram path,
the reference.
Every function returns a (B,) float64 tensor and is differentiable by autograd; the
closed-form gradients used by the descent steps are here too, so tests compare them.

Precision: products with the parameters (head features Y F_hᵀ, the FFN's Y W1) run in
Y's precision; pairwise Gram matrices, log-sum-exp and every sum run in float64. A
float64 input is thus float64 throughout; a float32 state, itself rounded to ~6e-8,
gets energies accurate to its own rounding level (`model.descent_tolerance`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .rho import Rho, get_rho
from .softmax import attention_pass, logit_error_bound, mass_energy
from .threads import free_core_threads

_CHUNK_ELEMENTS = 1 << 22  # float64 entries per (B, H, chunk, n) block: 32 MiB


# ----------------------------------------------------------------------------- checks
def all_finite(t: Tensor) -> bool:
    """Whether every entry of t is finite: one sum (a NaN or ±Inf entry makes it non-finite, so a finite sum
    proves it) and the elementwise test only when the sum is not finite (an overflow of finite entries)."""
    return bool(torch.isfinite(t.detach().sum())) or bool(torch.isfinite(t).all())


def check_states(Y: Tensor, padding_mask: Tensor | None = None, *, name: str = "Y",
                 check_finite: bool = True) -> Tensor:
    """Validate a (B, n, d) floating tensor and return the validity mask (B, n), True = real token."""
    if not isinstance(Y, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(Y).__name__}")
    if Y.dim() != 3:
        raise ValueError(f"{name} must have shape (B, n, d); got rank {Y.dim()} shape {tuple(Y.shape)}")
    if not Y.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got dtype {Y.dtype}")
    if Y.device.type == "meta":
        raise ValueError(f"{name} is on the meta device (a shape without values); build it on cpu or cuda")
    B, n, d = Y.shape
    if n == 0 or d == 0:
        raise ValueError(f"{name} has an empty dimension: shape {tuple(Y.shape)} (need n >= 1 and d >= 1)")
    if check_finite and not all_finite(Y):
        raise ValueError(f"{name} contains NaN or Inf values")
    if padding_mask is None:
        return torch.ones(B, n, dtype=torch.bool, device=Y.device)
    if padding_mask.dtype != torch.bool:
        raise TypeError(f"padding_mask must be a bool tensor (True marks padding), got {padding_mask.dtype}")
    if tuple(padding_mask.shape) != (B, n):
        raise ValueError(f"padding_mask must have shape (B, n) = {(B, n)}, got {tuple(padding_mask.shape)}")
    return ~padding_mask


def check_dtype(x: Tensor, module: torch.nn.Module, name: str = "x") -> None:
    """Refuse an input whose dtype differs from the module's parameters (float16 into a float32 model):
    casting silently would change the precision, and with it the round-off allowance of every
    descent check (`descent.descent_tolerance`), behind the caller's back."""
    param = next(module.parameters(), None)
    if param is not None and x.dtype != param.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but the model's parameters are {param.dtype}; convert one "
                        f"to the other first ({name}.to({param.dtype}) or model.to({x.dtype}))")


def check_factors(factors: Tensor, d: int) -> Tensor:
    """Validate attention factors and return them as (H, k, d)."""
    if not isinstance(factors, Tensor) or not factors.is_floating_point():
        raise TypeError("factors must be a floating torch.Tensor of shape (H, k, d) or (k, d)")
    if factors.dim() == 2:
        factors = factors.unsqueeze(0)
    if factors.dim() != 3:
        raise ValueError(f"factors must have shape (H, k, d) or (k, d); got {tuple(factors.shape)}")
    if factors.shape[-1] != d:
        raise ValueError(f"factors act on d={factors.shape[-1]} features but Y has d={d}")
    if not all_finite(factors):
        raise ValueError("factors contain NaN or Inf values")
    return factors


def _masked_rows(valid: Tensor) -> Tensor:
    return valid.to(torch.float64)  # (B, n)


# ----------------------------------------------------------------------------- attention
def centred_states(Y: Tensor, valid: Tensor) -> Tensor:
    """Y minus the mean of its real tokens, padded rows 0: (B, n, d) -> (B, n, d), in Y's dtype.

    Every z_ij = ½‖(y_i − y_j) F_hᵀ‖² is unchanged. The mean is formed in float64 and subtracted from the
    exactly converted states, so each centred row carries one rounding, u·‖y_i − mean‖, and the rounding of
    the mean itself is common to all rows (it cancels in every difference): the error of z_ij is bounded by
    u·(spread)², never by u·(offset)² (THEORY §3.10 (ii))."""
    real = valid[..., None]                                        # (B, n, 1)
    Yd = Y.to(torch.float64).where(real, 0.0)                      # (B, n, d) padded rows 0 (even if not finite)
    mean = Yd.sum(1, keepdim=True) / real.sum(1, keepdim=True).clamp_min(1)   # (B, 1, d)
    return (Yd - mean).where(real, 0.0).to(Y.dtype)                # (B, n, d)


def head_features(Y: Tensor, factors: Tensor) -> Tensor:
    """a^h_i = y_i F_hᵀ: (B, n, d) × (H, k, d) -> (B, H, n, k)."""
    return torch.einsum("bnd,hkd->bhnk", Y, factors)


def pair_distances(a_rows: Tensor, a: Tensor, sq_rows: Tensor, sq: Tensor) -> Tensor:
    """z_ij = ½‖a_i − a_j‖² = ½(‖a_i‖² + ‖a_j‖²) − a_i·a_j from Gram matrices, clamped at 0.

    a_rows (..., c, k) the query rows i, a (..., n, k) all rows j, sq_rows (..., c) and sq (..., n) their
    squared norms -> (..., c, n). Never forms the O(n²·k) pair differences (THEORY §5).
    """
    return (0.5 * (sq_rows[..., :, None] + sq[..., None, :]) - a_rows @ a.transpose(-1, -2)).clamp_min(0.0)


def _chunk_size(B: int, H: int, n: int, chunk_size: int | None) -> int:
    if chunk_size is not None:
        return max(1, int(chunk_size))
    return max(1, min(n, _CHUNK_ELEMENTS // max(1, B * H * n)))


def attention_energy(Y: Tensor, factors: Tensor, rho: str | Rho = "exp",
                     padding_mask: Tensor | None = None, *, chunk_size: int | None = None,
                     check_finite: bool = True, method: str = "fused", prior: Tensor | None = None) -> Tensor:
    """E_A(Y) = Σ_h Σ_{i<j} ρ(½‖(y_i − y_j) F_hᵀ‖²) over real tokens, as (B,) float64.

    Y: (B, n, d); factors: (H, k, d) or (k, d); `padding_mask` (B, n) bool, True marks padding.
    For ρ = exp, `method="fused"` (default) runs `softmax_attention_energy` (one fused float64 pass,
    padding-aware); `method="gram"` the float64 Gram-matrix path, the reference; `method="pairs"` explicit
    pair differences (`pair_difference_energy`: no cancellation, O(n²·d) work, for far-spread tokens).
    `prior` (B, n, H): a position prior's log-weights, each pair's term weighted by e^{p_i + p_j} (head h's p).
    """
    valid = check_states(Y, padding_mask, check_finite=check_finite)
    F = check_factors(factors, Y.shape[-1]).to(Y.dtype)
    r = get_rho(rho)
    if method not in ("fused", "gram", "pairs"):
        raise ValueError(f"unknown method {method!r}; valid: fused, gram, pairs")
    if prior is not None and prior.shape != (*Y.shape[:2], F.shape[0]):
        raise ValueError(f"prior must have shape (B, n, H) = {(*Y.shape[:2], F.shape[0])}, got {tuple(prior.shape)}")
    with free_core_threads():                                      # threads for the free cores (`threads.py`)
        if method == "pairs":
            return pair_difference_energy(Y, F, r, valid, prior)
        Y = centred_states(Y, valid)                               # (B, n, d) same z_ij, no common offset
        if r.softmax and method == "fused":
            return softmax_attention_energy(Y, F, valid, chunk_size=chunk_size, prior=prior)
        return gram_attention_energy(Y, F, r, valid, chunk_size=chunk_size, prior=prior)[0]


def gram_attention_energy(Y: Tensor, F: Tensor, r: Rho, valid: Tensor, *, chunk_size: int | None = None,
                          slopes: bool = False, prior: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """E_A of centred states Y (B, n, d) from Gram matrices and, with `slopes`, Σ_h Σ_{i<j} ρ'(z_ij) (the slope
    sum of `attention_error_bound`; else None): ((B,), (B,) or None) float64. F (H, k, d) in Y's dtype, `valid`
    (B, n) (unchecked); `prior` (B, n, H): pairs weighted by e^{p_i + p_j} (slopes too)."""
    a = head_features(Y, F).to(torch.float64)                      # (B, H, n, k), features in Y's precision
    sq = (a * a).sum(-1)                                           # (B, H, n)
    B, H, n, _ = a.shape
    p = None if prior is None else prior.to(torch.float64).transpose(1, 2)   # (B, H, n) p_i
    step = _chunk_size(B, H, n, chunk_size)
    total = torch.zeros(B, dtype=torch.float64, device=Y.device)
    slope_sum = torch.zeros(B, dtype=torch.float64, device=Y.device) if slopes and not r.softmax else None
    cols = torch.arange(n, device=Y.device)
    for s in range(0, n, step):
        e = min(n, s + step)
        pair = valid[:, None, s:e, None] & valid[:, None, None, :]  # (B, 1, c, n)
        pair = pair & (cols[s:e, None] != cols[None, :])           # mask the diagonal
        if r.softmax:
            gram = a[:, :, s:e] @ a.transpose(-1, -2)              # (B, H, c, n)
            logits = gram - 0.5 * sq[:, :, None, :]
            if p is not None:
                logits = logits + p[:, :, None, :] + p[:, :, s:e, None]   # + p_j + p_i
            lse = torch.logsumexp(logits.masked_fill(~pair, float("-inf")), dim=-1)   # (B, H, c)
            row_sums = torch.exp(lse - 0.5 * sq[:, :, s:e])        # Σ_{j≠i} e^{p_i + p_j − z_ij}
            total = total - 0.5 * row_sums.sum(dim=(1, 2))
        else:
            z = pair_distances(a[:, :, s:e], a, sq[:, :, s:e], sq)      # (B, H, c, n)
            zero = torch.zeros((), dtype=z.dtype, device=z.device)
            w = 1.0 if p is None else torch.exp(p[:, :, None, :] + p[:, :, s:e, None])   # (B, H, c, n) e^{p_i + p_j}
            total = total + 0.5 * torch.where(pair, w * r.value(z), zero).sum(dim=(1, 2, 3))
            if slope_sum is not None:
                slope_sum = slope_sum + 0.5 * torch.where(pair, w * r.derivative(z), zero).detach().sum(dim=(1, 2, 3))
    if slopes and r.softmax:                                        # exp: ρ' = e^{−z} = |ρ|, so the sum is |E_A|
        slope_sum = -total.detach()
    return total, slope_sum


def pair_difference_energy(Y: Tensor, F: Tensor, rho: str | Rho, valid: Tensor, prior: Tensor | None = None) -> Tensor:
    """E_A from explicit pair differences, z_ij = ½‖(y_i − y_j) F_hᵀ‖² with the difference of the states formed
    first (in float64): each z_ij carries a few u relative, never u·R² (no cancellation), so the result errs by
    ~u·Σ|ρ(z)|·(d + k) whatever the spread. O(n²·d·H·k) work in chunks of queries: the fallback for the rare
    far-spread samples whose Gram-form error bound exceeds what they are judged with (`attention_error_bound`),
    not the fast path. Y (B, n, d), F (H, k, d), `valid` (B, n) True = real, `prior` (B, n, H): each pair weighted by
    e^{p_i + p_j}: (B,) float64."""
    r = get_rho(rho)
    p = None if prior is None else prior.to(torch.float64).transpose(1, 2)   # (B, H, n)
    Yd = Y.to(torch.float64).where(valid[..., None], 0.0)          # (B, n, d)
    Fd = F.to(torch.float64)                                       # (H, k, d)
    B, n, d = Yd.shape
    width = max(d, Fd.shape[0] * Fd.shape[1])
    step = max(1, min(n, _CHUNK_ELEMENTS // max(1, B * n * width)))
    total = torch.zeros(B, dtype=torch.float64, device=Y.device)
    cols = torch.arange(n, device=Y.device)
    for s in range(0, n, step):
        e = min(n, s + step)
        diff = Yd[:, s:e, None, :] - Yd[:, None, :, :]             # (B, c, n, d) y_i − y_j
        z = 0.5 * torch.einsum("bcnd,hkd->bhcnk", diff, Fd).square().sum(-1)   # (B, H, c, n)
        pair = valid[:, None, s:e, None] & valid[:, None, None, :] & (cols[s:e, None] < cols[None, :])  # i < j
        value = r.value(z) if p is None else torch.exp(p[:, :, s:e, None] + p[:, :, None, :]) * r.value(z)
        total = total + torch.where(pair, value, torch.zeros((), dtype=z.dtype, device=z.device)).sum((1, 2, 3))
    return total


def attention_error_bound(radius_sq: Tensor, slope_sum: Tensor, k: int) -> Tensor:
    """First-order bound on the float64 round-off of E_A from the Gram form or the fused pass of centred
    features: |ΔE_A| ≤ 4γ_{k+4}R²·Σ_h Σ_{i<j} ρ'(z_ij) (each z_ij errs by ≤ 4γ_{k+4}R², `softmax.logit_error_bound`,
    and ρ' bounds ρ's change; for ρ = exp the same bound is relative on every weight, and the slope sum is
    |E_A|): (B,) from R² = max ‖a_i − mean‖² over heads and real tokens (B,) and the slope sum (B,)."""
    return logit_error_bound(radius_sq, k, torch.float64) * slope_sum


def softmax_attention_energy(Y: Tensor, factors: Tensor, valid: Tensor, *, chunk_size: int | None = None,
                             bucket_ratio: float = 0.8, prior: Tensor | None = None) -> Tensor:
    """E_A for ρ = exp, −½ Σ_h Σ_i Σ_{j≠i} e^{−z_ij}, from one fused softmax pass (`softmax.attention_pass`).

    Y (B, n, d), factors (H, k, d), `valid` (B, n) True = real token (unchecked: callers validate). Costs
    what the real tokens cost: real tokens are moved to the front of each row, rows sorted by length and
    grouped so that each group is cut to its longest row and no row is shorter than `bucket_ratio` of it.
    The features a = Y F_hᵀ are formed in Y's precision, the pass and every sum run in float64 (as the
    Gram path). `chunk_size`: queries per chunk of the diagonal mask; `prior` (B, n, H): pairs weighted by
    e^{p_i + p_j}.
    """
    B, n, _ = Y.shape
    total = torch.zeros(B, dtype=torch.float64, device=Y.device)
    for rows, length in _length_groups(valid, bucket_ratio):
        Yg, vg, pg = Y, valid, prior
        if rows is not None:
            order = torch.argsort((~valid[rows]).to(torch.int8), dim=1, stable=True)[:, :length]  # real tokens first
            Yg = Y[rows].gather(1, order[..., None].expand(-1, -1, Y.shape[-1]))  # (b, length, d)
            vg = valid[rows].gather(1, order)                       # (b, length)
            pg = None if prior is None else prior[rows].gather(1, order[..., None].expand(-1, -1, prior.shape[-1]))
        a = torch.einsum("bnd,hkd->bnhk", Yg, factors).to(torch.float64)   # (b, length, H, k), in Y's precision
        pg = None if pg is None else pg.to(torch.float64)          # (b, length, H)
        energy = mass_energy(attention_pass(a, None, vg, average=False, rows=chunk_size, prior=pg), vg)   # (b,)
        if rows is None:
            return energy
        total[rows] = energy
    return total


def _length_groups(valid: Tensor, ratio: float) -> list[tuple[Tensor | None, int]]:
    """(rows, length) groups of a padded batch, rows sorted by real length, each row at least `ratio` of
    its group's longest; rows without real tokens are left out. [(None, n)]: no padding at all."""
    if bool(valid.all()):
        return [(None, valid.shape[1])]
    lengths = valid.sum(1)                                         # (B,)
    order = torch.argsort(lengths, descending=True).tolist()
    sizes = lengths.tolist()
    groups, start = [], 0
    while start < len(order) and sizes[order[start]] > 0:
        top = sizes[order[start]]
        end = start + 1
        while end < len(order) and sizes[order[end]] >= ratio * top:
            end += 1
        groups.append((torch.tensor(order[start:end], device=valid.device), top))
        start = end
    return groups


def pair_weights(Y: Tensor, factors: Tensor, rho: str | Rho = "exp",
                 padding_mask: Tensor | None = None) -> Tensor:
    """β^h_ij = ρ'(z^h_ij) for real pairs (diagonal included, β_ii = ρ'(0)), 0 elsewhere: (B, H, n, n)."""
    valid = check_states(Y, padding_mask, check_finite=False)
    F = check_factors(factors, Y.shape[-1]).to(Y.dtype)
    r = get_rho(rho)
    a = head_features(centred_states(Y, valid), F)                 # (B, H, n, k) centred: same z_ij
    sq = (a * a).sum(-1)                                           # (B, H, n)
    z = pair_distances(a, a, sq, sq)                               # (B, H, n, n)
    pair = valid[:, None, :, None] & valid[:, None, None, :]       # (B, 1, n, n)
    return torch.where(pair, r.derivative(z), torch.zeros((), dtype=z.dtype, device=z.device))


def attention_energy_grad(Y: Tensor, factors: Tensor, rho: str | Rho = "exp",
                          padding_mask: Tensor | None = None) -> Tensor:
    """Closed-form ∇E_A = Σ_h L_h Y M_h with L_h = D_h − B_h, M_h = F_hᵀF_h (THEORY §3.1): (B, n, d)."""
    F = check_factors(factors, Y.shape[-1]).to(Y.dtype)
    beta = pair_weights(Y, F, rho, padding_mask)                   # (B, H, n, n)
    deg = beta.sum(-1, keepdim=True)                               # (B, H, n, 1)
    LY = deg * Y[:, None] - beta @ Y[:, None]                      # (B, H, n, d)
    return torch.einsum("bhnd,hkd,hke->bne", LY, F, F)


def attention_majorizer(Y: Tensor, Y0: Tensor, factors: Tensor, rho: str | Rho = "exp",
                        padding_mask: Tensor | None = None) -> Tensor:
    """E_A(Y0) + Q(Y) − Q(Y0), Q(Y) = ½ Σ_h tr(M_h Yᵀ L_h Y) with weights frozen at Y0 (THEORY §3.1).

    Majorises E_A (≥ E_A(Y) for every Y) and touches it at Y0 (value and gradient). (B,) float64.
    """
    Yd, Y0d = Y.to(torch.float64), Y0.to(torch.float64)
    F = check_factors(factors, Y.shape[-1]).to(torch.float64)
    beta = pair_weights(Y0d, F, rho, padding_mask)                 # (B, H, n, n)
    valid = check_states(Y, padding_mask, check_finite=False)

    def quad(Z: Tensor) -> Tensor:
        a = head_features(centred_states(Z, valid), F)             # (B, H, n, k) centred: same z_ij
        sq = (a * a).sum(-1)                                       # (B, H, n)
        return 0.5 * (beta * pair_distances(a, a, sq, sq)).sum(dim=(1, 2, 3))  # Σ_{i<j} β_ij z_ij

    return attention_energy(Y0d, F, rho, padding_mask) + quad(Yd) - quad(Y0d)


# ----------------------------------------------------------------------------- other terms
def anchor_energy(Y: Tensor, X: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """E_X(Y) = ½‖Y − X‖²_F over real tokens (data fidelity, THEORY §2), (B,) float64."""
    valid = check_states(Y, padding_mask)
    if X.shape != Y.shape:
        raise ValueError(f"anchor X must have Y's shape {tuple(Y.shape)}, got {tuple(X.shape)}")
    diff = (Y.to(torch.float64) - X.to(torch.float64)) * _masked_rows(valid)[..., None]
    return 0.5 * diff.pow(2).sum(dim=(1, 2))


def norm_regularizer(Y: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """The paper's earlier regulariser ½‖Y‖²_F (kept only to reproduce its figures), (B,) float64."""
    valid = check_states(Y, padding_mask)
    return 0.5 * (Y.to(torch.float64) * _masked_rows(valid)[..., None]).pow(2).sum(dim=(1, 2))


def symmetric_ffn_energy(Y: Tensor, W_F: Tensor, b: Tensor, padding_mask: Tensor | None = None,
                         nonneg: bool = False) -> Tensor:
    """(F1) E_F(Y) = ½ tr(Y (I − W_F) Yᵀ) − ⟨1b, Y⟩ [+ ι_{≥0}(Y) when `nonneg`], (B,) float64.

    W_F must be symmetric (d, d); bounded below iff λ_max(W_F) < 1. With `nonneg` a
    sample with a negative real entry has energy +inf.
    """
    valid = check_states(Y, padding_mask)
    w = _masked_rows(valid)[..., None]                             # (B, n, 1)
    Yd = Y.to(torch.float64) * w
    W, bd = W_F.to(torch.float64), b.to(torch.float64).reshape(-1)
    quad = 0.5 * ((Yd * Yd).sum(dim=(1, 2)) - (Yd @ W * Yd).sum(dim=(1, 2)))
    energy = quad - (Yd * bd).sum(dim=(1, 2))
    if nonneg:
        negative = ((Y < 0) & valid[..., None]).flatten(1).any(dim=1)
        energy = energy.masked_fill(negative, float("inf"))
    return energy


def symmetric_ffn_energy_grad(Y: Tensor, W_F: Tensor, b: Tensor) -> Tensor:
    """∇E_F = Y (I − W_F) − 1b for the smooth part of (F1): (B, n, d)."""
    return Y - Y @ W_F - b.reshape(1, 1, -1)


def tied_ffn_energy(Y: Tensor, W1: Tensor, b: Tensor, padding_mask: Tensor | None = None) -> Tensor:
    """(F2) E_H(Y) = ½‖Y‖² − ½‖ReLU(Y W1 + 1b)‖² with W1 (d, m), b (m,), (B,) float64.

    The (n·d·m) product runs in Y's precision (float64 in, float64 throughout); the
    squares are accumulated in float64.
    """
    valid = check_states(Y, padding_mask)
    hidden = torch.relu(Y @ W1.to(Y.dtype) + b.to(Y.dtype).reshape(1, 1, -1))  # (B, n, m), input precision
    return tied_ffn_energy_from_hidden(Y, hidden, valid)


def tied_ffn_energy_from_hidden(Y: Tensor, hidden: Tensor, valid: Tensor) -> Tensor:
    """E_H from a computed hidden layer ReLU(Y W1 + 1b) (B, n, m); `valid` (B, n), True = real token."""
    w = _masked_rows(valid)[..., None]                             # (B, n, 1)
    return 0.5 * ((Y.to(torch.float64) * w).pow(2).sum(dim=(1, 2))
                  - (hidden.to(torch.float64) * w).pow(2).sum(dim=(1, 2)))


def tied_ffn_energy_grad(Y: Tensor, W1: Tensor, b: Tensor) -> Tensor:
    """∇E_H = Y − ReLU(Y W1 + 1b) W1ᵀ: (B, n, d)."""
    return Y - torch.relu(Y @ W1 + b.reshape(1, 1, -1)) @ W1.T
