"""The released formulas (THEORY §7.1), for the `paper-as-released` preset: exact, defects included."""
import itertools

import torch

from conftest import D64, close_tol, default_dtype, random_inputs, small_config
from unfoldformer import UnfoldedTransformer
from unfoldformer.released import released_normalize


def released_energy_reference(Y, W, W_f, b):
    """E_rel from THEORY §7.1, written with explicit pair loops."""
    out = []
    for y in Y:
        pairs = itertools.combinations(range(len(y)), 2)
        e = sum(-torch.exp(-0.5 * ((y[i] - y[j]) @ W).pow(2).sum()) for i, j in pairs)
        e = e + 0.5 * (y @ W).pow(2).sum() + 0.5 * torch.trace(y @ W_f @ y.T) + 0.5 * (y - b).pow(2).sum()
        out.append(e)
    return torch.stack(out)


def test_released_formulas_exactly():
    torch.manual_seed(2)
    with default_dtype(D64):                     # the normalisation runs in float64 at construction
        model = UnfoldedTransformer(small_config("paper-as-released", depth=1))
    layer = model.layer(0)
    W, W_f, b = layer.attention.W, layer.ffn.W_f, layer.ffn.b
    evals = torch.linalg.eigvalsh(0.5 * (W_f + W_f.T))
    tol = close_tol(D64, 1.0)                    # eigenvalues of an O(1) symmetric matrix in float64
    assert evals.min() >= -tol and evals.max() <= 0.95 + tol                 # normalised: PSD, ≤ 0.95
    x, _ = random_inputs(2)
    with torch.no_grad():
        assert torch.allclose(model.energy(x, x), released_energy_reference(x, W, W_f, b))
        U = torch.softmax(x @ W.T @ W @ x.transpose(1, 2), dim=-1) @ x     # attention uses WᵀW
        expected = torch.relu(-U @ (0.5 * (W_f + W_f.T)) + b)
        assert torch.allclose(model(x).hidden, expected)
        before = W_f.clone()
        model.released_normalize_()                                        # re-squares, as released
        assert torch.allclose(W_f, released_normalize(before))
        assert not torch.allclose(W_f, before)
