"""Causal layers with per-head maps and free context keys (`keys="free"`, `causal.mapped_targets`).

Token i's conditional energy holds its context fixed, so the context's keys ȳ_j K_h may have their own map; the
preconditioned MM step with μ_h ≥ λ_max(A_hᵀA_h) lowers every token's energy for any A_h, K_h, and for any pair
weights e^{b_h(i − j)} of a relative bias (`relative_bias=K`). The references here are written from the formulas
with explicit pair differences, token by token."""
import pytest
import torch

import unfoldformer as uf
from unfoldformer.decoder import extend, prefill
from unfoldformer.lm.model import LanguageModel, LMConfig
from unfoldformer.metrics import spectral_bound
from unfoldformer.rho import get_rho

D, H = 8, 2
DH = D // H
EPS64 = torch.finfo(torch.float64).eps


def _model(seed, *, keys="free", tied=False, rho="exp", norm="none", depth=2, basis=False, spread=0.5, bias=0):
    cfg = uf.ModelConfig.preset("certified-causal", d_model=D, n_heads=H, depth=depth, ffn_hidden=16, metric="free",
                                keys=keys, tied=tied, rho=rho, attention_norm=norm, learn_basis=basis,
                                ffn_weight=0.7, anchor_weight=1.3, relative_bias=bias)
    torch.manual_seed(seed)
    model = uf.UnfoldedTransformer(cfg).double()
    with torch.no_grad():                                          # far from the symmetric start
        for p in model.parameters():
            p.add_(spread * torch.randn_like(p))
    return model


def _pair_weight(att, h, i, j):
    """e^{b_h(i − j)} of a relative bias (offsets past the table share its last entry); 1 without one."""
    table = att.pair_bias()
    return 1.0 if table is None else torch.exp(table[h, min(i - j, table.shape[1] - 1)].detach())


def _reference_layer(layer, Y, X, valid):
    """One causal step of `layer` (no basis) from THEORY's formulas, token by token and head by head."""
    att, ffn = layer.attention, layer.ffn
    A, K = att.metric_map.detach(), att.key_map.detach() if hasattr(att, "key_map") else None
    mu = spectral_bound(A)
    gamma, lam, r = float(layer.gamma), att.lam, get_rho(att.rho)
    out = X.clone()
    for b in range(Y.shape[0]):
        real = [j for j in range(Y.shape[1]) if valid[b, j]]
        for i in real:
            seen = [j for j in real if j <= i]
            w = 1.0 / len(seen) if att.length_norm else 1.0
            nu = lam * w / (1 + gamma)
            hidden = torch.relu(Y[b, i] @ ffn.W1.detach() + ffn.b.detach())
            p = (X[b, i] + gamma * hidden @ ffn.W1.detach().T) / (1 + gamma)        # (d,)
            for h in range(H):
                sl = slice(h * DH, (h + 1) * DH)
                c = Y[b, i, sl]
                q = A[h] @ c                                                      # c A_hᵀ as a column
                keys = [Y[b, j] @ K[h] if K is not None else A[h] @ Y[b, j, sl] for j in seen]
                beta = torch.stack([_pair_weight(att, h, i, j) * r.derivative(0.5 * (q - k).square().sum())
                                    for j, k in zip(seen, keys)])
                pull = beta.sum() * q - sum(bj * k for bj, k in zip(beta, keys))      # Σ_j β_ij (q_i − k_j)
                grad = nu * (A[h].T @ pull) + c - p[sl]
                out[b, i, sl] = c - grad / (nu * mu[h] * beta.sum() + 1)
    return out


def _reference_energy(layer, y, context, X, valid):
    """E_i(y_i | context) (B, n) from explicit differences, the library's units (THEORY's divided by λ)."""
    att, ffn = layer.attention, layer.ffn
    A, K = att.metric_map.detach(), att.key_map.detach() if hasattr(att, "key_map") else None
    gamma, lam, r = float(layer.gamma), att.lam, get_rho(att.rho)
    E = torch.zeros(y.shape[:2], dtype=torch.float64)
    for b in range(y.shape[0]):
        real = [j for j in range(y.shape[1]) if valid[b, j]]
        for i in real:
            seen = [j for j in real if j <= i]
            e = 0.0
            for h in range(H):
                sl = slice(h * DH, (h + 1) * DH)
                q = A[h] @ y[b, i, sl]
                for j in seen:
                    k = context[b, j] @ K[h] if K is not None else A[h] @ context[b, j, sl]
                    e = e + _pair_weight(att, h, i, j) * r.value(0.5 * (q - k).square().sum())
            if att.length_norm:
                e = e / len(seen)
            hidden = torch.relu(y[b, i] @ ffn.W1.detach() + ffn.b.detach())
            rest = 0.5 * (y[b, i] - X[b, i]).square().sum() + gamma * 0.5 * (y[b, i].square().sum()
                                                                               - hidden.square().sum())
            E[b, i] = e + rest / lam
    return E


