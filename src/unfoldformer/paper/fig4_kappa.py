"""Figure 4: kappa-regions of a projected (ReLU) gradient step (THEORY.md §3.5, §7 item 4).

Energy (THEORY §2 F1, the paper's FFN energy, in 2-d): with W = r G G^T / ||G G^T||_2
(G ~ N(0,1) 2x2, r = w_max < 1 so that F1 is bounded below),

    h(x) = 1/2 x^T (I - W) x - b^T x,     grad h(x) = (I - W) x - b,   Hessian I - W.

Its projected-gradient step x+ = ReLU(x - alpha grad h(x)) = ReLU((1 - alpha) x +
alpha (W x + b)) is the FFN step of §3.4 (F1). With xi = alpha grad h(x) and x >= 0,

    Div(x) = sum_k min(0, x_k^2 - xi_k^2) / ||xi||^2  in [-1, 0]   (0 where xi = 0),

and §3.5 states: Div(x) >= -kappa implies
h(ReLU(x - xi)) <= h(x) - alpha (1 - kappa - alpha L / 2) ||grad h(x)||^2, L = lambda_max.
Proof sketch (ours): on clipped coordinates (x_k < xi_k) the step is -x_k instead of
-xi_k; the descent lemma with ||x+ - x|| <= ||xi|| and xi_k (xi_k - x_k) <= xi_k^2 - x_k^2
gives the bound. It needs L >= 0 only, so `check_descent_inequality` tests it on
random PSD Hessians of several dimensions (F1 and plain G G^T forms).

`compute` evaluates {x >= 0 : Div(x) >= -kappa} on a grid over [0, R]^2; the regions
are nested, so their area fractions are non-decreasing in kappa.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plots import pyplot, save_figure

__all__ = ["DescentCheck", "KappaResult", "check_descent_inequality", "compute", "divergence",
           "make_energy", "plot", "relu_step", "summary"]


@dataclass
class KappaResult:
    H: np.ndarray  # (2, 2) Hessian I - W
    W: np.ndarray  # (2, 2) FFN weight G G^T (scaled)
    b: np.ndarray  # (2,) bias
    alpha: float
    L: float  # lambda_max(H)
    kappas: np.ndarray  # (k,)
    xs: np.ndarray  # (m,) cell-centre coordinates on both axes of [0, R]
    div: np.ndarray  # (m, m) Div at (x1 = xs[col], x2 = xs[row])
    masks: np.ndarray  # (k, m, m) bool: Div >= -kappa
    area_fraction: np.ndarray  # (k,) fraction of [0, R]^2 in each region
    x_star: np.ndarray  # (2,) minimiser of h over x >= 0
    extent: float  # R


@dataclass
class DescentCheck:
    n_tested: int  # cases with 1 - kappa - alpha L / 2 > 0 (kappa = -Div(x), tightest)
    n_violations: int  # cases violating the kappa bound (tolerance 1e-10 relative)
    worst_slack: float  # min over cases of (bound - h(x+)) / (|h(x)| + 1); >= 0 when it holds
    n_clipped: int  # tested cases with Div(x) < 0 (the ReLU actually clips)
    n_violations_kappa0: int  # clipped cases violating the bound with kappa = 0 instead


def make_energy(rng, dim: int = 2, w_max: float = 0.9) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F1 energy: W = w_max G G^T / ||G G^T||_2, H = I - W, b ~ N(0, I)."""
    G = rng.standard_normal((dim, dim))  # (dim, dim)
    W = G @ G.T  # (dim, dim)
    W = w_max * W / np.linalg.eigvalsh(W)[-1]
    b = rng.standard_normal(dim)  # (dim,)
    return np.eye(dim) - W, W, b


def _energy(H, b, X):
    """h at each row of X (..., dim)."""
    return 0.5 * np.einsum("...i,ij,...j->...", X, H, X) - X @ b  # (...)


def divergence(X: np.ndarray, xi: np.ndarray) -> np.ndarray:
    """Div for rows X, xi (..., dim); 0 where xi = 0."""
    num = np.minimum(0.0, X**2 - xi**2).sum(-1)  # (...)
    den = (xi**2).sum(-1)  # (...)
    return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


def relu_step(H, b, X, alpha: float) -> np.ndarray:
    """ReLU(x - alpha grad h(x)) for rows X (..., dim)."""
    return np.maximum(X - alpha * (X @ H - b), 0.0)  # (..., dim); H symmetric


def _quadrant_minimiser(H, b) -> np.ndarray:
    """argmin of h over x >= 0 in 2-d: best of the interior and the two faces."""
    cands = [np.linalg.solve(H, b), np.zeros(2)]
    for k in range(2):
        c = np.zeros(2)
        c[k] = max(0.0, b[k] / H[k, k])
        cands.append(c)
    feas = [c for c in cands if np.all(c >= 0)]
    return min(feas, key=lambda c: _energy(H, b, c))  # (2,)


