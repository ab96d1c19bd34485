"""Anchored layers in their own bases (`rotated.py`): the same function, the same gradients, padding kept.

The reference is the stack of layer modules in original coordinates (`UnfoldedLayer.forward`:
`anchored_attention_step` with the head subspaces, `tied_ffn_step`), the path the model ran before.
"""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.utils import parametrize

from conftest import D64, examples, small_config
from unfoldformer import UnfoldedTransformer
from unfoldformer.rotated import RotatedStack, runs_rotated


def _model(seed: int, **overrides) -> UnfoldedTransformer:
    """A float64 certified model (d = 8, 2 heads, depth 3) with every parameter moved off its init."""
    torch.manual_seed(seed)
    model = UnfoldedTransformer(small_config("certified", depth=3, **overrides)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _inputs(seed: int, B: int = 3, n: int = 6, pad_value: float | None = None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, 8, generator=g, dtype=D64)
    pad = torch.rand(B, n, generator=g) < 0.35
    pad[0] = False                                                   # one row without padding
    pad[-1, 1:] = True                                               # one row with a single real token
    if pad_value is not None:
        x = x.masked_fill(pad[..., None], pad_value)
    return x, pad


def _reference(model: UnfoldedTransformer, x, pad):
    """The module path: every layer in original coordinates."""
    with parametrize.cached():
        Y = x
        for ell in range(model.config.depth):
            Y = model.layer(ell)(Y, x, pad)
    return Y


def _output_and_grads(model, run, x, pad, weights):
    """Output of `run` and the gradients of ⟨output, weights⟩ (real rows) w.r.t. every parameter and x."""
    model.zero_grad()
    x = x.clone().requires_grad_(True)
    Y = run(x)
    (Y.where(~pad[..., None], 0.0) * weights).sum().backward()
    return Y.detach(), [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]


def _relative(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


VARIANTS = st.fixed_dictionaries({
    "tied": st.booleans(), "learn_basis": st.booleans(), "basis_map": st.sampled_from(["exp", "cayley"]),
    "alpha_attention": st.sampled_from([1.0, 0.6]), "alpha_ffn": st.sampled_from([1.0, 0.5, 1.7]),
    "ffn": st.sampled_from(["tied", "none"])})


@examples(200)
@given(seed=st.integers(0, 10**6), variant=VARIANTS, traced=st.booleans())
def test_rotated_stack_equals_the_module_path_outputs_and_gradients(seed, variant, traced):
    """Same parameters, same function: outputs and all gradients agree to float64 round-off (≤ 1e-12
    relative) for tied/untied layers, both orthogonal maps, no learned basis, α = 1 and α ≠ 1, no FFN."""
    variant = dict(variant)
    if not variant["learn_basis"]:
        variant.pop("basis_map")
    if variant["ffn"] == "none":
        variant.pop("alpha_ffn")
        variant["ffn_hidden"] = None
    model = _model(seed, **variant)
    x, pad = _inputs(seed)
    weights = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1), dtype=D64)
    fast = (lambda z: model(z, pad, return_energies="steps").hidden) if traced else (lambda z: model(z, pad).hidden)
    out, grads = _output_and_grads(model, fast, x, pad, weights)
    ref_out, ref_grads = _output_and_grads(model, lambda z: _reference(model, z, pad), x, pad, weights)
    assert _relative(out, ref_out) <= 1e-12
    for g, ref in zip(grads, ref_grads):
        assert _relative(g, ref) <= 1e-12


@pytest.mark.parametrize("pad_value", [1e30, -1e300, 0.0])
@pytest.mark.parametrize("tied", [True, False])
def test_padded_rows_never_feed_real_rows(pad_value, tied):
    """Padded rows holding huge values change no real output and no gradient, stay finite everywhere,
    and are returned unchanged (as the module path returns them)."""
    model = _model(3, tied=tied)
    x, pad = _inputs(3, pad_value=0.0)
    huge = x.masked_fill(pad[..., None], pad_value)
    weights = torch.randn(x.shape, dtype=D64)
    run = lambda z: model(z, pad, return_energies="steps").hidden   # noqa: E731
    out, grads = _output_and_grads(model, run, x, pad, weights)
    out_huge, grads_huge = _output_and_grads(model, run, huge, pad, weights)
    assert torch.equal(out_huge[pad], huge[pad])                       # padded rows returned unchanged
    assert torch.equal(out_huge[~pad], out[~pad])                      # real rows: bit for bit the same
    for g, g_huge in zip(grads[:-1], grads_huge[:-1]):
        assert torch.isfinite(g_huge).all() and torch.equal(g, g_huge)
    energies = model(huge, pad, return_energies="steps")
    assert torch.equal(energies.energies, model(x, pad, return_energies="steps").energies)


def test_rotated_stack_runs_the_certified_layers_only():
    assert all(runs_rotated(layer) for layer in UnfoldedTransformer(small_config("certified")).layers)
    for name in ("paper", "paper-as-released"):
        assert not any(runs_rotated(layer) for layer in UnfoldedTransformer(small_config(name)).layers)
    symmetric = UnfoldedTransformer(small_config("certified", ffn="symmetric", ffn_hidden=None, alpha_ffn=0.5))
    assert not runs_rotated(symmetric.layers[0])


def test_inputs_are_rotated_once_per_distinct_layer():
    """X Q is formed once per forward for tied layers (one basis), once per layer for untied ones."""
    for tied, expected in ((True, 1), (False, 3)):
        model = _model(0, tied=tied)
        x, pad = _inputs(0)
        with parametrize.cached():
            stack = RotatedStack(model, x, ~pad)
        assert len(stack.anchors) == expected
        Q = model.layers[0].attention.basis.weight
        assert torch.allclose(stack.anchors[0], x.where(~pad[..., None], 0.0) @ Q, rtol=0, atol=1e-14)
