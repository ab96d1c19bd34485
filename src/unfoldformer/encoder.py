"""A certified layer for your own model, with `nn.TransformerEncoderLayer(batch_first=True)` conventions.

    import unfoldformer as uf
    layer = uf.CertifiedEncoderLayer(d_model=64, nhead=4, dim_feedforward=256)
    encoder = uf.CertifiedEncoder(layer, num_layers=6)               # tied: one layer applied 6 times
    y = encoder(x, src_key_padding_mask=pad)                          # (B, n, 64); pad True = padding
    out = encoder(x, src_key_padding_mask=pad, return_energies=True)  # EncoderOutput: .hidden, .energies

Each layer is an anchored-attention descent step followed by a tied-FFN step (THEORY §3.3–3.4) on
E(Y) = E_A(Y) + E_H(Y) + λ⁻¹ ½‖Y − X‖², the anchor X being the stack's input. Under the hood the
arguments become a `ModelConfig` of the `certified` preset, so every argument is checked against its
certified range with the config's messages, and the stack *is* an `UnfoldedTransformer` (same forward,
same energies, same safeguard). The arguments and the config fields they set:

| argument          | ModelConfig field | default | certified range        |
|-------------------|-------------------|---------|------------------------|
| `d_model`         | `d_model`         | —       | ≥ 1, multiple of nhead |
| `nhead`           | `n_heads`         | —       | ≥ 1                    |
| `dim_feedforward` | `ffn_hidden`      | 2048    | ≥ 1                    |
| `rho`             | `rho`             | "exp"   | the ρ family           |
| `alpha`           | `alpha_attention` | 1.0     | (0, 1]                 |
| `lam`             | `anchor_weight`   | 1.0     | > 0                    |
| `alpha_ffn`       | `alpha_ffn`       | 1.0     | (0, 2)                 |

Any other `ModelConfig` field can be passed by name (`learn_basis=False`, `basis_map="cayley"`,
`certified=False` to leave the certified ranges, `layer="joint"` with `learn_steps`; a joint layer has no
`alpha_ffn`); `depth` and `tied`
belong to `CertifiedEncoder`. Attention masks other than padding (`src_mask`, `is_causal`) are refused:
the energy couples every pair of real tokens.
"""
from __future__ import annotations

import copy
import dataclasses

import torch
from torch import Tensor, nn

from .config import ModelConfig
from .energy import check_states
from .errors import ConfigError
from .hub import PretrainedMixin
from .model import EncoderOutput, UnfoldedTransformer

__all__ = ["CertifiedEncoder", "CertifiedEncoderLayer"]


def _refuse_masks(mask_name: str, mask, is_causal) -> None:
    if mask is not None or is_causal:
        what = mask_name if mask is not None else "is_causal"
        raise ConfigError(f"{what} is not supported: a certified layer's energy couples every pair of real tokens; "
                          "mark padding with src_key_padding_mask (True = padding)")


def _result(out: EncoderOutput, return_energies) -> Tensor | EncoderOutput:
    return out if return_energies else out.hidden


