"""Models and presets (THEORY §3.5, §7.1): energies, safeguard, padding, spectrum, validation."""
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unfoldformer.layers import bounded_symmetric, released_normalize
from unfoldformer.model import (PRESETS, ModelConfig, SequenceClassifier, StandardTransformer, UnfoldedTransformer,
                                descent_tolerance, list_presets, masked_mean)

D64 = torch.float64


def small(name, **kw):
    base = dict(d_model=8, n_heads=1 if name != "certified" else 2, depth=4, ffn_hidden=16)
    return ModelConfig.preset(name, **{**base, **kw})


def inputs(seed=0, B=3, n=7, d=8, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, d, generator=g, dtype=D64) * scale
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[1, 5:] = True
    return x, pad


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("tied", [True, False])
def test_energies_match_the_layer_energy_functions(name, tied):
    torch.manual_seed(0)
    model = UnfoldedTransformer(small(name, tied=tied)).double().eval()
    x, pad = inputs()
    out = model(x, pad, return_energies=True)
    assert out.energies.shape == (3, 5) and out.energies.dtype == D64
    assert torch.allclose(out.energies[:, 0], model.energy(x, x, pad, layer=0))
    assert torch.allclose(out.energies[:, -1], model.energy(out.hidden, x, pad, layer=3))
    assert torch.allclose(out.layer_after, out.energies[:, 1:])
    assert torch.allclose(out.layer_before[:, 0], out.energies[:, 0])
    if tied:  # one energy: the state after layer ℓ is the state before layer ℓ + 1
        assert torch.allclose(out.layer_before[:, 1:], out.layer_after[:, :-1])
    U = model.layer(0).attention(x, x, pad)                           # first sub-step by hand
    assert torch.allclose(out.attention_after[:, 0], model.layer(0).attention_energy(U, x, pad))
    assert torch.allclose(out.ffn_before[:, 0], model.layer(0).ffn_energy(U, pad))
    assert torch.allclose(model(x, pad).hidden, out.hidden) or model.config.safeguard


def test_paper_preset_is_theory_consistent():
    cfg = ModelConfig.preset("paper")
    assert (cfg.d_model, cfg.depth, cfg.n_heads, cfg.tied, cfg.attention, cfg.ffn) == (300, 12, 1, True, "metric", "symmetric")
    torch.manual_seed(1)
    model = UnfoldedTransformer(small("paper")).double()
    layer = model.layer(0)
    x, pad = inputs(1)
    A = layer.attention.factors()[0]                                  # metric AᵀA in energy and attention
    a = x @ A.T
    soft = torch.softmax(a @ a.transpose(1, 2) - 0.5 * (a * a).sum(-1)[:, None, :]
                         + torch.zeros(3, 7, 7, dtype=D64).masked_fill(pad[:, None, :], float("-inf")), dim=-1)
    U = layer.attention(x, x, pad)
    assert torch.allclose(U[~pad], (soft @ x)[~pad])
    evals = torch.linalg.eigvalsh(layer.ffn.weight())
    assert evals.abs().max() <= 0.95 + 1e-9


@pytest.mark.parametrize("relu", [True, False])
def test_paper_sub_steps_never_raise_their_energy(relu):
    for seed in range(8):
        torch.manual_seed(seed)
        model = UnfoldedTransformer(small("paper", depth=12, relu=relu)).double()
        x, pad = inputs(seed, scale=2.0)
        out = model(x, pad, return_energies=True)
        tol = descent_tolerance(D64) * (1 + out.attention_before.abs())
        assert (out.attention_after <= out.attention_before + tol).all()
        if not relu:  # with ReLU the FFN step is a projected step on E_F + ι, whose ι is +∞ at Y⁽⁰⁾
            assert (out.ffn_after <= out.ffn_before + 1e-12 * (1 + out.ffn_before.abs())).all()


