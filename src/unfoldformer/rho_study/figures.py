"""Figures of the ρ study (PNG): kernel against distance, attention statistics, attention maps, depth
dynamics and the distance-scale sweep. Each function draws from the study's result dict and saves."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..plots import pyplot, save_figure
from .study import SWEEP_Z

__all__ = ["plot_dynamics", "plot_kernel", "plot_maps", "plot_sweep"]

DPI = 90
DYNAMICS_TITLES = {"model": "model layers (anchored attention + FFN)", "anchored": "attention steps with anchor",
                   "anchored_unit": "attention steps with anchor, kernel scaled to ρ'(0) = 1",
                   "attention": "attention steps without anchor"}
MEASURES = (("cosine", "mean pairwise cosine similarity"), ("effective_rank", "effective rank of Y⁽ᵗ⁾"),
            ("spread_retained", "spread retained (distance to mean, / t = 0)"),
            ("energy_by_first_step", "energy: (E(t) − E(0)) / |E(1) − E(0)|"))


def _colors(rhos: list[str]) -> dict[str, str]:
    cycle = ["tab:blue", "tab:red", "tab:green", "tab:orange", "tab:purple", "tab:brown", "tab:gray"]
    return {r: cycle[i % len(cycle)] for i, r in enumerate(rhos)}


def _present(sources: dict) -> list[str]:
    return [label for label, by_rho in sources.items() if any("missing" not in r for r in by_rho.values())]


def plot_kernel(sources: dict, rhos: list[str], path: Path) -> None:
    """Per model source: relative weight n·P_ij against z_ij, and the row statistics per ρ."""
    plt = pyplot()
    labels = _present(sources)
    fig, axes = plt.subplots(len(labels), 2, figsize=(11, 3.4 * len(labels)), squeeze=False)
    colors = _colors(rhos)
    for (ax0, ax1), label in zip(axes, labels):
        width = 0.8 / len(rhos)
        names = ["entropy", "self", "nearest 1", "nearest 5", "nearest 10"]
        for i, rho in enumerate(rhos):
            res = sources[label][rho]
            if "missing" in res:
                continue
            a = res["attention"]
            edges = np.asarray(a["weight_by_z"]["z_edges"])
            curve = np.asarray(a["weight_by_z"]["relative_weight"], dtype=float)
            mid = np.sqrt(np.maximum(edges[:-1], 1e-4) * edges[1:])
            ax0.plot(mid, curve, "o-", ms=2.5, color=colors[rho], label=rho)
            vals = [a["entropy"], a["self_weight"]] + [a["nearest_share"].get(k) for k in (1, 5, 10)]
            ax1.bar(np.arange(5) + i * width, [np.nan if v is None else v for v in vals], width,
                    color=colors[rho], label=rho)
        ax0.set(xscale="log", yscale="log", xlabel="pair distance z_ij", ylabel="n · P_ij  (1 = uniform)",
                title=f"{label}: weight against distance (first step)")
        ax0.axhline(1.0, color="gray", lw=0.7)
        ax1.set(xticks=np.arange(5) + 0.4 - width / 2, xticklabels=names, ylim=(0, 1.05),
                title=f"{label}: row entropy (normalised), self weight, share on k nearest")
        for ax in (ax0, ax1):
            ax.title.set_fontsize(9)
            ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.95, bottom=0.07, hspace=0.45, wspace=0.2)
    save_figure(fig, path, dpi=DPI)


def plot_maps(sources: dict, rhos: list[str], tokens: list[list[str]], label: str, path: Path) -> None:
    """Attention maps P (head 0, first step) of the fixed sentences, one column per ρ; tokens on the axes."""
    plt = pyplot()
    present = [r for r in rhos if "missing" not in sources[label][r]]
    fig, axes = plt.subplots(len(tokens), len(present), figsize=(2.9 * len(present), 2.9 * len(tokens)),
                             squeeze=False)
    top = [max(float(np.asarray(sources[label][r]["maps"][row])[0].max()) for r in present)
           for row in range(len(tokens))]                              # one colour scale per sentence
    for col, rho in enumerate(present):
        for row, words in enumerate(tokens):
            ax = axes[row][col]
            P = np.asarray(sources[label][rho]["maps"][row])[0]        # (n, n) head 0
            im = ax.imshow(P, cmap="viridis", vmin=0, vmax=max(top[row], 1e-12))
            ax.set_xticks(range(len(words)), words, rotation=90, fontsize=6)
            ax.set_yticks(range(len(words)), words, fontsize=6)
            if row == 0:
                ax.set_title(f"ρ = {rho}", fontsize=9)
            if col == len(present) - 1:
                fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f"{label}: attention weights of the first step, head 0 (rows: queries)", fontsize=10)
    fig.subplots_adjust(left=0.08, right=0.96, top=0.92, bottom=0.1, hspace=0.5, wspace=0.5)
    save_figure(fig, path, dpi=DPI)


def plot_dynamics(sources: dict, rhos: list[str], kind: str, path: Path) -> None:
    """Rows: model sources; columns: the diversity measures and the energy over t, one line per ρ."""
    plt = pyplot()
    labels = _present(sources)
    colors = _colors(rhos)
    fig, axes = plt.subplots(len(labels), len(MEASURES), figsize=(4.2 * len(MEASURES), 3.1 * len(labels)),
                             squeeze=False)
    for row, label in zip(axes, labels):
        for ax, (key, title) in zip(row, MEASURES):
            for rho in rhos:
                res = sources[label][rho]
                if "missing" in res:
                    continue
                values = res["dynamics"][kind][key]
                ax.plot(range(len(values)), values, "o-", ms=2.5, color=colors[rho], label=rho)
            ax.set(title=f"{label}: {title}", xlabel="step t")
            ax.title.set_fontsize(8)
            ax.legend(fontsize=6)
    fig.suptitle(DYNAMICS_TITLES[kind], fontsize=10)
    height = 3.1 * len(labels)
    fig.subplots_adjust(left=0.05, right=0.99, top=1 - 0.55 / height, bottom=0.5 / height, hspace=0.45, wspace=0.22)
    save_figure(fig, path, dpi=DPI)


def plot_sweep(sources: dict, rhos: list[str], times: tuple[int, ...], path: Path) -> None:
    """Random-init: spread retained after t steps (rows) against the median head distance at t = 0, per ρ,
    for the three attention-only sequences (columns)."""
    plt = pyplot()
    colors = _colors(rhos)
    kinds = ("attention", "anchored_unit", "anchored")
    fig, axes = plt.subplots(len(times), len(kinds), figsize=(4.4 * len(kinds), 3.3 * len(times)), squeeze=False)
    for row, t in zip(axes, times):
        for ax, kind in zip(row, kinds):
            for rho in rhos:
                res = sources["random"][rho]
                if "missing" in res or "sweep" not in res:
                    continue
                ys = [res["sweep"][str(z)]["dynamics"][kind]["at"].get(t, {}).get("spread_retained") for z in SWEEP_Z]
                ax.plot(SWEEP_Z, [np.nan if y is None else y for y in ys], "o-", color=colors[rho], label=rho)
            ax.set(xscale="log", xlabel="median head distance z at t = 0", ylabel="spread retained", ylim=(-0.03, 1.03),
                   title=f"{DYNAMICS_TITLES[kind]}, t = {t}")
            ax.title.set_fontsize(8)
            ax.legend(fontsize=6)
    fig.subplots_adjust(left=0.06, right=0.99, top=0.94, bottom=0.09, hspace=0.4, wspace=0.25)
    save_figure(fig, path, dpi=DPI)
