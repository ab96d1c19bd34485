"""Kernel-weighted sums for a general ρ, chunked over query blocks (THEORY §3.1, §5).

The attention step for a penalty ρ needs, per head, the weights β_ij = ρ'(z_ij) of the pair
distances z_ij = ½‖a_i − a_j‖² (a_i = y_i F_hᵀ the head features) and the sums

    S_i = Σ_j ρ'(z_ij) v_j        (`kernel_sums`; v_j the rows of a value matrix)

With a value matrix [m_j c_j, m_j] (c_j = head coordinates, m_j = 1 for a real key, 0 for padding)
one product gives both the numerator Σ_j β_ij c_j and the degree d_i = Σ_j β_ij of the step over
real keys only (`weighted_average`), so no mask pass over the n × n weights is needed.

Cost and memory. Distances come from one matrix product per block, z = ½‖a_i‖² + ½‖a_j‖² − a_i·a_j, of
augmented rows [−a_i, ½‖a_i‖², 1] and columns [a_j, 1, ½‖a_j‖²] (never the O(n²·k) pair differences);
ρ' is applied in place (`Rho.derivative_inplace` for the built-in family); queries run in blocks of
`chunk` rows, so the working set is O(T·B·H·chunk·n) for T threads, never the n × n matrix of a head.
At T > 1 the blocks run on T single-threaded workers (`blockpool.run_blocks`: no parallel region per
step, robust when cores are shared), each block writing only its own rows, so the result does not
depend on T or on the scheduling. The backward pass recomputes each block's
weights from the saved inputs (O(n·k) memory) and uses ρ'' (`Rho.curvature`, else autograd of ρ');
K and z are symmetric, so it too writes only the block's rows (no accumulation across blocks).
A constant kernel (ρ = z) needs no pairs at all: S_i = ρ'(0) Σ_j v_j.

Precision: sums run in the inputs' dtype, as the softmax path does; energies (which the certified
checks compare) are accumulated in float64 by `energy.attention_energy`.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from .blockpool import run_blocks
from .rho import Rho
from .softmax import PRECISION_TARGET, logit_error_bound

__all__ = ["centred", "kernel_sums", "needs_float64", "weighted_average"]

#: Entries of one (B·H, chunk, n) weight block: 2^20 (4 MiB in float32; measured fastest on one
#: AVX-512 core at n = 4,096, where it is 64 query rows of 4 heads).
BLOCK_ELEMENTS = 1 << 20


def block_rows(batch_heads: int, n: int, chunk_size: int | None = None) -> int:
    """Query rows per block: `chunk_size` if given, else as many as fit in `BLOCK_ELEMENTS` (at least 16)."""
    if chunk_size is not None:
        return max(1, min(n, int(chunk_size)))
    return max(1, min(n, max(16, BLOCK_ELEMENTS // max(1, batch_heads * n))))


def _augmented(a: Tensor) -> tuple[Tensor, Tensor]:
    """Rows [−a_i, ½‖a_i‖², 1] and columns [a_j, 1, ½‖a_j‖²] whose products are z_ij: (G, n, k + 2), (G, k + 2, n)."""
    half_sq = 0.5 * (a * a).sum(-1, keepdim=True)                   # (G, n, 1)
    one = torch.ones_like(half_sq)
    return torch.cat([-a, half_sq, one], -1), torch.cat([a, one, half_sq], -1).transpose(1, 2).contiguous()


def _block_distances(queries: Tensor, keys: Tensor, s: int, e: int, out: Tensor | None = None) -> Tensor:
    """z_ij = ½‖a_i‖² + ½‖a_j‖² − a_i·a_j ≥ 0 for query rows i in [s, e) and every key j: (G, e − s, n)."""
    return torch.bmm(queries[:, s:e], keys, out=out).clamp_min_(0.0)


def _kernel(rho: Rho, z: Tensor) -> Tensor:
    """ρ'(z), overwriting z when the ρ has an in-place form."""
    return rho.derivative_inplace(z) if rho.derivative_inplace is not None else rho.derivative(z)


def _curvature(rho: Rho, z: Tensor) -> Tensor:
    """ρ''(z): the closed form if the ρ has one, else autograd of ρ'."""
    if rho.curvature is not None:
        return rho.curvature(z)
    with torch.enable_grad():
        zz = z.detach().requires_grad_(True)
        (second,) = torch.autograd.grad(rho.derivative(zz).sum(), zz, allow_unused=True)
    return torch.zeros_like(z) if second is None else second


