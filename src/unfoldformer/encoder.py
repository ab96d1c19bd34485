"""A certified layer for your own model, with `nn.TransformerEncoderLayer(batch_first=True)` conventions.

    import unfoldformer as uf
    layer = uf.CertifiedEncoderLayer(d_model=64, nhead=4, dim_feedforward=256)
    encoder = uf.CertifiedEncoder(layer, num_layers=6)               # tied: one layer applied 6 times
    y = encoder(x, src_key_padding_mask=pad)                          # (B, n, 64); pad True = padding
    out = encoder(x, src_key_padding_mask=pad, return_energies=True)  # EncoderOutput: .hidden, .energies

By default each layer is the joint layer (THEORY §3.7): one majorize-minimize step on
E(Y) = λE_A(Y) + ½‖Y − X‖² + γE_H(Y), anchored attention and the tied FFN together, the anchor X being
the stack's input; every layer lowers E by construction. `layer="alternating"` gives the alternating
layer instead (an anchored-attention step, then a tied-FFN step, THEORY §3.3–3.4; whole-layer descent
only with `safeguard=True`). Under the hood the arguments become a `ModelConfig` of the `certified`
preset (`certified-alternating` for the alternating layer), so every argument is checked against its
certified range with the config's messages, and the stack *is* an `UnfoldedTransformer` (same forward,
same energies). The arguments and the config fields they set:

| argument          | ModelConfig field | default  | certified range        |
|-------------------|-------------------|----------|------------------------|
| `d_model`         | `d_model`         | —        | ≥ 1, multiple of nhead |
| `nhead`           | `n_heads`         | —        | ≥ 1                    |
| `dim_feedforward` | `ffn_hidden`      | 2048     | ≥ 1                    |
| `rho`             | `rho`             | "exp"    | the ρ family           |
| `alpha`           | `alpha_attention` | 1.0      | (0, 1]                 |
| `lam`             | `anchor_weight`   | preset's (1.0) | > 0              |
| `layer`           | `layer`           | "joint"  | joint, alternating     |
| `alpha_ffn`       | `alpha_ffn`       | 1.0 (alternating only) | (0, 2)   |
| `position_prior`  | `position_prior`  | 64 (ρ = exp; else 0) | ≥ 0      |

Any other `ModelConfig` field can be passed by name (`learn_basis=False`, `basis_map="cayley"`,
`certified=False` to leave the certified ranges, `ffn_weight` (γ) and `learn_steps` for the joint layer;
`position_prior=0` for the layer without learned log-weights per token rank, docs/theory.md §4e);
`depth` and `tied` belong to `CertifiedEncoder`. Attention masks other than padding (`src_mask`,
`is_causal`) are refused: the energy couples every pair of real tokens.

Drop-in conventions (docs/guides/custom-model.md, "Differences"): `dropout` acts on the output (of the layer;
of the stack, before `norm`) in training only, so every step and its certificate are untouched; `activation`
is ReLU only (the FFN energy needs ½‖ReLU‖² convex); `device` / `dtype`; `CertifiedEncoder(..., norm=)` after
the last layer; float masks of 0 / −inf; unbatched (n, d) input; `batch_first=False` by transposing;
`torch.save(module)` pickles the config and state dict. `torch.export` is not supported (data-dependent checks).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F_nn
from torch import Tensor, nn

from .config import ModelConfig
from .energy import check_states
from .errors import ConfigError
from .model import EncoderOutput, UnfoldedTransformer, copy_layer
from .pretrained import PretrainedMixin
from .threads import free_core_threads, hold_for_backward

__all__ = ["CertifiedEncoder", "CertifiedEncoderLayer"]


def _refuse_masks(mask_name: str, mask, is_causal) -> None:
    if mask is not None or is_causal:
        what = mask_name if mask is not None else "is_causal"
        raise ConfigError(f"{what} is not supported: a certified layer's energy couples every pair of real tokens; "
                          "mark padding with src_key_padding_mask (True = padding)")


def _result(out: EncoderOutput, return_energies) -> Tensor | EncoderOutput:
    return out if return_energies else out.hidden


def _check_activation(activation) -> None:
    """Only ReLU: the energy's FFN term −½‖ReLU(YW₁ + b)‖² is concave because ½‖ReLU(·)‖² is convex, and the
    step's descent certificate rests on that (THEORY §3.4, §3.7)."""
    relu = activation in ("relu", torch.relu, F_nn.relu) or isinstance(activation, nn.ReLU)
    if not relu:
        raise ConfigError(f"activation={activation!r} is not supported: a certified layer's FFN energy needs ReLU "
                          "(½‖ReLU(YW₁ + b)‖² is convex, which the descent certificate rests on); use 'relu'")


