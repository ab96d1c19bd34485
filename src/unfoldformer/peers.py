"""Peer encoders for side-by-side benchmarks (THEORY §8): the Energy Transformer and CRATE.

Written from their papers (Hoover et al., NeurIPS 2023; Yu et al., NeurIPS 2023), same interface
as `StandardTransformer`: `forward(x (B, n, d), padding_mask (B, n) True = padding) -> EncoderOutput`.
Padded tokens take no part in any sum (attention keys and queries, Hopfield and coding-rate sums),
so they never change the real tokens. Neither peer has a safeguard (`safeguard=True` is refused).

- `EnergyTransformer`: one shared block applied T = `depth` times, x ← x − α ∂E/∂g with g = LN(x)
  (closed-form gradient, `et_gradient`, run as two fused softmax passes by `et_gradient_fused`, which
  also gives E(g) of the step's state); `return_energies=True` gives `energies` (B, T + 1) float64,
  E(g⁽ᵗ⁾) for t = 0 … T. The output is g⁽ᵀ⁾ = LN(x⁽ᵀ⁾) (the model reads out layer-normalised tokens).
- `Crate`: `depth` layers Y' = Y + MSSA(LN(Y)), Y'' = ISTA(LN(Y')), then a final LayerNorm;
  `return_energies=True` gives, per layer, the coding rate R^c_ℓ of the layer's own subspaces before
  and after its attention step (`coding_rate_before`, `coding_rate_after`) and the ISTA output's
  sparsity (`sparsity`), all (B, depth) float64 fields of `EncoderOutput`.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .energy import check_dtype, check_states
from .errors import ConfigError
from .model import EncoderOutput, masked_mean
from .pretrained import PretrainedMixin

__all__ = ["CODING_RATE_EPS", "Crate", "EnergyTransformer", "coding_rate", "energy_layer_norm", "et_energy",
           "et_gradient", "et_gradient_fused", "ista_step"]

#: ε of the coding rate R^c(Z | U) reported by `Crate` (a measurement setting, not a parameter).
CODING_RATE_EPS = 0.5
#: sequence length from which the Energy Transformer runs its steps fused (`EnergyTransformer.fused`)
FUSED_FROM = 128
_LN_EPS = 1e-5


def _peer_config(config: ModelConfig | None, preset: str, attention: str) -> ModelConfig:
    config = (config or ModelConfig(preset_name=preset)).resolved()
    if config.attention != attention:
        raise ConfigError(f"this peer encoder needs attention {attention!r} (preset {preset!r}), "
                          f"got {config.attention!r}")
    return config


def _refuse_safeguard(safeguard: bool, name: str) -> None:
    if safeguard:
        raise ConfigError(f"{name} has no safeguard: safeguard=True does not apply")


# ----------------------------------------------------------------------------- Energy Transformer
def energy_layer_norm(x: Tensor, gamma: Tensor, delta: Tensor, eps: float = _LN_EPS) -> Tensor:
    """g = γ (x − mean x) / sqrt(var x + eps) + δ per token, γ a scalar (so ∂g/∂x is PSD for γ > 0), δ (d,)."""
    centred = x - x.mean(dim=-1, keepdim=True)                    # (B, n, d)
    return gamma * centred / torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps) + delta


def _et_scores(g: Tensor, wq: Tensor, wk: Tensor, valid: Tensor,
               self_pair: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k (B, H, n, k), the masked scores β k_Bᵀ q_C (B, H, n, n) (−inf off the allowed pairs: both real,
    and B ≠ C unless `self_pair`) and the rows with at least one key (B, 1, n, 1)."""
    q = torch.einsum("bnd,hkd->bhnk", g, wq)                      # (B, H, n, k)
    k = torch.einsum("bnd,hkd->bhnk", g, wk)                      # (B, H, n, k)
    beta = 1.0 / math.sqrt(wq.shape[1])
    allowed = valid[:, None, :, None] & valid[:, None, None, :]  # (B, 1, n, n)
    if not self_pair:
        allowed = allowed & ~torch.eye(g.shape[1], dtype=torch.bool, device=g.device)
    scores = (beta * q @ k.transpose(-1, -2)).masked_fill(~allowed, float("-inf"))   # (B, H, n, n)
    return q, k, scores, allowed.any(dim=-1, keepdim=True)


