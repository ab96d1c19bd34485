"""`CertifiedEncoderLayer` / `CertifiedEncoder` as drop-ins for `nn.TransformerEncoderLayer` / `nn.TransformerEncoder`:
dropout, activation, factory kwargs, `norm=`, float masks, unbatched and sequence-first input, pickling,
torch.export (its documented limit) and torch.compile (docs/guides/custom-model.md, "Differences")."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F_nn
from torch import nn

import unfoldformer as uf
from unfoldformer.errors import ConfigError

D, H, M = 8, 2, 16
# float64 throughout: a reordering of the same sums (a transposed or unsqueezed input) differs by a few units of
# round-off, eps64 ≈ 2.2e-16, times the states' scale (O(1) here, a handful of layers): 1e-12 leaves ample room
# while any real difference (a dropped token, a skipped norm) is O(0.1).
TOL = 1e-12


def _layer(**kw) -> uf.CertifiedEncoderLayer:
    torch.manual_seed(0)
    return uf.CertifiedEncoderLayer(D, H, M, layer="joint", attention_norm="length", dtype=torch.float64, **kw)


def _inputs(B: int = 3, n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, n, D, generator=g, dtype=torch.float64)    # (B, n, D)
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[0, 4:] = True                                              # sample 0: 2 padded tokens
    return x, pad


def test_dropout_acts_in_training_only_and_keeps_descent_at_eval():
    plain, dropped = _layer(), _layer(dropout=0.5)
    dropped.load_state_dict(plain.state_dict())
    enc, enc_plain = uf.CertifiedEncoder(dropped, 3), uf.CertifiedEncoder(plain, 3)
    x, pad = _inputs()
    enc.train()
    y = enc(x, src_key_padding_mask=pad)
    zero_share = (y == 0).double().mean().item()
    assert 0.3 < zero_share < 0.7                                  # ~half the entries dropped (96 entries)
    enc.eval(), enc_plain.eval()
    assert torch.equal(enc(x, src_key_padding_mask=pad), enc_plain(x, src_key_padding_mask=pad))
    out = enc(x, src_key_padding_mask=pad, return_energies=True)
    assert bool((out.energies.diff(dim=1) <= 1e-9 * out.energies.abs()[:, :-1].clamp_min(1)).all())
    with pytest.raises(ConfigError, match="dropout"):
        _layer(dropout=1.0)


@pytest.mark.parametrize("activation", ["relu", F_nn.relu, torch.relu, nn.ReLU()])
def test_relu_activation_is_accepted(activation):
    assert isinstance(_layer(activation=activation), uf.CertifiedEncoderLayer)


@pytest.mark.parametrize("activation", ["gelu", F_nn.gelu, nn.GELU()])
def test_other_activations_are_refused_naming_the_reason(activation):
    with pytest.raises(ConfigError, match="ReLU.*convex"):
        _layer(activation=activation)


def test_factory_kwargs_set_dtype_and_device():
    layer = uf.CertifiedEncoderLayer(D, H, M, layer="joint", device="cpu", dtype=torch.float64)
    tensors = [*layer.parameters(), *layer.buffers()]
    assert tensors and all(t.dtype == torch.float64 and t.device.type == "cpu" for t in tensors)
    x, _ = _inputs()
    assert layer(x).dtype == torch.float64


def test_norm_is_applied_after_the_last_layer():
    layer = _layer()
    norm = nn.LayerNorm(D, dtype=torch.float64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5), norm.bias.uniform_(-0.5, 0.5)
    normed, bare = uf.CertifiedEncoder(layer, 2, norm=norm), uf.CertifiedEncoder(layer, 2)
    x, pad = _inputs()
    hidden = bare(x, src_key_padding_mask=pad)
    reference = F_nn.layer_norm(hidden, (D,), norm.weight, norm.bias, norm.eps)   # independent of the module call
    assert torch.allclose(normed(x, src_key_padding_mask=pad), reference, atol=TOL, rtol=0)
    out = normed(x, src_key_padding_mask=pad, return_energies=True)
    assert torch.allclose(out.hidden, reference, atol=TOL, rtol=0)
    assert torch.equal(out.energies, bare(x, src_key_padding_mask=pad, return_energies=True).energies)


def test_float_padding_mask_equals_the_boolean_one():
    enc = uf.CertifiedEncoder(_layer(), 2)
    x, pad = _inputs()
    additive = torch.zeros(pad.shape, dtype=torch.float64).masked_fill(pad, float("-inf"))   # 0 keep, −inf pad
    y = enc(x, src_key_padding_mask=pad)
    assert torch.equal(enc(x, src_key_padding_mask=additive), y)
    changed = x.clone()
    changed[0, 4:] = 100.0                                         # padded tokens' values must not matter
    assert torch.allclose(enc(changed, src_key_padding_mask=additive)[0, :4], y[0, :4], atol=TOL, rtol=0)
    with pytest.raises(ConfigError, match="only 0"):
        enc(x, src_key_padding_mask=additive.masked_fill(~pad, -1.0))


def test_unbatched_input_equals_a_batch_of_one():
    layer = _layer()
    enc = uf.CertifiedEncoder(layer, 2)
    x, pad = _inputs()
    for module in (layer, enc):
        assert module(x[0]).shape == (x.shape[1], D)
        assert torch.allclose(module(x[0], src_key_padding_mask=pad[0]), module(x[:1], src_key_padding_mask=pad[:1])[0],
                              atol=TOL, rtol=0)


def test_sequence_first_layout_equals_the_transposed_batch_first():
    first = _layer(batch_first=False)
    batch = _layer()
    x, pad = _inputs()
    seq = x.transpose(0, 1).contiguous()                           # (n, B, D)
    for a, b in ((first, batch), (uf.CertifiedEncoder(first, 2), uf.CertifiedEncoder(batch, 2))):
        out = a(seq, src_key_padding_mask=pad)                     # mask stays (B, n), as in PyTorch
        assert out.shape == seq.shape
        assert torch.allclose(out.transpose(0, 1), b(x, src_key_padding_mask=pad), atol=TOL, rtol=0)


def test_torch_save_and_load_round_trip():
    layer = _layer(dropout=0.25)
    enc = uf.CertifiedEncoder(layer, 3, tied=False, norm=nn.LayerNorm(D, dtype=torch.float64)).eval()
    x, pad = _inputs()
    for module in (layer.eval(), enc):
        buffer = io.BytesIO()
        torch.save(module, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        assert type(loaded) is type(module) and not loaded.training
        assert loaded.dropout.p == 0.25 and loaded.config == module.config
        assert torch.equal(loaded(x, src_key_padding_mask=pad), module(x, src_key_padding_mask=pad))
    assert isinstance(loaded.norm, nn.LayerNorm) and len(loaded.layers) == 3


def test_torch_export_fails_for_the_documented_reason():
    """The guide says why torch.export does not apply: data-dependent control flow (the input's finiteness check
    and the learned basis's number of squarings). If this starts to pass, update the guide's table."""
    enc = uf.CertifiedEncoder(_layer(), 2).eval()
    x, _ = _inputs()
    with pytest.raises(Exception, match="data-dependent"):
        torch.export.export(enc, (x,))


def test_torch_compile_gives_the_eager_output():
    enc = uf.CertifiedEncoder(_layer(), 2, norm=nn.LayerNorm(D, dtype=torch.float64)).eval()
    x, pad = _inputs()
    compiled = torch.compile(enc, backend="eager")                 # graph breaks are allowed; the result must match
    with torch.no_grad():
        assert torch.allclose(compiled(x, src_key_padding_mask=pad), enc(x, src_key_padding_mask=pad), atol=TOL, rtol=0)