def _bool_padding(mask: Tensor | None) -> Tensor | None:
    """A key padding mask as bool (True = padding): bool as given; float additive (0 = keep, −inf = padding)
    converted; other float values are refused (the energy weighs every real pair alike, no additive bias)."""
    if mask is None or mask.dtype == torch.bool:
        return mask
    if not mask.is_floating_point():
        raise TypeError(f"src_key_padding_mask must be bool (True = padding) or float (0 / -inf), got {mask.dtype}")
    padding = torch.isneginf(mask)
    if not bool(((mask == 0) | padding).all()):
        raise ConfigError("a float src_key_padding_mask may hold only 0 (keep) and -inf (padding): a certified "
                          "layer's energy has no additive attention bias")
    return padding


def _batch_first(src: Tensor, mask: Tensor | None, batch_first: bool) -> tuple[Tensor, Tensor | None, bool]:
    """src as (B, n, d) and mask as bool (B, n): unbatched (n, d) gets B = 1, (n, B, d) is transposed."""
    mask = _bool_padding(mask)
    if isinstance(src, Tensor) and src.dim() == 2:                 # unbatched (n, d), mask (n,)
        return src[None], (mask[None] if mask is not None and mask.dim() == 1 else mask), True
    if not batch_first and isinstance(src, Tensor) and src.dim() == 3:
        src = src.transpose(0, 1)                                  # (n, B, d) -> (B, n, d)
    return src, mask, False


def _layout(out: Tensor | EncoderOutput, unbatched: bool, batch_first: bool) -> Tensor | EncoderOutput:
    """The hidden states back in the caller's layout: (n, d) unbatched, (n, B, d) with batch_first=False
    (energies keep their (B, ·) shape)."""
    hidden = out.hidden if isinstance(out, EncoderOutput) else out
    hidden = hidden[0] if unbatched else (hidden if batch_first else hidden.transpose(0, 1))
    return dataclasses.replace(out, hidden=hidden) if isinstance(out, EncoderOutput) else hidden


def _rebuild(cls, config: dict, extras: dict, state: dict, training: bool):
    """Unpickle a certified encoder (`torch.load(weights_only=False)`): rebuilt from its config, then its state."""
    module = cls.from_config(ModelConfig.from_dict(config))
    norm = extras.pop("norm", None)
    if norm is not None:
        module.norm = norm
    for name, value in extras.items():
        setattr(module, name, value)
    floating = [t for t in state.values() if t.is_floating_point()]
    if floating:                                                   # the pickled dtype and device
        module.to(device=floating[0].device, dtype=floating[0].dtype)
    module.load_state_dict(state)
    return module.train(training)


