"""`UnfoldedTransformer` (THEORY §3, §3.5): energies, sub-steps, the safeguard, padding, spectrum, inputs."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from conftest import D64, assert_close, examples, random_inputs, rises, small_config
from unfoldformer import ConfigError, UnfoldedTransformer
from unfoldformer.descent import descent_tolerance

UNFOLDED = ("certified-alternating", "paper", "paper-as-released")   # the layers with attention and FFN sub-steps


@pytest.mark.parametrize("name", UNFOLDED)
@pytest.mark.parametrize("tied", [True, False])
def test_energies_match_the_layer_energy_functions(name, tied):
    torch.manual_seed(0)
    model = UnfoldedTransformer(small_config(name, tied=tied)).double().eval()
    x, pad = random_inputs()
    out = model(x, pad, return_energies="steps")
    assert out.energies.shape == (3, 5) and out.energies.dtype == D64
    assert torch.allclose(out.energies[:, 0], model.energy(x, x, pad, layer=0))
    assert torch.allclose(out.energies[:, -1], model.energy(out.hidden, x, pad, layer=3))
    assert torch.allclose(out.layer_after, out.energies[:, 1:])
    assert torch.allclose(out.layer_before[:, 0], out.energies[:, 0])
    if tied:  # one energy: the state after layer ℓ is the state before layer ℓ + 1
        assert torch.allclose(out.layer_before[:, 1:], out.layer_after[:, :-1])
    layer = model.layer(0)
    U = layer.attention(x, x, pad)                                    # first sub-step by hand
    assert torch.allclose(out.attention_after[:, 0], layer.attention.energy(U, x, pad))
    assert torch.allclose(out.ffn_before[:, 0], layer.ffn_energy(U, pad))
    assert_close(model(x, pad).hidden.detach(), out.hidden.detach())  # energies change nothing (to round-off)
    assert torch.equal(out.step_scales, torch.ones(3, 4, dtype=D64))   # the documented field without the safeguard


@pytest.mark.parametrize("relu", [True, False])
def test_paper_sub_steps_never_raise_their_energy(relu):
    for seed in range(8):
        torch.manual_seed(seed)
        model = UnfoldedTransformer(small_config("paper", depth=12, relu=relu)).double()
        x, pad = random_inputs(seed, scale=2.0)
        out = model(x, pad, return_energies="steps")
        assert not rises(out.attention_before, out.attention_after).any()
        if not relu:  # with ReLU the FFN step is a projected step on E_F + ι, whose ι is +∞ at Y⁽⁰⁾
            assert not rises(out.ffn_before, out.ffn_after).any()


def _fighting_model(seed: int) -> UnfoldedTransformer:
    """A certified model whose strong FFNs fight the attention energy, so whole layers can rise."""
    torch.manual_seed(seed)
    model = UnfoldedTransformer(small_config("certified-alternating", depth=6, tied=seed % 2 == 0, anchor_weight=0.05))
    model = model.double().eval()
    with torch.no_grad():
        for layer in model.layers:
            layer.ffn.W1.mul_(4.0)
            layer.attention.log_scale.add_(1.0)
    return model


def test_safeguard_makes_whole_layers_monotone_where_plain_layers_rise():
    rises_without, total, backtracked = 0, 0, 0
    for seed in range(12):
        model = _fighting_model(seed)
        x, pad = random_inputs(seed, scale=2.0)
        guarded = model(x, pad, safeguard=True)
        assert not rises(guarded.layer_before, guarded.layer_after).any()
        if model.config.tied:      # one energy: the whole curve never rises (untied curves mix energies)
            assert not rises(guarded.energies[:, :-1], guarded.energies[:, 1:]).any()
        assert torch.isfinite(guarded.hidden).all()
        plain = model(x, pad, return_energies=True)
        rises_without += int(rises(plain.layer_before, plain.layer_after).sum())
        backtracked += int((guarded.step_scales < 1).sum())
        total += plain.layer_after.numel()
    print(f"without safeguard: {rises_without}/{total} layer steps raise the energy; "
          f"the safeguard shortened {backtracked}")
    assert rises_without > 0 and backtracked >= rises_without


def test_safeguard_accepts_full_steps_when_they_descend_and_is_off_by_default():
    torch.manual_seed(5)
    model = UnfoldedTransformer(small_config("paper", depth=4)).double().eval()
    x, pad = random_inputs(5)
    plain, guarded = model(x, pad, return_energies=True), model(x, pad, safeguard=True)
    assert not rises(plain.layer_before, plain.layer_after).any()          # the paper preset descends
    assert (guarded.step_scales == 1).all() and torch.equal(guarded.hidden, plain.hidden)
    assert model(x, pad).energies is None                                  # off unless asked for


def test_safeguard_with_zero_halvings_skips_rising_layers():
    model = _fighting_model(0)
    x, pad = random_inputs(0, scale=2.0)
    out = model(x, pad, safeguard=True, max_halvings=0)
    assert set(out.step_scales.unique().tolist()) <= {0.0, 1.0}
    assert not rises(out.layer_before, out.layer_after).any()
    with pytest.raises(ConfigError, match="max_halvings must be >= 0"):
        model(x, pad, safeguard=True, max_halvings=-1)


@examples(60)
@given(seed=st.integers(0, 10**6), name=st.sampled_from(UNFOLDED), extra=st.integers(1, 5))
def test_padding_changes_nothing_for_real_tokens(seed, name, extra):
    torch.manual_seed(seed)
    model = UnfoldedTransformer(small_config(name, depth=3)).double().eval()
    x, _ = random_inputs(seed, B=2, n=5)
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
        model = UnfoldedTransformer(small_config("paper", spectrum_method=method))
        ffn = model.layer(0).ffn
        opt = torch.optim.SGD([ffn.S], lr=50.0)
        x = torch.randn(4, 6, 8)
        for _ in range(15):
            loss = -model(x).hidden.pow(2).mean() - ffn.W_F.trace()
            opt.zero_grad()
            loss.backward()
            opt.step()
            evals = torch.linalg.eigvalsh(model.layer(0).ffn.W_F.detach().double())
            # W_F is built in float32: its spectrum is 0.95 up to float32 round-off of an O(1) eigh
            assert evals.abs().max() <= 0.95 + 64 * torch.finfo(torch.float32).eps


def test_bad_inputs_get_clear_errors():
    model = UnfoldedTransformer(small_config("certified-alternating"))
    with pytest.raises(ValueError, match="d_model=8"):
        model(torch.randn(1, 3, 5))
    with pytest.raises(ValueError, match="NaN"):
        model(torch.full((1, 3, 8), float("nan")))
    with pytest.raises(TypeError, match="floating"):
        model(torch.ones(1, 3, 8, dtype=torch.long))
    with pytest.raises(ConfigError, match="StandardTransformer"):
        UnfoldedTransformer(small_config("standard"))


def test_descent_tolerance_follows_the_dtype_round_off():
    tols = {dt: descent_tolerance(dt) for dt in (torch.float64, torch.float32, torch.float16, torch.bfloat16)}
    for dtype, tol in tols.items():
        unit = torch.finfo(dtype).eps / 2
        assert tol >= 8 * unit and (tol <= 32 * unit or dtype == torch.float64)
    assert tols[torch.float64] < tols[torch.float32] < tols[torch.float16] < tols[torch.bfloat16]
    with pytest.raises(TypeError, match="floating point"):
        descent_tolerance(torch.int64)


@pytest.mark.parametrize("name", UNFOLDED)
def test_return_energies_gives_the_curve_and_on_request_the_sub_steps(name):
    torch.manual_seed(1)
    model = UnfoldedTransformer(small_config(name, depth=3)).double().eval()
    x, pad = random_inputs(1)
    steps = model(x, pad, return_energies="steps")
    for flag in (True, "curve"):
        curve = model(x, pad, return_energies=flag)
        assert curve.attention_before is None and curve.ffn_after is None       # sub-steps only on request
        for key in ("energies", "layer_before", "layer_after", "step_scales"):
            assert torch.allclose(getattr(curve, key), getattr(steps, key), rtol=1e-12, atol=1e-12)
    sub = (steps.attention_before, steps.attention_after, steps.ffn_before, steps.ffn_after)
    assert all(t.shape == (3, 3) and t.dtype == D64 for t in sub)
    guarded = model(x, pad, safeguard=True)
    assert guarded.energies is not None and guarded.attention_after is None
    assert model(x, pad, safeguard=True, return_energies="steps").attention_after is not None
    assert model(x, pad, return_energies=None).energies is None
    for bad in ("all", 1, 0.5):
        with pytest.raises(ConfigError, match="return_energies must be"):
            model(x, pad, return_energies=bad)