CASES = [("free", "exp", "none", 0), ("free", "exp", "length", 0), ("free", "log", "none", 0),
         ("tied", "exp", "length", 0), ("free", "linear", "none", 0),
         ("free", "exp", "none", 4), ("tied", "exp", "length", 3), ("free", "log", "none", 9),
         ("free", "linear", "length", 2)]


@pytest.mark.parametrize("keys,rho,norm,bias", CASES)
@pytest.mark.parametrize("tokens", ["gaussian", "identical", "far", "one"])
def test_the_step_is_the_formula(keys, rho, norm, bias, tokens):
    """With a relative bias the table's entries are e^{±several}: b = 10·θ, θ ~ 0.5·N(0, 1)."""
    model = _model(1, keys=keys, rho=rho, norm=norm, bias=bias)
    n = 1 if tokens == "one" else 7
    X = torch.randn(2, n, D, dtype=torch.float64)
    if tokens == "identical":
        X = X[:, :1].expand(2, n, D).clone()
    if tokens == "far":
        X = X + 6.0 * torch.randn(2, 1, D, dtype=torch.float64)   # a common offset, R up to ~20
    pad = torch.zeros(2, n, dtype=torch.bool)
    if n > 1:
        pad[1, :3] = True                                          # left padding in the second sample
    with torch.no_grad():
        out = model(X, pad).hidden
        Y, valid = X.clone(), ~pad
        for ell in range(model.config.depth):
            Y = _reference_layer(model.layers[ell], Y, X, valid)
    # Gram-form logits err by ≤ (dh + 2)·eps·2R² (R² ≤ 400 here), which moves an average by ≤ 4R times that;
    # the rest is O(eps) per operation: 1e-9 relative is above both and far below any formula error.
    scale = 1 + float(Y.abs().max())
    assert (out - Y)[valid].abs().max() <= 1e-9 * scale
    assert torch.equal(out[pad], X[pad])                           # padded rows are the input's


@pytest.mark.parametrize("keys,bias", [("free", 0), ("tied", 0), ("free", 5), ("tied", 2)])
def test_the_energies_are_the_formula(keys, bias):
    model = _model(2, keys=keys, norm="length", bias=bias)
    X = torch.randn(2, 6, D, dtype=torch.float64)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, :2] = True
    with torch.no_grad():
        out = model(X, pad, return_energies=True)
        layer = model.layers[0]
        first = _reference_layer(layer, X, X, ~pad)
        before = _reference_energy(layer, X, X, X, ~pad)
        after = _reference_energy(layer, first, X, X, ~pad)
    tol = 1e-10 * (1 + before.abs().max())
    assert (out.token_before[:, 0] - before).abs().max() <= tol
    assert (out.token_after[:, 0] - after).abs().max() <= tol


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("rho", ["exp", "log"])
@pytest.mark.parametrize("bias", [0, 5])
def test_every_token_descends_for_any_maps(tied, rho, bias):
    """Many random maps, scales, pair biases and inputs, float64 and float32: no token's conditional energy rises
    at any layer beyond the dtype's descent tolerance, and most fall."""
    fell = 0
    for seed in range(12):
        model = _model(seed, tied=tied, rho=rho, depth=3, basis=seed % 2 == 1, spread=0.3 + seed / 4,
                       norm=("none", "length")[seed % 2], bias=bias)
        torch.manual_seed(100 + seed)
        X = torch.randn(3, 9, D, dtype=torch.float64) * (1 + seed)
        X[1, 4:] = X[1, 3]                                         # identical tokens
        for dtype in (torch.float64, torch.float32):
            with torch.no_grad():
                out = model.to(dtype)(X.to(dtype), return_energies=True)
            assert bool(out.token_lowered().all()), (seed, dtype)
            fell += int((out.token_after < out.token_before).sum())
        model.double()
    assert fell > 0.8 * 12 * 2 * 3 * 27


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("bias", [0, 4])
def test_the_cache_equals_the_full_forward(tied, bias):
    model = _model(3, tied=tied, depth=3, bias=bias)
    x = torch.randn(2, 10, D, dtype=torch.float64)
    with torch.no_grad():
        full = model(x).hidden
        first, cache = prefill(model, x[:, :3])
        rows = [first] + [extend(model, cache, x[:, t: t + 1]) for t in range(3, 10)]
    # the same sums in another order: a few units of round-off per layer and key
    assert (torch.cat(rows, 1) - full).abs().max() <= 64 * EPS64 * 10 * 3 * (1 + float(full.abs().max()))