class _DropIn:
    """What both certified modules share as drop-ins for `nn.TransformerEncoder(Layer)`: pickling through the
    config (parametrised modules cannot be pickled as they are), the caller's layout, and the thread count of the
    whole call (`threads.py`)."""

    def __reduce_ex__(self, protocol):
        extras = {"dropout": self.dropout, "batch_first": self.batch_first}
        if isinstance(self, CertifiedEncoder):
            extras["norm"] = self.norm
        return _rebuild, (type(self), self.config.to_dict(), extras, self.state_dict(), self.training)

    def _finish(self, out: Tensor | EncoderOutput, unbatched: bool) -> Tensor | EncoderOutput:
        """Dropout (training only) and, for the encoder, `norm` on the hidden states, then the caller's layout."""
        hidden = out.hidden if isinstance(out, EncoderOutput) else out
        hidden = self.dropout(hidden)
        norm = getattr(self, "norm", None)
        if norm is not None:
            hidden = norm(hidden)
        out = dataclasses.replace(out, hidden=hidden) if isinstance(out, EncoderOutput) else hidden
        return _layout(out, unbatched, self.batch_first)

    def _at_free_cores(self, run):
        """`run()` (the step or stack, then `_finish`: dropout, `norm`, layout) at the free cores' thread count,
        forward and backward (`threads.py`): on a shared machine a region at the caller's count between two lowered
        ones would wait for the core the other process holds."""
        with free_core_threads() as threads:
            out = run()
        if torch.is_grad_enabled():
            hold_for_backward([out] if isinstance(out, Tensor) else vars(out).values(), threads)
        return out

    def _stack(self, src: Tensor, src_key_padding_mask: Tensor | None, return_energies, safeguard: bool,
               unbatched: bool) -> Tensor | EncoderOutput:
        """The wrapped stack's forward from `src` (also the anchor), finished for the caller."""
        return self._at_free_cores(lambda: self._finish(_result(
            self.encoder(src, src_key_padding_mask, return_energies=return_energies, safeguard=safeguard),
            return_energies), unbatched))


