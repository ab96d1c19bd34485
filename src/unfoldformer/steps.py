"""Descent steps: attention as an MM step, anchored attention, FFN gradient steps (THEORY §3).

Every step maps (B, n, d) -> (B, n, d). `padding_mask` is a bool (B, n) tensor in which
**True marks padding** (PyTorch's key_padding_mask convention): padded tokens take no
part in any sum and are returned unchanged.

- `attention_step` (§3.1–3.2): y_i ← (1−α) y_i + α Σ_j β_ij y_j / Σ_j β_ij with
  β_ij = ρ'(½‖(y_i − y_j) F_hᵀ‖²). One head moves all d coordinates (value = identity);
  with H > 1 heads head h moves only its own orthonormal subspace U_h (by default the
  h-th contiguous block of d/H coordinates). For ρ = exp this is softmax attention with
  q = k = Y F_hᵀ, scale 1 and the additive key-norm bias −½‖a_j‖², run through
  `scaled_dot_product_attention`; other ρ run through the blocked kernel of `kernels`.
- `anchored_attention_step` (§3.3): the MM step on ½‖Y − X‖² + λ E_A with isotropic
  heads F_h = s_h U_hᵀ; every token also attends to its own input with weight 1.
- `symmetric_ffn_step` (F1) and `tied_ffn_step` (F2) (§3.4).

Certified ranges (Theorem A and §3.4): attention α ∈ (0, 1] for any PSD metric,
α ∈ (0, 2) for PSD kernels (exp, log, linear); anchored α ∈ (0, 1]; F1 η ∈ (0, 1] with
spec(W_F) ⊂ (−1, 1); F2 α ∈ (0, 2) for any W1. Every step refuses a step size outside its
certified range with the message `ModelConfig` gives (`contracts.check_step`); pass
`certified=False` to study counterexamples (the step must still be a finite number > 0, and λ
of anchored attention too). The models' layers pass `certified=False`: their `ModelConfig`
already checked the range when it is certified.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F_nn
from torch import Tensor

from .contracts import check_positive, check_step
from .energy import check_factors, check_states, head_features, pair_weights, tied_ffn_energy_from_hidden
from .errors import ConfigError
from .kernels import centred, needs_float64, weighted_average
from .rho import Rho, get_rho
from .softmax import AttentionPass, attention_pass


# ----------------------------------------------------------------------------- subspaces
def check_subspaces(subspaces: Tensor | None, H: int, d: int, tol: float = 1e-4) -> Tensor | None:
    """Validate an orthonormal basis (H, d, d/H) whose heads are mutually orthogonal."""
    if subspaces is None:
        if d % H:
            raise ValueError(f"d={d} is not divisible by the number of heads H={H}; pass `subspaces`")
        return None
    if subspaces.dim() != 3 or subspaces.shape[0] != H or subspaces.shape[1] != d:
        raise ValueError(f"subspaces must have shape (H, d, d/H) = ({H}, {d}, {d // max(H, 1)}); "
                         f"got {tuple(subspaces.shape)}")
    basis = subspaces.permute(1, 0, 2).reshape(d, -1).to(torch.float64)  # (d, H·dh)
    gram = basis.T @ basis
    if (gram - torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)).abs().max() > tol:
        raise ValueError("subspaces must be orthonormal and mutually orthogonal across heads "
                         "(the certified multi-head step needs [U_1 … U_H] with orthonormal columns)")
    return subspaces


def head_values(Y: Tensor, H: int, subspaces: Tensor | None) -> Tensor:
    """Coordinates of Y in each head's subspace: (B, n, d) -> (B, H, n, dh)."""
    B, n, d = Y.shape
    if subspaces is None:
        return Y.reshape(B, n, H, d // H).transpose(1, 2)
    return torch.einsum("bnd,hde->bhne", Y, subspaces.to(Y.dtype))


def merge_heads(delta: Tensor, subspaces: Tensor | None) -> Tensor:
    """Σ_h delta_h U_hᵀ: (B, H, n, dh) -> (B, n, d)."""
    B, H, n, dh = delta.shape
    if subspaces is None:
        return delta.transpose(1, 2).reshape(B, n, H * dh)
    return torch.einsum("bhne,hde->bnd", delta, subspaces.to(delta.dtype))


def _keep_padding(Y: Tensor, Y_new: Tensor, valid: Tensor) -> Tensor:
    return torch.where(valid[..., None], Y_new, Y)


# ----------------------------------------------------------------------------- attention
def exp_attention_mask(a: Tensor, valid: Tensor) -> Tensor:
    """Additive SDPA mask: key-norm bias −½‖a_j‖² plus padding (−inf). a: (B, H, n, k).

    Real queries see real keys only; a padded query sees only itself (so it stays put).
    Returns (B, H, 1, n) without padding, (B, H, n, n) with it.
    """
    bias = -0.5 * (a * a).sum(-1)[:, :, None, :]                   # (B, H, 1, n)
    if bool(valid.all()):
        return bias
    n = valid.shape[1]
    eye = torch.eye(n, dtype=torch.bool, device=a.device)
    allowed = (valid[:, :, None] & valid[:, None, :]) | eye        # (B, n, n)
    block = torch.zeros(allowed.shape, dtype=a.dtype, device=a.device).masked_fill(~allowed, float("-inf"))
    return bias + block[:, None]                                   # (B, H, n, n)


def _weighted_average(Y: Tensor, factors: Tensor, r: Rho, valid: Tensor,
                      subspaces: Tensor | None, use_sdpa: bool) -> tuple[Tensor, Tensor]:
    """D⁻¹BV per head and V = head coordinates, both centred on the real tokens' mean: (B, H, n, dh) each
    (the step needs avg − V only, which the shift leaves unchanged and which then rounds at the spread)."""
    H = factors.shape[0]
    V = centred(head_values(Y, H, subspaces), valid)               # (B, H, n, dh) avg − V is shift-invariant
    if r.softmax and use_sdpa:
        a = centred(head_features(Y, factors), valid)              # (B, H, n, k) z_ij unchanged, offsets removed
        a = a if not needs_float64(a, valid) else a.double()      # far groups: logits in float64
        avg = F_nn.scaled_dot_product_attention(a, a, V.to(a.dtype), attn_mask=exp_attention_mask(a, valid), scale=1.0)
        return avg.to(Y.dtype), V
    if use_sdpa:                                                   # blocked kernel: O(n · block) memory
        num, deg = weighted_average(head_features(Y, factors), V, valid, r)   # (B, H, n, dh), (B, H, n, 1)
    else:                                                          # the dense reference: all n × n weights
        beta = pair_weights(Y, factors, r, ~valid)                 # (B, H, n, n)
        num, deg = beta @ V, beta.sum(-1, keepdim=True)
    avg = torch.where(deg > 0, num / deg.clamp_min(torch.finfo(Y.dtype).tiny), V)
    return avg, V


def attention_step(Y: Tensor, factors: Tensor, rho: str | Rho = "exp", alpha: float = 1.0,
                   padding_mask: Tensor | None = None, subspaces: Tensor | None = None, *,
                   use_sdpa: bool = True, certified: bool = True) -> Tensor:
    """MM step on E_A (THEORY §3.1–3.2): Y⁺ = Y + α Σ_h (D_h⁻¹ B_h (Y U_h) − Y U_h) U_hᵀ.

    Y: (B, n, d); factors: (H, k, d) or (k, d), any k; `padding_mask` (B, n) bool, True
    marks padding; `subspaces`: optional orthonormal (H, d, d/H). With `use_sdpa` (the fast
    path) ρ = exp runs through `scaled_dot_product_attention` (key-norm bias and padding in
    `attn_mask`) and every other ρ through the blocked kernel `kernels.weighted_average`
    (O(n · block) memory); `use_sdpa=False` forms the dense n × n weights β_ij = ρ'(z_ij)
    (`energy.pair_weights`), the reference both fast paths are tested against.
    `alpha` must lie in (0, 1], or (0, 2) for a PSD kernel (Theorem A); `certified=False` allows any
    finite α > 0, for experiments outside the theorem.
    """
    r = get_rho(rho)
    alpha = check_step("alpha", alpha, "metric", r, certified=certified)
    valid = check_states(Y, padding_mask)
    fac = check_factors(factors, Y.shape[-1]).to(Y.dtype)
    subspaces = check_subspaces(subspaces, fac.shape[0], Y.shape[-1])
    avg, V = _weighted_average(Y, fac, r, valid, subspaces, use_sdpa)
    return _keep_padding(Y, Y + alpha * merge_heads(avg - V, subspaces), valid)


def isotropic_factors(scales: Tensor, d: int, subspaces: Tensor | None = None) -> Tensor:
    """Factors F_h = s_h U_hᵀ of isotropic heads (metric s_h² U_h U_hᵀ): (H,) -> (H, d/H, d)."""
    H = scales.shape[0]
    check_subspaces(subspaces, H, d)
    if subspaces is None:
        eye = torch.eye(d, dtype=scales.dtype, device=scales.device).reshape(H, d // H, d)
        return scales[:, None, None] * eye
    return scales[:, None, None] * subspaces.to(scales.dtype).transpose(1, 2)


def anchored_softmax_update(C: Tensor, Xc: Tensor, scales: Tensor, log_nu: Tensor, valid: Tensor,
                            alpha: float = 1.0, attention: AttentionPass | None = None, *,
                            certified: bool = True, prior: Tensor | None = None) -> tuple[Tensor, AttentionPass]:
    """The anchored MM step for ρ = exp on head coordinates, and the attention pass it used (THEORY §3.3).

    C, Xc (B, n, H, dh): coordinates c_i of Y and x_i of X per head (heads contiguous); `scales` (H,)
    s_h; `log_nu` (H,) log ν_h = log(λ s_h²), or (B, 1, H) per sample (length normalisation);
    `valid` (B, n) True = real token. The target
        t_i = (ν Σ_j β_ij c_j + x_i) / (ν d_i + 1) = x_i + σ(log ν + log d_i) (o⁺_i − x_i)
    from a pass with the diagonal (d_i = Σ_j β_ij, o⁺_i its average, when such a pass is given), or, from the
    off-diagonal pass (S_i, o_i: β_ii = 1 split off, the pass that also gives E_A at C; the default),
        t_i = (S_i o_i + c_i + x_i/ν) / (S_i + 1 + 1/ν) = p_i + σ(log S_i − log(1 + 1/ν)) (o_i − p_i),
    p_i = (ν c_i + x_i) / (ν + 1). Then c_i⁺ = (1 − α) c_i + α t_i (α = 1: t_i itself, no arithmetic
    with α). Returns c⁺ (B, n, H, dh) and the pass. α ∈ (0, 1] (`certified=False`: any finite α > 0).
    `prior` (B, n, H): a position prior's log-weights (pairs weighted by e^{p_i + p_j}, `softmax.attention_pass`); a
    given pass must have been computed with it. The self pair keeps its weight 1 in the off-diagonal form: any
    self weight ≥ 0 leaves the Jacobi step a descent step (docs/theory.md, "Position priors").
    """
    alpha = check_step("alpha", alpha, "anchored", certified=certified)
    if attention is None or attention.average is None:            # the off-diagonal pass, as the traced forward:
        attention = attention_pass(C, scales, valid, prior=prior)  # S_i's error is relative to S_i, not to 1 + S_i
    log_nu = log_nu.to(C.dtype)
    if attention.diagonal:
        gate = torch.sigmoid(log_nu + attention.log_mass)[..., None]   # (B, n, H, 1) ν d / (ν d + 1)
        target = torch.lerp(Xc, attention.average, gate)           # (B, n, H, dh) t_i
    else:
        p = torch.lerp(C, Xc, torch.sigmoid(-log_nu)[..., None])  # (B, n, H, dh) p_i
        gate = torch.sigmoid(attention.log_mass - F_nn.softplus(-log_nu))[..., None]   # (B, n, H, 1)
        target = torch.lerp(p, attention.average, gate)            # (B, n, H, dh) t_i
    return toward(C, target, alpha), attention


def toward(C: Tensor, target: Tensor, alpha: float | Tensor) -> Tensor:
    """(1 − α) C + α target: `target` itself at α = 1 (a float: no arithmetic); a learned α (0-dim tensor)
    keeps its gradient."""
    if isinstance(alpha, Tensor):
        return torch.lerp(C, target, alpha.to(C.dtype))
    return target if alpha == 1 else torch.lerp(C, target, float(alpha))


def anchored_attention_step(Y: Tensor, X: Tensor, scales: Tensor, lam: float | Tensor = 1.0,
                            rho: str | Rho = "exp", alpha: float = 1.0,
                            padding_mask: Tensor | None = None,
                            subspaces: Tensor | None = None, *, certified: bool = True,
                            prior: Tensor | None = None) -> Tensor:
    """MM step on ½‖Y − X‖² + λ E_A with isotropic heads F_h = s_h U_hᵀ (THEORY §3.3).

    Per head, with c = Y U_h, x = X U_h and ν = λ s_h²:
    c_i ← (1 − α) c_i + α (ν Σ_j β_ij c_j + x_i) / (ν d_i + 1). Descent for α ∈ (0, 1].
    For ρ = exp the update is one fused softmax pass over the other tokens (diagonal masked) whose
    log-sum-exp gives the off-diagonal mass; the self and anchor terms enter in closed form
    (`anchored_softmax_update`), so it never overflows and stores no n×n weights. Other ρ run
    through the blocked kernel (`kernels.weighted_average`: Σ_j β_ij c_j and d_i in one pass).
    `padding_mask` (B, n) bool, True marks padding. `lam`: a finite number > 0, or (B,) per sample (λ/n
    for the length-normalised energy); `alpha` in (0, 1]; `certified=False` allows any finite α > 0.
    `prior` (B, n, H), ρ = exp only: a position prior's log-weights (pairs weighted by e^{p_i + p_j}, docs/theory.md
    §4e).
    """
    alpha = check_step("alpha", alpha, "anchored", certified=certified)
    valid = check_states(Y, padding_mask)
    if X.shape != Y.shape:
        raise ValueError(f"anchor X must have Y's shape {tuple(Y.shape)}, got {tuple(X.shape)}")
    if isinstance(lam, Tensor) and lam.numel() > 1:               # one per sample (λ/n)
        if lam.dim() > 1 or lam.numel() != Y.shape[0] or not bool((torch.isfinite(lam) & (lam > 0)).all()):
            raise ConfigError(f"lam must be a finite number > 0, or one per sample (B,), got {lam}")
        lam = lam.to(Y.dtype)
    else:
        lam = torch.as_tensor(check_positive("lam", lam), dtype=Y.dtype, device=Y.device)
    H, d = scales.shape[0], Y.shape[-1]
    subspaces = check_subspaces(subspaces, H, d)
    r = get_rho(rho)
    if prior is not None and not r.softmax:
        raise ConfigError(f"a position prior needs rho='exp', got {r.name!r}")
    V, Xh = head_values(Y, H, subspaces), head_values(X.to(Y.dtype), H, subspaces)  # (B, H, n, dh)
    log_nu = lam.log().reshape(-1, 1, 1) + 2 * torch.log(scales.to(Y.dtype).abs())   # (1 or B, 1, H)
    if r.softmax:
        keep = valid[:, None, :, None]                             # padded rows zeroed: finite whatever they hold
        C, Xc = V.where(keep, 0.0).transpose(1, 2), Xh.where(keep, 0.0).transpose(1, 2)   # (B, n, H, dh)
        new, _ = anchored_softmax_update(C, Xc, scales.to(Y.dtype), log_nu, valid,
                                         prior=None if prior is None else prior.to(Y.dtype))
        target = new.transpose(1, 2)                               # (B, H, n, dh)
    else:
        a = scales.to(Y.dtype)[None, :, None, None] * V            # (B, H, n, dh) head features s_h c
        num, deg = weighted_average(a, V, valid, r)                # (B, H, n, dh), (B, H, n, 1)
        nu = log_nu.exp().transpose(1, 2)[..., None]               # (1 or B, H, 1, 1)
        target = (nu * num + Xh) / (nu * deg + 1)
    return _keep_padding(Y, Y + alpha * merge_heads(target - V, subspaces), valid)


# ----------------------------------------------------------------------------- FFN steps
def symmetric_ffn_step(Y: Tensor, W_F: Tensor, b: Tensor, eta: float = 1.0, relu: bool = True,
                       padding_mask: Tensor | None = None, *, certified: bool = True) -> Tensor:
    """(F1) Y⁺ = ReLU((1 − η) Y + η (Y W_F + 1b)): projected gradient step on E_F + ι_{≥0}.

    Descent for η ∈ (0, 1] when spec(W_F) ⊂ (−1, 1). W_F (d, d) symmetric, b (d,).
    `padding_mask` (B, n) bool, True marks padding. `certified=False` allows any finite η > 0.
    """
    eta = check_step("eta", eta, "symmetric", certified=certified)
    valid = check_states(Y, padding_mask)
    Z = (1 - eta) * Y + eta * (Y @ W_F + b.reshape(1, 1, -1))     # (B, n, d)
    return _keep_padding(Y, torch.relu(Z) if relu else Z, valid)


def tied_ffn_step(Y: Tensor, W1: Tensor, b: Tensor, alpha: float = 1.0,
                  padding_mask: Tensor | None = None, *, return_energy: bool = False, certified: bool = True):
    """(F2) Y⁺ = (1 − α) Y + α ReLU(Y W1 + 1b) W1ᵀ: gradient step on E_H, descent for α ∈ (0, 2).

    W1 (d, m), b (m,). `padding_mask` (B, n) bool, True marks padding. With `return_energy`
    also E_H(Y) as (B,) float64, from the same hidden layer: (Y⁺, E_H(Y)). `certified=False` allows
    any finite α > 0.
    """
    alpha = check_step("alpha", alpha, "tied", certified=certified)
    valid = check_states(Y, padding_mask)
    hidden = torch.relu(F_nn.linear(Y, W1.T, b))                   # (B, n, m) = ReLU(Y W1 + 1b)
    Y_new = _keep_padding(Y, (1 - alpha) * Y + alpha * (hidden @ W1.T), valid)   # α on (B, n, d), not (B, n, m)
    return (Y_new, tied_ffn_energy_from_hidden(Y, hidden, valid)) if return_energy else Y_new
