"""`UnfoldedTransformer`: a Transformer whose layers are descent steps on an explicit energy (THEORY §3).

One layer applied `depth` times (tied) or `depth` layers (untied), built from a resolved
`ModelConfig`. `forward(x, padding_mask=None, *, return_energies=False, safeguard=False)`;
`padding_mask` is a bool (B, n) tensor in which **True marks padding** (PyTorch's
key_padding_mask convention).

**Safeguard** (THEORY §3.5): each sub-step descends its own term, but a whole layer need not
lower E = E_A + E_FFN. With `safeguard=True` every layer step is accepted per sample only if E
does not rise (beyond `descent_tolerance`); otherwise its step size is halved, up to
`max_halvings` times, after which the sample keeps its state (the layer is skipped for it). The
energy curve then never rises, by construction. It costs the energies of every layer (about
4–8× plain inference on CPU), so it is off unless asked for.

Energies returned with `return_energies=True` (or `safeguard=True`), all (B, ·) float64:
- `energies` (B, depth + 1). Tied: E(Y⁽ᵗ⁾) for t = 0 … depth, one energy throughout.
  Untied: entry 0 is E_1(Y⁽⁰⁾) and entry ℓ ≥ 1 is E_ℓ(Y⁽ℓ⁾), the energy of the layer
  that produced the state; descent of layer ℓ is `layer_after[:, ℓ-1] <= layer_before[:, ℓ-1]`.
- `layer_before`, `layer_after` (B, depth): E_ℓ(Y⁽ℓ⁻¹⁾) and E_ℓ(Y⁽ℓ⁾).
- `attention_before`, `attention_after` (B, depth): the attention term of E_ℓ at Y⁽ℓ⁻¹⁾ and
  at U⁽ℓ⁾ (after the attention step); `ffn_before`, `ffn_after`: the FFN term at U⁽ℓ⁾ and at Y⁽ℓ⁾.
- `step_scales` (B, depth): the step scale accepted per layer (1 without the safeguard).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .config import ModelConfig
from .descent import descent_tolerance, lowered
from .energy import check_dtype, check_states
from .errors import ConfigError
from .layers import AnchoredAttention, EnergyTerms, LayerTrace, MetricAttention, SymmetricFFN, TiedFFN, UnfoldedLayer
from .released import ReleasedAttention, ReleasedFFN

__all__ = ["EncoderOutput", "UnfoldedTransformer", "build_layer"]


def build_layer(cfg: ModelConfig) -> UnfoldedLayer:
    """One attention + FFN layer of a resolved unfolded config."""
    d, H = cfg.d_model, cfg.n_heads
    if cfg.attention == "anchored":
        attn = AnchoredAttention(d, H, cfg.rho, cfg.anchor_weight, cfg.alpha_attention, cfg.learn_basis)
    elif cfg.attention == "metric":
        attn = MetricAttention(d, H, cfg.rho, cfg.alpha_attention, cfg.learn_basis)
    else:
        attn = ReleasedAttention(d)
    ffn = {"tied": lambda: TiedFFN(d, cfg.ffn_hidden, cfg.alpha_ffn),
           "symmetric": lambda: SymmetricFFN(d, cfg.alpha_ffn, cfg.relu, cfg.spectrum_bound, cfg.spectrum_method),
           "released": lambda: ReleasedFFN(d, cfg.relu),
           "none": lambda: None}[cfg.ffn]()
    return UnfoldedLayer(attn, ffn)


@dataclass
class EncoderOutput:
    """`hidden` (B, n, d); with energies requested the (B, ·) float64 tensors described in the module doc."""

    hidden: Tensor
    energies: Tensor | None = None
    layer_before: Tensor | None = None
    layer_after: Tensor | None = None
    attention_before: Tensor | None = None
    attention_after: Tensor | None = None
    ffn_before: Tensor | None = None
    ffn_after: Tensor | None = None
    step_scales: Tensor | None = None


@dataclass
class _Step:
    """One layer on a batch, as accepted per sample (rows replaced as the safeguard backtracks)."""

    trace: LayerTrace          # states and energy terms at U and Y⁺
    at_input: EnergyTerms      # E_ℓ terms at Y
    scale: Tensor              # (B,) step scale accepted: 1 full step, 0.5^k after k halvings, 0 skipped

    def accept(self, rows: Tensor, trial: LayerTrace, scale: float) -> None:
        t = self.trace
        self.trace = LayerTrace(t.middle.index_copy(0, rows, trial.middle), t.output.index_copy(0, rows, trial.output),
                                t.at_middle.put(rows, trial.at_middle), t.at_output.put(rows, trial.at_output))
        self.scale = self.scale.index_fill(0, rows, scale)


class UnfoldedTransformer(nn.Module):
    """A Transformer whose layers are descent steps on an explicit energy (THEORY §3)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        config = config.resolved()
        if config.attention == "standard":
            raise ConfigError("the 'standard' preset is the baseline: build it with StandardTransformer "
                              "(or unfoldformer.classifier.build_encoder)")
        self.config = config
        n_layers = 1 if config.tied else config.depth
        self.layers = nn.ModuleList(build_layer(config) for _ in range(n_layers))

    def layer(self, index: int) -> UnfoldedLayer:
        return self.layers[0 if self.config.tied else index]

    def energy(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None = None, layer: int = 0) -> Tensor:
        """Total energy E_layer(Y) (anchored at X) as (B,) float64."""
        return self.layer(layer).energy(Y, X, padding_mask)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, *, return_energies: bool = False,
                safeguard: bool = False, max_halvings: int = 8) -> EncoderOutput:
        """x: (B, n, d) inputs X = Y⁽⁰⁾; `padding_mask` (B, n) bool, True marks padding.

        `return_energies`: the energy curve and sub-step energies (module doc). `safeguard`: whole-layer
        descent by backtracking, at most `max_halvings` halvings per layer and sample (module doc)."""
        check_states(x, padding_mask)
        check_dtype(x, self)
        if x.shape[-1] != self.config.d_model:
            raise ValueError(f"input has d={x.shape[-1]} but the model has d_model={self.config.d_model}")
        if max_halvings < 0:
            raise ConfigError(f"max_halvings must be >= 0, got {max_halvings}")
        with parametrize.cached():  # orthogonal head bases: computed once per forward, not per use
            if not (safeguard or return_energies):
                Y = x
                for ell in range(self.config.depth):
                    Y = self.layer(ell)(Y, x, padding_mask)
                return EncoderOutput(hidden=Y)
            return self._traced_forward(x, padding_mask, max_halvings if safeguard else None)

    def _traced_forward(self, X: Tensor, mask: Tensor | None, halvings: int | None) -> EncoderOutput:
        """All layers with their energy terms; `halvings` None: plain steps, else the safeguard."""
        steps: list[_Step] = []
        Y, at_input = X, None
        skipped = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        for ell in range(self.config.depth):
            layer = self.layer(ell)
            if at_input is None or not self.config.tied:            # tied: E at Y⁽ℓ⁾ is known from layer ℓ
                at_input = layer.energy_terms(Y, X, mask)
            step = self._step(layer, Y, X, mask, at_input, halvings, skipped)
            steps.append(step)
            Y, at_input = step.trace.output, step.trace.at_output
            if self.config.tied:   # same layer, same state: a sample skipped once stays skipped
                skipped = skipped | (step.scale == 0)
        stack = lambda rows: torch.stack(rows, dim=1)               # noqa: E731  (B, depth)
        return EncoderOutput(
            hidden=Y, energies=stack([steps[0].at_input.total] + [s.trace.at_output.total for s in steps]),
            layer_before=stack([s.at_input.total for s in steps]),
            layer_after=stack([s.trace.at_output.total for s in steps]),
            attention_before=stack([s.at_input.attention for s in steps]),
            attention_after=stack([s.trace.at_middle.attention for s in steps]),
            ffn_before=stack([s.trace.at_middle.ffn for s in steps]),
            ffn_after=stack([s.trace.at_output.ffn for s in steps]),
            step_scales=stack([s.scale for s in steps]))

    def _step(self, layer: UnfoldedLayer, Y: Tensor, X: Tensor, mask: Tensor | None, at_input: EnergyTerms,
              halvings: int | None, skipped: Tensor) -> _Step:
        """Layer ℓ on every sample not `skipped` (those keep Y). With `halvings` (the safeguard), a sample
        whose energy rises is retried at half the step, up to `halvings` times, then keeps Y (scale 0)."""
        tol = descent_tolerance(Y.dtype)
        step = _Step(LayerTrace(Y, Y, at_input, at_input), at_input, torch.zeros(Y.shape[0], dtype=Y.dtype,
                                                                                   device=Y.device))
        todo = torch.nonzero(~skipped).flatten()                    # samples still to be stepped
        for attempt in range((halvings or 0) + 1):
            if todo.numel() == 0:
                break
            scale = 0.5 ** attempt
            trial = layer.traced(Y[todo], X[todo], None if mask is None else mask[todo], scale)
            step.accept(todo, trial, scale)
            if halvings is None:
                return step
            rose = ~lowered(at_input.total[todo], trial.at_output.total, tol)
            todo = todo[rose]
        if todo.numel():                                            # still rising: these samples keep Y
            step.accept(todo, LayerTrace(Y[todo], Y[todo], at_input.take(todo), at_input.take(todo)), 0.0)
        return step

    @torch.no_grad()
    def released_normalize_(self) -> None:
        """Re-apply the released FFN normalisation (squares W_f again, as the released code does)."""
        for layer in self.layers:
            if isinstance(layer.ffn, ReleasedFFN):
                layer.ffn.normalize_()