def et_energy(g: Tensor, wq: Tensor, wk: Tensor, xi: Tensor, valid: Tensor, self_pair: bool = True) -> Tensor:
    """E(g) = E_att + E_hop per sample (B,) float64 (THEORY §8):
    E_att = −(1/β) Σ_h Σ_C log Σ_B exp(β k_hBᵀ q_hC), E_hop = −½ Σ_A Σ_μ ReLU(ξ_μᵀ g_A)², over real tokens,
    the key B = C included when `self_pair` (the published code) and left out otherwise (the paper's
    equation, Σ_{B≠C}). g (B, n, d); wq, wk (H, k, d), β = 1/√k; xi (m, d); valid (B, n) True = real token."""
    _, _, scores, has_keys = _et_scores(g, wq, wk, valid, self_pair)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)          # (B, H, n, 1), −inf on rows without keys
    lse = torch.where(has_keys, lse, torch.zeros_like(lse)).to(torch.float64)
    e_att = -math.sqrt(wq.shape[1]) * lse.sum(dim=(1, 2, 3))     # (B,)
    hidden = F.relu(g @ xi.T) * valid[..., None]                 # (B, n, m)
    e_hop = -0.5 * hidden.to(torch.float64).pow(2).sum(dim=(1, 2))
    return e_att + e_hop


def et_gradient(g: Tensor, wq: Tensor, wk: Tensor, xi: Tensor, valid: Tensor, self_pair: bool = True) -> Tensor:
    """∂E/∂g (B, n, d) in closed form: with P_hC· = softmax over allowed keys of β k_hBᵀ q_hC,
    ∂E/∂q_hC = −Σ_B P_hCB k_hB, ∂E/∂k_hB = −Σ_C P_hCB q_hC, ∂E_hop/∂g_A = −Σ_μ ξ_μ ReLU(ξ_μᵀ g_A);
    ∂E/∂g_A = Σ_h (W_Q,hᵀ ∂E/∂q_hA + W_K,hᵀ ∂E/∂k_hA) + ∂E_hop/∂g_A. Zero on padded tokens. With the
    self pair, token A's own key enters both sums (the formulas are the same, P has its diagonal)."""
    q, k, scores, has_keys = _et_scores(g, wq, wk, valid, self_pair)
    p = torch.where(has_keys, torch.softmax(scores, dim=-1), torch.zeros_like(scores))   # (B, H, n, n)
    dq = -(p @ k)                                                 # (B, H, n, k)
    dk = -(p.transpose(-1, -2) @ q)                               # (B, H, n, k)
    grad = torch.einsum("bhnk,hkd->bnd", dq, wq) + torch.einsum("bhnk,hkd->bnd", dk, wk)   # (B, n, d)
    hidden = F.relu(g @ xi.T) * valid[..., None]                 # (B, n, m)
    return grad - hidden @ xi


