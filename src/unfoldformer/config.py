"""`ModelConfig`: the typed configuration of an encoder, and the preset registry `PRESETS`.

A config names a preset (`preset_name`) and overrides some of its fields; fields left `None`
take the preset's value. `resolved()` returns the complete config, and the models store that.
A field that the chosen attention or FFN does not use must stay `None`: setting it is an error,
not a silent no-op (`ModelConfig.preset("paper", anchor_weight=2)` fails, since the paper's
metric attention has no anchor). Types are checked on construction, ranges on resolution;
certified configs also refuse step sizes outside the range their theorem certifies (THEORY §3).

| preset              | attention (THEORY)        | FFN                    | notes                              |
|---------------------|---------------------------|------------------------|------------------------------------|
| `certified`         | anchored + tied FFN, one MM step §3.7 | (joint)    | the default; whole-layer descent    |
| `certified-alternating` | anchored §3.3          | tied W2 = W1ᵀ §3.4     | two sub-steps; layers: safeguard   |
| `certified-causal`  | the joint step, causal §3.11 | (joint, causal) | every token's conditional energy (decoder) |
| `paper`             | metric AᵀA, one head §3.1 | symmetric W_F (F1) §3.4 | the paper's model, theory-consistent |
| `paper-as-released` | released formulas §7.1    | released               | defects included, not certified    |
| `standard`          | pre-LN softmax attention  | GELU MLP               | the `nn.TransformerEncoder` baseline |
| `energy-transformer`| ET attention energy §8    | Hopfield energy §8     | peer: one block, T = depth gradient steps |
| `crate`             | MSSA (coding rate) §8     | ISTA step §8           | peer: CRATE, depth L untied layers  |

Whole-layer descent is a run-time option for the alternating layer: pass `safeguard=True` to the
model's forward (backtracking on the step size, THEORY §3.5). The joint layer (`layer="joint"`,
THEORY §3.7: one MM step on λE_A + ½‖Y − X‖² + γE_H, γ = `ffn_weight`, α = `alpha_attention`)
lowers its whole-layer energy by construction, so it never needs the safeguard. `learn_steps=True` learns
α = alpha_attention·σ(θ) and γ = softplus(φ) per layer (one pair for a tied model's steps), inside the
certified ranges for every θ, φ.
`attention_norm="length"` weights the attention term by 1/n (n = the sample's real tokens:
ν_h = λ s_h²/n), for either layer kind; every guarantee holds unchanged. `ffn_bound="spectral"` keeps
the tied FFN's ‖W1‖₂ ≤ 1 (W1 = V / max(1, ‖V‖₂), `layers.SpectralCap`;
this bounds τ = max_{‖v‖=1} ‖ReLU(vW1)‖ ≤ ‖W1‖₂, which decides boundedness), so that E_H ≥ −‖Y‖‖b‖ − ½‖b‖²
and the layer energy has a minimum instead of falling towards −∞ along directions W1 stretches.

Positions (THEORY §3.9, `positions.py`), any encoder: `positions="learned"` (a table of `max_positions`
rows) or `"sinusoidal"` are added to the input by `SequenceClassifier` (the encoders see X + P: a
different input, every guarantee holds); `"rotary"` rotates queries, keys and values inside certified
anchored attention (still certified) and queries and keys in the standard baseline.
Free metrics (THEORY §3.8, `metrics.py`), anchored attention: `metric="diagonal"` or `"free"` replaces the
per-head scale s_h by a map A_h (query = key = c A_hᵀ, value map A_hᵀA_h/μ_h), still certified.
Causal keys (`causal.py`), the causal joint layer with `metric="free"`: `keys="tied"` (query = key, THEORY §3.11)
or `"free"`: the context's keys ȳ_j K_h have their own map K_h (d × d/H per head). Token i's conditional energy
holds its context fixed, so any key map keeps every token's step certified (docs/theory.md, "Causal keys").
`relative_bias=K` (causal joint layer): K learned biases b_h(δ) per head for the offsets δ = i − j = 0 … K − 1
(larger offsets share b_h(K − 1)); each pair of token i's conditional energy is weighted by e^{b_h(i − j)} > 0,
which keeps every token's step certified (docs/theory.md, "Causal keys"); 0: none.
`position_prior=K` (anchored encoders, ρ = exp, either layer kind): K learned log-weights p_h(k) per head for the
real-token positions k = 0 … K − 1 (later ones share p_h(K − 1)); every pair (i, j) of E_A is weighted by
e^{p_h(i) + p_h(j)}: symmetric, so one energy of all tokens and every step stays certified, while a head can make
every token read one position (docs/theory.md, "Position priors"); 0: none.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass

from .contracts import check_positive, check_step
from .errors import ConfigError
from .metrics import METRICS  # anchored attention's per-head map A_h (§3.8)
from .names import current_preset, legacy_preset  # the 0.3.0 renames (`names.py`)
from .positions import POSITIONS  # §3.9; absolute ones are added to the input
from .rho import RHO_FAMILY, get_rho

__all__ = ["ATTENTION_KINDS", "ATTENTION_NORMS", "BASIS_MAPS", "CRATE_READOUTS", "FFN_BOUNDS", "FFN_KINDS",
           "FINAL_NORMS", "LAYER_KINDS", "ModelConfig", "PEER_ATTENTIONS", "PRESETS", "upgrade_peer_fields"]

ATTENTION_KINDS = ("anchored", "metric", "released", "standard", "energy-transformer", "crate")
BASIS_MAPS = ("exp", "cayley")
FFN_KINDS = ("tied", "symmetric", "released", "none", "standard", "hopfield", "ista")
LAYER_KINDS = ("alternating", "joint")      # anchored attention with the tied FFN: two sub-steps, or one (§3.7)
CAUSAL_KEYS = ("tied", "free")              # causal joint layer: keys = queries (§3.11) or the context's own map
ATTENTION_NORMS = ("none", "length")        # anchored attention: E_A weighted by 1, or by 1/n (§3.7)
FFN_BOUNDS = ("none", "spectral")           # tied FFN: W1 free, or ‖W1‖₂ ≤ 1 by parametrisation (E bounded below)
ROTARY_ATTENTIONS = ("anchored", "standard")

# Fields each attention / FFN kind uses, beyond the ones every encoder has.
_COMMON = ("d_model", "n_heads", "depth", "positions")
_UNFOLDED = ("tied", "certified")
_ATTENTION_FIELDS = {
    "anchored": ("rho", "anchor_weight", "alpha_attention", "learn_basis", "basis_map", "attention_norm",
                 "metric", "position_prior") + _UNFOLDED,
    "metric": ("rho", "alpha_attention", "learn_basis", "basis_map") + _UNFOLDED,
    "released": _UNFOLDED,
    "standard": ("dropout",),
    "energy-transformer": ("energy_step", "self_pair"),
    "crate": ("readout",),
}
_FFN_FIELDS = {
    "tied": ("ffn_hidden", "alpha_ffn", "ffn_bound"),
    "symmetric": ("alpha_ffn", "relu", "spectrum_bound", "spectrum_method"),
    "released": ("relu",),
    "none": (),
    "standard": ("ffn_hidden",),
    "hopfield": ("ffn_hidden",),
    "ista": ("ista_step", "ista_lambda"),
}

#: Values of fields that neither the user nor the preset sets.
DEFAULTS = dict(d_model=128, n_heads=4, depth=6, tied=True, rho="exp", anchor_weight=1.0, alpha_attention=1.0,
                learn_basis=True, basis_map="exp", ffn_hidden=512, alpha_ffn=1.0, relu=True, spectrum_bound=0.95,
                spectrum_method="clip", dropout=0.0, certified=False, energy_step=0.1, ista_step=0.1,
                ista_lambda=0.1, self_pair=True, readout="pool-norm", layer="alternating",
                ffn_weight=1.0, attention_norm="none", ffn_bound="none",
                positions="none", max_positions=512, metric="isotropic", learn_steps=False, causal=False,
                keys="tied", relative_bias=0, position_prior=0)
#: CRATE readouts: `pool-norm` (the published model: mean-pool the tokens, then the final LayerNorm) or
#: `norm-pool` (the final LayerNorm per token, then mean-pool; what version 0.2.0 ran).
CRATE_READOUTS = ("pool-norm", "norm-pool")
#: Where a classifier's readout puts its LayerNorm (`SequenceClassifier`, `model.final_norm`): on the mean-pooled
#: vector (the certified kinds' default), on every token before pooling, or nowhere.
FINAL_NORMS = ("pooled", "tokens", "none")
#: Values of the peer fields for configs written before the fields existed (version 0.2.0 and older).
_LEGACY_PEER_FIELDS = {"energy-transformer": ("self_pair", False), "crate": ("readout", "norm-pool")}
#: Attention kinds of the peer encoders (no certified energy descent; `peers.py`).
PEER_ATTENTIONS = ("energy-transformer", "crate")

PRESETS: dict[str, dict] = {
    # The joint MM layer (THEORY §3.7): anchored attention and the tied FFN in one step from one state,
    # γ = λ (the alternating layer's energy), attention weighted by 1/n (the prototype's better IMDB fit).
    # Whole-layer descent by construction; the recommended certified model.
    # A position prior of 64 ranks (docs/theory.md §4e) lets a head make every token read one position; it applies
    # where ρ = exp and the layer is an encoder's (elsewhere the preset's value resolves to 0).
    "certified": dict(d_model=128, n_heads=4, depth=6, tied=True, attention="anchored", ffn="tied",
                      rho="exp", ffn_hidden=512, anchor_weight=1.0, alpha_attention=1.0, learn_basis=True,
                      layer="joint", ffn_weight=1.0, attention_norm="length", position_prior=64, certified=True),
    # The alternating layer: anchored attention, then the tied FFN, two certified sub-steps (the paper's
    # layer shape); each sub-step lowers its own energy, the whole layer only with the run-time safeguard.
    "certified-alternating": dict(d_model=128, n_heads=4, depth=6, tied=True, attention="anchored", ffn="tied",
                                  rho="exp", ffn_hidden=512, anchor_weight=1.0, alpha_attention=1.0, alpha_ffn=1.0,
                                  learn_basis=True, certified=True),
    # The causal joint layer (THEORY §3.11): each token's conditional energy given the layer's input, lowered by one
    # MM step per token (a decoder); attention weighted by 1/m_i, m_i = the real tokens j ≤ i.
    "certified-causal": dict(d_model=128, n_heads=4, depth=6, tied=True, attention="anchored", ffn="tied",
                             rho="exp", ffn_hidden=512, anchor_weight=1.0, alpha_attention=1.0, learn_basis=True,
                             layer="joint", ffn_weight=1.0, attention_norm="length", causal=True, certified=True),
    # The paper's model made theory-consistent: one PSD metric AᵀA for energy and attention,
    # key-norm bias, value = identity, one head, F1 with spectrum clipped to ±0.95, α = η = 1.
    "paper": dict(d_model=300, n_heads=1, depth=12, tied=True, attention="metric", ffn="symmetric", rho="exp",
                  relu=True, learn_basis=False, spectrum_bound=0.95, spectrum_method="clip", alpha_attention=1.0,
                  alpha_ffn=1.0, certified=True),
    # The formulas of the authors' released code, defects included (THEORY §7.1).
    "paper-as-released": dict(d_model=300, n_heads=1, depth=12, tied=True, attention="released", ffn="released",
                              relu=True, certified=False),
    # The pre-LayerNorm `nn.TransformerEncoder` baseline (softmax attention, GELU MLP).
    "standard": dict(d_model=128, n_heads=4, depth=6, attention="standard", ffn="standard", ffn_hidden=512,
                     dropout=0.0),
    # Peer: the Energy Transformer (Hoover et al. 2023), one block applied `depth` = T times, step α.
    # The self pair B = C is kept in the attention energy, as in the authors' published code (THEORY §8).
    "energy-transformer": dict(d_model=128, n_heads=4, depth=6, attention="energy-transformer", ffn="hopfield",
                               ffn_hidden=512, energy_step=0.1, self_pair=True),
    # Peer: CRATE (Yu et al. 2023), `depth` layers of MSSA + one ISTA step (η, λ as published: 0.1, 0.1).
    # Readout as published: pool the tokens, then the final LayerNorm.
    "crate": dict(d_model=128, n_heads=4, depth=6, attention="crate", ffn="ista", ista_step=0.1, ista_lambda=0.1,
                  readout="pool-norm"),
}


@dataclass
class ModelConfig:
    """Configuration of an encoder: a preset plus overrides (see the module docstring).

    Build one with `ModelConfig.preset(name, **overrides)` (resolved) or `ModelConfig(preset_name=…,
    **overrides)` (resolved by the model). `None` = the preset's value, or "not used by this model".
    Presets: `certified` (the default: the joint layer, THEORY §3.7), `certified-alternating`, `paper`,
    `paper-as-released`, `standard`, `energy-transformer`, `crate` (`PRESETS`).

    Main fields: `d_model` (width d), `n_heads` (h, divides d), `depth` (T), `tied` (one layer applied T
    times: one energy; False: T layers, one energy each), `rho` (attention penalty: exp, log, linear, lp,
    truncated), `anchor_weight` (λ), `alpha_attention` (α), `ffn_hidden` (m), `layer` (joint |
    alternating), `ffn_weight` (γ of the joint layer), `alpha_ffn` (the alternating layer's FFN step),
    `attention_norm` (none | length), `positions`, `metric`, `learn_steps`, `certified` (refuse step
    sizes outside the certified ranges). Each field's comment in the source says what it does.

    Example:
        >>> import unfoldformer as uf
        >>> cfg = uf.ModelConfig.preset("certified", d_model=64, depth=4)
        >>> cfg.layer, cfg.tied, cfg.alpha_attention
        ('joint', True, 1.0)
        >>> uf.ModelConfig.preset("certified", alpha_attention=1.5)   # outside the certified range
        Traceback (most recent call last):
        unfoldformer.errors.ConfigError: ...
    """

    preset_name: str = "certified"   # the preset whose values fill the fields left None
    d_model: int | None = None
    n_heads: int | None = None
    depth: int | None = None
    tied: bool | None = None              # one layer applied `depth` times (unfolded models)
    rho: str | None = None                # attention penalty ρ (anchored, metric): exp | log | linear | lp | truncated
    attention: str | None = None          # anchored | metric | released | standard
    ffn: str | None = None                # tied (F2) | symmetric (F1) | released | none | standard
    anchor_weight: float | None = None    # λ of anchored attention: E = E_A + E_FFN + λ⁻¹ ½‖Y − X‖²
    alpha_attention: float | None = None  # attention step size α (anchored, metric)
    learn_basis: bool | None = None       # learned orthogonal head subspaces (else contiguous blocks)
    basis_map: str | None = None          # learned basis only: exp (matrix exponential) | cayley, of a skew matrix
    ffn_hidden: int | None = None         # hidden width m (tied FFN, standard MLP)
    alpha_ffn: float | None = None        # α of the tied FFN (F2) or η of the symmetric FFN (F1)
    relu: bool | None = None              # ReLU in the symmetric (F1) or released FFN
    spectrum_bound: float | None = None   # F1: spec(W_F) ⊂ [−bound, bound], bound < 1
    spectrum_method: str | None = None    # F1: clip (eigen-clip) | scale (spectral scaling)
    dropout: float | None = None          # standard baseline only
    certified: bool | None = None         # refuse step sizes outside the certified ranges
    energy_step: float | None = None      # Energy Transformer only: step α of x ← x − α ∂E/∂g
    ista_step: float | None = None        # CRATE only: ISTA step η
    ista_lambda: float | None = None      # CRATE only: ISTA sparsity weight λ (threshold ηλ)
    self_pair: bool | None = None         # Energy Transformer only: keep the key B = C in log Σ_B (published code)
    readout: str | None = None            # CRATE only: pool-norm (published) | norm-pool (LayerNorm, then pool)
    layer: str | None = None              # anchored + tied FFN: alternating (two sub-steps) | joint (one, §3.7)
    ffn_weight: float | None = None       # joint layer only: γ ≥ 0, E = λE_A + ½‖Y − X‖² + γE_H
    attention_norm: str | None = None     # anchored: none | length (E_A weighted by 1/n, n = real tokens)
    ffn_bound: str | None = None          # tied FFN: none | spectral (‖W1‖₂ ≤ 1 by parametrisation, E bounded below)
    positions: str | None = None          # none | learned | sinusoidal (added to the input) | rotary (§3.9)
    max_positions: int | None = None      # learned positions only: rows of the table (longest sequence)
    metric: str | None = None             # anchored: isotropic (s_h I) | diagonal | free per-head map A_h (§3.8)
    learn_steps: bool | None = None       # joint layer only: learned α ∈ (0, alpha_attention], γ > 0 per layer
    causal: bool | None = None            # joint layer only: token i sees j ≤ i, one MM step per token (§3.11)
    keys: str | None = None               # causal only: tied (q = k = v, §3.11) | free (context keys ȳ_j K_h)
    relative_bias: int | None = None      # causal only: K learned pair biases b_h(i − j) per head (0: none)
    position_prior: int | None = None     # anchored encoders, ρ = exp: K learned log-weights p_h(k) per head (0: none)

    def __post_init__(self) -> None:
        self.preset_name = current_preset(self.preset_name)     # an old name given now: warn, map
        _check_types(self)

    # --- construction
    @classmethod
    def preset(cls, name: str, **overrides) -> ModelConfig:
        """The resolved config of preset `name` with `overrides` (unknown fields are an error)."""
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown ModelConfig field(s): {', '.join(sorted(unknown))}")
        return cls(preset_name=name, **overrides).resolved()

    def resolved(self) -> ModelConfig:
        """Every field the model uses filled (explicit value, else the preset's, else the default), the
        others None; ranges validated. Raises ConfigError naming the field."""
        if self.preset_name not in PRESETS:
            raise ConfigError(f"unknown preset {self.preset_name!r}; valid presets: {', '.join(PRESETS)}")
        base = PRESETS[self.preset_name]
        attention = self.attention or base["attention"]
        ffn = self.ffn or base["ffn"]
        if attention not in ATTENTION_KINDS:
            raise ConfigError(f"unknown attention {attention!r}; valid: {', '.join(ATTENTION_KINDS)}")
        if ffn not in FFN_KINDS:
            raise ConfigError(f"unknown ffn {ffn!r}; valid: {', '.join(FFN_KINDS)}")
        layer = self.layer or base.get("layer", DEFAULTS["layer"])
        used = _used_fields(attention, ffn, layer, self.positions or base.get("positions", DEFAULTS["positions"]))
        kind = f" in a {layer} layer" if "layer" in used else ""
        values = {"preset_name": self.preset_name, "attention": attention, "ffn": ffn}
        for f in _architecture_fields():
            mine = getattr(self, f)
            if f not in used:
                if mine is not None:
                    raise ConfigError(f"{f} does not apply to attention {attention!r} with ffn {ffn!r}{kind} "
                                      f"(preset {self.preset_name!r}); this model uses: {', '.join(sorted(used))}")
                continue
            values[f] = mine if mine is not None else base.get(f, DEFAULTS[f])
        if "basis_map" in values and not values["learn_basis"]:
            if self.basis_map is not None:
                raise ConfigError("basis_map applies only to a learned basis (learn_basis=True); "
                                  f"preset {self.preset_name!r} here has learn_basis=False")
            values["basis_map"] = None
        if "causal" in values and not values["causal"]:
            if self.keys is not None:
                raise ConfigError("keys applies only to a causal layer (causal=True): an encoder's keys are its "
                                  "queries, or its energy is no longer one energy of all tokens")
            values["keys"] = None
            if self.relative_bias:
                raise ConfigError("relative_bias applies only to a causal layer (causal=True): an encoder's pair "
                                  "weights must be symmetric for its one energy of all tokens")
            values["relative_bias"] = None
        if self.position_prior is None and values.get("position_prior") and (values["rho"] != "exp"
                                                                            or values.get("causal")):
            values["position_prior"] = 0      # the preset's prior where it applies (ρ = exp encoders) only
        cfg = ModelConfig(**values)
        cfg._check_ranges()
        return cfg

    # --- (de)serialisation
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        """A config from `to_dict()` output. Dicts written by version 0.1.0 (every field filled, with
        `safeguard` keys) are read too: their run-time safeguard keys and the fields their model does
        not use are dropped. Saved dicts of versions before 0.3.0 keep their meaning (`legacy_preset`)."""
        data = legacy_preset(dict(data))
        if "safeguard" in data:                                   # version 0.1.0
            data.pop("safeguard"), data.pop("safeguard_halvings", None)
            base = PRESETS[data["preset_name"]]
            used = _used_fields(data.get("attention") or base["attention"], data.get("ffn") or base["ffn"],
                                "alternating")
            data = {k: v for k, v in data.items() if k in used or k not in _architecture_fields()}
        data = upgrade_peer_fields(data)
        if "ista_lambda" in data and "position_prior" not in data:   # a complete dict saved before the field
            data["position_prior"] = 0 if data.get("attention", "anchored") == "anchored" else None
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown ModelConfig field(s): {', '.join(sorted(unknown))}")
        return cls(**data).resolved()

    def uses(self, name: str) -> bool:
        """Whether the resolved model uses field `name`."""
        cfg = self.resolved()
        return getattr(cfg, name) is not None

    @property
    def is_unfolded(self) -> bool:
        """True for this project's energy-descent models (not the `standard` baseline, not the peers)."""
        return (self.attention or PRESETS[self.preset_name]["attention"]) not in ("standard", *PEER_ATTENTIONS)

    # --- validation
    def _check_ranges(self) -> None:
        positive_ints = ("d_model", "n_heads", "depth", "ffn_hidden")
        for name in positive_ints:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if self.d_model % self.n_heads:
            raise ConfigError(f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads}")
        if self.rho is not None and self.rho not in RHO_FAMILY:
            raise ConfigError(f"unknown rho {self.rho!r}; valid: {', '.join(RHO_FAMILY)}")
        for name in ("anchor_weight", "alpha_attention", "alpha_ffn", "energy_step", "ista_step"):
            if getattr(self, name) is not None:
                check_positive(name, getattr(self, name))
        if self.spectrum_bound is not None and not 0 < self.spectrum_bound < 1:
            raise ConfigError(f"spectrum_bound must lie in (0, 1) for a bounded-below F1 energy, "
                              f"got {self.spectrum_bound}")
        if self.basis_map is not None and self.basis_map not in BASIS_MAPS:
            raise ConfigError(f"basis_map must be one of {', '.join(BASIS_MAPS)}, got {self.basis_map!r}")
        if self.spectrum_method is not None and self.spectrum_method not in ("clip", "scale"):
            raise ConfigError(f"spectrum_method must be clip or scale, got {self.spectrum_method!r}")
        if self.layer is not None and self.layer not in LAYER_KINDS:
            raise ConfigError(f"layer must be one of {', '.join(LAYER_KINDS)}, got {self.layer!r}")
        if self.attention_norm is not None and self.attention_norm not in ATTENTION_NORMS:
            raise ConfigError(f"attention_norm must be one of {', '.join(ATTENTION_NORMS)}, "
                              f"got {self.attention_norm!r}")
        if self.ffn_bound is not None and self.ffn_bound not in FFN_BOUNDS:
            raise ConfigError(f"ffn_bound must be one of {', '.join(FFN_BOUNDS)}, got {self.ffn_bound!r}")
        if self.positions not in POSITIONS:
            raise ConfigError(f"positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")
        if self.relative_bias is not None and (isinstance(self.relative_bias, bool) or self.relative_bias < 0):
            raise ConfigError(f"relative_bias must be an integer >= 0 (offsets with a learned bias), got "
                              f"{self.relative_bias!r}")
        if self.position_prior is not None:
            if isinstance(self.position_prior, bool) or self.position_prior < 0:
                raise ConfigError(f"position_prior must be an integer >= 0 (positions with a learned log-weight), got "
                                  f"{self.position_prior!r}")
            if self.position_prior and self.rho != "exp":
                raise ConfigError(f"position_prior needs rho='exp' (the prior rides in the fused pass's key column), "
                                  f"got rho={self.rho!r}")
            if self.position_prior and self.causal:
                raise ConfigError("position_prior applies to encoders; a causal layer weights its pairs by "
                                  "relative_bias instead")
        if self.max_positions is not None and self.max_positions < 1:
            raise ConfigError(f"max_positions must be >= 1, got {self.max_positions}")
        if self.positions == "rotary":
            if self.attention not in ROTARY_ATTENTIONS:
                raise ConfigError(f"rotary positions apply to attention {' or '.join(ROTARY_ATTENTIONS)}, got "
                                  f"{self.attention!r} (use learned or sinusoidal positions)")
            if (self.d_model // self.n_heads) % 2:
                raise ConfigError(f"rotary positions need an even head width d_model/n_heads, got "
                                  f"{self.d_model // self.n_heads}")
            if self.attention == "anchored" and self.ffn not in ("tied", "none"):
                raise ConfigError("rotary anchored attention runs with the tied FFN or none")
        if self.metric is not None and self.metric not in METRICS:
            raise ConfigError(f"metric must be one of {', '.join(METRICS)}, got {self.metric!r}")
        if self.keys is not None and self.keys not in CAUSAL_KEYS:
            raise ConfigError(f"keys must be one of {', '.join(CAUSAL_KEYS)}, got {self.keys!r}")
        if self.keys == "free" and self.metric != "free":
            raise ConfigError(f"keys='free' goes with metric='free' (queries c_i A_hᵀ, context keys ȳ_j K_h), got "
                              f"metric={self.metric!r}")
        if self.causal and self.metric != "isotropic" and self.positions == "rotary":
            raise ConfigError(f"a causal layer with metric={self.metric!r} has no rotary path: use learned or "
                              "sinusoidal positions, or metric='isotropic'")
        if self.metric not in (None, "isotropic") and self.ffn not in ("tied", "none"):
            raise ConfigError(f"metric={self.metric!r} runs with the tied FFN or none")
        if self.ffn_weight is not None and not self.ffn_weight >= 0:
            raise ConfigError(f"ffn_weight must be a finite number >= 0, got {self.ffn_weight}")
        if self.learn_steps and not self.ffn_weight > 0:
            raise ConfigError(f"learn_steps learns γ = softplus(φ) > 0 from ffn_weight; it needs ffn_weight > 0, "
                              f"got {self.ffn_weight}")
        if self.ista_lambda is not None and not self.ista_lambda >= 0:
            raise ConfigError(f"ista_lambda must be a finite number >= 0, got {self.ista_lambda}")
        if self.readout is not None and self.readout not in CRATE_READOUTS:
            raise ConfigError(f"readout must be one of {', '.join(CRATE_READOUTS)}, got {self.readout!r}")
        if self.dropout is not None and not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout must lie in [0, 1), got {self.dropout}")
        pairs = {"energy-transformer": "hopfield", "crate": "ista"}
        for attention, ffn in pairs.items():
            if (self.attention == attention) != (self.ffn == ffn):
                raise ConfigError(f"attention {attention!r} goes with ffn {ffn!r} only (a peer encoder), got "
                                  f"attention {self.attention!r} with ffn {self.ffn!r}")
        if self.attention == "released":
            if self.n_heads != 1:
                raise ConfigError(f"the released attention has one head, got n_heads={self.n_heads}")
            if self.certified:
                raise ConfigError("the released formulas are not certified; use preset 'paper-as-released' "
                                  "with certified=False")
        if self.certified:
            self._check_certified()

    def _check_certified(self) -> None:
        """Step sizes inside their certified ranges: the checker (and message) the step functions use."""
        if self.attention in ("anchored", "metric"):
            kind = "joint" if self.layer == "joint" else self.attention
            check_step("alpha_attention", self.alpha_attention, kind, get_rho(self.rho))
        if self.ffn in ("tied", "symmetric") and self.alpha_ffn is not None:    # a joint layer has one α
            check_step("alpha_ffn", self.alpha_ffn, self.ffn)


def upgrade_peer_fields(data: dict, attention: str | None = None) -> dict:
    """A config dict written before the peer fields `self_pair` / `readout` existed (it lists every other
    field, as `to_dict` does) gets the value that version ran: the ET without the self pair, CRATE's
    LayerNorm before pooling. Dicts that name the field, or list only some fields, are returned as they are."""
    base = PRESETS.get(data.get("preset_name") or "certified", {})
    attention = attention or data.get("attention") or base.get("attention")
    if attention not in _LEGACY_PEER_FIELDS or "ista_lambda" not in data:    # not a complete to_dict() output
        return data
    name, legacy = _LEGACY_PEER_FIELDS[attention]
    return data if name in data else {**data, name: legacy}


def _used_fields(attention: str, ffn: str, layer: str, positions: str = "none") -> set[str]:
    """Fields a model of these attention and FFN kinds uses (`layer`: the layer kind it resolves to,
    `positions`: its position scheme)."""
    used = set(_COMMON) | set(_ATTENTION_FIELDS.get(attention, ())) | set(_FFN_FIELDS.get(ffn, ()))
    if positions == "learned":
        used.add("max_positions")
    if attention == "anchored" and ffn == "tied":
        used.add("layer")
        if layer == "joint":          # one step of size alpha_attention; γ weights the FFN term
            used = (used - {"alpha_ffn"}) | {"ffn_weight", "learn_steps", "causal", "keys",
                                                    "relative_bias"}
    return used


def _architecture_fields() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(ModelConfig)
                 if f.name not in ("preset_name", "attention", "ffn"))


def _check_types(cfg) -> None:
    """Raise ConfigError for a field whose value has the wrong type (ints for floats are converted)."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        allowed = set(typing.get_args(hints[f.name])) or {hints[f.name]}
        if value is None and type(None) in allowed:
            continue
        if float in allowed and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
            setattr(cfg, f.name, value)
        kind = next((t for t in allowed if t is not type(None)), object)
        ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
        if not ok:
            raise ConfigError(f"{f.name} must be of type {kind.__name__}, got {value!r} ({type(value).__name__})")
        if kind is float and not math.isfinite(value):
            raise ConfigError(f"{f.name} must be a finite number, got {value}")
