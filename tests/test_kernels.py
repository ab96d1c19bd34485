"""Blocked general-ρ kernel (THEORY §3.1, §5): equal to the dense definition, gradients equal to
autograd and finite differences, memory O(n · block), and descent of the certified steps for every ρ."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from conftest import D64, close_tol, examples, rises
from unfoldformer import energy as E
from unfoldformer import kernels as K
from unfoldformer import steps as S
from unfoldformer.rho import RHO_FAMILY, custom_rho, get_rho

#: every family member plus a user ρ whose ρ' and ρ'' come from autograd
RHOS = sorted(RHO_FAMILY) + ["custom"]


def resolve(name):
    if name == "custom":
        return custom_rho(lambda z: torch.sqrt(z + 1.0), name="sqrt")
    return get_rho(name)


def dense_sums(a, values, rho):
    """S_i = Σ_j ρ'(½‖a_i − a_j‖²) v_j from explicit pair differences (the definition)."""
    z = 0.5 * (a[..., :, None, :] - a[..., None, :, :]).pow(2).sum(-1)   # (B, H, n, n)
    return rho.derivative(z) @ values


def max_curvature(rho, z):
    """max |ρ''| over the distances of a case (the condition number of ρ' in z)."""
    zz = z.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        first = rho.derivative(zz)
        if not first.requires_grad:                                       # piecewise-constant ρ'
            return 0.0
        (second,) = torch.autograd.grad(first.sum(), zz, allow_unused=True)
    return 0.0 if second is None else float(second.abs().max())


@st.composite
def kernel_cases(draw):
    seed = draw(st.integers(0, 2**31 - 1))
    B, H, n = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 40))
    k, m = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(B, H, n, k, generator=g, dtype=D64) * 10 ** draw(st.floats(-1.5, 0.7))
    values = torch.randn(B, H, n, m, generator=g, dtype=D64)
    values[torch.rand(B, 1, n, 1, generator=g).expand_as(values) < 0.3] = 0.0   # padded keys: zero rows
    return a, values, draw(st.integers(1, 50))


# ----------------------------------------------------------------------------- blocked = dense
@pytest.mark.parametrize("name", RHOS)
@examples(300)
@given(case=kernel_cases())
def test_blocked_sums_equal_the_definition_in_float64(name, case):
    a, values, chunk = case
    rho = resolve(name)
    ours = K.kernel_sums(a, values, rho, chunk_size=chunk)
    ref = dense_sums(a, values, rho)
    scale = float((rho.derivative(torch.zeros((), dtype=D64)).abs() + 1) * values.abs().sum(2).max())
    # distances from Gram matrices carry round-off eps·‖a‖², amplified by |ρ''|
    scale *= 1.0 + max_curvature(rho, 0.5 * (a[..., :, None, :] - a[..., None, :, :]).pow(2).sum(-1)) \
        * float((a * a).sum(-1).max())
    assert (ours - ref).abs().max() <= close_tol(D64, scale)


@pytest.mark.parametrize("name", ["exp", "log", "lp", "linear", "custom"])
def test_blocked_sums_equal_the_definition_in_float32(name):
    """float32 blocks against the float64 definition, to float32 round-off times the conditioning.
    (The truncated kernel is discontinuous at τ: one rounding can flip a pair, so it is compared in
    float64 only.)"""
    rho = resolve(name)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(2, 4, 300, 8, generator=g, dtype=D64) * 0.4
    values = torch.randn(2, 4, 300, 9, generator=g, dtype=D64)
    ours = K.kernel_sums(a.float(), values.float(), rho, chunk_size=37)
    ref = dense_sums(a, values, rho)
    z = 0.5 * (a[..., :, None, :] - a[..., None, :, :]).pow(2).sum(-1)
    scale = float(rho.derivative(z).abs().max() + max_curvature(rho, z) * (a * a).sum(-1).max())
    scale *= float(values.abs().sum(2).max())
    assert (ours.double() - ref).abs().max() <= close_tol(torch.float32, scale)


@pytest.mark.parametrize("dtype", [torch.float32, D64])
@pytest.mark.parametrize("name", ["log", "lp", "linear"])
def test_steps_blocked_path_equals_dense_path(dtype, name):
    g = torch.Generator().manual_seed(2)
    Y = torch.randn(3, 23, 8, generator=g).to(dtype)
    pad = torch.rand(3, 23, generator=g) < 0.3
    pad[2] = True
    F = torch.randn(2, 3, 8, generator=g).to(dtype) * 0.7
    Q, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=D64))
    U = Q.reshape(8, 2, 4).permute(1, 0, 2).to(dtype)                  # (H, d, dh)
    blocked = S.attention_step(Y, F, name, 0.8, pad, U)
    dense = S.attention_step(Y, F, name, 0.8, pad, U, use_sdpa=False)
    cond = 1 + 0.5 * float((torch.einsum("bnd,hkd->bhnk", Y, F) ** 2).sum(-1).max())
    assert (blocked - dense).abs().max() <= close_tol(dtype, cond * max(1.0, Y.abs().max().item()))