def et_gradient_fused(g: Tensor, wq: Tensor, wk: Tensor, xi: Tensor, valid: Tensor,
                      self_pair: bool = True) -> tuple[Tensor, Tensor]:
    """(∂E/∂g (B, n, d), E (B,) float64): `et_gradient` and `et_energy` at g, without
    the (B, H, n, n) weights, by two fused softmax passes (`softmax.softmax_with_lse`).

    Pass 1 (queries q_C, keys k_B, values k_B) gives Σ_B P_CB k_B = −∂E/∂q_C and lse_C = log Σ_B e^{β k_Bᵀq_C},
    so E_att = −(1/β) Σ_C lse_C. The key gradient needs the transposed sum Σ_C P_CB q_C, P_CB = e^{β k_Bᵀq_C − lse_C}:
    pass 2 is attention with the roles swapped (queries k_B, keys q_C, values q_C) and the key bias −lse_C,
    whose row normaliser is e^{lse2_B} = Σ_C P_CB, so Σ_C P_CB q_C = e^{lse2_B} · out2_B. Padding and the
    bias ride in an extra feature column (queries [β q, 1], keys [k, bias]), so only the constant self-pair
    mask is a mask, and both passes are differentiable (the model trains through its gradient steps)."""
    from .softmax import masked_logit, softmax_with_lse

    q = torch.einsum("bnd,hkd->bhnk", g, wq)                      # (B, H, n, k)
    k = torch.einsum("bnd,hkd->bhnk", g, wk)                      # (B, H, n, k)
    B, H, n, width = q.shape
    beta = 1.0 / math.sqrt(width)
    masked = masked_logit(g.dtype)
    one = q.new_ones(B, H, n, 1)
    zero = q.new_zeros(B, H, n, 1)
    pad_bias = torch.zeros(B, 1, n, 1, dtype=g.dtype, device=g.device).masked_fill(~valid[:, None, :, None], masked)
    diagonal = None
    if not self_pair:                                             # B ≠ C: the diagonal masked (a constant)
        diagonal = torch.zeros(n, n, dtype=g.dtype, device=g.device).fill_diagonal_(masked)[None, None]
    out1, lse1 = softmax_with_lse(torch.cat([beta * q, one], -1), torch.cat([k, pad_bias.expand(B, H, n, 1)], -1),
                                  torch.cat([k, zero], -1), diagonal)   # (B, H, n, k + 1), (B, H, n)
    has_keys = valid[:, None, :] if self_pair else valid[:, None, :] & (valid.sum(1) > 1)[:, None, None]   # (B, 1, n)
    bias2 = torch.where(has_keys, -lse1, torch.full_like(lse1, masked))[..., None]   # (B, H, n, 1) per key C
    out2, lse2 = softmax_with_lse(torch.cat([beta * k, one], -1), torch.cat([q, bias2], -1),
                                  torch.cat([q, zero], -1), diagonal)   # (B, H, n, k + 1), (B, H, n)
    rows = has_keys[..., None].to(g.dtype)                        # (B, 1, n, 1): rows with a key
    dq = -out1[..., :width] * rows                                # (B, H, n, k)
    dk = -torch.exp(lse2)[..., None] * out2[..., :width] * valid[:, None, :, None].to(g.dtype)   # (B, H, n, k)
    grad = torch.einsum("bhnk,hkd->bnd", dq, wq) + torch.einsum("bhnk,hkd->bnd", dk, wk)   # (B, n, d)
    hidden = F.relu(g @ xi.T) * valid[..., None]                 # (B, n, m)
    e_att = -(torch.where(has_keys, lse1, 0.0).to(torch.float64).sum(dim=(1, 2))) / beta
    e_hop = -0.5 * hidden.to(torch.float64).pow(2).sum(dim=(1, 2))
    return grad - hidden @ xi, e_att + e_hop