class _KernelSums(torch.autograd.Function):
    """S = K V with K_ij = ρ'(½‖a_i − a_j‖²), blockwise; a (G, n, k), V (G, n, m) -> (G, n, m).

    Every block writes only its own rows (forward and backward: K is symmetric), so the blocks run on
    `blockpool.run_blocks`' single-threaded workers in any order with the same result."""

    @staticmethod
    def forward(ctx, a: Tensor, V: Tensor, rho: Rho, rows: int) -> Tensor:
        G, n, _ = a.shape
        queries, keys = _augmented(a)                                # (G, n, k + 2), (G, k + 2, n)
        out = V.new_empty(G, n, V.shape[-1])                         # (G, n, m)

        def step(block: Tensor, s: int, e: int) -> None:            # block (G, c, n) reused by a worker
            w = _kernel(rho, _block_distances(queries, keys, s, e, block[:, :e - s]))   # (G, c, n)
            torch.bmm(w, V, out=out[:, s:e])

        run_blocks(n, rows, step, lambda: a.new_empty(G, rows, n))
        ctx.save_for_backward(a, V)
        ctx.rho, ctx.rows = rho, rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        """Per query block, with dz_ij = (g_i·v_j) ρ''(z_ij) and K, z symmetric:
        dV_i = Σ_j K_ij g_j; da_i = Σ_j (dz_ij + dz_ji)(a_i − a_j), dz_ji = (v_i·g_j) ρ''(z_ij)."""
        a, V = ctx.saved_tensors
        rho, rows = ctx.rho, ctx.rows
        n = a.shape[1]
        queries, keys = _augmented(a)                                # (G, n, k + 2), (G, k + 2, n)
        grad_out = grad_out.contiguous()                             # (G, n, m)
        grad_a, grad_V = torch.empty_like(a), torch.empty_like(V)    # (G, n, k), (G, n, m)
        V_t, g_t = V.transpose(1, 2), grad_out.transpose(1, 2)       # (G, m, n)

        def step(_: None, s: int, e: int) -> None:
            z = _block_distances(queries, keys, s, e)                # (G, c, n)
            dz = torch.bmm(grad_out[:, s:e], V_t).baddbmm_(V[:, s:e], g_t)   # (G, c, n) g_i·v_j + v_i·g_j
            dz.mul_(_curvature(rho, z))                              # dz_ij + dz_ji
            torch.bmm(_kernel(rho, z), grad_out, out=grad_V[:, s:e])   # K symmetric: Kᵀ G_S rows
            torch.baddbmm(dz.sum(-1, keepdim=True) * a[:, s:e], dz, a, alpha=-1.0, out=grad_a[:, s:e])

        run_blocks(n, rows, step)
        return grad_a, grad_V, None, None


def centred(a: Tensor, valid: Tensor) -> Tensor:
    """Head features minus their mean over the real tokens, (B, H, n, k): every z_ij is unchanged, and the
    Gram-form distances lose the common part (docs/theory.md, "Numerics of the fast paths")."""
    w = valid.to(a.dtype)[:, None, :, None]                        # (B, 1, n, 1)
    mean = (a * w).sum(2, keepdim=True) / w.sum(2, keepdim=True).clamp_min(1.0)   # (B, H, 1, k)
    return a - mean


def needs_float64(a: Tensor, valid: Tensor) -> bool:
    """Whether Gram-form logits of centred features a (B, H, n, k) exceed `softmax.PRECISION_TARGET` in a's dtype."""
    if a.dtype == torch.float64 or a.shape[2] < 2:
        return False
    radius_sq = (a.detach() * a.detach()).sum(-1).where(valid[:, None], 0.0).max()
    return float(logit_error_bound(radius_sq, a.shape[-1], a.dtype)) > PRECISION_TARGET


def kernel_sums(a: Tensor, values: Tensor, rho: Rho, *, chunk_size: int | None = None) -> Tensor:
    """S_i = Σ_j ρ'(½‖a_i − a_j‖²) v_j per batch and head (THEORY §3.1): a (B, H, n, k), values
    (B, H, n, m) -> (B, H, n, m), in blocks of `chunk_size` query rows (default: `BLOCK_ELEMENTS` per block).

    Every key j counts, the query itself included (β_ii = ρ'(0)); zero rows of `values` remove keys.
    Differentiable in `a` and `values` with O(n·(k + m)) saved memory (blocks are recomputed).
    """
    B, H, n, k = a.shape
    m = values.shape[-1]
    if rho.constant_kernel:                                          # ρ' ≡ ρ'(0): no pairs needed
        w0 = rho.derivative(a.new_zeros(()))
        return (w0 * values.sum(2, keepdim=True)).expand(B, H, n, m)
    rows = block_rows(B * H, n, chunk_size)
    out = _KernelSums.apply(a.reshape(B * H, n, k), values.reshape(B * H, n, m), rho, rows)
    return out.reshape(B, H, n, m)


def weighted_average(a: Tensor, V: Tensor, valid: Tensor, rho: Rho, *,
                     chunk_size: int | None = None) -> tuple[Tensor, Tensor]:
    """Numerator Σ_j β_ij c_j and degree d_i = Σ_j β_ij over real keys j (β_ij = ρ'(z_ij), THEORY §3.1).

    a (B, H, n, k) head features, V (B, H, n, dh) head coordinates c, `valid` (B, n) True = real token
    -> ((B, H, n, dh), (B, H, n, 1)). One `kernel_sums` over the values [m_j c_j, m_j], on features centred on
    the real tokens' mean (`centred`), in float64 where the float32 distances' bound exceeds the target
    (`needs_float64`; docs/theory.md, "Numerics of the fast paths").
    """
    a = centred(a, valid)                                            # (B, H, n, k) same z_ij, no common offset
    dtype = V.dtype
    if needs_float64(a, valid):                                      # far groups, large norms: distances in float64
        a, V = a.double(), V.double()
    keep = valid[:, None, :, None].to(V.dtype)                       # (B, 1, n, 1)
    sums = kernel_sums(a, torch.cat([V * keep, keep.expand(*V.shape[:-1], 1)], dim=-1), rho,
                       chunk_size=chunk_size).to(dtype)              # (B, H, n, dh + 1)
    return sums[..., :-1], sums[..., -1:]
