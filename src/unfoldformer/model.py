"""Model configuration, presets and models (THEORY §2, §3, §7).

- `ModelConfig`: a dataclass; `ModelConfig.preset(name, **overrides)` resolves a preset
  from `PRESETS` (`paper`, `paper-as-released`, `certified`) and validates it — certified
  presets refuse step sizes outside the range their theorem certifies.
- `UnfoldedTransformer`: one layer applied `depth` times (tied) or `depth` layers.
  `forward(x, padding_mask=None, return_energies=False)`; `padding_mask` is a bool (B, n)
  tensor in which **True marks padding** (PyTorch's key_padding_mask convention).
- `StandardTransformer`: the pre-LayerNorm `nn.TransformerEncoder` baseline.
- `SequenceClassifier`: token embeddings → encoder → masked mean pooling → linear head.

Energies returned with `return_energies=True` (all (B, ·) float64):
- `energies` (B, depth + 1). Tied: E(Y⁽ᵗ⁾) for t = 0 … depth, one energy throughout.
  Untied: entry 0 is E_1(Y⁽⁰⁾) and entry ℓ ≥ 1 is E_ℓ(Y⁽ℓ⁾), the energy of the layer
  that produced the state; descent of layer ℓ is `layer_after[:, ℓ-1] <= layer_before[:, ℓ-1]`.
- `layer_before`, `layer_after` (B, depth): E_ℓ(Y⁽ℓ⁻¹⁾) and E_ℓ(Y⁽ℓ⁾).
- `attention_before`, `attention_after` (B, depth): the attention term of E_ℓ at Y⁽ℓ⁻¹⁾ and
  at U⁽ℓ⁾ (after the attention step); `ffn_before`, `ffn_after`: the FFN term at U⁽ℓ⁾ and at Y⁽ℓ⁾.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .energy import check_states
from .layers import (AnchoredAttention, MetricAttention, ReleasedAttention, ReleasedFFN, SymmetricFFN,
                     TiedFFN, UnfoldedLayer)
from .rho import get_rho

ATTENTION_KINDS = ("anchored", "metric", "released")
FFN_KINDS = ("tied", "symmetric", "released", "none")


@dataclass
class ModelConfig:
    """Configuration of an unfolded Transformer. See `PRESETS` and `ModelConfig.preset`."""

    d_model: int = 128
    n_heads: int = 4
    depth: int = 6
    tied: bool = True
    rho: str = "exp"
    attention: str = "anchored"       # anchored | metric | released
    ffn: str = "tied"                 # tied (F2) | symmetric (F1) | released | none
    ffn_hidden: int = 512             # m of the tied FFN
    relu: bool = True                 # ReLU in F1 / released FFN
    anchor_weight: float = 1.0        # λ of anchored attention: E = E_A + E_FFN + λ⁻¹ ½‖Y − X‖²
    alpha_attention: float = 1.0
    alpha_ffn: float = 1.0            # α of F2 or η of F1
    spectrum_bound: float = 0.95      # F1: spec(W_F) ⊂ [−bound, bound]
    spectrum_method: str = "clip"     # clip | scale
    learn_basis: bool = True          # learned orthogonal head subspaces (else contiguous blocks)
    safeguard: bool = False           # backtracking at inference: whole-layer descent by construction
    safeguard_halvings: int = 8       # then the layer is skipped for that sample (scale 0)
    certified: bool = False           # validate step sizes against the theorems
    preset_name: str | None = None    # the preset this config was resolved from

    @classmethod
    def preset(cls, name: str, **overrides) -> "ModelConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s): {', '.join(sorted(unknown))}")
        cfg = cls(**{**PRESETS[name], **overrides, "preset_name": name})
        cfg.validate()
        return cfg

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        data = dict(data)
        if "preset" in data:  # configs saved before the field was renamed
            data["preset_name"] = data.pop("preset")
        cfg = cls(**data)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Raise ValueError on an inconsistent config; certified configs also check step sizes."""
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"unknown attention {self.attention!r}; valid: {', '.join(ATTENTION_KINDS)}")
        if self.ffn not in FFN_KINDS:
            raise ValueError(f"unknown ffn {self.ffn!r}; valid: {', '.join(FFN_KINDS)}")
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {self.depth}")
        if self.d_model < 1 or self.n_heads < 1 or self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be a positive multiple of n_heads={self.n_heads}")
        if self.attention == "anchored" and self.anchor_weight <= 0:
            raise ValueError(f"anchor_weight (λ) must be > 0, got {self.anchor_weight}")
        rho = get_rho(self.rho)
        if not 0 < self.spectrum_bound < 1:
            raise ValueError(f"spectrum_bound must lie in (0, 1) for a bounded-below F1 energy, got {self.spectrum_bound}")
        if self.certified:
            self._check_certified(rho.certified_alpha_max(), rho.name)

    def _check_certified(self, attn_max: float, rho_name: str) -> None:
        a, f = self.alpha_attention, self.alpha_ffn
        if self.attention == "anchored" and not 0 < a <= 1:
            raise ValueError(f"alpha_attention={a} is outside the certified range (0, 1] of anchored "
                             "attention (THEORY §3.3)")
        if self.attention == "metric" and not (0 < a <= 1 or (attn_max == 2.0 and 0 < a < 2)):
            rng = "(0, 2) for a PSD kernel" if attn_max == 2.0 else "(0, 1]"
            raise ValueError(f"alpha_attention={a} is outside the certified range {rng} of Theorem A "
                             f"(rho={rho_name}, THEORY §3.1)")
        if self.ffn == "tied" and not 0 < f < 2:
            raise ValueError(f"alpha_ffn={f} is outside the certified range (0, 2) of the tied FFN (THEORY §3.4, F2)")
        if self.ffn == "symmetric" and not 0 < f <= 1:
            raise ValueError(f"alpha_ffn (η)={f} is outside the certified range (0, 1] of the symmetric FFN "
                             "with spec(W_F) ⊂ (−1, 1) (THEORY §3.4, F1)")
        if self.attention == "released" or self.ffn == "released":
            raise ValueError("the released formulas are not certified; use preset 'paper-as-released' uncertified")


