"""Figures 5–6 drawn: the paper's box plots per layer, plus the per-layer change that makes layers 1–12 readable.

Panels are grouped by energy: the models whose descent is certified (the corrected `paper` formulas and
the certified models) and the released formulas (E_rel). Each variant is a column with two panels:

- top: per-token energies E(Y⁽ᵗ⁾)/n shifted by the lowest lower whisker (the paper's box plots,
  1.5·IQR whiskers, points beyond them counted in the panel, not drawn), the median of each box
  (orange) and the mean (red);
- bottom: each layer's change as a share of the sample's total descent D = E(Y⁽⁰⁾) − min_t E(Y⁽ᵗ⁾)
  (`change_share`: free of text length and of the energy's scale) on a symmetric log scale, so a
  share of 1e-6 at layer 12 is as visible as one of 0.9 at layer 1; the shaded band is the float32
  round-off allowance within which a change does not count as a rise; rising steps (beyond it) are
  red dots and counted in the panel.

Per-token energies still grow with length for the `paper` energy (its attention term sums over
token pairs: about −n/2 per token once the tokens have merged); the summary records that
correlation (`length_correlation_per_token`), and the bottom row does not depend on it.

A caption names the embeddings, the data, the truncation and the sample count.
"""
from __future__ import annotations

import numpy as np

from ..descent import lowered
from ..plots import box_stats, lowest_whisker, pyplot, save_figure
from .fig56_energy_curves import (
    CurvesResult,
    VariantCurves,
    beyond_whiskers,
    change_share,
    descent_scale,
    per_token,
)

__all__ = ["GROUPS", "plot"]

#: Rows of the figure: (title, variant keys), drawn when present.
GROUPS = (
    ("certified descent: corrected paper formulas, certified (joint) model",
     ("paper/random", "paper/random-relu", "paper/trained-as-released", "paper/trained", "certified/trained")),
    ("as released: the authors' formulas, energy E_rel (THEORY §7.1)",
     ("paper-as-released/random", "paper-as-released/random-relu", "paper-as-released/trained-as-released")),
)
_MEDIAN, _MEAN, _RISE, _BAND = "tab:orange", "tab:red", "crimson", "#d9e8f5"


def _title(c: VariantCurves) -> str:
    head = {"paper": "paper", "paper-as-released": "as released", "certified": "certified (joint)"}[c.formula]
    title = f"{head}: {c.label}\nd={c.d_model}" + (", safeguard on" if c.safeguard else "")
    if c.accuracy is not None:
        title += f", accuracy {100 * c.accuracy:.1f}%"
    return title


def _energy_panel(ax, c: VariantCurves) -> None:
    tok = per_token(c)                                             # (N, T+1)
    shifted = tok - lowest_whisker(tok)
    pos = np.arange(tok.shape[1])
    ax.bxp([box_stats(shifted[:, t]) for t in pos], positions=pos, showfliers=False, widths=0.6,
           medianprops={"color": _MEDIAN, "lw": 1.5})
    ax.plot(pos, shifted.mean(axis=0), "-o", color=_MEAN, ms=2.5, lw=1.0)
    n_out = beyond_whiskers(tok)
    ax.text(0.98, 0.96, f"{n_out} of {tok.size} points\nbeyond whiskers (not drawn)", transform=ax.transAxes,
            ha="right", va="top", fontsize=6.5, color="0.25")
    ax.set_xticks(pos[::2], [str(t) for t in pos[::2]])
    ax.tick_params(labelsize=7)


def _linthresh(change: np.ndarray) -> float:
    """Linear range of the symlog axis: a decade below the smallest per-layer median |change|."""
    med = np.median(np.abs(change), axis=0)                        # (T,)
    med = med[med > 0]
    return float(10.0 ** (np.floor(np.log10(med.min())) - 1)) if med.size else 1e-12


