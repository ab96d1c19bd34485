"""A certified decoder for your own model, and generation with a cache (THEORY §3.11).

    import unfoldformer as uf
    layer = uf.CertifiedDecoderLayer(d_model=64, nhead=4, dim_feedforward=256)
    decoder = uf.CertifiedDecoder(layer, num_layers=6)                # tied: one layer applied 6 times
    y = decoder(x)                                                     # (B, n, 64); token i sees tokens j ≤ i
    out = decoder(x, return_energies=True)                             # causal.DecoderOutput
    out.token_lowered().all()                                          # every token, every layer: certified

Why separate classes rather than `is_causal=True` on the encoder classes: a causal layer lowers a different
energy (one conditional energy per token, THEORY §3.11, not one energy of all tokens), and its forward with
energies returns a different record (`DecoderOutput`: per-token curves and the measured sequence energy G).
A flag on the encoder would let one class return two kinds of guarantee; two classes keep each one explicit.
Under the hood both are an `UnfoldedTransformer` of the `certified-causal` preset (the joint layer with
`causal=True`): one forward, one set of kernels.

Arguments as `CertifiedEncoderLayer`'s (`d_model`, `nhead`, `dim_feedforward`, `rho`, `alpha`, `lam`, and any
`ModelConfig` field by name: `ffn_weight`, `attention_norm`, `positions="rotary"`, `learn_steps`, ...).

**Cache** (`prefill`, `extend`): token i's step reads only the layer's inputs at tokens j ≤ i, so keeping every
layer's input states (in the layer's basis) lets a new token run through the stack alone: its output equals the
full forward's last row to round-off (the fused kernel sums in another order). Sequences in a cache have no
padding.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .causal import DecoderOutput, causal_joint_step
from .config import ModelConfig
from .energy import check_dtype, check_states
from .errors import ConfigError
from .joint import JointStack
from .model import UnfoldedTransformer, copy_layer
from .pretrained import PretrainedMixin
from .rotated import _change

__all__ = ["CausalCache", "CertifiedDecoder", "CertifiedDecoderLayer", "DecoderOutput", "extend", "prefill"]


def _refuse_masks(mask, is_causal) -> None:
    if mask is not None or is_causal is False:
        raise ConfigError("a certified decoder is causal by construction: pass no attention mask (and not "
                          "is_causal=False); mark padding with tgt_key_padding_mask (True = padding)")


class CertifiedDecoderLayer(PretrainedMixin, nn.Module):
    """One causal certified layer (module doc). `forward(tgt, tgt_mask=None, tgt_key_padding_mask=None,
    is_causal=True, *, anchor=None, return_energies=False)`: tgt (B, n, d_model); the anchor X of the energies
    defaults to `tgt`. Returns (B, n, d_model), or a `DecoderOutput` with `return_energies`. `**config`: other
    fields of the `certified-causal` preset's `ModelConfig`; the language model's recommended layer is
    `metric="free", keys="free", attention_norm="none", relative_bias=64` (free context keys and a learned bias
    per offset, docs/theory.md §4d)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, *, rho: str = "exp",
                 alpha: float = 1.0, lam: float = 1.0, batch_first: bool = True, **config):
        super().__init__()
        if batch_first is not True:
            raise ConfigError("CertifiedDecoderLayer takes batch-first inputs (B, n, d) only: batch_first=True")
        for name in ("depth", "tied", "preset_name", "causal"):
            if name in config:
                raise ConfigError(f"{name} is not an argument of CertifiedDecoderLayer (depth and tying are "
                                  "CertifiedDecoder's; the layer is always causal)")
        cfg = ModelConfig.preset("certified-causal", d_model=d_model, n_heads=nhead, ffn_hidden=dim_feedforward,
                                 rho=rho, alpha_attention=alpha, anchor_weight=lam, depth=1, tied=True, **config)
        self.decoder = UnfoldedTransformer(cfg)

    @classmethod
    def from_config(cls, config: ModelConfig) -> CertifiedDecoderLayer:
        """The layer of a resolved causal config (its depth and tying are ignored)."""
        config = config.resolved()
        if not config.causal:
            raise ConfigError(f"CertifiedDecoderLayer needs a causal config (preset 'certified-causal'), got "
                              f"preset {config.preset_name!r} with causal={config.causal}")
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.decoder = UnfoldedTransformer(dataclasses.replace(config, depth=1, tied=True))
        return layer

    @property
    def config(self) -> ModelConfig:
        return self.decoder.config

    @property
    def layer(self) -> nn.Module:
        """The `joint.JointLayer` module (`causal=True`)."""
        return self.decoder.layers[0]

    def forward(self, tgt: Tensor, tgt_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                is_causal: bool = True, *, anchor: Tensor | None = None,
                return_energies: bool = False) -> Tensor | DecoderOutput:
        _refuse_masks(tgt_mask, is_causal)
        if anchor is None:
            out = self.decoder(tgt, tgt_key_padding_mask, return_energies=return_energies)
            return out if return_energies else out.hidden
        if return_energies:
            raise ConfigError("return_energies needs the anchor to be the input (anchor=None)")
        if anchor.shape != tgt.shape:
            raise ValueError(f"anchor has shape {tuple(anchor.shape)} but tgt has {tuple(tgt.shape)}")
        check_states(tgt, tgt_key_padding_mask)
        check_states(anchor, tgt_key_padding_mask)
        check_dtype(tgt, self)
        return self.layer(tgt, anchor, tgt_key_padding_mask)      # (B, n, d) the layer module's causal step

    def _pretrained_init(self) -> dict:
        return {"config": self.config.to_dict()}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> CertifiedDecoderLayer:
        return cls.from_config(ModelConfig.from_dict(init["config"]))