class CertifiedEncoderLayer(PretrainedMixin, nn.Module):
    """One certified layer: anchored attention step, then tied-FFN step (module doc for the arguments).

    `forward(src, src_mask=None, src_key_padding_mask=None, is_causal=False, *, anchor=None,
    return_energies=False, safeguard=False)`: src (B, n, d_model); `src_key_padding_mask` (B, n) bool,
    True marks padding; `anchor` the X of the energy (default: `src`). Returns the (B, n, d_model)
    output, or with `return_energies` an `EncoderOutput` whose `energies` (B, 2) are E at the input and
    at the output (float64).
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, *, rho: str = "exp",
                 alpha: float = 1.0, lam: float = 1.0, alpha_ffn: float | None = None, batch_first: bool = True,
                 **config):
        super().__init__()
        if batch_first is not True:
            raise ConfigError("CertifiedEncoderLayer takes batch-first inputs (B, n, d) only: batch_first=True")
        for name in ("depth", "tied", "preset_name"):
            if name in config:
                raise ConfigError(f"{name} is not an argument of CertifiedEncoderLayer: depth and tying are "
                                  "CertifiedEncoder(layer, num_layers, tied=...)'s")
        if alpha_ffn is not None:                              # None: 1.0, or no FFN step size (a joint layer)
            config["alpha_ffn"] = alpha_ffn
        cfg = ModelConfig.preset("certified", d_model=d_model, n_heads=nhead, ffn_hidden=dim_feedforward, rho=rho,
                                 alpha_attention=alpha, anchor_weight=lam, depth=1, tied=True, **config)
        self.encoder = UnfoldedTransformer(cfg)                # depth 1: the existing stack, one layer

    @classmethod
    def from_config(cls, config: ModelConfig) -> CertifiedEncoderLayer:
        """The layer of a resolved unfolded config (its depth and tying are ignored)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.encoder = UnfoldedTransformer(dataclasses.replace(config.resolved(), depth=1, tied=True))
        return layer

    @property
    def config(self) -> ModelConfig:
        """The resolved config of this layer (depth 1)."""
        return self.encoder.config

    @property
    def layer(self) -> nn.Module:
        """The layer module itself (`layers.UnfoldedLayer`: `.attention`, `.ffn`, `.energy(Y, X, mask)`)."""
        return self.encoder.layers[0]

    def energy(self, Y: Tensor, X: Tensor, src_key_padding_mask: Tensor | None = None) -> Tensor:
        """E(Y) anchored at X, (B,) float64."""
        return self.layer.energy(Y, X, src_key_padding_mask)

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False, *, anchor: Tensor | None = None, return_energies: bool = False,
                safeguard: bool = False) -> Tensor | EncoderOutput:
        _refuse_masks("src_mask", src_mask, is_causal)
        if anchor is None:
            out = self.encoder(src, src_key_padding_mask, return_energies=return_energies, safeguard=safeguard)
            return _result(out, return_energies)
        if safeguard:
            raise ConfigError("safeguard=True needs the anchor to be the input (anchor=None); "
                              "run the layer inside a CertifiedEncoder")
        if anchor.shape != src.shape:
            raise ValueError(f"anchor has shape {tuple(anchor.shape)} but src has {tuple(src.shape)}")
        check_states(src, src_key_padding_mask)
        check_states(anchor, src_key_padding_mask)
        hidden = self.layer(src, anchor, src_key_padding_mask)   # the layer module's own step, (B, n, d)
        if not return_energies:
            return hidden
        before, after = self.energy(src, anchor, src_key_padding_mask), self.energy(hidden, anchor,
                                                                                    src_key_padding_mask)
        return EncoderOutput(hidden=hidden, energies=torch.stack([before, after], dim=1),  # (B, 2)
                             layer_before=before[:, None], layer_after=after[:, None],
                             step_scales=torch.ones_like(before, dtype=src.dtype)[:, None])

    def _pretrained_init(self) -> dict:
        return {"config": self.config.to_dict()}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> CertifiedEncoderLayer:
        return cls.from_config(ModelConfig.from_dict(init["config"]))


class CertifiedEncoder(PretrainedMixin, nn.Module):
    """`num_layers` certified layers, as `nn.TransformerEncoder(layer, num_layers)`; the anchor is the input.

    `tied=True` (default): the one `layer` applied `num_layers` times, one energy for the whole stack
    (its parameters are `layer`'s). `tied=False`: `num_layers` independent copies of `layer`, as
    `nn.TransformerEncoder` makes. `forward(src, mask=None, src_key_padding_mask=None, is_causal=None,
    *, return_energies=False, safeguard=False)` returns the (B, n, d_model) output, or with
    `return_energies` (True / "curve" / "steps") an `EncoderOutput` with the energy curve (B, T + 1).
    `safeguard=True` backtracks each layer's step until the energy does not rise (THEORY §3.5).
    """

    def __init__(self, encoder_layer: CertifiedEncoderLayer, num_layers: int, tied: bool = True):
        super().__init__()
        if not isinstance(encoder_layer, CertifiedEncoderLayer):
            raise ConfigError(f"CertifiedEncoder stacks a CertifiedEncoderLayer, got {type(encoder_layer).__name__}")
        cfg = dataclasses.replace(encoder_layer.config, depth=num_layers, tied=tied).resolved()
        one = encoder_layer.layer
        layers = [one] if cfg.tied else [copy.deepcopy(one) for _ in range(cfg.depth)]
        self.encoder = UnfoldedTransformer(cfg, layers=layers)

    @classmethod
    def from_config(cls, config: ModelConfig) -> CertifiedEncoder:
        """The stack of a resolved unfolded config (depth and tying from it)."""
        config = config.resolved()
        return cls(CertifiedEncoderLayer.from_config(config), config.depth, config.tied)

    @property
    def config(self) -> ModelConfig:
        return self.encoder.config

    @property
    def layers(self) -> nn.ModuleList:
        return self.encoder.layers

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None, *, return_energies: bool | str = False,
                safeguard: bool = False) -> Tensor | EncoderOutput:
        _refuse_masks("mask", mask, is_causal)
        out = self.encoder(src, src_key_padding_mask, return_energies=return_energies, safeguard=safeguard)
        return _result(out, return_energies)

    def _pretrained_init(self) -> dict:
        return {"config": self.config.to_dict()}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> CertifiedEncoder:
        return cls.from_config(ModelConfig.from_dict(init["config"]))
