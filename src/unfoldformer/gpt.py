"""The standard decoder: pre-LN GPT blocks, the side-by-side baseline of the certified decoder.

Each block (Radford et al. 2018/2019, pre-LayerNorm as in GPT-2; written from the papers) is

    x ← x + W_O · CausalSoftmaxAttention(LN₁(x) W_Q, LN₁(x) W_K, LN₁(x) W_V)
    x ← x + W₂ GELU(W₁ LN₂(x))

with H heads of width d/H, scale 1/√(d/H), attention through `scaled_dot_product_attention(is_causal=True)`,
an MLP of width `ffn_hidden` and a final LayerNorm after the last block. It has no energy.

Configured by a `ModelConfig` of the `standard` preset (d_model, n_heads, depth, ffn_hidden, dropout).
`prefill` / `extend` keep every block's inputs (the decoder's cache, as `decoder.prefill`): a new token's
keys and values are recomputed from the cached inputs, so its output equals the full forward's last row.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F_nn
from torch import Tensor, nn

from .config import ModelConfig
from .decoder import CausalCache
from .energy import check_dtype, check_states
from .errors import ConfigError
from .pretrained import PretrainedMixin

__all__ = ["GPTBlock", "StandardDecoder"]


class GPTBlock(nn.Module):
    """One pre-LN block: causal multi-head self-attention and a GELU MLP, each with a residual connection."""

    def __init__(self, d: int, n_heads: int, hidden: int, dropout: float = 0.0):
        super().__init__()
        self.H, self.dropout = n_heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)                               # W_Q, W_K, W_V stacked
        self.out = nn.Linear(d, d)                                   # W_O
        self.fc, self.proj = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.drop = nn.Dropout(dropout)

    def _attention(self, x: Tensor, last_only: bool) -> Tensor:
        """Causal attention of LN₁(x) (B, n, d): every row (B, n, d), or the last row (B, 1, d) against all keys."""
        B, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, n, 3, self.H, d // self.H).permute(2, 0, 3, 1, 4)   # (B, H, n, dh)
        if last_only:
            q = q[:, :, -1:]                                         # the new token sees every key: no mask
        p = self.dropout if self.training else 0.0
        o = F_nn.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=not last_only)   # (B, H, q, dh)
        return self.drop(self.out(o.transpose(1, 2).reshape(B, q.shape[2], d)))

    def _mlp(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(F_nn.gelu(self.fc(self.ln2(x)))))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self._attention(x, False)                            # (B, n, d)
        return x + self._mlp(x)

    def last(self, context: Tensor) -> Tensor:
        """The block's output at the last row of `context` (B, t, d), its inputs so far: (B, 1, d)."""
        x = context[:, -1:] + self._attention(context, True)
        return x + self._mlp(x)


class StandardDecoder(PretrainedMixin, nn.Module):
    """`depth` pre-LN GPT blocks and a final LayerNorm (module doc); `forward(x)` (B, n, d) -> (B, n, d)."""

    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        config = (config or ModelConfig(preset_name="standard")).resolved()
        if config.attention != "standard":
            raise ConfigError(f"StandardDecoder needs the 'standard' preset, got attention {config.attention!r}")
        if config.positions == "rotary":
            raise ConfigError("StandardDecoder takes absolute positions (added to its input); rotary is not built in")
        self.config = config
        self.blocks = nn.ModuleList(GPTBlock(config.d_model, config.n_heads, config.ffn_hidden, config.dropout)
                                    for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.d_model)

    def forward(self, x: Tensor) -> Tensor:
        check_states(x)
        check_dtype(x, self)
        for block in self.blocks:
            x = block(x)
        return self.norm(x)

    def prefill(self, x: Tensor) -> tuple[Tensor, CausalCache]:
        """The full forward on x (B, n, d) and the cache of every block's inputs."""
        check_states(x)
        cache = CausalCache()
        for block in self.blocks:
            cache.inputs.append(x)
            x = block(x)
        return self.norm(x), cache

    def extend(self, cache: CausalCache, x_new: Tensor) -> Tensor:
        """The output (B, 1, d) of one new token after the cached ones; the cache grows by it."""
        if not cache.inputs or cache.inputs[0].shape[0] != x_new.shape[0] or x_new.shape[1] != 1:
            raise ValueError("extend takes (B, 1, d) after a prefill of the same batch size")
        y = x_new
        for i, block in enumerate(self.blocks):
            cache.inputs[i] = torch.cat([cache.inputs[i], y], dim=1)  # (B, t + 1, d)
            y = block.last(cache.inputs[i])
        return self.norm(y)
