"""Anchored layers in their own bases (`rotated.py`): the same function, the same gradients, padding kept.

The reference is the stack of layer modules in original coordinates (`UnfoldedLayer.forward`:
`anchored_attention_step` with the head subspaces, `tied_ffn_step`), the path the model ran before.
"""
import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn.utils import parametrize

from conftest import D64, close_tol, examples, small_config
from unfoldformer import UnfoldedTransformer
from unfoldformer.rotated import RotatedStack, runs_rotated
from unfoldformer.softmax import logit_error_bound


def _model(seed: int, **overrides) -> UnfoldedTransformer:
    """A float64 certified model (d = 8, 2 heads, depth 3) with every parameter moved off its init."""
    torch.manual_seed(seed)
    model = UnfoldedTransformer(small_config("certified-alternating", depth=3, **overrides)).double()
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
    assert all(runs_rotated(layer) for layer in UnfoldedTransformer(small_config("certified-alternating")).layers)
    for name in ("paper", "paper-as-released"):
        assert not any(runs_rotated(layer) for layer in UnfoldedTransformer(small_config(name)).layers)
    symmetric = UnfoldedTransformer(small_config("certified-alternating", ffn="symmetric", ffn_hidden=None,
                                                 alpha_ffn=0.5))
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


def _gamma(k: int) -> float:
    """γ_k = k u / (1 − k u), u the float32 unit round-off: the relative error bound of a k-term float32 sum or
    dot product (Higham, Accuracy and Stability of Numerical Algorithms, Lemma 3.1 and §3.1)."""
    u = torch.finfo(torch.float32).eps / 2
    return k * u / (1 - k * u)


def _float32_error_bounds(stack: RotatedStack, ell: int, Z: torch.Tensor, ref) -> tuple[torch.Tensor, torch.Tensor]:
    """Bounds (B,) on the round-off of the traced forward's float32 evaluation of E_ℓ's attention (+ anchor) and
    FFN terms at the float32 state Z (B, n, d) in layer ℓ's basis; `ref` = `_reference_terms` there (float64).

    Attention: log S_i = LSE_j(logits) − ½‖a_i‖² carries at most `logit_error_bound(R², d_h)` + u log n
    (softmax.py, with R² the sample's largest ‖a_i‖² of its centred, scaled head features); rounding log S_i
    to float32 adds u|log S_i| ≤ u(R² + log n). Every S_i has the same sign in E_A = −½ Σ S_i, so
    |δE_A| ≤ (e^b − 1)|E_A|. Anchor ½‖Z − X̃‖²/λ: a float32 difference, square and d-term row sum, ≤ γ_{d+3}.
    FFN ½(Σ‖y‖² − Σ‖h‖²): ‖y‖² rows ≤ γ_{d+1}; h = ReLU(Z W̃ + b) with W̃ = QᵀW1 rounded in float32 moves each
    entry by δh ≤ γ_{2d+2} M, M = |Z|(|Q|ᵀ|W1|) + |b| (ReLU is 1-Lipschitz); then |δ(h²)| ≤ 2|h|δh + δh²,
    and the m-term row sums add γ_m. The float64 sums over tokens and the float64 reference add 64 ε₆₄ of
    the summands' magnitude."""
    f = stack.frame(ell)
    att = f.layer.attention
    valid = stack.valid
    u = torch.finfo(torch.float32).eps / 2
    n, d = Z.shape[1:]
    Zd = Z.double()
    # attention: the centred, scaled head features of the pass, in float64
    C = stack.heads(Z, att.H).double()                                    # (B, n, H, dh)
    w = valid.double()[..., None, None]
    mean = (C * w).sum(1, keepdim=True) / w.sum(1, keepdim=True).clamp_min(1)
    a_sq = ((C - mean) * f.scales.double()[:, None]).square().sum(-1)    # (B, n, H) ‖a_i‖²
    radius_sq = a_sq.where(valid[..., None], 0.0).flatten(1).amax(1)     # (B,)
    log_n = torch.log(torch.tensor(float(max(n, 2)), dtype=D64))
    b = logit_error_bound(radius_sq, C.shape[-1], torch.float32) + u * log_n + u * (radius_sq + log_n)
    X = stack.anchor(ell).double()
    anchor = 0.5 * (Zd - X).square().sum(-1).where(valid, 0.0).sum(1) / att.lam   # (B,)
    e_a = (ref[0] - anchor).abs()                                         # |E_A|
    bound_attention = torch.expm1(b) * e_a + _gamma(d + 3) * anchor
    # FFN
    Qa = torch.eye(d, dtype=D64) if f.Q is None else f.Q.double().abs()
    W1a, bias = f.W1.double().abs(), f.b.double()
    h = torch.relu(Zd @ f.W.double() + bias)                              # (B, n, m)
    M = Zd.abs() @ (Qa.T @ W1a) + bias.abs()
    dh = _gamma(2 * d + 2) * M
    m = h.shape[-1]
    y_sq = 0.5 * Zd.square().sum(-1)
    h_sq = 0.5 * h.square().sum(-1)
    rows = _gamma(d + 1) * y_sq + 0.5 * (2 * h * dh + dh.square()).sum(-1) + _gamma(m) * (h_sq + (h * dh).sum(-1))
    bound_ffn = rows.where(valid, 0.0).sum(1)
    slack = 64 * torch.finfo(D64).eps
    return bound_attention + slack * ref[1], bound_ffn + slack * ref[3]