def released_energy_reference(Y, W, W_f, b):
    """E_rel from THEORY §7.1, written with explicit pair loops."""
    out = []
    for y in Y:
        e = sum(-torch.exp(-0.5 * ((y[i] - y[j]) @ W).pow(2).sum()) for i, j in itertools.combinations(range(len(y)), 2))
        e = e + 0.5 * (y @ W).pow(2).sum() + 0.5 * torch.trace(y @ W_f @ y.T) + 0.5 * (y - b).pow(2).sum()
        out.append(e)
    return torch.stack(out)


def test_released_formulas_exactly():
    torch.manual_seed(2)
    model = UnfoldedTransformer(small("paper-as-released", depth=1)).double()
    layer = model.layer(0)
    W, W_f, b = layer.attention.W, layer.ffn.W_f, layer.ffn.b
    assert torch.linalg.eigvalsh(0.5 * (W_f + W_f.T)).min() >= -1e-9       # normalised: PSD, ≤ 0.95
    assert torch.linalg.eigvalsh(0.5 * (W_f + W_f.T)).max() <= 0.95 + 1e-9
    x, _ = inputs(2)
    with torch.no_grad():
        assert torch.allclose(model.energy(x, x), released_energy_reference(x, W, W_f, b))
        U = torch.softmax(x @ W.T @ W @ x.transpose(1, 2), dim=-1) @ x     # attention uses WᵀW
        expected = torch.relu(-U @ (0.5 * (W_f + W_f.T)) + b)
        assert torch.allclose(model(x).hidden, expected)
        before = W_f.clone()
        model.released_normalize_()                                        # re-squares, as released
        assert torch.allclose(W_f, released_normalize(before))
        assert not torch.allclose(W_f, before)


def test_safeguard_makes_whole_layers_monotone_where_plain_layers_rise():
    rises_without, total = 0, 0
    for seed in range(12):
        torch.manual_seed(seed)
        cfg = small("certified", depth=6, tied=seed % 2 == 0, anchor_weight=0.05)
        model = UnfoldedTransformer(cfg).double().eval()
        with torch.no_grad():
            for layer in model.layers:
                layer.ffn.W1.mul_(4.0)          # strong FFNs that fight the attention energy
                layer.attention.log_scale.add_(1.0)
        x, pad = inputs(seed, scale=2.0)
        guarded = model(x, pad, return_energies=True)
        tol = descent_tolerance(D64) * (1 + guarded.layer_before.abs())
        assert (guarded.layer_after <= guarded.layer_before + tol).all()
        assert torch.isfinite(guarded.hidden).all()
        model.config.safeguard = False
        plain = model(x, pad, return_energies=True)
        rises_without += int((plain.layer_after > plain.layer_before + tol).sum())
        total += plain.layer_after.numel()
    print(f"without safeguard: {rises_without}/{total} layer steps raise the energy")
    assert rises_without > 0


@settings(max_examples=60, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), name=st.sampled_from(sorted(PRESETS)), extra=st.integers(1, 5))
def test_padding_changes_nothing_for_real_tokens(seed, name, extra):
    torch.manual_seed(seed)
    model = UnfoldedTransformer(small(name, depth=3)).double().eval()
    x, _ = inputs(seed, B=2, n=5)
    padded = torch.cat([x, 50 * torch.randn(2, extra, 8, dtype=D64)], dim=1)
    pad = torch.zeros(2, 5 + extra, dtype=torch.bool)
    pad[:, 5:] = True
    a = model(x, return_energies=True)
    b = model(padded, pad, return_energies=True)
    assert torch.allclose(b.hidden[:, :5], a.hidden, atol=1e-10)
    assert torch.allclose(b.energies, a.energies, rtol=1e-10, atol=1e-10)


def test_symmetric_ffn_spectrum_stays_inside_during_training():
    for method in ("clip", "scale"):
        torch.manual_seed(3)
        model = UnfoldedTransformer(small("paper", spectrum_method=method))
        ffn = model.layer(0).ffn
        opt = torch.optim.SGD([ffn.S], lr=50.0)
        x = torch.randn(4, 6, 8)
        for _ in range(15):
            loss = -model(x).hidden.pow(2).mean() - ffn.weight().trace()
            opt.zero_grad()
            loss.backward()
            opt.step()
            evals = torch.linalg.eigvalsh(model.layer(0).ffn.weight().detach().double())
            assert evals.abs().max() <= 0.95 + 1e-5


