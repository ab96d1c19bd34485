"""`UnfoldedTransformer`: a Transformer whose layers are descent steps on an explicit energy (THEORY §3).

One layer applied `depth` times (tied) or `depth` layers (untied), built from a resolved
`ModelConfig`. `forward(x, padding_mask=None, *, return_energies=False, safeguard=False)`;
`padding_mask` is a bool (B, n) tensor in which **True marks padding** (PyTorch's
key_padding_mask convention). The input is validated once per forward. Anchored layers with the
tied FFN run in their own learned bases (`rotated.py`: same parameters, the same results to
round-off, no head projections); the other layers run as their modules.

**Joint layer** (`layer="joint"`, THEORY §3.7, `joint.py`): attention and the tied FFN in one MM step
on the whole layer energy, which every layer lowers by construction; its curve comes from the steps'
own passes and hidden layers (one more of each at the last state).

**Safeguard** (THEORY §3.5): each sub-step of the alternating layer descends its own term, but a whole
layer need not lower E = E_A + E_FFN (the joint layer does; the safeguard then never shortens its step,
and with float32 states keeps a sample's state only where rounding the new one would raise E).
With `safeguard=True` every layer step is accepted per sample only if E does not rise (beyond
`descent_tolerance`); otherwise its step size is halved, up to `max_halvings` times, after which the
sample keeps its state (the layer is skipped for it). The energy curve then never rises, by
construction. It needs the energies of every layer, so it is off unless asked for. With states in
float32 (or lower) every energy the forward returns (the curve, the layer energies, the sub-step terms;
with or without the safeguard) is a float64 evaluation of the states (operators as stored, converted
exactly; the steps stay in the states' dtype): the safeguard decides on them, and an accepted layer does
not rise under an independent float64 evaluation; the statistics judged from them (`descent.py`) err by
far less than the float32 tolerance (float32 passes err by up to 4γR², `softmax.logit_error_bound`, and
float32 row sums of squares by (d + 1)u‖y‖²: both above it; docs/theory.md, "Numerics of the fast paths").
The float64 evaluations cost about 3× the plain forward of a float32 preset (measured on CPU, B = 16, n = 128).

Energies, all (B, ·) float64. `return_energies=True` (or "curve", or `safeguard=True`) gives the curve:
- `energies` (B, depth + 1). Tied: E(Y⁽ᵗ⁾) for t = 0 … depth, one energy throughout.
  Untied: entry 0 is E_1(Y⁽⁰⁾) and entry ℓ ≥ 1 is E_ℓ(Y⁽ℓ⁾), the energy of the layer
  that produced the state; descent of layer ℓ is `layer_after[:, ℓ-1] <= layer_before[:, ℓ-1]`.
- `layer_before`, `layer_after` (B, depth): E_ℓ(Y⁽ℓ⁻¹⁾) and E_ℓ(Y⁽ℓ⁾) (tied: the curve's entries).
- `step_scales` (B, depth): the step scale accepted per layer (1 without the safeguard).
`return_energies="steps"` adds the sub-step terms (one more attention energy per layer):
- `attention_before`, `attention_after` (B, depth): the attention term of E_ℓ at Y⁽ℓ⁻¹⁾ and
  at U⁽ℓ⁾ (after the attention step); `ffn_before`, `ffn_after`: the FFN term at U⁽ℓ⁾ and at Y⁽ℓ⁾.
For float64 states and ρ = exp each state's attention pass serves both its energy and the step from it
(`softmax.attention_pass`), so the curve of a tied model costs one extra pass in all, plus the
FFN product Y⁽ᵗ⁾ W1 per layer that no alternating step computes (the joint layer's step computes it:
one extra pass and hidden layer in all). For a joint layer `"steps"` has no intermediate state: U = Y⁺.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .config import ModelConfig
from .descent import descent_tolerance, lowered
from .energy import check_dtype, check_states
from .errors import ConfigError
from .joint import JointLayer, JointStack
from .layers import AnchoredAttention, EnergyTerms, LayerTrace, MetricAttention, SymmetricFFN, TiedFFN, UnfoldedLayer
from .pretrained import PretrainedMixin
from .released import ReleasedAttention, ReleasedFFN
from .rotated import RotatedStack, runs_rotated
from .threads import free_core_threads, hold_for_backward

__all__ = ["EncoderOutput", "UnfoldedTransformer", "build_layer", "copy_layer", "masked_mean"]


def build_layer(cfg: ModelConfig) -> UnfoldedLayer:
    """One attention + FFN layer of a resolved unfolded config."""
    d, H = cfg.d_model, cfg.n_heads
    if cfg.attention == "anchored":
        attn = AnchoredAttention(d, H, cfg.rho, cfg.anchor_weight, cfg.alpha_attention, cfg.learn_basis,
                                 cfg.basis_map or "exp", certified=bool(cfg.certified),
                                 length_norm=cfg.attention_norm == "length", metric=cfg.metric,
                                 rotary=cfg.positions == "rotary", keys=cfg.keys or "tied",
                                 relative_bias=cfg.relative_bias or 0, position_prior=cfg.position_prior or 0)
        if cfg.layer == "joint":                                   # one MM step on the whole layer energy (§3.7)
            ffn = TiedFFN(d, cfg.ffn_hidden, 1.0, bound=cfg.ffn_bound)           # ffn.alpha unused
            return JointLayer(attn, ffn, cfg.ffn_weight, bool(cfg.learn_steps), bool(cfg.causal))
    elif cfg.attention == "metric":
        attn = MetricAttention(d, H, cfg.rho, cfg.alpha_attention, cfg.learn_basis, cfg.basis_map or "exp",
                               certified=cfg.certified)
    else:
        attn = ReleasedAttention(d)
    ffn = {"tied": lambda: TiedFFN(d, cfg.ffn_hidden, cfg.alpha_ffn, certified=bool(cfg.certified),
                                   bound=cfg.ffn_bound),
           "symmetric": lambda: SymmetricFFN(d, cfg.alpha_ffn, cfg.relu, cfg.spectrum_bound, cfg.spectrum_method,
                                             certified=bool(cfg.certified)),
           "released": lambda: ReleasedFFN(d, cfg.relu),
           "none": lambda: None}[cfg.ffn]()
    return UnfoldedLayer(attn, ffn)


def masked_mean(hidden: Tensor, padding_mask: Tensor | None) -> Tensor:
    """Mean over real tokens: (B, n, d) -> (B, d); `padding_mask` True marks padding."""
    if padding_mask is None:
        return hidden.mean(dim=1)
    w = (~padding_mask).to(hidden.dtype)[..., None]               # (B, n, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)


def copy_layer(layer: UnfoldedLayer, cfg: ModelConfig) -> UnfoldedLayer:
    """An independent copy of `layer` (built from `cfg`, its state loaded). Not `copy.deepcopy`: a deep copy of a
    parametrised basis shares the original's cached weight inside `parametrize.cached()` (the forward's), so an
    untied stack of deep copies ran every layer with the first one's basis and trained only that one."""
    param = next(layer.parameters(), None)
    fresh = build_layer(cfg)
    if param is not None:
        fresh = fresh.to(device=param.device, dtype=param.dtype)
    fresh.load_state_dict(layer.state_dict())
    return fresh


