"""Figure 4: kappa-regions of a projected (ReLU) gradient step (THEORY.md §3.5, §7 item 4).

With xi = alpha grad h(x) and Div(x) = sum_k min(0, x_k^2 - xi_k^2) / ||xi||^2 in [-1, 0]
(0 where xi = 0), §3.5 states: for x >= 0, Div(x) >= -kappa implies
h(ReLU(x - xi)) <= h(x) - alpha (1 - kappa - alpha L / 2) ||grad h(x)||^2, L = lambda_max.
Proof sketch (ours): on clipped coordinates (x_k < xi_k) the step is -x_k instead of
-xi_k; the descent lemma with ||x+ - x|| <= ||xi|| and xi_k (xi_k - x_k) <= xi_k^2 - x_k^2
gives the bound. It needs L >= 0 only, so `check_descent_inequality` tests it on
random PSD Hessians of several dimensions (F1 and plain G G^T forms).

Two settings, both 2-d with a Hessian H (h(x) = 1/2 x^T H x - b^T x, grad h = H x - b):

- `compute_authors` (the figure of the paper, THEORY §7 item 4): the authors' script,
  h(x) = 1/2 x^T W x + 1/2 ||x||^2 - b^T x with W = G G^T (G, b standard normal), so
  H = W + I; alpha = 0.25; the grid [-5, 5]^2 at spacing 0.02 (501 x 501 points); x is not
  restricted to x >= 0 there.
- `compute` (our variant, the theorem's own setting): x >= 0 and the F1 energy of THEORY §2,
  H = I - W with W = r G G^T / ||G G^T||_2 (r = w_max < 1, bounded below), on a cell-centred
  grid over [0, R]^2; Div < 0 only within about one step length of the axes, so R is kept at
  the scale of that step.

The regions {Div >= -kappa} are nested, so their area fractions are non-decreasing in kappa.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plots import pyplot, save_figure

__all__ = ["DescentCheck", "KappaResult", "authors_energy", "check_descent_inequality", "compute",
           "compute_authors", "divergence", "make_energy", "plot", "relu_step", "summary"]


@dataclass
class KappaResult:
    setting: str  # "authors" (x in [-5, 5]^2, H = W + I) or "quadrant" (x >= 0, H = I - W)
    H: np.ndarray  # (2, 2) Hessian
    W: np.ndarray  # (2, 2) the weight G G^T (scaled in the quadrant setting)
    b: np.ndarray  # (2,) bias
    alpha: float
    L: float  # lambda_max(H)
    kappas: np.ndarray  # (k,)
    xs: np.ndarray  # (m,) grid coordinates on both axes
    div: np.ndarray  # (m, m) Div at (x1 = xs[col], x2 = xs[row])
    masks: np.ndarray  # (k, m, m) bool: Div >= -kappa
    area_fraction: np.ndarray  # (k,) share of grid points in each region
    x_star: np.ndarray  # (2,) minimiser of h (over x >= 0 in the quadrant setting)
    window: tuple[float, float]  # (lo, hi) of both axes


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


def _regions(setting: str, H, W, b, alpha: float, kappas, xs: np.ndarray, x_star, window) -> KappaResult:
    """Div and the kappa-regions on the grid xs x xs."""
    X = np.stack(np.meshgrid(xs, xs), axis=-1)  # (m, m, 2): [..., 0] = x1 = xs[col]
    xi = alpha * (X @ H - b)  # (m, m, 2); H symmetric
    div = divergence(X, xi)  # (m, m)
    ks = np.asarray(kappas, dtype=float)  # (k,)
    masks = div[None] >= -ks[:, None, None]  # (k, m, m)
    return KappaResult(setting, H, W, b, alpha, float(np.linalg.eigvalsh(H)[-1]), ks, xs, div, masks,
                       masks.mean(axis=(1, 2)), x_star, window)


def authors_energy(rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The authors' 2-d energy: W = G G^T, H = W + I, b ~ N(0, I) (G drawn first)."""
    G = rng.standard_normal((2, 2))  # (2, 2)
    W = G @ G.T  # (2, 2)
    b = rng.standard_normal(2)  # (2,)
    return W + np.eye(2), W, b


