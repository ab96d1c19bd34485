"""The baseline encoder: a pre-LayerNorm `nn.TransformerEncoder` (the `standard` preset).

Same interface as `UnfoldedTransformer` (`forward(x, padding_mask) -> EncoderOutput`), so the
classifier and the benchmarks treat both alike; it has no energy, so `return_energies` and
`safeguard` are refused. With `positions="rotary"` every block's self-attention rotates queries and keys
by RoPE (`positions.rotate_heads`, the same tables as the certified rotary attention) with the same
parameters as `nn.MultiheadAttention`; absolute positions are added to the input by the classifier.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F_nn
from torch import Tensor, nn

from .config import ModelConfig
from .energy import check_dtype, check_states
from .errors import ConfigError
from .model import EncoderOutput
from .positions import rope_tables, rotate_heads
from .pretrained import PretrainedMixin

__all__ = ["RotaryEncoderLayer", "StandardTransformer"]


class RotaryEncoderLayer(nn.TransformerEncoderLayer):
    """A pre-LN `nn.TransformerEncoderLayer` whose self-attention applies RoPE to queries and keys (same
    parameters and state-dict keys; the fused inference fast path is not used)."""

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        x = src + self._sa_block(self.norm1(src), src_mask, src_key_padding_mask)
        return x + self._ff_block(self.norm2(x))

    def _sa_block(self, x: Tensor, attn_mask: Tensor | None, key_padding_mask: Tensor | None,
                  is_causal: bool = False) -> Tensor:
        att = self.self_attn
        B, n, d = x.shape
        H = att.num_heads
        q, k, v = F_nn.linear(x, att.in_proj_weight, att.in_proj_bias).view(B, n, 3, H, d // H).unbind(2)
        tables = rope_tables(n, d // H, x.dtype, x.device)
        q, k = rotate_heads(q, tables), rotate_heads(k, tables)    # (B, n, H, dh) R_i q_i, R_j k_j
        mask = None
        if key_padding_mask is not None:                           # (B, n): True / −inf marks padding
            if key_padding_mask.dtype == torch.bool:
                mask = torch.zeros(B, n, dtype=x.dtype, device=x.device).masked_fill(key_padding_mask, float("-inf"))
            else:
                mask = key_padding_mask.to(x.dtype)
            mask = mask[:, None, None, :]                          # (B, 1, 1, n)
        out = F_nn.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                attn_mask=mask, dropout_p=att.dropout if self.training else 0.0)
        return self.dropout1(att.out_proj(out.transpose(1, 2).reshape(B, n, d)))   # (B, n, d)


class StandardTransformer(PretrainedMixin, nn.Module):
    """Pre-LayerNorm `nn.TransformerEncoder` (GELU MLP, final LayerNorm) of width d_model, depth, heads, MLP width."""

    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        config = (config or ModelConfig(preset_name="standard")).resolved()
        if config.attention != "standard":
            raise ConfigError(f"StandardTransformer needs the 'standard' preset, got attention {config.attention!r}")
        self.config = config
        layer = RotaryEncoderLayer if config.positions == "rotary" else nn.TransformerEncoderLayer
        block = layer(config.d_model, config.n_heads, config.ffn_hidden, dropout=config.dropout,
                                           activation="gelu", batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(block, config.depth, norm=nn.LayerNorm(config.d_model),
                                             enable_nested_tensor=False)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, *, return_energies: bool = False,
                safeguard: bool = False) -> EncoderOutput:
        """x (B, n, d); `padding_mask` (B, n) bool, True marks padding."""
        if return_energies or safeguard:
            raise ConfigError("the standard Transformer has no energy: return_energies and safeguard do not apply")
        check_states(x, padding_mask)
        check_dtype(x, self)
        if x.shape[0] == 0:                                        # an empty batch: an empty output
            return EncoderOutput(hidden=x.clone())
        return EncoderOutput(hidden=self.encoder(x, src_key_padding_mask=padding_mask))