@dataclass
class EncoderOutput:
    """What every encoder's forward returns. Only `hidden` is always set; the other fields are None
    unless the forward was asked for them. B = batch, n = tokens, d = d_model, T = depth; every
    energy is float64, summed over the real (unpadded) tokens of each sample.

    Args:
        hidden (`Tensor` (B, n, d), the input's dtype):
            The final states Y⁽ᵀ⁾ (a peer: its read-out, e.g. LN(x⁽ᵀ⁾) for the Energy Transformer).
            Padded rows hold the input's padded rows.
        energies (`Tensor` (B, T + 1), `return_energies=True`):
            The energy curve. Tied: E(Y⁽ᵗ⁾) for t = 0 … T, one energy throughout. Untied: entry 0 is
            E_1(Y⁽⁰⁾) and entry ℓ ≥ 1 is E_ℓ(Y⁽ℓ⁾), the energy of the layer that produced the state.
            Energy Transformer: E(g⁽ᵗ⁾). Divide by the number of real tokens for a per-token value.
        layer_before (`Tensor` (B, T), `return_energies=True`):
            E_ℓ(Y⁽ℓ⁻¹⁾): layer ℓ's energy at its input.
        layer_after (`Tensor` (B, T), `return_energies=True`):
            E_ℓ(Y⁽ℓ⁾): layer ℓ's energy at its output; layer ℓ descended where
            `layer_after[:, ℓ-1] <= layer_before[:, ℓ-1]` (up to `descent_tolerance`).
        attention_before, attention_after (`Tensor` (B, T), `return_energies="steps"`):
            The attention term of E_ℓ (with the anchor term, for anchored attention) at Y⁽ℓ⁻¹⁾ and at
            U⁽ℓ⁾, the state after the attention step.
        ffn_before, ffn_after (`Tensor` (B, T), `return_energies="steps"`):
            The FFN term of E_ℓ at U⁽ℓ⁾ and at Y⁽ℓ⁾ (0 without an FFN).
        step_scales (`Tensor` (B, T), `return_energies=True` or `safeguard=True`):
            The step scale accepted per layer and sample: 1 a full step, 0.5ᵏ after k halvings of the
            safeguard, 0 a skipped layer (the sample kept its state).
        coding_rate_before, coding_rate_after (`Tensor` (B, T), CRATE with `return_energies=True`):
            The coding rate R^c_ℓ of layer ℓ's subspaces at LN(Y⁽ℓ⁻¹⁾) and at LN(Y⁽ℓ⁻¹⁾ + MSSA), after
            its attention step.
        sparsity (`Tensor` (B, T), CRATE with `return_energies=True`):
            The share of zero entries of layer ℓ's ISTA output over the real tokens.
    """

    hidden: Tensor
    energies: Tensor | None = None
    layer_before: Tensor | None = None
    layer_after: Tensor | None = None
    attention_before: Tensor | None = None
    attention_after: Tensor | None = None
    ffn_before: Tensor | None = None
    ffn_after: Tensor | None = None
    step_scales: Tensor | None = None
    coding_rate_before: Tensor | None = None
    coding_rate_after: Tensor | None = None
    sparsity: Tensor | None = None

    def energies_per_token(self, padding_mask: Tensor | None = None) -> Tensor | None:
        """(B, depth + 1) float64: `energies` / n, n = each sample's real tokens (`padding_mask` (B, n), True
        marks padding; None: all n tokens are real); None without energies. E sums over tokens, so E/n
        compares texts of different lengths."""
        if self.energies is None:
            return None
        n = (torch.full(self.energies.shape[:1], self.hidden.shape[1], device=self.energies.device)
             if padding_mask is None else (~padding_mask).sum(1).to(self.energies.device))   # (B,)
        return self.energies / n.to(torch.float64).clamp_min(1.0)[:, None]


