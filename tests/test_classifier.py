"""`SequenceClassifier`, `build_encoder` and the `StandardTransformer` baseline."""
import pytest
import torch

from conftest import small_config
from unfoldformer import ConfigError, SequenceClassifier, StandardTransformer, UnfoldedTransformer, build_encoder
from unfoldformer.classifier import masked_mean


def test_classifier_and_baseline_shapes_and_pooling():
    torch.manual_seed(4)
    table = torch.randn(20, 6)
    ids = torch.randint(1, 20, (3, 5))
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:] = True
    for preset in ("certified", "standard"):
        enc = build_encoder(small_config(preset))
        assert isinstance(enc, StandardTransformer if preset == "standard" else UnfoldedTransformer)
        clf = SequenceClassifier(enc, table, d_model=8, n_classes=2)
        logits, out = clf(ids, pad)
        assert logits.shape == (3, 2) and out.hidden.shape == (3, 5, 8)
        assert not clf.embedding.weight.requires_grad
    h = torch.randn(2, 4, 3)
    m = torch.tensor([[False, False, True, True], [False] * 4])
    assert torch.allclose(masked_mean(h, m)[0], h[0, :2].mean(0))


def test_the_baseline_has_no_energy():
    enc = StandardTransformer(small_config("standard"))
    x = torch.randn(2, 4, 8)
    with pytest.raises(ConfigError, match="no energy"):
        enc(x, return_energies=True)
    with pytest.raises(ConfigError, match="no energy"):
        enc(x, safeguard=True)
    with pytest.raises(ConfigError, match="'standard' preset"):
        StandardTransformer(small_config("certified-alternating"))