class EnergyTransformer(PretrainedMixin, nn.Module):
    """Energy Transformer encoder (THEORY §8): one block (LayerNorm γ, δ; W_Q, W_K (H, d/H, d); Hopfield
    ξ (m, d), m = `ffn_hidden`) applied T = `depth` times: x ← x − α ∂E/∂g, g = LN(x), α = `energy_step`.

    `self_pair` (config) chooses the attention energy: True (the default) keeps the key B = C in
    log Σ_B exp(β k_Bᵀ q_C), as the authors' published code does, so the peer rows race the model its
    authors trained and reported; False is the paper's equation, Σ_{B≠C}. They are different functions
    (the gradients differ by 12–22 % at our initial scale); both are exact energies with closed-form
    gradients, and both fall along the continuous dynamics. Configs saved before the field existed
    (version 0.2.0) ran without the self pair and load so."""

    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        config = _peer_config(config, "energy-transformer", "energy-transformer")
        self.config = config
        d, H, m = config.d_model, config.n_heads, config.ffn_hidden
        self.gamma = nn.Parameter(torch.ones(()))
        self.delta = nn.Parameter(torch.zeros(d))
        self.wq = nn.Parameter(torch.randn(H, d // H, d) / math.sqrt(d))
        self.wk = nn.Parameter(torch.randn(H, d // H, d) / math.sqrt(d))
        self.xi = nn.Parameter(torch.randn(m, d) / math.sqrt(d))

    #: run each step as two fused softmax passes (`et_gradient_fused`); False: the explicit weights
    #: (`et_gradient`, `et_energy`), the same function to round-off, kept as the reference; None (default):
    #: fused from n = FUSED_FROM tokens on (a training step at B 32, 1 thread: fused 1.45× faster than
    #: explicit at n = 256, 0.85× at n = 64, `benchmarks/train_speed.py`).
    fused: bool | None = None

    def norm(self, x: Tensor) -> Tensor:
        """g = LN(x) (B, n, d)."""
        return energy_layer_norm(x, self.gamma, self.delta)

    def energy(self, g: Tensor, valid: Tensor) -> Tensor:
        """E(g) per sample (B,) float64 (`et_energy` with this block's weights)."""
        return et_energy(g, self.wq, self.wk, self.xi, valid, self.config.self_pair)

    def gradient(self, g: Tensor, valid: Tensor) -> Tensor:
        """∂E/∂g (B, n, d) (`et_gradient` with this block's weights)."""
        return et_gradient(g, self.wq, self.wk, self.xi, valid, self.config.self_pair)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, *, return_energies: bool | str = False,
                safeguard: bool = False) -> EncoderOutput:
        """x (B, n, d); `padding_mask` (B, n) bool, True marks padding. hidden = LN(x⁽ᵀ⁾) (B, n, d)."""
        _refuse_safeguard(safeguard, "the Energy Transformer")
        valid = check_states(x, padding_mask)                     # (B, n)
        check_dtype(x, self)
        curve = []
        for _ in range(self.config.depth):
            g = self.norm(x)                                      # (B, n, d)
            if self.fused or (self.fused is None and x.shape[1] >= FUSED_FROM):
                grad, energy = et_gradient_fused(g, self.wq, self.wk, self.xi, valid, self.config.self_pair)
            else:                                                 # the explicit (B, H, n, n) reference
                grad, energy = self.gradient(g, valid), self.energy(g, valid) if return_energies else None
            if return_energies:
                curve.append(energy.detach())
            x = x - self.config.energy_step * grad
        g = self.norm(x)
        if return_energies:
            with torch.no_grad():
                curve.append(self.energy(g, valid))
        return EncoderOutput(hidden=g, energies=torch.stack(curve, dim=1) if return_energies else None)


# ----------------------------------------------------------------------------- CRATE
def coding_rate(z: Tensor, u: Tensor, valid: Tensor, eps: float = CODING_RATE_EPS) -> Tensor:
    """R^c(Z | U) = Σ_k ½ log det(I + (p / (n ε²)) (Z U_k)ᵀ (Z U_k)) per sample (B,) float64 (THEORY §8),
    n = the sample's real tokens. z (B, n, d); u (H, p, d) holds U_kᵀ; valid (B, n) True = real token."""
    w = torch.einsum("bnd,hpd->bhnp", z.to(torch.float64), u.to(torch.float64))   # (B, H, n, p)
    w = w * valid[:, None, :, None]
    gram = w.transpose(-1, -2) @ w                                # (B, H, p, p)
    p = u.shape[1]
    n = valid.sum(dim=1).clamp_min(1).to(torch.float64)[:, None, None, None]        # (B, 1, 1, 1)
    eye = torch.eye(p, dtype=torch.float64, device=z.device)
    return 0.5 * torch.logdet(eye + (p / (n * eps ** 2)) * gram).sum(dim=1)


def ista_step(z: Tensor, dictionary: Tensor, eta: float, lam: float) -> Tensor:
    """One ISTA step ReLU(Z + η (Z − Z Dᵀ) D − ηλ) = ReLU(Z + η (Z D − Z Dᵀ D) − ηλ) (THEORY §8);
    z (B, n, d), D (d, d)."""
    return F.relu(z + eta * (z - z @ dictionary.T) @ dictionary - eta * lam)


class CrateLayer(nn.Module):
    """Y' = Y + MSSA(LN₁(Y)), Y'' = ISTA(LN₂(Y')). MSSA: per head k, SSA_k(Z) = softmax((Z U_k)(Z U_k)ᵀ/√p)
    (Z U_k) over real keys, heads concatenated and mapped by a learned output map (weights and bias);
    the 1/√p scale is the published code's."""

    def __init__(self, d: int, heads: int, eta: float, lam: float):
        super().__init__()
        self.heads, self.eta, self.lam = heads, eta, lam
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.u = nn.Linear(d, d, bias=False)                     # rows k·p … (k+1)·p − 1 hold U_kᵀ
        self.out = nn.Linear(d, d)
        self.dictionary = nn.Parameter(torch.empty(d, d))
        nn.init.kaiming_uniform_(self.dictionary, a=math.sqrt(5))

    def subspaces(self) -> Tensor:
        """U_kᵀ for every head (H, p, d)."""
        d = self.u.weight.shape[1]
        return self.u.weight.view(self.heads, d // self.heads, d)

    def mssa(self, z: Tensor, valid: Tensor) -> Tensor:
        """MSSA(Z) (B, n, d): the heads [SSA_1 … SSA_K] concatenated, then the output map `out`."""
        B, n, d = z.shape
        w = self.u(z).view(B, n, self.heads, d // self.heads).transpose(1, 2)           # (B, H, n, p)
        # softmax(w wᵀ/√p) w over real keys, by the fused kernel (no (B, H, n, n) matrix kept for backward)
        heads = F.scaled_dot_product_attention(w, w, w, attn_mask=valid[:, None, None, :],
                                               scale=1 / math.sqrt(d // self.heads))    # (B, H, n, p)
        return self.out(heads.transpose(1, 2).reshape(B, n, d))

    def forward(self, y: Tensor, valid: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(Y'' (B, n, d), LN₁(Y), Y'): the coding rate before / after the step is measured at LN₁(Y)
        and LN₁(Y'), the latter computed only when asked for."""
        z = self.norm1(y)                                         # (B, n, d)
        y = y + self.mssa(z, valid)
        return ista_step(self.norm2(y), self.dictionary, self.eta, self.lam), z, y


class Crate(PretrainedMixin, nn.Module):
    """CRATE encoder (THEORY §8): `depth` `CrateLayer`s (width d, `n_heads` heads of width p = d/H,
    ISTA η = `ista_step`, λ = `ista_lambda`) and a final LayerNorm.

    `readout` (config) places the final LayerNorm: `pool-norm` (the default, the published model) pools
    the tokens first and normalises the pooled vector — then `hidden` holds the last layer's tokens
    before the LayerNorm and `pool(hidden, padding_mask)` gives the normalised pooled vector; `norm-pool`
    (what version 0.2.0 ran) normalises every token, `hidden` holds them, and `pool` is the masked mean.
    The two are different functions (15–66 % apart on random inputs)."""

    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        config = _peer_config(config, "crate", "crate")
        self.config = config
        self.layers = nn.ModuleList(CrateLayer(config.d_model, config.n_heads, config.ista_step, config.ista_lambda)
                                    for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.d_model)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, *, return_energies: bool | str = False,
                safeguard: bool = False) -> EncoderOutput:
        """x (B, n, d); `padding_mask` (B, n) bool, True marks padding. With `return_energies`: the
        per-layer coding rates before / after the attention step and the sparsity, (B, depth) float64."""
        _refuse_safeguard(safeguard, "CRATE")
        valid = check_states(x, padding_mask)                     # (B, n)
        check_dtype(x, self)
        before, after, sparsity = [], [], []
        for layer in self.layers:
            x, z_before, y_mid = layer(x, valid)
            if return_energies:                                   # measurements: outside autograd
                u = layer.subspaces().detach()
                with torch.no_grad():
                    before.append(coding_rate(z_before, u, valid))
                    after.append(coding_rate(layer.norm1(y_mid), u, valid))
                zeros = ((x.detach() == 0) & valid[..., None]).sum(dim=(1, 2)).to(torch.float64)   # (B,)
                sparsity.append(zeros / (valid.sum(dim=1) * x.shape[-1]).clamp_min(1))
        out = EncoderOutput(hidden=x if self.config.readout == "pool-norm" else self.norm(x))
        if return_energies:
            out.coding_rate_before, out.coding_rate_after = torch.stack(before, 1), torch.stack(after, 1)
            out.sparsity = torch.stack(sparsity, 1)
        return out

    def pool(self, hidden: Tensor, padding_mask: Tensor | None) -> Tensor:
        """The sequence vector (B, d) of `forward`'s `hidden` (B, n, d): the mean over real tokens, then
        the final LayerNorm (`pool-norm`), or the mean of the normalised tokens (`norm-pool`)."""
        pooled = masked_mean(hidden, padding_mask)                # (B, d)
        return self.norm(pooled) if self.config.readout == "pool-norm" else pooled