def compute_authors(seed: int = 0, kappas: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8), alpha: float = 0.25,
                    half_width: float = 5.0, spacing: float = 0.02) -> KappaResult:
    """kappa-regions of h(x) = 1/2 x^T W x + 1/2 ||x||^2 - b^T x on the grid [-w, w]^2 at `spacing`
    (the authors' figure: w = 5, spacing 0.02, alpha = 0.25; x of either sign)."""
    H, W, b = authors_energy(np.random.default_rng(seed))
    m = int(round(2 * half_width / spacing)) + 1
    xs = -half_width + spacing * np.arange(m)  # (m,): -w, -w + spacing, ..., w
    return _regions("authors", H, W, b, alpha, kappas, xs, np.linalg.solve(H, b),
                    (-half_width, half_width))


def compute(seed: int = 0, kappas: tuple[float, ...] = (0.2, 0.4, 0.6, 0.8), alpha: float = 0.25,
            grid: int = 401, w_max: float = 0.9, extent: float = 1.0) -> KappaResult:
    """kappa-regions of the 2-d F1 energy over x >= 0: a grid x grid cell-centred grid on [0, R]^2, R = `extent`."""
    H, W, b = make_energy(np.random.default_rng(seed), 2, w_max)
    xs = extent * (np.arange(grid) + 0.5) / grid  # (m,)
    return _regions("quadrant", H, W, b, alpha, kappas, xs, _quadrant_minimiser(H, b), (0.0, float(extent)))


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
        "setting": r.setting,
        "window": list(r.window),
        "grid_points": int(r.xs.size) ** 2,
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


SETTING_LABELS = {
    "authors": r"authors' setup: $h=\frac{1}{2} x^\top Wx+\frac{1}{2}\|x\|^2-b^\top x$, $W=GG^\top$, $x\in[-5,5]^2$",
    "quadrant": r"our variant, the theorem's domain $x\geq 0$: F1 energy $h=\frac{1}{2} x^\top(I-W)x-b^\top x$",
}


def _draw(ax, r: KappaResult, k: float, mask: np.ndarray, lo: float, hi: float) -> None:
    from matplotlib.colors import ListedColormap

    ax.imshow(mask, origin="lower", extent=(r.window[0], r.window[1]) * 2, interpolation="nearest",
              cmap=ListedColormap(["white", "#6baed6"]), vmin=0, vmax=1)
    ax.contour(r.xs, r.xs, r.div, levels=[-k], colors="k", linewidths=0.6)
    if np.all((r.x_star >= lo) & (r.x_star <= hi)):
        ax.plot(*r.x_star, "*", color="tab:red", ms=10, mec="k", label=r"$x^*=\arg\min h$")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")


def _row(axes, r: KappaResult, zoom: float | None) -> None:
    """One panel per kappa: the region {Div >= -kappa} filled, its area share in the title, x* marked;
    with `zoom`, an inset of [-zoom, zoom]^2."""
    lo, hi = r.window
    for ax, k, mask, frac in zip(axes, r.kappas, r.masks, r.area_fraction):
        _draw(ax, r, k, mask, lo, hi)
        ax.set_title(rf"$\kappa={k:g}$: {100 * frac:.1f}% of the window", fontsize=9)
        ax.set_xlabel("$x_1$")
        if zoom is not None:
            inset = ax.inset_axes([0.54, 0.54, 0.44, 0.44])
            _draw(inset, r, k, mask, -zoom, zoom)
            inset.tick_params(labelsize=6)
            ax.indicate_inset_zoom(inset, edgecolor="0.3")
    axes[0].set_ylabel("$x_2$")


def plot(result: KappaResult, path, variant: KappaResult | None = None) -> None:
    """Top row: one panel per kappa of `result` (blue: Div(x) >= -kappa); second row: `variant`, if given.
    The authors' window gets an inset around the origin, where the regions' boundaries lie."""
    plt = pyplot()
    rows = [result] + ([variant] if variant is not None else [])
    k = len(result.kappas)
    fig = plt.figure(figsize=(3.2 * k, 3.7 * len(rows) + 0.4), layout="constrained")
    subfigs = np.atleast_1d(fig.subfigures(len(rows), 1))
    for sub, r in zip(subfigs, rows):
        axes = sub.subplots(1, k)
        _row(axes, r, zoom=1.5 if r.setting == "authors" else None)
        sub.suptitle(SETTING_LABELS[r.setting] + rf", $\alpha={r.alpha:g}$", fontsize=10)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", fontsize=8)
    fig.suptitle(r"Figure 4: $\kappa$-regions $\{x: \mathrm{Div}(x)\geq-\kappa\}$ (blue) of the step "
                 r"$x - \xi$, $\xi=\alpha\nabla h(x)$", fontsize=11)
    save_figure(fig, path, dpi=110)