@dataclass
class _Step:
    """One layer on a batch, as accepted per sample (rows replaced as the safeguard backtracks)."""

    trace: LayerTrace          # states, energy terms at U and Y⁺, the attention pass at Y⁺
    at_input: EnergyTerms      # E_ℓ terms at Y
    scale: Tensor              # (B,) step scale accepted: 1 full step, 0.5^k after k halvings, 0 skipped

    def accept(self, rows: Tensor, trial: LayerTrace, scale: float) -> None:
        t = self.trace
        every = rows.numel() == t.output.shape[0]                  # every sample: the trial's next-basis state too
        self.trace = t._replace(middle=_put(t.middle, rows, trial.middle), output=_put(t.output, rows, trial.output),
                                at_middle=_put(t.at_middle, rows, trial.at_middle),
                                at_output=_put(t.at_output, rows, trial.at_output),
                                output_pass=_put(t.output_pass, rows, trial.output_pass),
                                advanced=trial.advanced if every else _put(t.advanced, rows, trial.advanced))
        self.scale = self.scale.index_fill(0, rows, scale)


def _take(value, rows: Tensor | None):
    """Rows of a tensor or of a named tuple of tensors (None and plain values stay; rows None: all)."""
    if value is None or rows is None or not isinstance(value, (Tensor, tuple)):
        return value
    if isinstance(value, Tensor):
        return value[rows]
    return type(value)(*(_take(v, rows) for v in value))


def _put(value, rows: Tensor, new):
    """`value` with `rows` replaced by `new` (tensors or named tuples of them; None when either is None;
    plain values are taken from `new`)."""
    if value is None or new is None:
        return None
    if not isinstance(value, (Tensor, tuple)):
        return new
    if isinstance(value, Tensor):
        return new if rows.numel() == value.shape[0] else value.index_copy(0, rows, new)   # rows sorted, unique
    return type(value)(*(_put(v, rows, w) for v, w in zip(value, new)))