class CertifiedDecoder(PretrainedMixin, nn.Module):
    """`num_layers` causal certified layers; `tied=True` (default) applies the one `layer` `num_layers` times.
    `forward(tgt, mask=None, tgt_key_padding_mask=None, is_causal=True, *, return_energies=False)`."""

    def __init__(self, decoder_layer: CertifiedDecoderLayer, num_layers: int, tied: bool = True):
        super().__init__()
        if not isinstance(decoder_layer, CertifiedDecoderLayer):
            raise ConfigError(f"CertifiedDecoder stacks a CertifiedDecoderLayer, got {type(decoder_layer).__name__}")
        cfg = dataclasses.replace(decoder_layer.config, depth=num_layers, tied=tied).resolved()
        one = decoder_layer.layer
        layers = [one] if cfg.tied else [copy_layer(one, cfg) for _ in range(cfg.depth)]
        self.decoder = UnfoldedTransformer(cfg, layers=layers)

    @classmethod
    def from_config(cls, config: ModelConfig) -> CertifiedDecoder:
        config = config.resolved()
        return cls(CertifiedDecoderLayer.from_config(config), config.depth, config.tied)

    @property
    def config(self) -> ModelConfig:
        return self.decoder.config

    def forward(self, tgt: Tensor, mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                is_causal: bool = True, *, return_energies: bool = False) -> Tensor | DecoderOutput:
        _refuse_masks(mask, is_causal)
        out = self.decoder(tgt, tgt_key_padding_mask, return_energies=return_energies)
        return out if return_energies else out.hidden

    def prefill(self, x: Tensor) -> tuple[Tensor, CausalCache]:
        return prefill(self.decoder, x)

    def extend(self, cache: CausalCache, x_new: Tensor) -> Tensor:
        return extend(self.decoder, cache, x_new)

    def _pretrained_init(self) -> dict:
        return {"config": self.config.to_dict()}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> CertifiedDecoder:
        return cls.from_config(ModelConfig.from_dict(init["config"]))


@dataclass
class CausalCache:
    """Every layer's input states so far, each (B, t, d) in its layer's basis (tied: one basis)."""

    inputs: list[Tensor] = field(default_factory=list)

    @property
    def length(self) -> int:
        return 0 if not self.inputs else self.inputs[0].shape[1]


def _check_causal(model: UnfoldedTransformer, x: Tensor) -> None:
    if not isinstance(model, UnfoldedTransformer) or not model.config.causal:
        raise ConfigError("a cache runs a causal UnfoldedTransformer (preset 'certified-causal')")
    check_states(x)
    check_dtype(x, model)


def prefill(model: UnfoldedTransformer, x: Tensor) -> tuple[Tensor, CausalCache]:
    """The full forward of a causal model on x (B, n, d) without padding, and the cache of its layers' inputs."""
    _check_causal(model, x)
    stack = JointStack(model, x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device))
    cache = CausalCache()
    Y = stack.start()
    for ell in range(model.config.depth):
        cache.inputs.append(Y)
        Y = stack.advance(ell, stack._joint(stack.frame(ell), Y, stack.anchor(ell), stack.valid, 1.0, None))
    return stack.finish(Y), cache


def extend(model: UnfoldedTransformer, cache: CausalCache, x_new: Tensor) -> Tensor:
    """The output (B, 1, d) of one new token x_new (B, 1, d) after the cached ones; the cache grows by it. Equals
    the last row of the full forward on the whole sequence, to round-off."""
    _check_causal(model, x_new)
    if x_new.shape[1] != 1:
        raise ValueError(f"extend takes one new token per sample (B, 1, d), got {tuple(x_new.shape)}")
    if not cache.inputs or cache.inputs[0].shape[0] != x_new.shape[0]:
        raise ValueError("the cache is empty or holds another batch size: run prefill first")
    stack = JointStack(model, x_new, torch.ones(x_new.shape[:2], dtype=torch.bool, device=x_new.device))
    depth, y = model.config.depth, stack.start()                    # (B, 1, d) x̃ in the first layer's basis
    valid = torch.ones(x_new.shape[0], cache.length + 1, dtype=torch.bool, device=x_new.device)
    for ell in range(depth):
        f = stack.frame(ell)
        context = torch.cat([cache.inputs[ell], y], dim=1)           # (B, t + 1, d) this layer's inputs
        cache.inputs[ell] = context
        alpha = f.layer.step_size()
        y = causal_joint_step(f, context, stack.anchor(ell), valid, alpha, stack.rotary, last_only=True)
        if not (stack.tied and ell < depth - 1):                     # into the next layer's basis (original: last)
            turn = _change(f.Q, None if ell == depth - 1 else stack.frame(ell + 1).Q)
            y = y if turn is None else y @ turn
    return y