def test_free_keys_start_as_the_tied_keys():
    free = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified-causal", d_model=D, n_heads=H, depth=2,
                                                        metric="free", keys="free", tied=False)).double()
    tied = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified-causal", d_model=D, n_heads=H, depth=2,
                                                        metric="free", keys="tied", tied=False)).double()
    state = {k: v for k, v in free.state_dict().items() if "key_map" not in k}
    tied.load_state_dict(state)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    with torch.no_grad():
        assert (free(x).hidden - tied(x).hidden).abs().max() <= 1e-12 * (1 + float(x.abs().max()))
        free.layers[0].attention.key_map.add_(0.3)                 # and a changed key map changes the function
        assert (free(x).hidden - tied(x).hidden).abs().max() > 1e-3


def test_refusals_and_old_configs():
    with pytest.raises(uf.ConfigError, match="only to a causal layer"):
        uf.ModelConfig.preset("certified", keys="free")
    with pytest.raises(uf.ConfigError, match="goes with metric='free'"):
        uf.ModelConfig.preset("certified-causal", keys="free")
    with pytest.raises(uf.ConfigError, match="keys must be one of"):
        uf.ModelConfig.preset("certified-causal", metric="free", keys="loose")
    old = uf.ModelConfig.preset("certified-causal").to_dict()
    old.pop("keys")                                                # a config saved before the field existed
    assert uf.ModelConfig.from_dict(old).keys == "tied"
    assert uf.ModelConfig.preset("certified").keys is None          # encoders carry no keys field value


@pytest.mark.parametrize("tied,bias", [(False, 0), (True, 12)])
def test_a_language_model_with_free_keys_round_trips(tmp_path, tied, bias):
    """Save / load, token descent and generation, with free keys (and a relative bias of random entries)."""
    cfg = uf.ModelConfig.preset("certified-causal", d_model=D, n_heads=H, depth=2, ffn_hidden=16, metric="free",
                                keys="free", tied=tied, attention_norm="none", relative_bias=bias)
    torch.manual_seed(0)
    lm = LanguageModel(LMConfig(vocab_size=11, context=12, decoder=cfg.to_dict()))
    if bias:
        with torch.no_grad():
            lm.decoder.layers[0].attention.relative_bias_table.normal_(0, 0.3)
    again = LanguageModel.from_pretrained(lm.save_pretrained(tmp_path / "lm"))
    ids = torch.randint(0, 11, (2, 12))
    with torch.no_grad():
        assert torch.equal(lm(ids)[0], again(ids)[0])
        out = lm.hidden(ids, return_energies=True)
    assert out.token_descent_share() == 1.0
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    sample = lm.generate(ids[:, :3], 5, generator=g1)
    assert sample.shape == (2, 8) and torch.equal(sample, again.generate(ids[:, :3], 5, generator=g2))


@pytest.mark.parametrize("bias", [0, 6])
def test_the_nn_style_layer_takes_free_keys(bias):
    torch.manual_seed(0)
    layer = uf.CertifiedDecoderLayer(D, H, 16, metric="free", keys="free", attention_norm="none",
                                     relative_bias=bias).double()
    with torch.no_grad():
        layer.decoder.layers[0].attention.key_map.add_(torch.randn(H, D, DH, dtype=torch.float64))
        if bias:
            layer.layer.attention.relative_bias_table.normal_(0, 0.3)
        out = layer(torch.randn(2, 5, D, dtype=torch.float64), return_energies=True)
    assert bool(out.token_lowered().all()) and bool((out.token_after < out.token_before).any())



