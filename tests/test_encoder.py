"""`CertifiedEncoderLayer` / `CertifiedEncoder`: a certified layer with `nn.TransformerEncoderLayer` conventions.

The stack is the `UnfoldedTransformer` machinery (same parameters -> the same function, bitwise), its
arguments are checked with the config's messages, and the layer modules refuse uncertified steps too."""
import dataclasses

import pytest
import torch

import unfoldformer as uf
from conftest import D64, assert_close, default_dtype, random_inputs, rises
from unfoldformer.config import ModelConfig
from unfoldformer.layers import AnchoredAttention, MetricAttention, SymmetricFFN, TiedFFN


def small_layer(**kw) -> uf.CertifiedEncoderLayer:
    """The alternating layer (most tests here check its sub-steps against the `certified-alternating` preset)."""
    return uf.CertifiedEncoderLayer(8, 2, 16, **{"layer": "alternating", **kw})


@pytest.mark.parametrize("tied", [True, False])
def test_the_stack_is_the_unfolded_transformer_of_its_config(tied):
    torch.manual_seed(0)
    with default_dtype(D64):
        enc = uf.CertifiedEncoder(small_layer(), num_layers=4, tied=tied)
        ref = uf.UnfoldedTransformer(ModelConfig.preset("certified-alternating", d_model=8, n_heads=2, ffn_hidden=16,
                                                        depth=4,
                                                        tied=tied))
    assert enc.config == ref.config
    ref.load_state_dict(enc.encoder.state_dict())
    x, pad = random_inputs(B=3, n=7, d=8)
    assert torch.equal(enc(x, src_key_padding_mask=pad), ref(x, pad).hidden)
    out, expected = enc(x, src_key_padding_mask=pad, return_energies=True), ref(x, pad, return_energies=True)
    assert isinstance(out, uf.EncoderOutput) and torch.equal(out.energies, expected.energies)


def test_tied_shares_the_layer_untied_copies_it():
    layer = small_layer()
    tied = uf.CertifiedEncoder(layer, num_layers=5)
    assert len(tied.layers) == 1 and tied.layers[0] is layer.layer
    assert sum(p.numel() for p in tied.parameters()) == sum(p.numel() for p in layer.parameters())
    untied = uf.CertifiedEncoder(layer, num_layers=3, tied=False)
    assert len(untied.layers) == 3 and all(m is not layer.layer for m in untied.layers)
    with torch.no_grad():
        untied.layers[0].ffn.W1.add_(1.0)
    assert not torch.equal(untied.layers[0].ffn.W1, untied.layers[1].ffn.W1)
    assert torch.equal(untied.layers[1].ffn.W1, layer.layer.ffn.W1)


def test_padding_true_marks_padding_and_padded_tokens_never_reach_real_ones():
    with default_dtype(D64):
        enc = uf.CertifiedEncoder(small_layer(), num_layers=3)
    x, pad = random_inputs(B=3, n=7, d=8)
    y = enc(x, src_key_padding_mask=pad)
    x2 = x.clone()
    x2[pad] = 1e3 * torch.randn(int(pad.sum()), 8, dtype=D64)        # padded rows: anything, even huge
    y2 = enc(x2, src_key_padding_mask=pad)
    assert torch.equal(y[~pad], y2[~pad])
    # the padded rows do change the real ones when they are real tokens
    assert not torch.equal(enc(x2)[~pad], y[~pad])


def test_energies_on_request_and_the_safeguard_curve_never_rises():
    torch.manual_seed(1)
    with default_dtype(D64):
        layer = small_layer()
        enc = uf.CertifiedEncoder(layer, num_layers=6)
    x, pad = random_inputs(seed=3, B=4, n=7, d=8, scale=3.0)
    out = enc(x, src_key_padding_mask=pad, return_energies=True)
    assert out.energies.shape == (4, 7) and out.energies.dtype == D64
    assert_close(out.energies[:, 0].detach(), layer.energy(x, x, pad).detach())   # E(Y⁽⁰⁾), anchored at X
    safe = enc(x, src_key_padding_mask=pad, return_energies=True, safeguard=True)
    assert not rises(safe.energies[:, :-1], safe.energies[:, 1:]).any()
    assert torch.is_tensor(enc(x, src_key_padding_mask=pad, safeguard=True))   # a tensor unless energies asked


