"""The baseline encoder: a pre-LayerNorm `nn.TransformerEncoder` (the `standard` preset).

Same interface as `UnfoldedTransformer` (`forward(x, padding_mask) -> EncoderOutput`), so the
classifier and the benchmarks treat both alike; it has no energy, so `return_energies` and
`safeguard` are refused.
"""
from __future__ import annotations

from torch import Tensor, nn

from .config import ModelConfig
from .energy import check_dtype, check_states
from .errors import ConfigError
from .hub import PretrainedMixin
from .model import EncoderOutput

__all__ = ["StandardTransformer"]


class StandardTransformer(PretrainedMixin, nn.Module):
    """Pre-LayerNorm `nn.TransformerEncoder` (GELU MLP, final LayerNorm) of width d_model, depth, heads, MLP width."""

    def __init__(self, config: ModelConfig | None = None):
        super().__init__()
        config = (config or ModelConfig(preset_name="standard")).resolved()
        if config.attention != "standard":
            raise ConfigError(f"StandardTransformer needs the 'standard' preset, got attention {config.attention!r}")
        self.config = config
        block = nn.TransformerEncoderLayer(config.d_model, config.n_heads, config.ffn_hidden, dropout=config.dropout,
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