def compute(seed: int = 0, kappas: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8), alpha: float = 0.25,
            grid: int = 401, w_max: float = 0.9, extent: float = 1.0) -> KappaResult:
    """kappa-regions of the 2-d F1 energy on a grid x grid cell-centred grid over [0, R]^2.

    R = `extent`. Div < 0 only where some |xi_k| > x_k, i.e. within about one step
    length alpha ||grad h|| of the axes, so R is kept at the scale of that step.
    """
    rng = np.random.default_rng(seed)
    H, W, b = make_energy(rng, 2, w_max)
    x_star = _quadrant_minimiser(H, b)
    R = float(extent)
    xs = R * (np.arange(grid) + 0.5) / grid  # (m,)
    X = np.stack(np.meshgrid(xs, xs), axis=-1)  # (m, m, 2): [..., 0] = x1 = xs[col]
    xi = alpha * (X @ H - b)  # (m, m, 2)
    div = divergence(X, xi)  # (m, m)
    ks = np.asarray(kappas, dtype=float)  # (k,)
    masks = div[None] >= -ks[:, None, None]  # (k, m, m)
    return KappaResult(H, W, b, alpha, float(np.linalg.eigvalsh(H)[-1]), ks, xs, div, masks,
                       masks.mean(axis=(1, 2)), x_star, R)


def summary(result: KappaResult) -> dict:
    """JSON-serialisable headline numbers."""
    r = result
    return {
        "kappas": r.kappas.tolist(),
        "area_fraction": r.area_fraction.tolist(),
        "alpha": r.alpha,
        "L": r.L,
        "rate_factor": (1.0 - r.kappas - r.alpha * r.L / 2).tolist(),
        "min_div_on_grid": float(r.div.min()),
        "x_star": r.x_star.tolist(),
        "eig_W": np.linalg.eigvalsh(r.W).tolist(),
        "b": r.b.tolist(),
        "extent": r.extent,
    }


def _sample_x(rng, dim: int, scale: float) -> np.ndarray:
    """Non-negative point; some coordinates small or zero so that the ReLU clips."""
    x = np.abs(rng.standard_normal(dim)) * scale  # (dim,)
    small = rng.random(dim) < 0.5  # (dim,)
    x[small] *= rng.choice([0.0, 1e-3, 0.1], size=int(small.sum()))
    return x


def check_descent_inequality(n_cases: int = 20000, seed: int = 0,
                             dims=(1, 2, 3, 5, 8)) -> DescentCheck:
    """Count violations of §3.5's kappa bound with kappa = -Div(x) (the tightest kappa).

    Random F1 energies (I - w G G^T, w < 1) and plain PSD G G^T Hessians, random
    alpha in (0, 2/L), random x >= 0. Also counts, on clipped cases, violations when
    kappa is replaced by 0 (shows the test can fail: the Div term is needed).
    """
    rng = np.random.default_rng(seed)
    n_tested = n_viol = n_clip = n_viol0 = 0
    worst = np.inf
    for _ in range(n_cases):
        dim = int(rng.choice(dims))
        if rng.random() < 0.5:
            H, _, b = make_energy(rng, dim, rng.uniform(0.1, 0.99))
        else:
            G = rng.standard_normal((dim, dim)) * rng.uniform(0.2, 3.0)  # (dim, dim)
            H, b = G @ G.T, rng.standard_normal(dim)  # (dim, dim), (dim,)
        L = float(np.linalg.eigvalsh(H)[-1])
        alpha = rng.uniform(0.0, 2.0 / L)
        x = _sample_x(rng, dim, rng.uniform(0.1, 3.0))  # (dim,)
        grad = x @ H - b  # (dim,)
        kappa = -float(divergence(x, alpha * grad))
        rate = 1.0 - kappa - alpha * L / 2
        if rate <= 0:
            continue
        h0, h1 = _energy(H, b, x), _energy(H, b, relu_step(H, b, x, alpha))
        g2, scale = float(grad @ grad), abs(h0) + 1.0
        slack = (h0 - alpha * rate * g2 - h1) / scale
        n_tested, worst = n_tested + 1, min(worst, slack)
        n_viol += slack < -1e-10
        if kappa > 0:
            n_clip += 1
            n_viol0 += (h0 - alpha * (1.0 - alpha * L / 2) * g2 - h1) / scale < -1e-10
    return DescentCheck(n_tested, int(n_viol), float(worst), n_clip, int(n_viol0))


def plot(result: KappaResult, path) -> None:
    """Nested kappa-regions over the quadrant, coloured by the smallest kappa containing x."""
    plt = pyplot()
    from matplotlib.colors import BoundaryNorm, ListedColormap

    r = result
    level = np.full(r.div.shape, len(r.kappas), dtype=float)  # (m, m): index of smallest kappa
    for i in range(len(r.kappas) - 1, -1, -1):
        level[r.masks[i]] = i
    colors = list(plt.cm.viridis(np.linspace(0.15, 0.95, len(r.kappas)))) + ["white"]
    fig, ax = plt.subplots(figsize=(5.6, 4.8))
    im = ax.imshow(level, origin="lower", extent=(0, r.extent, 0, r.extent),
                   cmap=ListedColormap(colors), interpolation="nearest",
                   norm=BoundaryNorm(np.arange(len(colors) + 1) - 0.5, len(colors)))
    cb = fig.colorbar(im, ax=ax, ticks=np.arange(len(colors)))
    cb.ax.set_yticklabels([rf"$\kappa={k:g}$" for k in r.kappas] + [r"Div $< -\kappa_{\max}$"])
    if np.all(r.x_star <= r.extent):
        ax.plot(*r.x_star, "*", color="tab:red", ms=12, mec="k", clip_on=False,
                label=r"$x^* = \arg\min_{x\geq 0} h$")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlim(0, r.extent)
    ax.set_ylim(0, r.extent)
    ax.set_xlabel("$x_1$")
    ax.set_ylabel("$x_2$")
    ax.set_title(rf"$\{{x\geq 0: \mathrm{{Div}}(x)\geq-\kappa\}}$, $\alpha={r.alpha:g}$")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