@pytest.mark.parametrize("tied", [True, False])
def test_a_joint_layer_with_learned_steps_is_passed_by_name_and_never_rises_unaided(tied):
    """`layer="joint"` (and its fields) through the layer API: the joint layer has no FFN step size, so
    `alpha_ffn` is not passed for it (and refused with the config's message when given)."""
    torch.manual_seed(4)
    with default_dtype(D64):
        layer = small_layer(layer="joint", learn_steps=True)
        enc = uf.CertifiedEncoder(layer, num_layers=4, tied=tied)
    assert enc.config.layer == "joint" and enc.config.learn_steps
    assert sum(name.endswith("step_logit") for name, _ in enc.named_parameters()) == (1 if tied else 4)
    x, pad = random_inputs(seed=5, B=4, n=7, d=8, scale=3.0)
    out = enc(x, src_key_padding_mask=pad, return_energies=True)
    assert not rises(out.layer_before, out.layer_after).any()
    with pytest.raises(uf.ConfigError, match="alpha_ffn does not apply"):
        small_layer(layer="joint", alpha_ffn=1.0)


def test_a_layer_with_its_own_anchor_runs_the_layer_module():
    torch.manual_seed(2)
    with default_dtype(D64):
        layer = small_layer()
    x, pad = random_inputs(B=3, n=7, d=8)
    anchor = x + 0.5
    out = layer(x, src_key_padding_mask=pad, anchor=anchor, return_energies=True)
    assert torch.equal(out.hidden, layer.layer(x, anchor, pad))
    assert torch.equal(out.energies[:, 1], layer.energy(out.hidden, anchor, pad))
    # anchor = input: the module path and the rotated stack agree to round-off. Both run the same few
    # dozen float64 operations per entry on O(1) inputs, so 64 eps · max|Y| (conftest.close_tol) bounds it.
    with torch.no_grad():
        assert_close(layer(x, src_key_padding_mask=pad, anchor=x)[~pad], layer(x, src_key_padding_mask=pad)[~pad])
    with pytest.raises(ValueError, match="anchor has shape"):
        layer(x, anchor=x[:, :3])


# (CertifiedEncoderLayer arguments, the same settings as ModelConfig fields)
BAD = [
    (dict(alpha=5.0), dict(alpha_attention=5.0)),
    (dict(alpha=-1.0), dict(alpha_attention=-1.0)),
    (dict(alpha=0.0), dict(alpha_attention=0.0)),
    (dict(lam=0.0), dict(anchor_weight=0.0)),
    (dict(lam=-2.0), dict(anchor_weight=-2.0)),
    (dict(alpha_ffn=2.0), dict(alpha_ffn=2.0)),
    (dict(rho="nope"), dict(rho="nope")),
    (dict(basis_map="nope"), dict(basis_map="nope")),
    (dict(alpha=float("nan")), dict(alpha_attention=float("nan"))),
    (dict(learn_basis=1), dict(learn_basis=1)),
]


@pytest.mark.parametrize("layer_kw, config_kw", BAD)
def test_every_argument_is_checked_with_the_config_message(layer_kw, config_kw):
    with pytest.raises(uf.ConfigError) as from_config:
        ModelConfig.preset("certified-alternating", d_model=8, n_heads=2, ffn_hidden=16, depth=1, **config_kw)
    with pytest.raises(uf.ConfigError) as from_layer:
        small_layer(**layer_kw)
    assert str(from_layer.value) == str(from_config.value)


@pytest.mark.parametrize("args, message", [((30, 4, 16), "multiple of n_heads"), ((8, 0, 16), "n_heads must be >= 1"),
                                           ((8, 2, 0), "ffn_hidden must be >= 1"), ((8.0, 2, 16), "d_model must be")])
def test_sizes_are_checked(args, message):
    with pytest.raises(uf.ConfigError, match=message):
        uf.CertifiedEncoderLayer(*args)