PRESETS: dict[str, dict] = {
    # The paper's model made theory-consistent: one PSD metric AᵀA for energy and attention,
    # key-norm bias, value = identity, one head, F1 with spectrum clipped to ±0.95, α = η = 1.
    "paper": dict(d_model=300, n_heads=1, depth=12, tied=True, attention="metric", ffn="symmetric",
                  relu=True, learn_basis=False, spectrum_bound=0.95, spectrum_method="clip",
                  alpha_attention=1.0, alpha_ffn=1.0, certified=True),
    # The formulas of the authors' released code, defects included (THEORY §7.1).
    "paper-as-released": dict(d_model=300, n_heads=1, depth=12, tied=True, attention="released",
                              ffn="released", relu=True, learn_basis=False, certified=False),
    # Certified multi-head anchored attention + tied FFN + safeguard at inference.
    "certified": dict(d_model=128, n_heads=4, depth=6, tied=True, attention="anchored", ffn="tied",
                      ffn_hidden=512, anchor_weight=1.0, alpha_attention=1.0, alpha_ffn=1.0,
                      learn_basis=True, safeguard=True, certified=True),
}


def descent_tolerance(dtype: torch.dtype) -> float:
    """Relative round-off allowance when comparing energies of states stored in `dtype`.

    Energies are accumulated in float64, but a state stored in float32 is rounded to
    ~6e-8 relative, which moves E by ~1e-7 relative at a fixed point. A rise counts only
    beyond tol·(1 + |E|): 1e-6 for float32/16 states, 1e-12 for float64 states.
    """
    return 1e-12 if dtype == torch.float64 else 1e-6


def lowered(before, after, tol: float):
    """True where `after` does not rise above `before` beyond tol·(1 + |before|).

    Works on tensors and numpy arrays alike; `tol` is usually `descent_tolerance(dtype)`.
    """
    return after <= before + tol * (1.0 + abs(before))


def list_presets() -> dict[str, dict]:
    return {name: dict(values) for name, values in PRESETS.items()}


def build_layer(cfg: ModelConfig) -> UnfoldedLayer:
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
    step_scales: Tensor | None = None  # (B, depth) safeguard step scale accepted per layer
    extras: dict = field(default_factory=dict)