@pytest.mark.parametrize("name", ["log", "lp", "truncated", "linear", "custom"])
def test_anchored_blocked_step_equals_the_pair_weight_formula(name):
    """c_i ← (1 − α) c_i + α (ν Σ_j β_ij c_j + x_i) / (ν d_i + 1), β from the dense `pair_weights`."""
    rho = resolve(name)
    g = torch.Generator().manual_seed(4)
    B, n, H, dh = 2, 17, 3, 2
    Y, X = torch.randn(B, n, H * dh, generator=g, dtype=D64), torch.randn(B, n, H * dh, generator=g, dtype=D64)
    pad = torch.rand(B, n, generator=g) < 0.3
    scales, lam, alpha = torch.tensor([0.5, 1.0, 2.0], dtype=D64), 0.7, 0.9
    beta = E.pair_weights(Y, S.isotropic_factors(scales, H * dh), rho, pad)       # (B, H, n, n)
    V, Xh = S.head_values(Y, H, None), S.head_values(X, H, None)                   # (B, H, n, dh)
    nu = (lam * scales**2)[None, :, None, None]
    target = (nu * (beta @ V) + Xh) / (nu * beta.sum(-1, keepdim=True) + 1)
    ref = torch.where(~pad[..., None], Y + alpha * S.merge_heads(target - V, None), Y)
    out = S.anchored_attention_step(Y, X, scales, lam, rho, alpha, pad)
    assert (out - ref).abs().max() <= close_tol(D64, 10 * max(1.0, float(Y.abs().max())))


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("name", RHOS)
def test_backward_equals_autograd_of_the_definition(name):
    rho = resolve(name)
    g = torch.Generator().manual_seed(7)
    a = (torch.randn(2, 3, 29, 4, generator=g, dtype=D64) * 0.8).requires_grad_(True)
    values = torch.randn(2, 3, 29, 5, generator=g, dtype=D64).requires_grad_(True)
    grad_out = torch.randn(2, 3, 29, 5, generator=g, dtype=D64)
    ours = torch.autograd.grad(K.kernel_sums(a, values, rho, chunk_size=6), (a, values), grad_out,
                               allow_unused=True)
    ref = torch.autograd.grad(dense_sums(a, values, rho), (a, values), grad_out, allow_unused=True)
    for mine, theirs in zip(ours, ref):
        mine = torch.zeros_like(a) if mine is None else mine
        theirs = torch.zeros_like(mine) if theirs is None else theirs
        assert (mine - theirs).abs().max() <= close_tol(D64, 100 * max(1.0, float(theirs.abs().max())))


@pytest.mark.parametrize("name", ["exp", "log", "lp", "custom"])
def test_backward_passes_gradcheck(name):
    """Finite differences agree with the blocked backward (smooth kernels; lp away from its floor)."""
    rho = resolve(name)
    g = torch.Generator().manual_seed(8)
    a = (torch.randn(1, 2, 9, 3, generator=g, dtype=D64) * 0.7).requires_grad_(True)
    values = torch.randn(1, 2, 9, 2, generator=g, dtype=D64).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a, v: K.kernel_sums(a, v, rho, chunk_size=4), (a, values))


def test_step_gradients_through_the_blocked_kernel_equal_the_dense_step():
    """Gradients of a loss through the certified steps (features, values, mask, anchor) match the dense path."""
    g = torch.Generator().manual_seed(9)
    Y = torch.randn(2, 13, 6, generator=g, dtype=D64).requires_grad_(True)
    pad = torch.zeros(2, 13, dtype=torch.bool)
    pad[1, 9:] = True
    F = (torch.randn(2, 2, 6, generator=g, dtype=D64) * 0.6).requires_grad_(True)
    losses = [S.attention_step(Y, F, "log", 1.0, pad, use_sdpa=fast).pow(2).sum() for fast in (True, False)]
    grads = [torch.autograd.grad(loss, (Y, F)) for loss in losses]
    for fast, dense in zip(*grads):
        assert (fast - dense).abs().max() <= close_tol(D64, 100 * float(dense.abs().max()))


# ----------------------------------------------------------------------------- memory
class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("name", ["log", "truncated"])
def test_memory_is_n_times_block_forward_and_backward(name):
    """No tensor of the forward or backward pass holds more than B·H·block·n entries, and the saved
    state of the backward is O(n·(k + m)): never the n × n weights of a head."""
    B, H, n, k, block = 1, 2, 512, 8, 32
    a = torch.randn(B, H, n, k, requires_grad=True)
    values = torch.randn(B, H, n, k + 1, requires_grad=True)
    saved = []
    with _LargestTensor() as mode, torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.numel()) or t, lambda t: t):
        K.kernel_sums(a, values, get_rho(name), chunk_size=block).sum().backward()
    assert mode.largest <= B * H * block * n < n * n
    assert max(saved) <= B * H * n * (k + 1)


