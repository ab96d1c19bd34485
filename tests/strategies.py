"""Adversarial token sets for the fast-path-equals-formula and descent property tests (THEORY §3.10 (ii)).

One strategy, `token_sets`, draws a batch (Y, X, padding_mask) of shapes (B, n, d), (B, n, d) or None,
(B, n) (True = padded, the library's convention), in float32 or float64. Every batch is built in
float64 and then rounded once to its dtype, so a float64 reference evaluated on `Y.double()` sees
exactly the rounded inputs the fast path saw (`as_float64`).

Each sample of the batch is drawn from one of these shapes (all combined with a common offset and a
norm scale):

- ``gaussian``   i.i.d. N(0, 1) tokens;
- ``clusters``   2–3 tight groups (spread 1e-3…1) whose centres lie up to `max_offset` apart;
- ``identical``  every token the same vector (z_ij = 0 exactly: the diagonal and the off-diagonal
                 pairs have the same weight);
- ``duplicates`` a gaussian set in which some tokens repeat others exactly;

then Y = offset + scale · shape with a common offset of norm up to `max_offset` (drawn 0, small or large)
and scale log-uniform in [min_norm, max_norm] (1e-3 … 1e3 by default). Padding: none, random, or
all-but-one padded; at least one token of every sample is real. n = 1 is drawn often.

Usage::

    from strategies import token_sets, as_float64

    @given(batch=token_sets(d=8, with_input=True))
    def test_something(batch):
        Y, X, pad = batch                      # X is None unless with_input
        ...

Keep the scales in mind when deriving tolerances: `batch_scale(batch)` is max |Y| (and |X|), the
magnitude that enters float32 round-off of differences; z_ij can reach max_offset² (far clusters), so a
test of e^{−z} compares in the log domain or against a float64 reference on the same rounded input.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from hypothesis import strategies as st

__all__ = ["RHOS", "SHAPES", "TokenBatch", "as_float64", "batch_scale", "joint_models", "token_sets"]

SHAPES = ("gaussian", "clusters", "identical", "duplicates")
RHOS = ("exp", "log", "lp", "linear", "truncated")     # every built-in ρ (rho.RHO_FAMILY)


class TokenBatch(NamedTuple):
    """One drawn batch; unpacks as (Y, X, padding_mask)."""

    Y: torch.Tensor                     # (B, n, d) the state
    X: torch.Tensor | None              # (B, n, d) the input (anchor), or None
    padding_mask: torch.Tensor          # (B, n) bool, True = padded; every sample has a real token


def as_float64(batch: TokenBatch) -> TokenBatch:
    """The same (rounded) batch in float64, for the reference computation."""
    X = None if batch.X is None else batch.X.double()
    return TokenBatch(batch.Y.double(), X, batch.padding_mask)


def batch_scale(batch: TokenBatch) -> float:
    """max |entry| of Y (and X), at least 1: the magnitude behind the round-off of differences."""
    m = float(batch.Y.abs().max())
    if batch.X is not None:
        m = max(m, float(batch.X.abs().max()))
    return max(1.0, m)


def _sample(g: torch.Generator, shape: str, n: int, d: int, max_offset: float, scale: float,
            offset: torch.Tensor) -> torch.Tensor:
    """One sample (n, d) in float64."""
    if shape == "identical":
        base = torch.randn(1, d, generator=g, dtype=torch.float64).expand(n, d)
    elif shape == "clusters":
        k = int(torch.randint(2, 4, (1,), generator=g))
        far = max_offset * float(torch.rand(1, generator=g, dtype=torch.float64))
        centres = torch.randn(k, d, generator=g, dtype=torch.float64)
        centres = far * centres / centres.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        spread = 10.0 ** (-3 * float(torch.rand(1, generator=g, dtype=torch.float64)))
        which = torch.randint(0, k, (n,), generator=g)
        base = centres[which] + spread * torch.randn(n, d, generator=g, dtype=torch.float64)
        return offset + base                      # cluster distances are absolute (up to max_offset), not scaled
    else:
        base = torch.randn(n, d, generator=g, dtype=torch.float64)
        if shape == "duplicates" and n > 1:
            src = torch.randint(0, n, (n,), generator=g)
            copy = torch.rand(n, generator=g) < 0.5
            base = torch.where(copy[:, None], base[src], base)
    return offset + scale * base


@st.composite
def token_sets(draw, *, d: int | None = None, n: int | None = None, max_n: int = 8, max_batch: int = 3,
               dtype: torch.dtype | None = None, with_input: bool = False, max_offset: float = 1e3,
               min_norm: float = 1e-3, max_norm: float = 1e3, padding: bool = True,
               shapes: tuple[str, ...] = SHAPES) -> TokenBatch:
    """An adversarial batch (module doc). Fix `d`, `n`, `dtype` or leave them to be drawn (d in 1…8,
    n in 1…max_n with n = 1 often, dtype float32 or float64). `with_input`: X is drawn like Y, near
    it (Y = X + a perturbation of the same scale) or independent. `padding=False`: no padded tokens."""
    dtype = draw(st.sampled_from([torch.float32, torch.float64])) if dtype is None else dtype
    d = draw(st.integers(1, 8)) if d is None else d
    n = draw(st.one_of(st.just(1), st.integers(1, max_n))) if n is None else n
    B = draw(st.integers(1, max_batch))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    Ys, Xs = [], []
    for _ in range(B):
        shape = draw(st.sampled_from(shapes))
        log_norm = draw(st.floats(float(torch.tensor(min_norm).log10()), float(torch.tensor(max_norm).log10())))
        scale = 10.0 ** log_norm
        off_kind = draw(st.sampled_from(["none", "small", "large"]))
        off_norm = {"none": 0.0, "small": 1.0, "large": max_offset}[off_kind]
        direction = torch.randn(d, generator=g, dtype=torch.float64)
        offset = off_norm * direction / direction.norm().clamp_min(1e-300)   # (d,)
        Y = _sample(g, shape, n, d, max_offset, scale, offset)
        Ys.append(Y)
        if with_input:
            near = draw(st.booleans())
            X = Y + scale * torch.randn(n, d, generator=g, dtype=torch.float64) if near else \
                _sample(g, shape, n, d, max_offset, scale, offset)
            Xs.append(X)
    pad = torch.zeros(B, n, dtype=torch.bool)
    if padding and n > 1:
        for b in range(B):
            kind = draw(st.sampled_from(["none", "random", "all_but_one"]))
            keep = int(torch.randint(0, n, (1,), generator=g))
            if kind == "random":
                pad[b] = torch.rand(n, generator=g) < 0.4
            elif kind == "all_but_one":
                pad[b] = True
            pad[b, keep] = False                  # at least one real token
    Y = torch.stack(Ys).to(dtype)                 # (B, n, d) rounded once to dtype
    X = torch.stack(Xs).to(dtype) if with_input else None
    return TokenBatch(Y, X, pad)


@st.composite
def joint_models(draw, d: int, dtype: torch.dtype, *, depth: int = 2, positions: bool = True):
    """A random joint model on width d (import inside: the library is under test): every ρ, tied or untied,
    learned basis or contiguous heads, isotropic or free metrics, rotary positions or none, fixed or learned
    step sizes, and the corners the certificate's arithmetic meets: λ down to 1e-4 and γ down to 1e-6 (with
    tokens at offsets up to 1e3 from `token_sets`, the model then starts near a fixed point: Y⁺ ≈ X), scales
    e^{±2}, W₁ of any norm."""
    import math

    from unfoldformer.config import ModelConfig
    from unfoldformer.model import UnfoldedTransformer
    heads = [h for h in (1, 2, 4) if d % h == 0 and (d // h) % 2 == 0] or [1]
    rotary = positions and d % 2 == 0 and draw(st.booleans())
    heads = [h for h in heads if not rotary or (d // h) % 2 == 0] or [1]
    gamma = draw(st.sampled_from([0.0, 1e-6, 1e-3, 1.0, draw(st.floats(0.0, 10.0))]))
    overrides = dict(d_model=d, n_heads=draw(st.sampled_from(heads)), depth=depth, tied=draw(st.booleans()),
                     rho=draw(st.sampled_from(RHOS)), ffn_hidden=draw(st.sampled_from([1, 4, 16])),
                     learn_basis=draw(st.booleans()), layer="joint", ffn_weight=gamma,
                     anchor_weight=10.0 ** draw(st.floats(-4.0, 1.3)),
                     alpha_attention=draw(st.sampled_from([1.0, draw(st.floats(1e-3, 1.0))])),
                     attention_norm=draw(st.sampled_from(["none", "length"])),
                     metric=draw(st.sampled_from(["isotropic", "free"])),
                     positions="rotary" if rotary else "none")
    learned = None
    if gamma > 0 and draw(st.booleans()):
        overrides["learn_steps"] = True
        learned = draw(st.floats(-8.0, 8.0)), draw(st.floats(-6.0, 3.0))
    seed = draw(st.integers(0, 2**31 - 1))
    w_scale, b_scale, log_scale = draw(st.floats(0.05, 3.0)), draw(st.floats(0.0, 3.0)), draw(st.floats(-2.0, 2.0))
    torch.manual_seed(seed)
    model = UnfoldedTransformer(ModelConfig.preset("certified", **overrides)).to(dtype)
    with torch.no_grad():
        for lay in model.layers:
            lay.ffn.W1.normal_().mul_(w_scale / math.sqrt(lay.ffn.W1.shape[1]))
            lay.ffn.b.uniform_(-1, 1).mul_(b_scale)
            if hasattr(lay.attention, "log_scale"):
                lay.attention.log_scale.add_(log_scale)
            if lay.attention.basis is not None:
                lay.attention.basis.parametrizations.weight.original.normal_()
            if learned is not None:
                lay.step_logit.fill_(learned[0]), lay.ffn_weight_raw.fill_(learned[1])
    return model.eval()
