"""Figures 2-3: alternating gradient half-steps on h = f + g (THEORY.md §3.5, §7 items 2-3).

Setting of the paper (row convention, Y is n x d):

    f(Y) = ||Y W1||_F^2 + ||Y - B1||_F^2,     grad f = 2 Y W1 W1^T + 2 (Y - B1)
    g(Y) = ||W2 Y||_F^2 + ||Y - B2||_F^2,     grad g = 2 W2^T W2 Y + 2 (Y - B2)

with W1 (d x d), W2 (n x n) = 0.1 N(0,1), B1, B2 ~ U[0,1), Y0 = 2 U[0,1). One
half-step is Y <- Y - lr grad f(Y) or Y <- Y - lr grad g(Y), alternating, f first.

Minimisers in closed form: Y_f* = B1 (W1 W1^T + I)^-1, Y_g* = (W2^T W2 + I)^-1 B2,
and grad h = 0 is the Sylvester equation (W2^T W2 + 2I) Y + Y (W1 W1^T) = B1 + B2.
Smoothness constants with this (un-halved) convention: L_f = 2 lambda_max(W1 W1^T + I),
L_g = 2 lambda_max(W2^T W2 + I); h is mu-strongly convex with
mu = 2 lambda_min(W2^T W2 + 2I) + 2 lambda_min(W1 W1^T).

§3.5's Apollonius claim (descent of one alternating pass when
||y - y_f*|| / ||y - y_h*|| <= C = mu / (4 alpha L_f L_g)) is checked on random
strongly convex quadratics by `check_apollonius_claim`. Our own proof sketch: with
u = y - a grad f(y), one pass is y+ = y - a grad h(y) + a e, ||e|| <= a L_g ||grad f(y)||
<= ||grad h(y)|| / 4 inside the region, so h(y+) <= h(y) + a ||grad h||^2
(-3/4 + (a L_h / 2)(5/4)^2): descent is guaranteed for a L_h <= 24/25, but NOT for
every a <= 1/max(L_f, L_g) (1-d counterexample: f = (y-1)^2/2, g = (y+1)^2/2,
a = 1, y = 0.8 gives h: 0.64 -> 1).

The iteration converges to a 2-cycle (P1 after f-steps, P2 after g-steps) which is
not Y_h*; unless h(P1) = h(P2), one half-step of every cycle raises h, whatever lr:
the late saw-tooth does not need lr > 2/L_g (it appears at lr = 0.03 as well).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import solve_sylvester

from ..plots import pyplot, save_figure

__all__ = ["AlternatingResult", "ApolloniusCheck", "Problem", "apollonius_constant",
           "check_apollonius_claim", "compute", "make_problem", "minimisers", "plot",
           "summary"]

#  alpha L_h bound under which the Apollonius region provably gives descent (see docstring)
SAFE_ALPHA_LH = 24.0 / 25.0


@dataclass
class Problem:
    W1: np.ndarray  # (d, d)
    W2: np.ndarray  # (n, n)
    B1: np.ndarray  # (n, d)
    B2: np.ndarray  # (n, d)
    Y0: np.ndarray  # (n, d)


@dataclass
class AlternatingResult:
    h: np.ndarray  # (T+1,) h(Y_t), float64, t = 0 .. T half-steps
    f: np.ndarray  # (T+1,) f(Y_t)
    g: np.ndarray  # (T+1,) g(Y_t)
    kind: np.ndarray  # (T+1,) int: 0 = start, 1 = after an f-step, 2 = after a g-step
    h_min: float  # h(Y_h*)
    gap: np.ndarray  # (T+1,) h(Y_t) - h_min
    log_gap: np.ndarray  # (T+1,) log(h(Y_t) - h_min)
    log_ratio: np.ndarray  # (T+1,) log h(Y_t) - log h_min (the paper's figure 3)
    rises: np.ndarray  # (r,) half-step indices t >= 1 with h[t] > h[t-1]
    dist_h: np.ndarray  # (T+1,) ||Y_t - Y_h*||_F
    L_f: float
    L_g: float
    L_h: float
    mu: float
    lr: float
    grad_h_star: float  # ||grad h(Y_h*)||_F / ||B1 + B2||_F (Sylvester residual)
    pca_traj: np.ndarray  # (T+1, 2) iterates in the trajectory's 2-d PCA basis
    pca_min: np.ndarray  # (3, 2) Y_f*, Y_g*, Y_h* in the same basis
    pca_var: np.ndarray  # (2,) fraction of trajectory variance explained


@dataclass
class ApolloniusCheck:
    step_rule: str  # "max": alpha <= 1/max(L_f, L_g); "safe": alpha L_h <= 24/25
    n_tested: int  # points y inside the Apollonius region that were tested
    n_violations: int  # passes with h(y+) > h(y) (relative tolerance 1e-10)
    worst_rel_increase: float  # max (h(y+) - h(y)) / (|h(y)| + 1), 0 if none
    violation_alpha_Lh: np.ndarray  # (n_violations,) alpha L_h of each violation
    violation_dim: np.ndarray  # (n_violations,) dimension of each violating problem


def apollonius_constant(mu: float, alpha: float, L_f: float, L_g: float) -> float:
    """THEORY §3.5's (reconstructed) ratio C = mu / (4 alpha L_f L_g)."""
    return mu / (4.0 * alpha * L_f * L_g)