def _change_panel(ax, c: VariantCurves, tol: float) -> None:
    share = change_share(c, tol)                                   # (N, T)
    rises = ~lowered(c.energies[:, :-1], c.energies[:, 1:], tol)  # (N, T)
    pos = np.arange(1, share.shape[1] + 1)
    allowance = np.median(tol * (1 + np.abs(c.energies[:, :-1])) / descent_scale(c, tol)[:, None], axis=0)  # (T,)
    edges = np.r_[pos[0] - 0.5, pos, pos[-1] + 0.5]
    band = np.r_[allowance[0], allowance, allowance[-1]]
    ax.fill_between(edges, -band, band, step="mid", color=_BAND, lw=0, zorder=0)
    ax.axhline(0.0, color="0.5", lw=0.8)
    ax.bxp([box_stats(share[:, t - 1]) for t in pos], positions=pos, showfliers=False, widths=0.6,
           medianprops={"color": _MEDIAN, "lw": 1.5})
    rows, cols = np.nonzero(rises)
    if rows.size:
        ax.plot(pos[cols], share[rows, cols], ".", color=_RISE, ms=3)
    ax.set_yscale("symlog", linthresh=_linthresh(share))
    ax.text(0.98, 0.04, f"rising steps: {int(rises.sum())} of {rises.size}", transform=ax.transAxes,
            ha="right", va="bottom", fontsize=7, color=_RISE if rises.any() else "0.2",
            bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 1})
    ax.set_xticks(pos[1::2], [str(t) for t in pos[1::2]])
    ax.tick_params(labelsize=7)
    ax.set_xlabel("layer t", fontsize=8)


def _legend(ax) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ax.axis("off")
    handles = [Patch(fc="white", ec="k", label="box: quartiles; whiskers: 1.5·IQR"),
               Line2D([], [], color=_MEDIAN, lw=1.5, label="median"),
               Line2D([], [], color=_MEAN, marker="o", ms=3, lw=1.0, label="mean (top row)"),
               Line2D([], [], color=_RISE, marker=".", ls="", ms=6, label="a rising step (bottom row)"),
               Line2D([], [], color="0.5", lw=0.8, label="no change (bottom row)"),
               Patch(fc=_BAND, ec="none", label="round-off allowance of a step: ±1e-6·(1 + |E|)/D,\n"
                                                "median over the samples (bottom row)")]
    ax.legend(handles=handles, loc="center", fontsize=8, frameon=False)


def plot(result: CurvesResult, path, title: str, caption: str) -> None:
    """Write the figure: per group two rows (energies per token, per-layer change), one column per variant."""
    plt = pyplot()
    r = result
    groups = [(name, [k for k in keys if k in r.curves]) for name, keys in GROUPS]
    groups = [(name, keys) for name, keys in groups if keys]
    cols = max(len(keys) for _, keys in groups)
    fig = plt.figure(figsize=(3.3 * cols, 5.4 * len(groups) + 0.9), layout="constrained")
    subfigs = np.atleast_1d(fig.subfigures(len(groups), 1))
    free = None
    for sub, (name, keys) in zip(subfigs, groups):
        axes = sub.subplots(2, cols, squeeze=False)
        for j, key in enumerate(keys):
            c = r.curves[key]
            axes[0, j].set_title(_title(c), fontsize=8)
            _energy_panel(axes[0, j], c)
            _change_panel(axes[1, j], c, r.tolerance)
        for j in range(len(keys), cols):
            axes[0, j].axis("off")
            axes[1, j].axis("off")
            free = free or axes[0, j]
        axes[0, 0].set_ylabel("E(Y$^{(t)}$)/n − lowest whisker", fontsize=8)
        axes[1, 0].set_ylabel("(E(Y$^{(t)}$) − E(Y$^{(t-1)}$)) / D\nD = E(Y$^{(0)}$) − min$_t$ E(Y$^{(t)}$)",
                              fontsize=8)
        sub.suptitle(name, fontsize=10, fontweight="bold")
    _legend(free if free is not None else subfigs[0].axes[0].inset_axes([0, 0, 0.01, 0.01]))
    fig.suptitle(title, fontsize=12)
    fig.supxlabel(caption, fontsize=8, ha="left", x=0.01, multialignment="left")
    save_figure(fig, path, dpi=100)