# ----------------------------------------------------------------------------- descent for every ρ
@st.composite
def step_cases(draw):
    """Random multi-head states with norms 1e-3 … 1e3, random padding, n = 1 included."""
    seed = draw(st.integers(0, 2**31 - 1))
    B, n, H, dh = draw(st.integers(1, 3)), draw(st.integers(1, 9)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    g = torch.Generator().manual_seed(seed)
    Y = torch.randn(B, n, H * dh, generator=g, dtype=D64) * 10 ** draw(st.floats(-3.0, 3.0)) / (H * dh) ** 0.5
    pad = torch.rand(B, n, generator=g) < draw(st.sampled_from([0.0, 0.3, 1.0]))
    Q, _ = torch.linalg.qr(torch.randn(H * dh, H * dh, generator=g, dtype=D64))
    U = Q.reshape(H * dh, H, dh).permute(1, 0, 2) if draw(st.booleans()) else None   # (H, d, dh)
    return dict(Y=Y, pad=pad, H=H, dh=dh, U=U, g=g)


#: exp and log are covered by the same theorems in test_steps.py (which now run log through the blocked kernel)
OTHER_RHOS = ["lp", "truncated", "linear", "custom"]


@pytest.mark.parametrize("name", OTHER_RHOS)
@examples(1000)
@given(c=step_cases(), k=st.integers(1, 4), alpha_share=st.floats(1e-6, 0.9995), alpha=st.floats(1e-6, 1.0),
       lam=st.floats(1e-3, 1e3), log_s=st.floats(-2, 1))
def test_certified_steps_descend_for_every_rho(name, c, k, alpha_share, alpha, lam, log_s):
    """Theorem A per head (α ∈ (0, 1], α ∈ (0, 2) for PSD kernels, any A_h; THEORY §3.1–3.2) and the
    anchored step (½‖Y − X‖² + λ E_A falls for α ∈ (0, 1]; THEORY §3.3), on the same random case."""
    rho = resolve(name)
    Y, pad, H, dh, U, g = c["Y"], c["pad"], c["H"], c["dh"], c["U"], c["g"]
    A = torch.randn(H, k, dh, generator=g, dtype=D64)
    basis = U if U is not None else torch.eye(H * dh, dtype=D64).reshape(H * dh, H, dh).permute(1, 0, 2)
    F = A @ basis.transpose(1, 2)                                       # (H, k, d) = A_h U_hᵀ
    step = S.attention_step(Y, F, rho, alpha_share * rho.certified_alpha_max(), pad, U)
    assert not rises(E.attention_energy(Y, F, rho, pad), E.attention_energy(step, F, rho, pad)).any()

    X = Y + torch.randn(Y.shape, generator=g, dtype=D64) * Y.abs().mean()
    scales = 10 ** (log_s + 0.3 * torch.randn(H, generator=g, dtype=D64))
    fac = S.isotropic_factors(scales, Y.shape[-1], U)

    def energy(Z):
        return lam * E.attention_energy(Z, fac, rho, pad) + E.anchor_energy(Z, X, pad)

    anchored = S.anchored_attention_step(Y, X, scales, lam, rho, alpha, pad, U)
    assert not rises(energy(Y), energy(anchored)).any()


# ----------------------------------------------------------------------------- worker threads (blockpool)
def _sums_and_grads(a, values, rho, chunk):
    a, values = a.clone().requires_grad_(True), values.clone().requires_grad_(True)
    out = K.kernel_sums(a, values, rho, chunk_size=chunk)
    grads = torch.autograd.grad(out, (a, values), torch.ones_like(out).cumsum(-2))
    return [out.detach(), *grads]


@pytest.mark.parametrize("name", ["log", "custom"])
def test_blocks_on_workers_equal_the_serial_loop_exactly(name):
    """At 2 threads the blocks run on single-threaded workers in any order; every block writes its own rows
    with the same single-threaded operations as the 1-thread loop, so the results are bitwise equal."""
    import threading

    rho = resolve(name)
    g = torch.Generator().manual_seed(11)
    a, values = torch.randn(2, 3, 200, 6, generator=g), torch.randn(2, 3, 200, 7, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        serial = _sums_and_grads(a, values, rho, 7)
        torch.set_num_threads(2)
        pooled = _sums_and_grads(a, values, rho, 7)
        assert any(t.name == "unfoldformer-block" for t in threading.enumerate())
    finally:
        torch.set_num_threads(threads)
    for x, y in zip(serial, pooled):
        assert torch.equal(x, y)


def test_worker_errors_reach_the_caller():
    from unfoldformer.blockpool import run_blocks

    def step(_, s, e):
        if s >= 8:
            raise RuntimeError("block failed")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with pytest.raises(RuntimeError, match="block failed"):
            run_blocks(32, 4, step)
        seen = []
        run_blocks(32, 4, lambda _, s, e: seen.append((s, e)))        # the pool still works after an error
        assert sorted(seen) == [(s, s + 4) for s in range(0, 32, 4)]
    finally:
        torch.set_num_threads(threads)