@pytest.mark.parametrize("tied, offset", [(True, 0.0), (False, 0.0), (True, 3.0), (True, 1e3)])
def test_float32_energies_agree_with_the_float64_reference_and_give_the_same_descent_flags(tied, offset):
    """Float32 states: every reported energy (curve and sub-steps, from the fused passes in rotated bases)
    differs from the float64 Gram path at the same float32 states by at most its round-off bound
    (`_float32_error_bounds`, derived from the computation's operations and the data's magnitudes), and
    the descent flags (layer steps, attention and FFN sub-steps) are identical; also when all tokens
    share a large common component (`offset` per coordinate, as embeddings often do). The states come from
    the traced forward's own steps (`RotatedStack.trial`, `advance`), checked equal to the model's output
    to the bit, so the comparison measures the energies' evaluation alone."""
    from unfoldformer.descent import descent_tolerance, lowered
    tol = descent_tolerance(torch.float32)
    rises, steps, used = 0, 0, 0.0
    for seed in range(4):
        torch.manual_seed(seed)
        model = UnfoldedTransformer(small_config("certified-alternating", d_model=32, n_heads=4, ffn_hidden=64, depth=5,
                                                 tied=tied, anchor_weight=0.2))
        with torch.no_grad():
            for layer in model.layers:                               # strong FFNs: some layers rise
                layer.ffn.W1.mul_(1.5)
                layer.attention.log_scale.add_(0.5)
        x, pad = _inputs(seed, B=6, n=24, d=32)
        x = (x + offset * torch.randn(32, generator=torch.Generator().manual_seed(seed), dtype=D64)).float()
        terms, bounds = [], []                                       # per layer: at Y⁽ℓ⁻¹⁾, U⁽ℓ⁾, Y⁽ℓ⁾
        with torch.no_grad(), parametrize.cached():
            out = model(x, pad, return_energies="steps")
            stack = RotatedStack(model, x, ~pad)
            model64 = copy.deepcopy(model).double()                  # the same operators, converted exactly
            Y = stack.start()
            for ell in range(model.config.depth):
                trace = stack.trial(ell, Y, None, None, 1.0, True, True)
                f = stack.frame(ell)
                to_original = (lambda Z: Z.double()) if f.Q is None else (lambda Z, Q=f.Q: Z.double() @ Q.double().T)
                layer_terms = [_reference_terms(model64, to_original(Z), x.double(), pad, ell)
                               for Z in (Y, trace.middle, trace.output)]
                terms.append(layer_terms)
                bounds.append([_float32_error_bounds(stack, ell, Z, r)
                               for Z, r in zip((Y, trace.middle, trace.output), layer_terms)])
                Y = stack.advance(ell, trace.output)
            assert torch.equal(stack.finish(Y), out.hidden)         # the reference sits on the model's states

        def col(state: int, i: int, table=terms):                   # (B, depth)
            return torch.stack([t[state][i] for t in table], dim=1)

        ref = {"attention_before": (col(0, 0), col(0, 0, bounds)), "attention_after": (col(1, 0), col(1, 0, bounds)),
               "ffn_before": (col(1, 2), col(1, 1, bounds)), "ffn_after": (col(2, 2), col(2, 1, bounds)),
               "layer_before": (col(0, 0) + col(0, 2), col(0, 0, bounds) + col(0, 1, bounds)),
               "layer_after": (col(2, 0) + col(2, 2), col(2, 0, bounds) + col(2, 1, bounds))}
        for key, (value, bound) in ref.items():
            err = (getattr(out, key) - value).abs()
            assert (err <= bound).all(), (key, float((err / bound).max()))
            used = max(used, float((err / bound).max()))
        for before, after in (("layer_before", "layer_after"), ("attention_before", "attention_after"),
                              ("ffn_before", "ffn_after")):
            flags = lowered(getattr(out, before), getattr(out, after), tol)
            assert torch.equal(flags, lowered(ref[before][0], ref[after][0], tol)), before
        layer_flags = lowered(ref["layer_before"][0], ref["layer_after"][0], tol)
        rises, steps = rises + int((~layer_flags).sum()), steps + layer_flags.numel()
    assert 0 < rises < steps                                         # the flags were compared both ways
    assert used > 0                                                  # float32 evaluation error was measured