def test_bounded_symmetric_is_identity_inside_the_bound():
    S = torch.diag(torch.tensor([0.1, -0.5, 0.3], dtype=D64))
    assert torch.allclose(bounded_symmetric(S, 0.9, "clip"), S)
    assert torch.allclose(bounded_symmetric(S, 0.9, "scale"), S)
    assert torch.allclose(torch.linalg.eigvalsh(bounded_symmetric(5 * S, 0.9, "clip")),
                          torch.tensor([-0.9, 0.5, 0.9], dtype=D64))


def test_certified_presets_refuse_uncertified_step_sizes():
    with pytest.raises(ValueError, match=r"\(0, 1\].*THEORY §3.3"):
        ModelConfig.preset("certified", alpha_attention=1.5)
    with pytest.raises(ValueError, match=r"\(0, 2\).*F2"):
        ModelConfig.preset("certified", alpha_ffn=2.0)
    with pytest.raises(ValueError, match=r"\(0, 1\].*F1"):
        ModelConfig.preset("paper", alpha_ffn=1.2)
    with pytest.raises(ValueError, match=r"\(0, 1\].*Theorem A"):
        ModelConfig.preset("paper", rho="lp", alpha_attention=1.5)
    assert ModelConfig.preset("paper", alpha_attention=1.5).alpha_attention == 1.5  # PSD kernel: (0, 2)
    assert ModelConfig.preset("paper-as-released", alpha_attention=3.0)  # not certified: allowed


def test_bad_configs_and_inputs():
    with pytest.raises(ValueError, match="valid presets: paper"):
        ModelConfig.preset("bert")
    with pytest.raises(ValueError, match="unknown ModelConfig field"):
        ModelConfig.preset("paper", width=3)
    with pytest.raises(ValueError, match="depth"):
        ModelConfig.preset("paper", depth=0)
    with pytest.raises(ValueError, match="valid names"):
        ModelConfig.preset("paper", rho="cosine")
    with pytest.raises(ValueError, match="multiple of n_heads"):
        ModelConfig.preset("certified", d_model=10, n_heads=4)
    model = UnfoldedTransformer(small("certified"))
    with pytest.raises(ValueError, match="d_model=8"):
        model(torch.randn(1, 3, 5))
    with pytest.raises(ValueError, match="NaN"):
        model(torch.full((1, 3, 8), float("nan")))
    with pytest.raises(TypeError, match="floating"):
        model(torch.ones(1, 3, 8, dtype=torch.long))


def test_config_round_trip_and_registry():
    cfg = ModelConfig.preset("certified", depth=3)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.preset_name == "certified" and ModelConfig().preset_name is None
    legacy = {k: v for k, v in cfg.to_dict().items() if k != "preset_name"} | {"preset": "certified"}
    assert ModelConfig.from_dict(legacy) == cfg
    assert set(list_presets()) == {"paper", "paper-as-released", "certified"}


def test_classifier_and_baseline_shapes_and_pooling():
    torch.manual_seed(4)
    table = torch.randn(20, 6)
    ids = torch.randint(1, 20, (3, 5))
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:] = True
    for enc in (UnfoldedTransformer(small("certified")), StandardTransformer(8, 2, 2, 16)):
        clf = SequenceClassifier(enc, table, d_model=8, n_classes=2)
        logits, out = clf(ids, pad)
        assert logits.shape == (3, 2) and out.hidden.shape == (3, 5, 8)
        assert not clf.embedding.weight.requires_grad
    h = torch.randn(2, 4, 3)
    m = torch.tensor([[False, False, True, True], [False] * 4])
    assert torch.allclose(masked_mean(h, m)[0], h[0, :2].mean(0))