class UnfoldedTransformer(nn.Module):
    """A Transformer whose layers are descent steps on an explicit energy (THEORY §3)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        self.config = config
        n_layers = 1 if config.tied else config.depth
        self.layers = nn.ModuleList(build_layer(config) for _ in range(n_layers))

    def layer(self, index: int) -> UnfoldedLayer:
        return self.layers[0 if self.config.tied else index]

    def energy(self, Y: Tensor, X: Tensor, padding_mask: Tensor | None = None, layer: int = 0) -> Tensor:
        """Total energy E_layer(Y) (anchored at X) as (B,) float64."""
        return self.layer(layer).energy(Y, X, padding_mask)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, return_energies: bool = False) -> EncoderOutput:
        """x: (B, n, d) inputs X = Y⁽⁰⁾; `padding_mask` (B, n) bool, True marks padding."""
        check_states(x, padding_mask)
        if x.shape[-1] != self.config.d_model:
            raise ValueError(f"input has d={x.shape[-1]} but the model has d_model={self.config.d_model}")
        guard = self.config.safeguard and not self.training
        with parametrize.cached():  # orthogonal head bases: computed once per forward, not per use
            if not (guard or return_energies):
                Y = x
                for ell in range(self.config.depth):
                    Y = self.layer(ell)(Y, x, padding_mask)[1]
                return EncoderOutput(hidden=Y)
            return self._forward_with_energies(x, padding_mask, guard)

    def _forward_with_energies(self, X: Tensor, mask: Tensor | None, guard: bool) -> EncoderOutput:
        keys = ("lb", "la", "ab", "aa", "fb", "fa", "scale")
        rows: dict[str, list[Tensor]] = {k: [] for k in keys}
        Y, totals = X, []
        att_y, ffn_y = None, None                                  # energy parts of layer ℓ at Y⁽ℓ⁻¹⁾
        frozen = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        for ell in range(self.config.depth):
            layer = self.layer(ell)
            if att_y is None or not self.config.tied:
                att_y, ffn_y = layer.attention_energy(Y, X, mask), layer.ffn_energy(Y, mask)
            if ell == 0:
                totals.append(att_y + ffn_y)
            U, Y_new, parts, scale = self._layer_step(layer, Y, X, mask, att_y, ffn_y, guard, frozen)
            att_u, ffn_u, att_n, ffn_n = parts
            for key, val in zip(keys, (att_y + ffn_y, att_n + ffn_n, att_y, att_u, ffn_u, ffn_n, scale)):
                rows[key].append(val)
            totals.append(att_n + ffn_n)
            Y, att_y, ffn_y = Y_new, att_n, ffn_n
            if self.config.tied:  # same layer, same state: a skipped sample stays skipped
                frozen = frozen | (scale == 0)
        stack = lambda key: torch.stack(rows[key], dim=1)          # (B, depth)
        return EncoderOutput(hidden=Y, energies=torch.stack(totals, dim=1), layer_before=stack("lb"),
                             layer_after=stack("la"), attention_before=stack("ab"), attention_after=stack("aa"),
                             ffn_before=stack("fb"), ffn_after=stack("fa"), step_scales=stack("scale"))

    def _layer_step(self, layer: UnfoldedLayer, Y: Tensor, X: Tensor, mask: Tensor | None,
                    att_y: Tensor, ffn_y: Tensor, guard: bool, frozen: Tensor):
        """One layer for the samples not `frozen`. With `guard`: per-sample backtracking on the
        step scale (halving); after `safeguard_halvings` failed halvings the sample keeps Y
        (scale 0), so its energy never rises. Frozen samples keep Y as well."""
        before = att_y + ffn_y
        tol = descent_tolerance(Y.dtype)
        scale = torch.zeros(Y.shape[0], dtype=Y.dtype, device=Y.device).masked_fill(~frozen, 1.0)
        U, Y_new = Y, Y
        parts = [att_y, ffn_y, att_y, ffn_y]
        todo = torch.nonzero(~frozen).flatten()
        for attempt in range(self.config.safeguard_halvings + 1 if guard else 1):
            if todo.numel() == 0:
                break
            if attempt:
                scale = scale.index_fill(0, todo, 0.5 ** attempt)
            sub_mask = None if mask is None else mask[todo]
            U_t, Y_t, ffn_u = layer.forward_with_ffn_energy(Y[todo], X[todo], sub_mask, scale[todo, None, None])
            parts_t = self._parts(layer, U_t, Y_t, X[todo], sub_mask, ffn_u)
            U, Y_new = U.index_copy(0, todo, U_t), Y_new.index_copy(0, todo, Y_t)
            parts = [p.index_copy(0, todo, q) for p, q in zip(parts, parts_t)]
            todo = todo[~lowered(before[todo], parts_t[2] + parts_t[3], tol)] if guard else todo[:0]
        if todo.numel():  # fallback: these samples keep Y
            scale = scale.index_fill(0, todo, 0.0)
            U, Y_new = U.index_copy(0, todo, Y[todo]), Y_new.index_copy(0, todo, Y[todo])
            parts = [p.index_copy(0, todo, q[todo]) for p, q in zip(parts, (att_y, ffn_y, att_y, ffn_y))]
        return U, Y_new, parts, scale

    @staticmethod
    def _parts(layer: UnfoldedLayer, U: Tensor, Y_new: Tensor, X: Tensor, mask: Tensor | None, ffn_u: Tensor):
        return (layer.attention_energy(U, X, mask), ffn_u,
                layer.attention_energy(Y_new, X, mask), layer.ffn_energy(Y_new, mask))

    @torch.no_grad()
    def released_normalize_(self) -> None:
        """Re-apply the released FFN normalisation (squares W_f again, as the released code does)."""
        for layer in self.layers:
            if isinstance(layer.ffn, ReleasedFFN):
                layer.ffn.normalize_()


class StandardTransformer(nn.Module):
    """Baseline: pre-LayerNorm `nn.TransformerEncoder` (same width, heads, FFN width, depth)."""

    def __init__(self, d_model: int, n_heads: int, depth: int, ffn_hidden: int, dropout: float = 0.0):
        super().__init__()
        block = nn.TransformerEncoderLayer(d_model, n_heads, ffn_hidden, dropout=dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(block, depth, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None, return_energies: bool = False) -> EncoderOutput:
        check_states(x, padding_mask)
        return EncoderOutput(hidden=self.encoder(x, src_key_padding_mask=padding_mask))


def masked_mean(hidden: Tensor, padding_mask: Tensor | None) -> Tensor:
    """Mean over real tokens: (B, n, d) -> (B, d); `padding_mask` True marks padding."""
    if padding_mask is None:
        return hidden.mean(dim=1)
    w = (~padding_mask).to(hidden.dtype)[..., None]               # (B, n, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp_min(1.0)


class SequenceClassifier(nn.Module):
    """Token embeddings → (linear map to d_model) → encoder → masked mean pooling → linear head.

    `embedding_table` (V, e) initialises the token embeddings, frozen unless
    `trainable_embeddings`; a linear map to the encoder width is added when e ≠ d_model
    (or when `project` is set).
    """

    def __init__(self, encoder: nn.Module, embedding_table: Tensor, d_model: int, n_classes: int = 2,
                 trainable_embeddings: bool = False, project: bool | None = None, pad_id: int = 0):
        super().__init__()
        self.embedding = nn.Embedding.from_pretrained(embedding_table.float(), freeze=not trainable_embeddings,
                                                      padding_idx=pad_id)
        e = embedding_table.shape[1]
        self.project = nn.Linear(e, d_model) if (project or e != d_model) else nn.Identity()
        self.encoder, self.head = encoder, nn.Linear(d_model, n_classes)

    def forward(self, ids: Tensor, padding_mask: Tensor | None = None, return_energies: bool = False):
        """ids (B, n) long; `padding_mask` (B, n) bool, True marks padding. Returns (logits (B, C), EncoderOutput)."""
        x = self.project(self.embedding(ids))                      # (B, n, d_model)
        out = self.encoder(x, padding_mask=padding_mask, return_energies=return_energies)
        return self.head(masked_mean(out.hidden, padding_mask)), out