# ----------------------------------------------------------------------------- relative biases (relative_bias=K)
def test_isotropic_heads_with_a_bias_are_the_map_step_with_scaled_identities():
    """The isotropic pass (`causal_targets`) with pair biases equals the map pass (`mapped_targets`, checked
    against the explicit formula above) at A_h = s_h I with tied keys (a diagonal metric: μ_h = s_h² exactly,
    where a free map's bound carries a 2^-20 margin): two code paths, one step."""
    kw = dict(d_model=D, n_heads=H, depth=2, ffn_hidden=16, tied=False, relative_bias=4, attention_norm="length")
    torch.manual_seed(5)
    iso = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified-causal", **kw)).double()
    mapped = uf.UnfoldedTransformer(uf.ModelConfig.preset("certified-causal", metric="diagonal", **kw)).double()
    with torch.no_grad():
        for a, b in zip(iso.layers, mapped.layers):
            a.attention.log_scale.copy_(torch.tensor([-0.3, 0.4], dtype=torch.float64))
            a.attention.relative_bias_table.normal_(0, 0.3)        # b = 10 θ: entries of a few units
            b.load_state_dict({k: v for k, v in a.state_dict().items() if "log_scale" not in k}, strict=False)
            b.attention.metric_diag.copy_(a.attention.scales()[:, None].expand(H, DH))
        x = torch.randn(3, 9, D, dtype=torch.float64)
        pad = torch.zeros(3, 9, dtype=torch.bool)
        pad[2, :4] = True
        got, want = iso(x, pad).hidden, mapped(x, pad).hidden
    # the same sums through two passes: round-off of the logits, O(10 eps) relative per operation
    assert (got - want).abs().max() <= 1e-12 * (1 + float(want.abs().max()))


@pytest.mark.parametrize("keys", ["free", "tied"])
def test_the_biased_pass_gets_its_exact_gradient(keys):
    """The pass with pair biases runs from explicit logits through `softmax.logit_softmax`, whose backward is
    written out (and autograd reaches b, which the fused kernel's backward would not for an additive mask):
    gradcheck against finite differences for every operand it reads — the bias table, the maps A_h and K_h, the
    input states — with left padding, ρ = exp and log."""
    from torch.func import functional_call
    for rho in ("exp", "log"):
        model = _model(6, rho=rho, bias=3, depth=2, keys=keys)
        x = torch.randn(2, 6, D, dtype=torch.float64)
        pad = torch.zeros(2, 6, dtype=torch.bool)
        pad[1, :2] = True                                          # left padding: rows with no visible real key
        names = ["layers.0.attention.relative_bias_table", "layers.1.attention.metric_map"]
        names += ["layers.1.attention.key_map"] if keys == "free" else []
        start = [model.get_parameter(name).detach().clone().requires_grad_(True) for name in names]

        def hidden(x_in, *tensors, model=model, names=names, pad=pad):
            return functional_call(model, dict(zip(names, tensors)), (x_in, pad)).hidden

        x_in = x.clone().requires_grad_(True)
        assert torch.autograd.gradcheck(hidden, (x_in, *start), eps=1e-6, atol=1e-7, rtol=1e-5)
        (g,) = torch.autograd.grad(hidden(x_in, *start).square().sum(), start[0])
        assert float(g.abs().max()) > 1e-3                       # the bias is a live parameter


def test_relative_bias_refusals_and_old_configs():
    with pytest.raises(uf.ConfigError, match="only to a causal layer"):
        uf.ModelConfig.preset("certified", relative_bias=8)
    for bad in (-1, True):
        with pytest.raises(uf.ConfigError, match="relative_bias must be"):
            uf.ModelConfig.preset("certified-causal", relative_bias=bad)
    old = uf.ModelConfig.preset("certified-causal").to_dict()
    old.pop("relative_bias")                                       # a config saved before the field existed
    assert uf.ModelConfig.from_dict(old).relative_bias == 0
    assert uf.ModelConfig.preset("certified").relative_bias is None
    plain = uf.UnfoldedTransformer(uf.ModelConfig.from_dict(old))
    assert not any("relative_bias" in k for k in plain.state_dict())


def test_an_untied_stack_bounds_every_layers_maps_in_one_call():
    """With autograd, `rotated._frames` takes the μ_h of all free-metric layers from one `spectral_bound` call over
    their maps stacked: each equals the layer's own bound (every head's squarings are its own matrices), and the
    gradient reaches every layer's map through it."""
    from unfoldformer.rotated import _frames
    model = _model(4, depth=3)                                     # untied, free metric: three layers of maps
    frames = _frames(model.layers, torch.float64)
    for f, layer in zip(frames, model.layers):
        assert torch.equal(f.mu, layer.attention.mu())
    sum(f.mu.sum() for f in frames).backward()
    for layer in model.layers:
        assert float(layer.attention.metric_map.grad.abs().max()) > 0