def make_problem(seed: int = 0, n: int = 500, d: int = 128) -> Problem:
    """The paper's random instance (THEORY §7 item 2-3)."""
    rng = np.random.default_rng(seed)
    W1 = 0.1 * rng.standard_normal((d, d))  # (d, d)
    W2 = 0.1 * rng.standard_normal((n, n))  # (n, n)
    B1, B2 = rng.random((n, d)), rng.random((n, d))  # (n, d) each
    Y0 = 2.0 * rng.random((n, d))  # (n, d)
    return Problem(W1, W2, B1, B2, Y0)


def _f(p: Problem, Y: np.ndarray) -> float:
    return float(np.sum((Y @ p.W1) ** 2) + np.sum((Y - p.B1) ** 2))


def _g(p: Problem, Y: np.ndarray) -> float:
    return float(np.sum((p.W2 @ Y) ** 2) + np.sum((Y - p.B2) ** 2))


def _grad_f(p: Problem, Y: np.ndarray) -> np.ndarray:
    return 2.0 * (Y @ p.W1) @ p.W1.T + 2.0 * (Y - p.B1)  # (n, d)


def _grad_g(p: Problem, Y: np.ndarray) -> np.ndarray:
    return 2.0 * p.W2.T @ (p.W2 @ Y) + 2.0 * (Y - p.B2)  # (n, d)