def _empty_output(x: Tensor, depth: int, detail: str | None) -> EncoderOutput:
    """The output of a batch of B = 0 samples: hidden (0, n, d) and, when asked for, (0, ·) float64 energies."""
    if detail is None:
        return EncoderOutput(hidden=x.clone())
    rows = lambda width: x.new_zeros(0, width, dtype=torch.float64)   # noqa: E731
    steps = {name: rows(depth) for name in ("attention_before", "attention_after", "ffn_before", "ffn_after")}
    return EncoderOutput(hidden=x.clone(), energies=rows(depth + 1), layer_before=rows(depth),
                         layer_after=rows(depth), step_scales=rows(depth).to(x.dtype),
                         **(steps if detail == "steps" else {}))


class _ModuleStack:
    """The layers as modules, in original coordinates (metric and released attention, other FFNs)."""

    def __init__(self, model: UnfoldedTransformer, X: Tensor, mask: Tensor | None, exact: bool = False):
        self.model, self.X, self.mask = model, X, mask
        # `exact`: energies from float64 copies of the layers at the float64 states (the steps stay in X's dtype)
        self.exact = [copy.deepcopy(layer).double() for layer in model.layers] \
            if exact and X.dtype != torch.float64 else None

    def run(self) -> Tensor:
        Y = self.X
        for ell in range(self.model.config.depth):
            Y = self.model.layer(ell)(Y, self.X, self.mask)
        return Y

    def start(self) -> Tensor:
        return self.X

    def trial(self, ell: int, Y: Tensor, rows: Tensor | None, carry, scale: float, substeps: bool,
              need_input: bool) -> LayerTrace:
        layer, X, mask = self.model.layer(ell), _take(self.X, rows), _take(self.mask, rows)
        if self.exact is not None:
            exact, X64 = self.exact[0 if self.model.config.tied else ell], X.double()
            terms = lambda Z: exact.energy_terms(Z.double(), X64, mask)   # noqa: E731
            trace = layer.traced(Y, X, mask, scale, substeps=False)
            return trace._replace(at_middle=terms(trace.middle) if substeps else None, at_output=terms(trace.output),
                                  at_input=terms(Y) if need_input else None)
        at_input = layer.energy_terms(Y, X, mask) if need_input else None
        return layer.traced(Y, X, mask, scale, substeps)._replace(at_input=at_input)

    def advance(self, ell: int, Y: Tensor, advanced: Tensor | None = None) -> Tensor:
        return Y

    def finish(self, Y: Tensor) -> Tensor:
        return Y


_DETAIL = {None: None, False: None, True: "curve", "curve": "curve", "steps": "steps"}


