"""The orthogonal maps of `bases.py`: the exp map against `torch.matrix_exp` (values and gradients), the
Cayley map, checkpoints of `torch.nn.utils.parametrizations.orthogonal`, diverged weights."""
import pytest
import torch
from torch.nn.utils import parametrizations

from conftest import D64
from unfoldformer.bases import cayley_map, exp_map, orthogonal_basis


@pytest.mark.parametrize("scale", [0.0, 0.05, 0.7, 4.0])
def test_exp_map_equals_matrix_exp_with_its_gradient(scale):
    g = torch.Generator().manual_seed(4)
    L = torch.randn(24, 24, generator=g, dtype=D64).tril(-1) * scale
    A = (L - L.T).requires_grad_(True)
    G = torch.randn(24, 24, generator=g, dtype=D64)
    ours = exp_map(A)
    ref = torch.matrix_exp(A)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-13 * max(1.0, scale))
    assert torch.allclose(ours.T @ ours, torch.eye(24, dtype=D64), rtol=0, atol=1e-13 * max(1.0, scale))
    (g_ours,), (g_ref,) = torch.autograd.grad((ours * G).sum(), A), torch.autograd.grad((ref * G).sum(), A)
    assert torch.allclose(g_ours, g_ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("ours, torchs", [("exp", "matrix_exp"), ("cayley", "cayley")])
def test_learned_basis_loads_torch_orthogonal_checkpoints(ours, torchs):
    """Same state (`original`, `base`) and the same matrix as torch.nn.utils.parametrizations.orthogonal."""
    torch.manual_seed(5)
    reference = torch.nn.Linear(12, 12, bias=False).double()
    torch.nn.init.eye_(reference.weight)
    parametrizations.orthogonal(reference, orthogonal_map=torchs)
    with torch.no_grad():
        reference.parametrizations.weight.original.normal_(0, 0.3)
    basis = orthogonal_basis(12, ours).double()
    assert torch.equal(basis.weight, torch.eye(12, dtype=D64))       # starts at the identity
    basis.load_state_dict(reference.state_dict())
    assert torch.allclose(basis.weight, reference.weight, rtol=0, atol=1e-13)
    L = reference.parametrizations.weight.original.detach().tril(-1)
    assert torch.allclose(cayley_map(L - L.T) if ours == "cayley" else exp_map(L - L.T), basis.weight, atol=1e-14)
    with pytest.raises(ValueError, match="basis_map"):
        orthogonal_basis(4, "householder")


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_exp_map_of_diverged_weights_is_nan(bad):
    """Non-finite generator entries (a diverged training step) give an all-NaN basis, so the training loop's
    divergence check sees them, instead of an error inside the map."""
    A = torch.zeros(6, 6, dtype=D64)
    A[0, 1], A[1, 0] = bad, -bad
    assert torch.isnan(exp_map(A)).all()