def minimisers(p: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact Y_f*, Y_g*, Y_h* (each (n, d)); Y_h* from the Sylvester equation."""
    n, d = p.B1.shape
    S1 = p.W1 @ p.W1.T  # (d, d)
    S2 = p.W2.T @ p.W2  # (n, n)
    Y_f = np.linalg.solve(S1 + np.eye(d), p.B1.T).T  # (n, d); S1 symmetric
    Y_g = np.linalg.solve(S2 + np.eye(n), p.B2)  # (n, d)
    Y_h = solve_sylvester(S2 + 2.0 * np.eye(n), S1, p.B1 + p.B2)  # (n, d)
    return Y_f, Y_g, Y_h


def _constants(p: Problem) -> tuple[float, float, float, float]:
    """L_f, L_g, L_h, mu of f, g, h in the Frobenius geometry."""
    e1 = np.linalg.eigvalsh(p.W1 @ p.W1.T)  # (d,) ascending
    e2 = np.linalg.eigvalsh(p.W2.T @ p.W2)  # (n,) ascending
    L_f, L_g = 2.0 * (e1[-1] + 1.0), 2.0 * (e2[-1] + 1.0)
    # Hessian of h acts as Y -> 2 (S2 + 2I) Y + 2 Y S1: eigenvalues 2 (e2_i + 2 + e1_j)
    L_h, mu = 2.0 * (e2[-1] + 2.0 + e1[-1]), 2.0 * (e2[0] + 2.0 + e1[0])
    return float(L_f), float(L_g), float(L_h), float(mu)


def _pca(traj: np.ndarray, extra: np.ndarray):
    """2-d PCA of traj (T+1, D); project traj and extra (k, D) in that basis."""
    mean = traj.mean(axis=0)  # (D,)
    Xc = traj - mean  # (T+1, D)
    ev, U = np.linalg.eigh(Xc @ Xc.T)  # (T+1,), (T+1, T+1): Gram trick, T+1 << D
    ev, U = ev[::-1][:2], U[:, ::-1][:, :2]  # top two: (2,), (T+1, 2)
    V = (Xc.T @ U / np.sqrt(ev)).T  # (2, D) orthonormal principal directions
    V = V * np.sign(V[np.arange(2), np.abs(V).argmax(axis=1)])[:, None]  # fix signs
    var = ev / np.sum(Xc**2)  # (2,)
    return Xc @ V.T, (extra - mean) @ V.T, var  # (T+1, 2), (k, 2), (2,)


def compute(seed: int = 0, n: int = 500, d: int = 128, lr: float = 0.05,
            half_steps: int = 200) -> AlternatingResult:
    """Run `half_steps` alternating half-steps (f first) and record h in float64."""
    p = make_problem(seed, n, d)
    Y_f, Y_g, Y_h = minimisers(p)
    L_f, L_g, L_h, mu = _constants(p)
    resid = _grad_f(p, Y_h) + _grad_g(p, Y_h)  # (n, d)
    Y = p.Y0.copy()  # (n, d)
    traj = np.empty((half_steps + 1, n * d))  # (T+1, n d)
    fs, gs = np.empty(half_steps + 1), np.empty(half_steps + 1)  # (T+1,) each
    kind = np.zeros(half_steps + 1, dtype=int)  # (T+1,)
    for t in range(half_steps + 1):
        if t > 0:
            kind[t] = 1 if t % 2 == 1 else 2
            Y = Y - lr * (_grad_f(p, Y) if kind[t] == 1 else _grad_g(p, Y))
        traj[t], fs[t], gs[t] = Y.ravel(), _f(p, Y), _g(p, Y)
    h = fs + gs  # (T+1,)
    h_min = _f(p, Y_h) + _g(p, Y_h)
    gap = h - h_min  # (T+1,)
    rises = np.flatnonzero(np.diff(h) > 0) + 1  # (r,)
    dist_h = np.linalg.norm(traj - Y_h.ravel(), axis=1)  # (T+1,)
    mins = np.stack([Y_f.ravel(), Y_g.ravel(), Y_h.ravel()])  # (3, n d)
    pca_traj, pca_min, pca_var = _pca(traj, mins)
    return AlternatingResult(
        h=h, f=fs, g=gs, kind=kind, h_min=h_min, gap=gap,
        log_gap=np.log(np.maximum(gap, np.finfo(float).tiny)), log_ratio=np.log(h) - np.log(h_min),
        rises=rises, dist_h=dist_h,
        L_f=L_f, L_g=L_g, L_h=L_h, mu=mu, lr=lr,
        grad_h_star=float(np.linalg.norm(resid) / np.linalg.norm(p.B1 + p.B2)),
        pca_traj=pca_traj, pca_min=pca_min, pca_var=pca_var)


def summary(result: AlternatingResult) -> dict:
    """JSON-serialisable headline numbers."""
    r = result
    rise_kind = r.kind[r.rises]
    return {
        "half_steps": int(len(r.h) - 1),
        "lr": r.lr,
        "L_f": r.L_f,
        "L_g": r.L_g,
        "L_h": r.L_h,
        "mu": r.mu,
        "two_over_L_f": 2.0 / r.L_f,
        "two_over_L_g": 2.0 / r.L_g,
        "lr_exceeds_two_over_L_g": bool(r.lr > 2.0 / r.L_g),
        "apollonius_C": apollonius_constant(r.mu, r.lr, r.L_f, r.L_g),
        "lr_times_L_h": r.lr * r.L_h,
        "n_rises": int(len(r.rises)),
        "n_rises_after_f_step": int(np.sum(rise_kind == 1)),
        "n_rises_after_g_step": int(np.sum(rise_kind == 2)),
        "first_rise": int(r.rises[0]) if len(r.rises) else -1,
        "h0": float(r.h[0]),
        "h_min": r.h_min,
        "final_gap": float(r.gap[-1]),
        "final_rel_gap": float(r.gap[-1] / abs(r.h_min)),
        "final_log_ratio": float(r.log_ratio[-1]),
        "final_dist_to_Y_h": float(r.dist_h[-1]),
        "sylvester_rel_residual": r.grad_h_star,
        "pca_variance_explained": r.pca_var.tolist(),
    }


# ---------------------------------------------------------------------------
# The Apollonius claim on random strongly convex quadratics
# ---------------------------------------------------------------------------

def _random_psd(rng, dim: int) -> np.ndarray:
    """Random symmetric PSD matrix with a spread of scales and conditioning."""
    Q, _ = np.linalg.qr(rng.standard_normal((dim, dim)))  # (dim, dim)
    ev = rng.uniform(0.0, rng.uniform(0.1, 10.0), dim) ** rng.uniform(1.0, 3.0)  # (dim,)
    return (Q * ev) @ Q.T  # (dim, dim)


def _region_points(rng, y_f, y_h, C: float, k: int) -> np.ndarray:
    """k points of {||y - y_f|| <= C ||y - y_h||}: half on its boundary, half inside."""
    dim = y_f.shape[0]
    centre, c2 = (y_f - C * C * y_h) / (1.0 - C * C), C * C  # (dim,)
    radius = C * np.linalg.norm(y_f - y_h) / abs(1.0 - c2)
    u = rng.standard_normal((k, dim))  # (k, dim)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    s = rng.uniform(0.0, 1.0, k) if C < 1 else rng.uniform(1.0, 3.0, k)  # (k,)
    s[::2] = 1.0  # boundary points: the hardest case
    return centre + radius * s[:, None] * u  # (k, dim)


def _one_problem(rng, step_rule: str, k: int):
    """Sample one problem and k points; return (n_tested, [(rel_inc, alpha L_h, dim)])."""
    dim = int(rng.integers(1, 7))
    A, B = _random_psd(rng, dim), _random_psd(rng, dim)  # (dim, dim) each
    a, b = 3 * rng.standard_normal(dim), 3 * rng.standard_normal(dim)  # (dim,) each
    L_f, L_g = np.linalg.eigvalsh(A)[-1], np.linalg.eigvalsh(B)[-1]
    eh = np.linalg.eigvalsh(A + B)  # (dim,)
    if np.linalg.eigvalsh(A)[0] < 1e-6 or eh[0] < 1e-6:
        return 0, []
    cap = 1.0 / max(L_f, L_g) if step_rule == "max" else SAFE_ALPHA_LH / eh[-1]
    alpha = rng.uniform(0.05, 1.0) * cap
    C = apollonius_constant(eh[0], alpha, L_f, L_g)
    y_f, y_h = np.linalg.solve(A, a), np.linalg.solve(A + B, a + b)  # (dim,) each
    if abs(C - 1.0) < 1e-6 or np.linalg.norm(y_f - y_h) < 1e-9:
        return 0, []
    Y = _region_points(rng, y_f, y_h, C, k)  # (k, dim)
    ratio = np.linalg.norm(Y - y_f, axis=1) / np.linalg.norm(Y - y_h, axis=1)  # (k,)
    Y = Y[ratio <= C * (1 + 1e-9)]  # (k', dim)
    U = Y - alpha * (Y @ A - a)  # (k', dim) step on f = y'Ay/2 - a'y
    Yp = U - alpha * (U @ B - b)  # (k', dim) step on g
    h = lambda Z: 0.5 * np.einsum("ij,jk,ik->i", Z, A + B, Z) - Z @ (a + b)  # noqa: E731
    h0, h1 = h(Y), h(Yp)  # (k',) each
    rel = (h1 - h0) / (np.abs(h0) + 1.0)  # (k',)
    bad = [(float(x), float(alpha * eh[-1]), dim) for x in rel[rel > 1e-10]]
    return len(Y), bad


def check_apollonius_claim(n_problems: int = 2000, points: int = 20, step_rule: str = "max",
                           seed: int = 0) -> ApolloniusCheck:
    """Test THEORY §3.5's Apollonius claim: a pass from inside the region must not raise h.

    f = y'Ay/2 - a'y, g = y'By/2 - b'y with random PSD A, B (A + B, A positive
    definite), dimension 1..6, alpha uniform in (0.05, 1] x cap, where cap is
    1/max(L_f, L_g) (step_rule "max", as the brief states it) or 24/(25 L_h)
    ("safe", the bound our proof needs).
    """
    if step_rule not in ("max", "safe"):
        raise ValueError(f"unknown step_rule {step_rule!r}")
    rng = np.random.default_rng(seed)
    n_tested, bad = 0, []
    for _ in range(n_problems):
        k, b = _one_problem(rng, step_rule, points)
        n_tested, bad = n_tested + k, bad + b
    arr = np.array(bad).reshape(-1, 3)  # (v, 3)
    return ApolloniusCheck(step_rule, n_tested, len(bad),
                           float(arr[:, 0].max()) if len(bad) else 0.0,
                           arr[:, 1].copy(), arr[:, 2].astype(int))


# ---------------------------------------------------------------------------
# Plotting
# ---------------------------------------------------------------------------

MINIMISER_STYLE = ((r"$Y_f^*=\arg\min f$", "s", "tab:orange"), (r"$Y_g^*=\arg\min g$", "^", "tab:purple"),
                   (r"$Y_h^*=\arg\min h$", "*", "tab:red"))


def _plot_fig2(r: AlternatingResult, path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    half = len(r.h) // 2
    for ax, start in zip(axes, (0, half)):
        pts, t = r.pca_traj[start:], np.arange(start, len(r.h))  # (m, 2), (m,)
        ax.plot(*pts.T, "-", color="0.6", lw=0.6)
        sc = ax.scatter(*pts.T, c=t, cmap="viridis", s=10, zorder=3, vmin=0, vmax=len(r.h) - 1)
        ax.plot(*r.pca_traj[0], "o", ms=10, mfc="none", mec="k", mew=1.8, zorder=5, label=r"start $Y_0$")
        for (x, y), (name, marker, colour) in zip(r.pca_min, MINIMISER_STYLE):
            ax.plot(x, y, marker, ms=12, color=colour, mec="k", label=name, zorder=4)
        ax.set_xlabel(f"PC1 ({100 * r.pca_var[0]:.1f}% of the trajectory's variance)")
        ax.set_ylabel(f"PC2 ({100 * r.pca_var[1]:.1f}%)")
    axes[0].set_title(f"Figure 2: alternating half-steps on f and g (lr {r.lr:g}), 2-d PCA", fontsize=10)
    axes[0].legend(fontsize=8, loc="best")
    fig.colorbar(sc, ax=axes[1], label="half-step t")
    tail = np.vstack([r.pca_traj[half:], r.pca_min[2:]])  # (T/2+2, 2)
    lo, hi = tail.min(0), tail.max(0)  # (2,) each
    pad = 0.15 * np.maximum(hi - lo, 1e-12)  # (2,)
    axes[1].set_xlim(lo[0] - pad[0], hi[0] + pad[0])
    axes[1].set_ylim(lo[1] - pad[1], hi[1] + pad[1])
    late = np.arange(len(r.h)) >= half  # (T+1,)
    for kind, text in ((1, "after f-steps"), (2, "after g-steps")):
        x, y = r.pca_traj[late & (r.kind == kind)].mean(axis=0)  # one end of the 2-cycle
        axes[1].annotate(text, (x, y), xytext=(-10, -3), textcoords="offset points", fontsize=8, ha="right")
    axes[1].set_title(rf"zoom: half-steps $t \geq {half}$ around $Y_h^*$ (a 2-cycle)", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def _plot_fig3(r: AlternatingResult, path) -> None:
    plt = pyplot()

    t = np.arange(len(r.h))  # (T+1,)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ax.plot(t, r.log_ratio, "-", color="tab:blue", lw=1, label=r"$\log h(Y_t) - \log h_{\min}$")
    ax.plot(r.rises, r.log_ratio[r.rises], "^", color="tab:red", ms=4,
            label=f"half-steps where h rises ({len(r.rises)} of {len(r.h) - 1})")
    ax.set_yscale("log")
    ax.set_xlabel("half-step t (odd: step on f, even: step on g)")
    ax.set_ylabel(r"$\log h(Y_t) - \log h_{\min}$ (log scale)")
    ax.set_title(f"Figure 3: alternating half-steps, lr {r.lr:g} (2/L_g = {2 / r.L_g:.4f})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def plot(result: AlternatingResult, path, path_fig3=None) -> None:
    """Fig. 2 (PCA trace + zoom) to `path`; Fig. 3 (log gap) to `path_fig3`.

    When `path_fig3` is None it is derived from `path` ("x.png" -> "x_fig3.png").
    """
    from pathlib import Path

    path = Path(path)
    if path_fig3 is None:
        path_fig3 = path.with_name(path.stem + "_fig3" + (path.suffix or ".png"))
    _plot_fig2(result, path)
    _plot_fig3(result, path_fig3)