class UnfoldedTransformer(PretrainedMixin, nn.Module):
    """A Transformer whose layers are descent steps on an explicit energy (THEORY §3).

    Args:
        config: a `ModelConfig` (resolved here); `ModelConfig.preset("certified")` is the joint layer,
            tied, whose every layer lowers one energy E for any weights.
        layers: the layer modules to use (1 if tied, else `depth`), built from `config` when None
            (`CertifiedEncoder` passes its own).

    Example:
        >>> import torch, unfoldformer as uf
        >>> model = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified", d_model=64)).eval()
        >>> x = torch.randn(4, 32, 64)                              # (B, n, d)
        >>> pad = torch.zeros(4, 32, dtype=torch.bool)              # (B, n), True = padding
        >>> out = model(x, pad, return_energies=True)
        >>> out.hidden.shape, out.energies.shape                    # (B, n, d), (B, depth + 1) float64
        (torch.Size([4, 32, 64]), torch.Size([4, 7]))
    """

    def __init__(self, config: ModelConfig, *, layers: list[nn.Module] | None = None):
        super().__init__()
        config = config.resolved()
        if config.attention == "standard":
            raise ConfigError("the 'standard' preset is the baseline: build it with StandardTransformer "
                              "(or unfoldformer.classifier.build_encoder)")
        self.config = config
        n_layers = 1 if config.tied else config.depth
        if layers is not None and len(layers) != n_layers:
            raise ConfigError(f"a {'tied' if config.tied else 'untied'} model of depth {config.depth} takes "
                              f"{n_layers} layer module(s), got {len(layers)}")
        self.layers = nn.ModuleList(layers if layers is not None else (build_layer(config) for _ in range(n_layers)))

    def layer(self, index: int) -> UnfoldedLayer:
        return self.layers[0 if self.config.tied else index]

    def energy(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None = None, layer: int = 0) -> Tensor:
        """Total energy E_layer(Y) (anchored at X) as (B,) float64."""
        return self.layer(layer).energy(Y, X, padding_mask)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, *, return_energies: bool | str = False,
                safeguard: bool = False, max_halvings: int = 8) -> EncoderOutput:
        """Run the `depth` descent steps from x.

        Args:
            x: (B, n, d) inputs X = Y⁽⁰⁾, also the anchor of the energy.
            padding_mask: (B, n) bool, True marks padding (None: no padding).
            return_energies: False; True or "curve" for the energy at every depth; "steps" for the
                sub-step energies as well (module doc).
            safeguard: whole-layer descent by backtracking, at most `max_halvings` halvings per layer and
                sample (module doc); it returns the curve at least. The joint layer never needs it.
            max_halvings: the safeguard's halvings per layer step before the step is skipped.

        Returns:
            An `EncoderOutput`: `hidden` (B, n, d) and, when asked, `energies` (B, depth + 1) float64
            (tied: E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾); untied: each layer's own E_ℓ, so read `layer_before` /
            `layer_after` (B, depth) for the per-layer certificate).
        """
        valid = check_states(x, padding_mask)                        # the only check of the input
        check_dtype(x, self)
        if x.shape[-1] != self.config.d_model:
            raise ValueError(f"input has d={x.shape[-1]} but the model has d_model={self.config.d_model}")
        if max_halvings < 0:
            raise ConfigError(f"max_halvings must be >= 0, got {max_halvings}")
        if not isinstance(return_energies, (bool, str, type(None))) or return_energies not in _DETAIL:
            raise ConfigError(f"return_energies must be False, True (the energy curve), 'curve' or 'steps' "
                              f"(the curve and the sub-step energies), got {return_energies!r}")
        detail = _DETAIL[return_energies] or ("curve" if safeguard else None)
        if self.config.causal and (safeguard or detail == "steps"):
            raise ConfigError("a causal model lowers every token's conditional energy by construction (THEORY §3.11): "
                              "no safeguard and no sub-steps; return_energies=True gives the per-token energies")
        if x.shape[0] == 0:                                          # an empty batch: empty outputs
            return _empty_output(x, self.config.depth, detail)
        # orthogonal head bases computed once per forward, not per use; threads for the free cores (`threads.py`)
        with parametrize.cached(), free_core_threads() as threads:
            # energies of float32 (or lower) states are float64 evaluations of those states, for the safeguard's
            # decisions and for every reported curve alike (descent.py: their error is then far below the tolerance)
            exact = detail is not None and x.dtype != torch.float64
            rotated = JointStack if isinstance(self.layers[0], JointLayer) else RotatedStack
            stack = (rotated(self, x, valid, exact) if all(runs_rotated(layer) for layer in self.layers)
                     else _ModuleStack(self, x, padding_mask, exact))
            if detail is None:
                out = EncoderOutput(hidden=stack.run())
            elif self.config.causal:                                 # per-token conditional energies (`causal.py`)
                from .causal import causal_trace
                out = causal_trace(stack, self.config.depth)
            else:
                out = self._traced_forward(stack, detail == "steps", max_halvings if safeguard else None)
        if torch.is_grad_enabled():                                  # the backward pass at the forward's count
            hold_for_backward(vars(out).values(), threads)
        return out

    def _traced_forward(self, stack, substeps: bool, halvings: int | None) -> EncoderOutput:
        """All layers with their energy terms; `halvings` None: plain steps, else the safeguard."""
        steps: list[_Step] = []
        Y, carry, at_input = stack.start(), None, None
        skipped = torch.zeros(Y.shape[0], dtype=torch.bool, device=Y.device)
        tied = self.config.tied
        for ell in range(self.config.depth):
            step = self._step(stack, ell, Y, carry, at_input, substeps, halvings, skipped)
            # tied: E and the attention pass at Y⁽ℓ⁾ carry over to layer ℓ + 1 (same layer, same basis)
            carry, at_input = (step.trace.output_pass, step.trace.at_output) if tied else (None, None)
            Y = stack.advance(ell, step.trace.output, step.trace.advanced)
            # only the energy terms are kept past this layer: the states, passes and hidden layers go now, so
            # the forward holds O(1) of them instead of O(depth) (less memory, fresh pages and allocator churn)
            step.trace = step.trace._replace(middle=None, output=None, input_pass=None, output_pass=None,
                                             advanced=None)
            steps.append(step)
            if tied:   # same layer, same state: a sample skipped once stays skipped
                skipped = skipped | (step.scale == 0)
        stack_rows = lambda rows: torch.stack(rows, dim=1)          # noqa: E731  (B, depth)
        out = EncoderOutput(
            hidden=stack.finish(Y),
            energies=stack_rows([steps[0].at_input.total] + [s.trace.at_output.total for s in steps]),
            layer_before=stack_rows([s.at_input.total for s in steps]),
            layer_after=stack_rows([s.trace.at_output.total for s in steps]),
            step_scales=stack_rows([s.scale for s in steps]))
        if substeps:
            out.attention_before = stack_rows([s.at_input.attention for s in steps])
            out.attention_after = stack_rows([s.trace.at_middle.attention for s in steps])
            out.ffn_before = stack_rows([s.trace.at_middle.ffn for s in steps])
            out.ffn_after = stack_rows([s.trace.at_output.ffn for s in steps])
        return out

    def _step(self, stack, ell: int, Y: Tensor, carry, at_input: EnergyTerms | None, substeps: bool,
              halvings: int | None, skipped: Tensor) -> _Step:
        """Layer ℓ on every sample not `skipped` (those keep Y). With `halvings` (the safeguard), a sample
        whose energy rises is retried at half the step, up to `halvings` times, then keeps Y (scale 0).
        `at_input` None: the first trial computes E_ℓ at Y (it then runs on every sample), and its attention
        pass at Y becomes `carry` for the retries. A joint layer is never retried: its exact step descends at every
        α ∈ (0, 1], so a rise comes from rounding the new state (float32 near a fixed point: docs/theory.md,
        "Rounding the state"), which a shorter step does not remove; the sample keeps Y (scale 0) at once."""
        tol = descent_tolerance(Y.dtype)
        if halvings is not None and isinstance(self.layers[0], JointLayer):
            halvings = 0
        B = Y.shape[0]
        todo = torch.nonzero(~skipped).flatten()                    # samples still to be stepped
        step = None
        for attempt in range((halvings or 0) + 1):
            if todo.numel() == 0:
                break
            scale = 0.5 ** attempt
            rows = None if todo.numel() == B else todo
            trial = stack.trial(ell, _take(Y, rows), rows, _take(carry, rows), scale, substeps, at_input is None)
            if at_input is None:
                at_input = trial.at_input
            if halvings is None and rows is None:                   # no safeguard: every sample takes the step as
                return _Step(trial, at_input, Y.new_ones(B))        # it is (no copy into a kept trace)
            if carry is None and rows is None:
                carry = trial.input_pass
            if step is None:
                step = self._kept(Y, at_input, carry, substeps)
            step.accept(todo, trial, scale)
            if halvings is None:
                return step
            rose = ~lowered(at_input.total[todo], trial.at_output.total, tol)
            todo = todo[rose]
        if step is None:                                            # every sample skipped before this layer
            step = self._kept(Y, at_input, carry, substeps)
        if todo.numel():                                            # still rising: these samples keep Y
            kept = self._kept(Y, at_input, carry, substeps)
            step.accept(todo, _take(kept.trace, todo), 0.0)
        return step

    @staticmethod
    def _kept(Y: Tensor, at_input: EnergyTerms, carry, substeps: bool) -> _Step:
        """Every sample keeping Y: U = Y⁺ = Y, all energy terms those at Y, scale 0."""
        trace = LayerTrace(Y, Y, at_input if substeps else None, at_input, output_pass=carry)
        return _Step(trace, at_input, torch.zeros(Y.shape[0], dtype=Y.dtype, device=Y.device))

    @torch.no_grad()
    def released_normalize_(self) -> None:
        """Re-apply the released FFN normalisation (squares W_f again, as the released code does)."""
        for layer in self.layers:
            if isinstance(layer.ffn, ReleasedFFN):
                layer.ffn.normalize_()
