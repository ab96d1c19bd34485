"""The ρ family: concave, non-decreasing penalties on pairwise distances (THEORY §4).

The attention energy is E_A(Y) = Σ_h Σ_{i<j} ρ(z^h_ij) with z = ½‖(y_i − y_j) Fᵀ‖².
A majorisation-minimisation step on E_A only needs the kernel ρ'(z) (THEORY §3.1);
energies need ρ itself. Every member exposes both.

| name        | ρ(z)                                   | ρ'(z)                       |
|-------------|----------------------------------------|-----------------------------|
| `exp`       | −exp(−z)                               | exp(−z)  (softmax)          |
| `log`       | log(z + c), c = 2                      | 1 / (z + c)                 |
| `linear`    | z                                      | 1  (uniform averaging)      |
| `lp`        | z^{p/2} for z ≥ τ, its tangent below τ | (p/2) max(z, τ)^{p/2 − 1}   |
| `truncated` | min(z, τ)                              | 1[z < τ] (supergradient)    |

`custom_rho(fn)` wraps any callable; ρ' comes from autograd when not given.
`check_rho` verifies concavity and monotonicity numerically and says what fails;
`register_rho` makes a checked custom ρ nameable in configs (`ModelConfig(rho="mine")`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .contracts import check_in_range, check_positive

RhoFn = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Rho:
    """A penalty ρ with its derivative ρ' (the attention kernel).

    `psd_kernel` records whether [ρ'(½‖a_i − a_j‖²)]_ij is positive semi-definite for
    every point set, which extends the certified attention step size from (0, 1] to
    (0, 2) (THEORY §3.1, Theorem A). `softmax` marks ρ'(z) = exp(−z) exactly (only `exp_rho`
    sets it): steps then run as softmax attention and energies through log-sum-exp.

    Optional speed-ups used by the blocked kernel (`unfoldformer.kernels`), none needed for
    correctness: `derivative_inplace(z)` returns ρ'(z) and may overwrite z (z ≥ 0);
    `curvature(z)` = ρ''(z) for the backward pass (else autograd of ρ');
    `constant_kernel` marks ρ' constant (every pair gets the weight ρ'(0)).
    """

    name: str
    value: RhoFn
    derivative: RhoFn
    psd_kernel: bool = False
    softmax: bool = False
    derivative_inplace: RhoFn | None = None
    curvature: RhoFn | None = None
    constant_kernel: bool = False

    def __post_init__(self) -> None:
        for what in ("value", "derivative"):
            if not callable(getattr(self, what)):
                raise TypeError(f"Rho {self.name!r}: {what} must be a callable z -> tensor, got "
                                f"{type(getattr(self, what)).__name__}")

    def __call__(self, z: Tensor) -> Tensor:
        return self.value(z)

    def certified_alpha_max(self) -> float:
        """Largest attention step α for which Theorem A certifies descent (open at 2)."""
        return 2.0 if self.psd_kernel else 1.0


def exp_rho() -> Rho:
    """ρ(z) = −exp(−z): the Gaussian kernel, giving softmax attention with a key-norm bias."""
    return Rho("exp", lambda z: -torch.exp(-z), lambda z: torch.exp(-z), psd_kernel=True, softmax=True,
               derivative_inplace=lambda z: z.neg_().exp_(), curvature=lambda z: torch.exp(-z).neg_())


def log_rho(c: float = 2.0) -> Rho:
    """ρ(z) = log(z + c): heavy-tailed (Cauchy / Student-t) attention weights 1/(z + c)."""
    c = check_positive("log rho: c", c)
    return Rho("log", lambda z: torch.log(z + c), lambda z: 1.0 / (z + c), psd_kernel=True,
               derivative_inplace=lambda z: z.add_(c).reciprocal_(),
               curvature=lambda z: (z + c).square_().reciprocal_().neg_())


def linear_rho() -> Rho:
    """ρ(z) = z: uniform averaging (Laplacian smoothing)."""
    return Rho("linear", lambda z: z, torch.ones_like, psd_kernel=True, curvature=torch.zeros_like,
               constant_kernel=True)


def lp_rho(p: float = 1.0, tau: float = 1e-3) -> Rho:
    """ρ(z) = z^{p/2} (robust ℓ_p), replaced below the floor τ by its tangent at τ.

    The tangent extension keeps ρ concave and differentiable, and ρ'(0) finite, so the
    IRLS weights (p/2)·max(z, τ)^{p/2−1} are bounded.
    """
    p = check_in_range("lp rho: p", p, 0.0, 2.0)
    tau = check_positive("lp rho: the floor tau", tau)
    h = p / 2.0

    def value(z: Tensor) -> Tensor:
        tangent = tau**h + h * tau ** (h - 1) * (z - tau)
        return torch.where(z >= tau, z.clamp_min(tau) ** h, tangent)

    def derivative(z: Tensor) -> Tensor:
        return h * z.clamp_min(tau) ** (h - 1)

    def curvature(z: Tensor) -> Tensor:   # 0 on the tangent below τ
        # c^{h-2} as c^{h-1}/c: torch's pow takes its rsqrt path for h − 1 = −½ (p = 1), and the general
        # pow of c^{h-2} was a fifth of the ℓ_p backward at n = 4,096 (benchmarks/profile_misses.py)
        c = z.clamp_min(tau)
        return c.pow(h - 1).div_(c).mul_(h * (h - 1)).masked_fill_(z <= tau, 0.0)

    return Rho("lp", value, derivative, psd_kernel=False,
               derivative_inplace=lambda z: z.clamp_min_(tau).pow_(h - 1).mul_(h), curvature=curvature)


def truncated_rho(tau: float = 1.0) -> Rho:
    """ρ(z) = min(z, τ): hard neighbourhood averaging (ρ' is a supergradient at τ)."""
    tau = check_positive("truncated rho: tau", tau)
    return Rho("truncated", lambda z: z.clamp(max=tau), lambda z: (z < tau).to(z.dtype),
               psd_kernel=False, derivative_inplace=lambda z: z.lt_(tau), curvature=torch.zeros_like)


def custom_rho(value: RhoFn, derivative: RhoFn | None = None, name: str = "custom",
               psd_kernel: bool = False, *, check: bool = False) -> Rho:
    """Wrap a user callable ρ; ρ' by autograd when not given. Check it with `check_rho`.

    The autograd ρ' is itself differentiable when its input requires grad (so ρ'' for the backward
    pass of the attention step comes from autograd too). `value` and `derivative` must be callable
    and, on a probe grid z ∈ [0, 50], return finite tensors of z's shape (ValueError naming what
    fails: a ρ returning a scalar would give every sample the same energy). Every later call is
    checked the same cheap way (shape, and finite where z is finite), so a ρ that gives NaN on the
    states it meets fails in one line instead of giving NaN energies or a step that keeps its input.
    `check=True` also runs the full `check_rho` (concave, non-decreasing, ρ' = dρ/dz) now;
    `register_rho` always does.
    """
    for what, fn in (("value", value), ("derivative", derivative)):
        if fn is not None and not callable(fn):
            raise TypeError(f"custom_rho: {what} must be a callable z -> rho(z) on tensors, got {fn!r} "
                            f"({type(fn).__name__})")
    if not isinstance(name, str) or not name:
        raise ValueError(f"custom_rho: name must be a non-empty string, got {name!r}")
    if derivative is None:
        def derivative(z: Tensor) -> Tensor:
            with torch.enable_grad():
                zz = z if z.requires_grad else z.detach().requires_grad_(True)
                (grad,) = torch.autograd.grad(value(zz).sum(), zz, create_graph=z.requires_grad)
            return grad
    rho = Rho(name, _checked(name, "rho", value), _checked(name, "rho'", derivative), psd_kernel=psd_kernel)
    probe = torch.linspace(0.0, 50.0, 11, dtype=torch.float64)
    rho.value(probe), rho.derivative(probe)                        # raise now, naming what fails
    if check:
        result = check_rho(rho)
        if not result:
            raise ValueError(f"rho {name!r} fails the checks: {'; '.join(result.problems)}")
    return rho


def _checked(name: str, what: str, fn: RhoFn) -> RhoFn:
    """`fn` with its output checked at every call: a tensor of the input's shape, finite where z is."""
    def call(z: Tensor) -> Tensor:
        try:
            out = fn(z)
        except Exception as exc:       # a user callable may raise anything; say whose it is
            raise ValueError(f"custom rho {name!r}: {what} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(out, Tensor) or out.shape != z.shape:
            got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"custom rho {name!r}: {what}(z) must be a tensor of z's shape {tuple(z.shape)}, "
                             f"got {got}")
        if z.device.type != "meta":
            bad = ~torch.isfinite(out) & torch.isfinite(z)
            if bool(bad.any()):
                at = float(z[bad].flatten()[0])
                raise ValueError(f"custom rho {name!r}: {what}(z) is not finite at z = {at:.6g}")
        return out
    return call


RHO_FAMILY: dict[str, Callable[..., Rho]] = {
    "exp": exp_rho,
    "log": log_rho,
    "linear": linear_rho,
    "lp": lp_rho,
    "truncated": truncated_rho,
}


BUILT_IN = tuple(RHO_FAMILY)


def register_rho(rho: Rho, *, check: bool = True) -> str:
    """Make a user ρ (e.g. `custom_rho(fn, name="sqrt")`) known by its name, so configs can name it.

    After `register_rho(r)`, `ModelConfig(rho=r.name)`, training configs and saved runs that name it
    resolve to `r` in this process (register it again before loading such a run elsewhere). With
    `check` the ρ must pass `check_rho` (concave, non-decreasing, ρ' = dρ/dz). Built-in names cannot
    be replaced; registering the same name again replaces the earlier user ρ. Returns the name.
    """
    if not isinstance(rho, Rho):
        raise TypeError(f"register_rho needs a Rho (e.g. custom_rho(fn, name=...)), got {type(rho).__name__}")
    if rho.name in BUILT_IN:
        raise ValueError(f"{rho.name!r} is a built-in rho; give the custom one another name")
    if check:
        result = check_rho(rho)
        if not result:
            raise ValueError(f"rho {rho.name!r} fails the checks: {'; '.join(result.problems)}")
    RHO_FAMILY[rho.name] = lambda: rho
    return rho.name


def get_rho(rho: str | Rho, **params) -> Rho:
    """Resolve a name (``"exp"``, ``"log"``, ``"linear"``, ``"lp"``, ``"truncated"``, or one given to
    `register_rho`) or a `Rho`."""
    if isinstance(rho, Rho):
        return rho
    if not isinstance(rho, str) or rho not in RHO_FAMILY:
        raise ValueError(f"unknown rho {rho!r}; valid names: {', '.join(RHO_FAMILY)} "
                         "(or pass a Rho, e.g. custom_rho(fn))")
    return RHO_FAMILY[rho](**params)


@dataclass
class RhoCheck:
    ok: bool
    problems: list[str]

    def __bool__(self) -> bool:
        return self.ok


def check_rho(rho: str | Rho, z_max: float = 50.0, points: int = 2001, tol: float = 1e-7) -> RhoCheck:
    """Check numerically on [0, z_max] that ρ' ≥ 0 (non-decreasing ρ), that ρ' is
    non-increasing and ρ lies below its chords (concave), and that ρ' matches
    finite differences of ρ. Returns which condition fails, with a witness point."""
    r = get_rho(rho)
    z = torch.linspace(0.0, z_max, points, dtype=torch.float64)
    problems: list[str] = []
    try:
        v, dv = r.value(z), r.derivative(z)
    except ValueError as exc:                                      # a custom ρ's own shape/finiteness check
        return RhoCheck(False, [str(exc)])
    if not (torch.isfinite(v).all() and torch.isfinite(dv).all()):
        problems.append("rho or rho' is not finite on [0, z_max]")
        return RhoCheck(False, problems)
    scale = 1.0 + dv.abs().max().item()
    if (dv < -tol * scale).any():
        i = int(torch.nonzero(dv < -tol * scale)[0])
        problems.append(f"not non-decreasing: rho'({z[i].item():.4g}) = {dv[i].item():.4g} < 0")
    if (dv[1:] - dv[:-1] > tol * scale).any():
        i = int(torch.nonzero(dv[1:] - dv[:-1] > tol * scale)[0])
        problems.append(f"not concave: rho' increases after z = {z[i].item():.4g}")
    mid = 0.5 * (v[2:] + v[:-2])
    if (v[1:-1] < mid - tol * (1.0 + v.abs().max().item())).any():
        i = int(torch.nonzero(v[1:-1] < mid - tol * (1.0 + v.abs().max().item()))[0]) + 1
        problems.append(f"not concave: rho lies below a chord at z = {z[i].item():.4g}")
    # A concave ρ with derivative ρ' has every chord slope between the endpoint derivatives.
    chord = (v[1:] - v[:-1]) / (z[1:] - z[:-1])
    slack = tol * scale
    bad = (chord > dv[:-1] + slack) | (chord < dv[1:] - slack)
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        problems.append(f"rho' disagrees with finite differences of rho on [{z[i].item():.4g}, {z[i + 1].item():.4g}]")
    return RhoCheck(not problems, problems)
