"""Figure 1: Apollonius regions (THEORY.md §3.5 "Apollonius region", §7 item 1).

For two points y_f*, y_h* in R^2 and a ratio C > 0, C != 1, the set

    R_C = {y : ||y - y_f*|| <= C ||y - y_h*||}

is bounded by the Apollonius circle with closed-form centre and radius

    c = (y_f* - C^2 y_h*) / (1 - C^2),      r = C ||y_f* - y_h*|| / |1 - C^2|.

For C < 1, R_C is the closed disc (c, r), which contains y_f*; for C > 1 it is
the complement of the open disc (c, r), which contains y_h*. (Expand
||y - y_f||^2 <= C^2 ||y - y_h||^2 and complete the square; dividing by 1 - C^2
flips the inequality when C > 1.)

`compute` evaluates R_C on a cell-centred grid over a window that contains every
circle, and compares the grid area with the closed form (pi r^2 for C < 1,
window area - pi r^2 for C > 1). `plot` draws one panel per C.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..plots import pyplot, save_figure

__all__ = ["ApolloniusResult", "apollonius_circle", "compute", "plot", "summary"]


@dataclass
class ApolloniusResult:
    y_f: np.ndarray  # (2,) minimiser of f
    y_h: np.ndarray  # (2,) minimiser of h
    C: np.ndarray  # (k,) ratios
    centres: np.ndarray  # (k, 2) Apollonius circle centres
    radii: np.ndarray  # (k,) Apollonius circle radii
    xs: np.ndarray  # (m,) cell-centre x coordinates
    ys: np.ndarray  # (m,) cell-centre y coordinates
    masks: np.ndarray  # (k, m, m) bool, masks[i, row=y, col=x]: point in R_C
    area_grid: np.ndarray  # (k,) grid estimate of area(R_C ∩ window)
    area_exact: np.ndarray  # (k,) closed-form area(R_C ∩ window)
    window: np.ndarray  # (4,) x_lo, x_hi, y_lo, y_hi
    cell: float  # grid spacing (square cells)


def apollonius_circle(y_f: np.ndarray, y_h: np.ndarray, C: float) -> tuple[np.ndarray, float]:
    """Centre (2,) and radius of the circle ||y - y_f|| = C ||y - y_h||, C != 1."""
    if C <= 0 or np.isclose(C, 1.0):
        raise ValueError(f"C must be positive and != 1 (got {C}); C = 1 is a half-plane")
    c2 = C * C
    centre = (y_f - c2 * y_h) / (1.0 - c2)  # (2,)
    radius = C * float(np.linalg.norm(y_f - y_h)) / abs(1.0 - c2)
    return centre, radius


def _window(centres: np.ndarray, radii: np.ndarray, pts: np.ndarray, margin: float) -> np.ndarray:
    """Square window containing all discs and points, padded by `margin` x its size."""
    lo = np.minimum((centres - radii[:, None]).min(0), pts.min(0))  # (2,)
    hi = np.maximum((centres + radii[:, None]).max(0), pts.max(0))  # (2,)
    mid, half = (lo + hi) / 2, (hi - lo).max() / 2 * (1 + margin)
    return np.array([mid[0] - half, mid[0] + half, mid[1] - half, mid[1] + half])


def _region_mask(y_f, y_h, C, gx, gy) -> np.ndarray:
    """Boolean grid of ||y - y_f|| <= C ||y - y_h|| (squared form, no division)."""
    d_f = (gx - y_f[0]) ** 2 + (gy - y_f[1]) ** 2  # (m, m)
    d_h = (gx - y_h[0]) ** 2 + (gy - y_h[1]) ** 2  # (m, m)
    return d_f <= C * C * d_h


def compute(seed: int = 0, C: tuple[float, ...] = (0.7, 1.5), grid: int = 401,
            margin: float = 0.15) -> ApolloniusResult:
    """Draw y_f*, y_h* ~ N(0, I_2) and evaluate each R_C on a grid x grid window."""
    rng = np.random.default_rng(seed)
    y_f, y_h = rng.standard_normal(2), rng.standard_normal(2)  # (2,), (2,)
    Cs = np.asarray(C, dtype=float)  # (k,)
    circles = [apollonius_circle(y_f, y_h, c) for c in Cs]
    centres = np.stack([c for c, _ in circles])  # (k, 2)
    radii = np.array([r for _, r in circles])  # (k,)
    win = _window(centres, radii, np.stack([y_f, y_h]), margin)
    cell = (win[1] - win[0]) / grid
    xs = win[0] + cell * (np.arange(grid) + 0.5)  # (m,)
    ys = win[2] + cell * (np.arange(grid) + 0.5)  # (m,)
    gx, gy = np.meshgrid(xs, ys)  # (m, m) each
    masks = np.stack([_region_mask(y_f, y_h, c, gx, gy) for c in Cs])  # (k, m, m)
    area_grid = masks.sum(axis=(1, 2)) * cell**2  # (k,)
    disc = np.pi * radii**2  # (k,)
    win_area = (win[1] - win[0]) * (win[3] - win[2])
    area_exact = np.where(Cs < 1, disc, win_area - disc)  # (k,)
    return ApolloniusResult(y_f, y_h, Cs, centres, radii, xs, ys, masks,
                            area_grid, area_exact, win, float(cell))


def summary(result: ApolloniusResult) -> dict:
    """JSON-serialisable headline numbers."""
    r = result
    return {
        "y_f": r.y_f.tolist(),
        "y_h": r.y_h.tolist(),
        "C": r.C.tolist(),
        "centres": r.centres.tolist(),
        "radii": r.radii.tolist(),
        "area_grid": r.area_grid.tolist(),
        "area_exact": r.area_exact.tolist(),
        "area_rel_error": (np.abs(r.area_grid - r.area_exact) / r.area_exact).tolist(),
        "grid_cell": r.cell,
    }


def plot(result: ApolloniusResult, path) -> None:
    """One panel per C: region filled, Apollonius circle and its centre, y_f* and y_h* marked."""
    plt = pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    r = result
    k = len(r.C)
    fig, axes = plt.subplots(1, k, figsize=(4.4 * k, 4.6), squeeze=False)
    theta = np.linspace(0, 2 * np.pi, 400)  # (400,)
    for ax, c, centre, rad, mask in zip(axes[0], r.C, r.centres, r.radii, r.masks):
        ax.imshow(mask, origin="lower", extent=tuple(r.window), interpolation="nearest",
                  cmap=ListedColormap(["white", "#9ecae1"]), vmin=0, vmax=1)
        ax.plot(centre[0] + rad * np.cos(theta), centre[1] + rad * np.sin(theta), "k-", lw=1)
        ax.plot(*centre, "+", color="k", ms=9, label="circle centre")
        ax.plot(*r.y_f, "o", color="tab:red", mec="k", ms=8, label=r"$y_f^*=\arg\min f$")
        ax.plot(*r.y_h, "*", color="tab:green", mec="k", ms=13, label=r"$y_h^*=\arg\min h$")
        handles, _ = ax.get_legend_handles_labels()
        handles.append(Patch(color="#9ecae1", label=rf"$R_C$, C = {c:g}"))
        ax.set_title(rf"$R_C=\{{y: \|y-y_f^*\| \leq C\,\|y-y_h^*\|\}}$, $C={c:g}$", fontsize=10)
        ax.set_xlabel("$y_1$")
        ax.set_ylabel("$y_2$")
        ax.set_aspect("equal")
        ax.legend(handles=handles, loc="best", fontsize=7, framealpha=0.9)
    fig.suptitle("Figure 1: Apollonius regions (shaded) for two random points in $\\mathbb{R}^2$", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