class CertifiedEncoderLayer(_DropIn, PretrainedMixin, nn.Module):
    """One certified layer, a drop-in for `nn.TransformerEncoderLayer(batch_first=True)`.

    The default is the joint layer: one step that lowers E(Y) = λE_A(Y) + ½‖Y − X‖² + γE_H(Y) for every
    input (THEORY §3.7). `layer="alternating"` gives the attention step then the FFN step (THEORY §3.3–3.4).

    Args:
        d_model: width d of the tokens; a multiple of `nhead`.
        nhead: number of attention heads h (each works in a d/h-dimensional subspace).
        dim_feedforward: hidden width m of the tied FFN (W2 = W1ᵀ).
        rho: the attention penalty ρ: "exp" (softmax-like), "log", "linear", "lp", "truncated".
        alpha: attention step size α, certified in (0, 1].
        lam: anchor weight λ > 0 (None: the preset's, 1.0).
        layer: "joint" (default, whole-layer descent by construction) or "alternating".
        alpha_ffn: the alternating layer's FFN step size, certified in (0, 2); a joint layer has none.
        batch_first: True: inputs (B, n, d); False: (n, B, d), transposed. Unbatched (n, d) is accepted too.
        dropout: dropout on the layer's output, training only (the step and its certificate are untouched).
        activation: "relu" only (the FFN energy needs ½‖ReLU‖² convex).
        device, dtype: factory arguments, as for `nn.TransformerEncoderLayer`.
        **config: any other `ModelConfig` field (`learn_basis`, `basis_map`, `ffn_weight`, `learn_steps`,
            `positions`, `metric`, `certified`, ...).

    Raises:
        ConfigError: an argument outside its certified range, or a field the layer does not use.

    Example:
        >>> import torch, unfoldformer as uf
        >>> layer = uf.CertifiedEncoderLayer(64, 4)                       # the joint layer
        >>> x = torch.randn(2, 5, 64)                                     # (B, n, d)
        >>> pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])   # (B, n), True = padding
        >>> out = layer(x, src_key_padding_mask=pad, return_energies=True)
        >>> out.hidden.shape, out.energies.shape                          # (B, n, d), (B, 2)
        (torch.Size([2, 5, 64]), torch.Size([2, 2]))
        >>> bool((out.energies[:, 1] <= out.energies[:, 0]).all())        # E never rises
        True
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int | None = 2048, *, rho: str = "exp",
                 alpha: float = 1.0, lam: float | None = None, layer: str = "joint", alpha_ffn: float | None = None,
                 batch_first: bool = True, dropout: float = 0.0, activation="relu", device=None, dtype=None,
                 **config):
        super().__init__()
        _check_activation(activation)
        if not 0.0 <= float(dropout) < 1.0:
            raise ConfigError(f"dropout must be in [0, 1), got {dropout}")
        self.batch_first, self.dropout = bool(batch_first), nn.Dropout(float(dropout))
        for name in ("depth", "tied", "preset_name"):
            if name in config:
                raise ConfigError(f"{name} is not an argument of CertifiedEncoderLayer: depth and tying are "
                                  "CertifiedEncoder(layer, num_layers, tied=...)'s")
        for name, value in (("d_model", d_model), ("nhead", nhead)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"CertifiedEncoderLayer: {name} must be an integer >= 1, got {value!r}")
        dim_feedforward = 2048 if dim_feedforward is None else dim_feedforward     # the documented default
        if alpha_ffn is not None:                              # None: 1.0, or no FFN step size (a joint layer)
            config["alpha_ffn"] = alpha_ffn
        if lam is not None:                                    # None: the preset's λ
            config["anchor_weight"] = lam
        preset = "certified-alternating" if layer == "alternating" else "certified"
        cfg = ModelConfig.preset(preset, d_model=d_model, n_heads=nhead, ffn_hidden=dim_feedforward, rho=rho,
                                 alpha_attention=alpha, layer=layer, depth=1, tied=True, **config)
        self.encoder = UnfoldedTransformer(cfg)                # depth 1: the existing stack, one layer
        if device is not None or dtype is not None:
            self.to(device=device, dtype=dtype)

    @classmethod
    def from_config(cls, config: ModelConfig) -> CertifiedEncoderLayer:
        """The layer of a resolved unfolded config (its depth and tying are ignored)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.encoder = UnfoldedTransformer(dataclasses.replace(config.resolved(), depth=1, tied=True))
        layer.batch_first, layer.dropout = True, nn.Dropout(0.0)
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
        """One descent step from `src`.

        Args:
            src: the tokens, (B, n, d_model).
            src_mask, is_causal: must be None / False (the energy couples every pair of real tokens).
            src_key_padding_mask: (B, n) bool, True marks padding (padded rows are left unchanged).
            anchor: the X of the energy, (B, n, d_model); default `src` (a stack passes its input).
            return_energies: also return E at the input and at the output.
            safeguard: backtrack the step until E does not rise (alternating layer; needs `anchor=None`).

        Returns:
            The output (B, n, d_model); with `return_energies` an `EncoderOutput` with `hidden`
            (B, n, d_model) and `energies` (B, 2): E before and after, float64.
        """
        _refuse_masks("src_mask", src_mask, is_causal)
        src, src_key_padding_mask, unbatched = _batch_first(src, src_key_padding_mask, self.batch_first)
        if anchor is None:
            return self._stack(src, src_key_padding_mask, return_energies, safeguard, unbatched)
        anchor = _batch_first(anchor, None, self.batch_first)[0]
        if safeguard:
            raise ConfigError("safeguard=True needs the anchor to be the input (anchor=None); "
                              "run the layer inside a CertifiedEncoder")
        if anchor.shape != src.shape:
            raise ValueError(f"anchor has shape {tuple(anchor.shape)} but src has {tuple(src.shape)}")
        check_states(src, src_key_padding_mask)
        check_states(anchor, src_key_padding_mask)
        return self._at_free_cores(lambda: self._anchored_step(src, anchor, src_key_padding_mask, return_energies,
                                                               unbatched))

    def _anchored_step(self, src: Tensor, anchor: Tensor, src_key_padding_mask: Tensor | None, return_energies: bool,
                       unbatched: bool) -> Tensor | EncoderOutput:
        """The layer module's own step towards a given anchor (a stack's inner layer), finished for the caller."""
        hidden = self.layer(src, anchor, src_key_padding_mask)   # the layer module's own step, (B, n, d)
        if not return_energies:
            return self._finish(hidden, unbatched)
        before, after = self.energy(src, anchor, src_key_padding_mask), self.energy(hidden, anchor,
                                                                                    src_key_padding_mask)
        return self._finish(EncoderOutput(hidden=hidden, energies=torch.stack([before, after], dim=1),  # (B, 2)
                                          layer_before=before[:, None], layer_after=after[:, None],
                                          step_scales=torch.ones_like(before, dtype=src.dtype)[:, None]), unbatched)

    def _pretrained_init(self) -> dict:
        return {"config": self.config.to_dict()}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> CertifiedEncoderLayer:
        return cls.from_config(ModelConfig.from_dict(init["config"]))


