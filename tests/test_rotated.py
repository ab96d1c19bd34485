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


def _inputs(seed: int, B: int = 3, n: int = 6, pad_value: float | None = None, d: int = 8):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, d, generator=g, dtype=D64)
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
    "ffn": st.sampled_from(["tied", "none"]), "rho": st.sampled_from(["exp", "exp", "log"])})


@examples(200)
@given(seed=st.integers(0, 10**6), variant=VARIANTS, traced=st.booleans())
def test_rotated_stack_equals_the_module_path_outputs_and_gradients(seed, variant, traced):
    """Same parameters, same function: outputs (relative to their largest entry) and the gradient of every
    parameter and of the input (‖g − g_ref‖ / ‖g_ref‖ over all of them) agree to ≤ 1e-12 in float64, for
    tied/untied layers, both orthogonal maps, no learned basis, α = 1 and α ≠ 1, no FFN, and a ρ other
    than exp (whose steps run through the general path, in rotated coordinates). The traced forward's
    steps use the pass with the diagonal masked (the one its energies need), another rounding of the
    same function: its gradients agree to ≤ 1e-10 (measured ≤ 3e-12 over 150 random cases)."""
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
    G, R = torch.cat([g.flatten() for g in grads]), torch.cat([g.flatten() for g in ref_grads])
    assert float((G - R).norm() / R.norm()) <= (1e-10 if traced else 1e-12)


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


def _reference_terms(model, Y, X, pad, ell):
    """E_ℓ's terms at Y from the float64 Gram path (`method="gram"`) and float64 FFN sums, each with the
    magnitude of its summands (the scale its round-off follows): (attention, its scale, ffn, its scale)."""
    from unfoldformer import energy as E
    layer = model.layer(ell)
    att, ffn = layer.attention, layer.ffn
    e_attention = E.attention_energy(Y, att.factors(), att.rho, pad, method="gram")
    anchor = E.anchor_energy(Y, X, pad) / att.lam
    hidden_sq = E.norm_regularizer(torch.relu(Y @ ffn.W1 + ffn.b), pad)   # ½‖ReLU(Y W1 + b)‖²
    y_sq = E.norm_regularizer(Y, pad)
    return e_attention + anchor, e_attention.abs() + anchor, y_sq - hidden_sq, y_sq + hidden_sq


@pytest.mark.parametrize("tied, offset", [(True, 0.0), (False, 0.0), (True, 3.0)])
def test_float32_energies_agree_with_the_float64_reference_and_give_the_same_descent_flags(tied, offset):
    """Float32 states: every reported energy (curve and sub-steps, from the fused passes in rotated bases)
    is within 1e-5 of the float64 Gram path on the module path's states, relative to the magnitude of
    its summands, and the descent flags (layer steps, attention and FFN sub-steps) are identical; also
    when all tokens share a large common component (`offset` per coordinate, as embeddings often do)."""
    from unfoldformer.descent import descent_tolerance, lowered
    tol = descent_tolerance(torch.float32)
    rises, steps = 0, 0
    for seed in range(4):
        torch.manual_seed(seed)
        model = UnfoldedTransformer(small_config("certified", d_model=32, n_heads=4, ffn_hidden=64, depth=5,
                                                 tied=tied, anchor_weight=0.2))
        with torch.no_grad():
            for layer in model.layers:                               # strong FFNs: some layers rise
                layer.ffn.W1.mul_(1.5)
                layer.attention.log_scale.add_(0.5)
        x, pad = _inputs(seed, B=6, n=24, d=32)
        x = (x + offset * torch.randn(32, generator=torch.Generator().manual_seed(seed), dtype=D64)).float()
        terms = []                                                   # per layer: Y⁽ℓ⁻¹⁾, U⁽ℓ⁾, Y⁽ℓ⁾ terms
        with torch.no_grad():
            out = model(x, pad, return_energies="steps")
            with parametrize.cached():
                Y = x
                for ell in range(model.config.depth):
                    layer = model.layer(ell)
                    U = layer.attention(Y, x, pad)
                    Y_new = layer.ffn(U, pad)
                    terms.append([_reference_terms(model, Z, x, pad, ell) for Z in (Y, U, Y_new)])
                    Y = Y_new
        def col(state: int, i: int, terms=terms):                    # (B, depth)
            return torch.stack([t[state][i] for t in terms], dim=1)

        ref = {"attention_before": (col(0, 0), col(0, 1)), "attention_after": (col(1, 0), col(1, 1)),
               "ffn_before": (col(1, 2), col(1, 3)), "ffn_after": (col(2, 2), col(2, 3)),
               "layer_before": (col(0, 0) + col(0, 2), col(0, 1) + col(0, 3)),
               "layer_after": (col(2, 0) + col(2, 2), col(2, 1) + col(2, 3))}
        for key, (value, scale) in ref.items():
            assert ((getattr(out, key) - value).abs() <= 1e-5 * scale).all(), key
        for before, after in (("layer_before", "layer_after"), ("attention_before", "attention_after"),
                              ("ffn_before", "ffn_after")):
            flags = lowered(getattr(out, before), getattr(out, after), tol)
            assert torch.equal(flags, lowered(ref[before][0], ref[after][0], tol)), before
        layer_flags = lowered(ref["layer_before"][0], ref["layer_after"][0], tol)
        rises, steps = rises + int((~layer_flags).sum()), steps + layer_flags.numel()
    assert 0 < rises < steps                                         # the flags were compared both ways


@pytest.mark.parametrize("tied", [True, False])
def test_evaluation_reuses_the_frames_until_a_parameter_changes(tied):
    """Without autograd each layer's frame (basis, QᵀW1, scales) is computed once and reused; any in-place
    change of a parameter (an optimizer step, `load_state_dict`) or buffer is seen by the next forward, which
    then equals a freshly built model with the same parameters, bit for bit."""
    from unfoldformer.config import ModelConfig
    torch.manual_seed(0)
    cfg = ModelConfig.preset("certified", d_model=8, n_heads=2, depth=3, ffn_hidden=16, tied=tied)
    model = UnfoldedTransformer(cfg).eval()
    x = torch.randn(2, 5, 8)

    def fresh():
        other = UnfoldedTransformer(cfg).eval()
        other.load_state_dict(model.state_dict())
        return other(x).hidden

    with torch.no_grad():
        first = model(x).hidden
        cached = model.layers[0].__dict__["_frame_cache"][torch.float32][1]
        assert model(x).hidden.equal(first)
        assert model.layers[0].__dict__["_frame_cache"][torch.float32][1] is cached   # reused, not rebuilt
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(x).hidden.square().sum().backward()                          # with autograd: no cache involved
    opt.step()
    with torch.no_grad():
        after_step = model(x).hidden
        assert not after_step.equal(first) and after_step.equal(fresh())
        model.load_state_dict(UnfoldedTransformer(cfg).state_dict())    # every parameter replaced in place
        assert model(x).hidden.equal(fresh())
    with torch.inference_mode():
        assert model(x).hidden.equal(fresh())