def test_the_default_layer_is_the_joint_certified_preset():
    torch.manual_seed(0)
    with default_dtype(D64):
        enc = uf.CertifiedEncoder(uf.CertifiedEncoderLayer(8, 2, 16), num_layers=4)
        ref = uf.UnfoldedTransformer(ModelConfig.preset("certified", d_model=8, n_heads=2, ffn_hidden=16, depth=4))
    assert enc.config == ref.config and enc.config.layer == "joint" and enc.config.alpha_ffn is None
    ref.load_state_dict(enc.encoder.state_dict())
    x, pad = random_inputs(B=3, n=7, d=8)
    out = enc(x, src_key_padding_mask=pad, return_energies=True)
    assert torch.equal(out.hidden, ref(x, pad).hidden)
    assert not rises(out.energies[:, :-1], out.energies[:, 1:]).any()   # joint: the curve never rises, unaided
    with pytest.raises(uf.ConfigError, match="alpha_ffn does not apply"):
        uf.CertifiedEncoderLayer(8, 2, 16, alpha_ffn=0.5)      # one step, one α


def test_defaults_certify_and_uncertified_steps_need_certified_false():
    cfg = small_layer().config
    assert cfg.certified and cfg.alpha_attention == 1.0 and cfg.anchor_weight == 1.0 and cfg.alpha_ffn == 1.0
    assert uf.CertifiedEncoderLayer(64, 4).config.ffn_hidden == 2048          # nn.TransformerEncoderLayer's default
    assert small_layer(alpha=5.0, certified=False).layer.attention.alpha == 5.0


def test_conventions_it_does_not_support_are_refused():
    layer, x = small_layer(), torch.randn(2, 3, 8)
    with pytest.raises(uf.ConfigError, match="src_mask is not supported"):
        layer(x, torch.zeros(3, 3, dtype=torch.bool))
    with pytest.raises(uf.ConfigError, match="is_causal"):
        uf.CertifiedEncoder(layer, 2)(x, is_causal=True)
    for name in ("depth", "tied"):
        with pytest.raises(uf.ConfigError, match="CertifiedEncoder"):
            small_layer(**{name: 2})
    with pytest.raises(uf.ConfigError, match="depth must be >= 1"):
        uf.CertifiedEncoder(layer, 0)
    with pytest.raises(uf.ConfigError, match="stacks a CertifiedEncoderLayer"):
        uf.CertifiedEncoder(torch.nn.TransformerEncoderLayer(8, 2, batch_first=True), 2)


@pytest.mark.parametrize("alpha", [5.0, -1.0])
def test_layer_modules_refuse_uncertified_steps_with_the_config_message(alpha):
    with pytest.raises(uf.ConfigError) as from_config:
        ModelConfig.preset("certified-alternating", d_model=8, n_heads=2, alpha_attention=alpha)
    with pytest.raises(uf.ConfigError) as from_module:
        AnchoredAttention(8, 2, "exp", 1.0, alpha, True)
    assert str(from_module.value) == str(from_config.value)
    assert AnchoredAttention(8, 2, "exp", 1.0, 5.0, True, certified=False).alpha == 5.0
    with pytest.raises(uf.ConfigError, match="must be a finite number > 0"):
        AnchoredAttention(8, 2, "exp", 1.0, -1.0, True, certified=False)      # a negative step is never a step
    with pytest.raises(uf.ConfigError, match="anchor_weight must be a finite number > 0"):
        AnchoredAttention(8, 2, "exp", 0.0, 1.0, True)
    with pytest.raises(uf.ConfigError, match="certified range"):
        TiedFFN(8, 16, 2.0)
    with pytest.raises(uf.ConfigError, match="certified range"):
        SymmetricFFN(8, 1.5, True, 0.95, "clip")
    with pytest.raises(uf.ConfigError, match="certified range"):
        MetricAttention(8, 1, "exp", 2.5, False)


def test_encoder_output_documents_every_field():
    doc = uf.EncoderOutput.__doc__
    for field in dataclasses.fields(uf.EncoderOutput):
        assert f"{field.name} (" in doc or f"{field.name}, " in doc, field.name