class CertifiedEncoder(_DropIn, PretrainedMixin, nn.Module):
    """`num_layers` certified layers, as `nn.TransformerEncoder(layer, num_layers)`; the anchor is the input.

    Args:
        encoder_layer: the `CertifiedEncoderLayer` to stack.
        num_layers: depth T.
        tied: True (default): the one `encoder_layer` applied `num_layers` times, one energy E for the
            whole stack, whose curve E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾) never rises (joint layer). False: `num_layers`
            independent copies, as `nn.TransformerEncoder` makes; layer ℓ lowers its own energy E_ℓ, so
            the certificate is per layer (`EncoderOutput.layer_before` / `layer_after`), not one curve.

    Example:
        >>> import torch, unfoldformer as uf
        >>> encoder = uf.CertifiedEncoder(uf.CertifiedEncoderLayer(64, 4), num_layers=6)
        >>> out = encoder(torch.randn(2, 5, 64), return_energies=True)
        >>> out.hidden.shape, out.energies.shape                  # (B, n, d), (B, T + 1)
        (torch.Size([2, 5, 64]), torch.Size([2, 7]))
        >>> bool((out.energies.diff(dim=1) <= 0).all())            # tied joint: the curve never rises
        True
    """

    def __init__(self, encoder_layer: CertifiedEncoderLayer, num_layers: int, tied: bool = True, *,
                 norm: nn.Module | None = None, enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        if not isinstance(encoder_layer, CertifiedEncoderLayer):
            raise ConfigError(f"CertifiedEncoder stacks a CertifiedEncoderLayer, got {type(encoder_layer).__name__}")
        cfg = dataclasses.replace(encoder_layer.config, depth=num_layers, tied=tied).resolved()
        one = encoder_layer.layer
        layers = [one] if cfg.tied else [copy_layer(one, cfg) for _ in range(cfg.depth)]
        self.encoder = UnfoldedTransformer(cfg, layers=layers)
        # nn.TransformerEncoder's options: `norm` after the last layer; the other two concern nested tensors
        self.norm, self.batch_first = norm, encoder_layer.batch_first
        self.dropout = nn.Dropout(encoder_layer.dropout.p)        # on the stack's output, training only

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
        """The stack's forward from `src` (also the anchor X).

        Args:
            src: the tokens, (B, n, d_model).
            mask, is_causal: must be None (padding only, through `src_key_padding_mask`).
            src_key_padding_mask: (B, n) bool, True marks padding.
            return_energies: False, True / "curve" (the energy at every depth) or "steps" (also the
                per-layer energies before and after each step).
            safeguard: backtrack each layer's step until its energy does not rise (THEORY §3.5); the
                joint layer never needs it.

        Returns:
            The output (B, n, d_model), or an `EncoderOutput`: `hidden` (B, n, d_model), `energies`
            (B, T + 1) float64 and, per layer, `layer_before` / `layer_after` (B, T).
        """
        _refuse_masks("mask", mask, is_causal)
        src, src_key_padding_mask, unbatched = _batch_first(src, src_key_padding_mask, self.batch_first)
        return self._stack(src, src_key_padding_mask, return_energies, safeguard, unbatched)

    def _pretrained_init(self) -> dict:
        return {"config": self.config.to_dict()}

    @classmethod
    def _from_pretrained_init(cls, init: dict) -> CertifiedEncoder:
        return cls.from_config(ModelConfig.from_dict(init["config"]))