@pytest.mark.parametrize("tied", [True, False])
def test_evaluation_reuses_the_frames_until_a_parameter_changes(tied):
    """Without autograd each layer's frame (basis, QᵀW1, scales) is computed once and reused; any in-place
    change of a parameter (an optimizer step, `load_state_dict`) or buffer is seen by the next forward, which
    then equals a freshly built model with the same parameters, bit for bit."""
    from unfoldformer.config import ModelConfig
    torch.manual_seed(0)
    cfg = ModelConfig.preset("certified-alternating", d_model=8, n_heads=2, depth=3, ffn_hidden=16, tied=tied)
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


@pytest.mark.parametrize("alpha_ffn", [1.0, 0.5])
def test_untied_layers_pass_the_state_on_in_the_next_basis_and_the_safeguard_keeps_it(alpha_ffn):
    """Untied layers with α_ffn = 1 hand Y⁺ to the next layer through the FFN's output weight in the next
    basis, Q_{ℓ+1}ᵀ W1 (`next_weight`); with α_ffn < 1 (the step mixes in U) by the turn Q_ℓᵀ Q_{ℓ+1}. Either
    way the state is Y⁺ in the next basis (float64: equal to the turned state to round-off), plain, traced and
    safeguarded forwards that accept every full step return the same hidden states to the bit."""
    torch.manual_seed(0)
    model = UnfoldedTransformer(small_config("certified-alternating", d_model=16, n_heads=4, ffn_hidden=32, depth=4,
                                             tied=False,
                                             alpha_ffn=alpha_ffn)).eval()
    with torch.no_grad():
        for p in model.parameters():                                 # bases off the identity
            p.add_(0.1 * torch.randn_like(p))
    x, pad = _inputs(0, B=4, n=10, d=16)
    for dtype in (torch.float32, D64):
        model, X = model.to(dtype), x.to(dtype)
        with torch.no_grad(), parametrize.cached():
            stack = RotatedStack(model, X, ~pad)
            folded = [stack.next_weight(ell, 1.0) is not None for ell in range(4)]
            assert folded == [alpha_ffn == 1.0] * 4
            assert stack.next_weight(0, 0.5) is None                 # a halved step mixes in U: the turn
            plain = model(X, pad).hidden
            traced = model(X, pad, return_energies=True).hidden
            guarded = model(X, pad, safeguard=True)
            reference = _reference(model, X, pad)                    # the layer modules, turn by turn
        assert (guarded.step_scales == 1).all()
        assert torch.equal(plain, traced) and torch.equal(plain, guarded.hidden)
        if dtype == D64:
            assert _relative(plain, reference) <= close_tol(D64, 10)
