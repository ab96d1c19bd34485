"""ρ family (THEORY §4): values, derivatives, concavity checks, name resolution."""
import math

import pytest
import torch

from unfoldformer.rho import RHO_FAMILY, check_rho, custom_rho, get_rho, lp_rho, truncated_rho

Z = torch.linspace(0.0, 30.0, 301, dtype=torch.float64)


@pytest.mark.parametrize("name", sorted(RHO_FAMILY))
def test_family_members_pass_the_concavity_check(name):
    result = check_rho(name)
    assert result.ok, result.problems


@pytest.mark.parametrize("name", ["exp", "log", "linear", "lp"])
def test_derivative_equals_autograd(name):
    rho = get_rho(name)
    z = Z[1:].clone().requires_grad_(True)  # lp's tangent extension is C1 at tau; skip z = 0 for clarity
    (grad,) = torch.autograd.grad(rho(z).sum(), z)
    assert torch.allclose(grad, rho.derivative(z.detach()), rtol=1e-12, atol=1e-12)


def test_closed_forms():
    assert torch.allclose(get_rho("exp")(Z), -torch.exp(-Z))
    assert torch.allclose(get_rho("log")(Z), torch.log(Z + 2))
    assert torch.allclose(get_rho("log", c=5.0).derivative(Z), 1 / (Z + 5))
    rho = lp_rho(p=1.0, tau=0.25)
    assert torch.allclose(rho(torch.tensor([4.0], dtype=torch.float64)), torch.tensor([2.0], dtype=torch.float64))
    # below the floor: the tangent at tau, so rho'(0) = rho'(tau) = 0.5 * tau^{-1/2} = 1
    assert rho.derivative(torch.tensor([0.0])).item() == pytest.approx(1.0)
    t = truncated_rho(tau=2.0)
    assert t(torch.tensor([1.0, 3.0])).tolist() == [1.0, 2.0]
    assert t.derivative(torch.tensor([1.0, 3.0])).tolist() == [1.0, 0.0]


def test_custom_rho_derivative_by_autograd_and_checks():
    rho = custom_rho(lambda z: torch.sqrt(z + 1.0))
    assert torch.allclose(rho.derivative(Z), 0.5 / torch.sqrt(Z + 1.0))
    assert check_rho(rho).ok


def test_check_rho_says_which_condition_fails():
    convex = check_rho(custom_rho(lambda z: z**2, name="square"))
    assert not convex.ok and any("concave" in p for p in convex.problems)
    decreasing = check_rho(custom_rho(lambda z: torch.exp(-z), name="decreasing"))
    assert not decreasing.ok and any("non-decreasing" in p for p in decreasing.problems)
    wrong_derivative = check_rho(custom_rho(lambda z: torch.log(z + 2), lambda z: 2 / (z + 2)))
    assert not wrong_derivative.ok and any("finite differences" in p for p in wrong_derivative.problems)


def test_unknown_name_lists_valid_ones():
    with pytest.raises(ValueError) as err:
        get_rho("softplus")
    for name in RHO_FAMILY:
        assert name in str(err.value)


def test_bad_parameters_rejected():
    with pytest.raises(ValueError):
        get_rho("lp", p=3.0)
    with pytest.raises(ValueError):
        get_rho("log", c=0.0)
    with pytest.raises(ValueError):
        get_rho("truncated", tau=-1.0)


def test_certified_alpha_range():
    assert get_rho("exp").certified_alpha_max() == 2.0
    assert get_rho("lp").certified_alpha_max() == 1.0
    assert math.isclose(get_rho("log").derivative(torch.tensor(0.0)).item(), 0.5)


def test_registered_custom_rho_is_nameable_in_model_configs(registry):
    from unfoldformer import ModelConfig, UnfoldedTransformer
    from unfoldformer.rho import register_rho

    sqrt = custom_rho(lambda z: torch.sqrt(z + 1.0), name="sqrt")
    assert register_rho(sqrt) == "sqrt" and get_rho("sqrt") is sqrt
    cfg = ModelConfig.preset("certified-alternating", d_model=8, n_heads=2, depth=2, ffn_hidden=8, rho="sqrt")
    model = UnfoldedTransformer(cfg).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    out = model(x, return_energies=True)
    assert model.layers[0].attention.rho == "sqrt" and torch.isfinite(out.energies).all()


def test_register_rho_refuses_builtin_names_and_failing_rhos(registry):
    from unfoldformer.rho import register_rho

    with pytest.raises(ValueError, match="built-in"):
        register_rho(custom_rho(lambda z: torch.log(z + 3.0), name="log"))
    with pytest.raises(ValueError, match="concave"):
        register_rho(custom_rho(lambda z: z**2, name="square"))
    assert "square" not in RHO_FAMILY


@pytest.mark.parametrize("p", [0.5, 1.0, 1.5])
def test_lp_curvature_is_the_derivative_of_its_derivative(p):
    """ℓ_p's ρ'' (used by the blocked kernel's backward) equals h(h−1)·z^{h−2} above the floor τ and 0 on the
    tangent below it, in float64 (to round-off) and in float32: pow (≤ 1 ulp), one division and one
    multiplication by the exact constant h(h−1) give a relative error of at most 4u, u = 2⁻²⁴ (asserted 5u)."""
    tau = 1e-3
    rho = lp_rho(p, tau)
    h = p / 2
    z64 = torch.cat([torch.tensor([0.0, tau / 2, tau, tau * (1 + 1e-6), 1.0, 1e4], dtype=torch.float64),
                     torch.logspace(-5, 3, 200, dtype=torch.float64)])
    exact = torch.where(z64 > tau, h * (h - 1) * z64.clamp_min(tau) ** (h - 2), torch.zeros_like(z64))
    assert torch.equal(rho.curvature(z64) == 0, z64 <= tau)
    assert torch.allclose(rho.curvature(z64), exact, rtol=1e-14, atol=0)
    zz = z64[z64 > tau].clone().requires_grad_(True)                # autograd of ρ' away from the kink
    (auto,) = torch.autograd.grad(rho.derivative(zz).sum(), zz)
    assert torch.allclose(rho.curvature(zz.detach()), auto, rtol=1e-12, atol=0)
    z32 = z64.float()
    # the floor test is made in the input's dtype (τ rounds to float32 as z does), the value in float64
    exact32 = torch.where(z32 > tau, h * (h - 1) * z32.double().clamp_min(tau) ** (h - 2), 0.0)
    ours = rho.curvature(z32).double()
    assert torch.equal(ours == 0, exact32 == 0)
    assert ((ours - exact32).abs() <= 5 * 2.0**-24 * exact32.abs()).all()
