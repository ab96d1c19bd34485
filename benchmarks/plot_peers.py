"""Figure "who descends what": the certified model's energy, the Energy Transformer's energy and CRATE's
coding rate, from the accuracy benchmark's result files (reduced cells, seed 0).

    python benchmarks/plot_peers.py [--results benchmarks/results] [--out benchmarks/results/peers.png]

Left: the Energy Transformer's mean energy curve per step, rescaled to (E_t − E_T) / (E_0 − E_T).
Middle: CRATE's mean coding rate R^c_ℓ of each layer's subspaces before and after its attention step.
Right: the share of evaluation samples whose own objective never rises: the certified model's energy
(tied, safeguard off / on), the Energy Transformer's energy at its step size, CRATE's coding rate in
every layer's attention step.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from unfoldformer.plots import pyplot, save_figure

RESULTS = Path(__file__).resolve().parent / "results"
DATASETS = {"sst2": "SST-2", "imdb": "IMDB"}


def load(folder: Path, name: str) -> dict | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def shares(results: Path, dataset: str) -> dict[str, float]:
    """Share of samples whose objective never rises, per model (missing cells left out)."""
    out = {}
    cert = load(results / "study", f"{dataset}-certified-tied-v_baseline-seed0-reduced")
    if cert:
        out["certified, safeguard off"] = cert["energy"]["monotone_share"]
        out["certified, safeguard on"] = cert["energy_safeguard"]["monotone_share"]
    et = load(results, f"{dataset}-energy-transformer-seed0-reduced")
    if et:
        out["Energy Transformer"] = et["peer_energy"]["monotone_share"]
    crate = load(results, f"{dataset}-crate-seed0-reduced")
    if crate:
        out["CRATE (R^c, every layer)"] = crate["peer_energy"]["every_layer_lowers_share"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--out", default=str(RESULTS / "peers.png"))
    args = p.parse_args(argv)
    results = Path(args.results)
    plt = pyplot()
    fig, (ax_et, ax_crate, ax_share) = plt.subplots(1, 3, figsize=(15, 4.2))
    for dataset, label in DATASETS.items():
        et = load(results, f"{dataset}-energy-transformer-seed0-reduced")
        if et:
            curve = np.asarray(et["peer_energy"]["mean_curve"])
            ax_et.plot((curve - curve[-1]) / (curve[0] - curve[-1]), marker="o", label=label)
        crate = load(results, f"{dataset}-crate-seed0-reduced")
        if crate:
            layers = np.arange(1, len(crate["peer_energy"]["mean_rate_before"]) + 1)
            line, = ax_crate.plot(layers, crate["peer_energy"]["mean_rate_before"], marker="o",
                                  label=f"{label}: before attention step")
            ax_crate.plot(layers, crate["peer_energy"]["mean_rate_after"], marker="x", ls="--", color=line.get_color(),
                          label=f"{label}: after")
    ax_et.set(title="Energy Transformer: mean energy per step", xlabel="step t",
              ylabel="(E_t − E_T) / (E_0 − E_T)")
    ax_crate.set(title="CRATE: mean coding rate R^c_ℓ", xlabel="layer ℓ", ylabel="R^c (ε = 0.5)")
    width = 0.38
    values = {dataset: shares(results, dataset) for dataset in DATASETS}
    names = list(dict.fromkeys(n for v in values.values() for n in v))   # every model with a cell, in order
    for i, (dataset, label) in enumerate(DATASETS.items()):
        x = np.arange(len(names)) + (i - 0.5) * width
        ax_share.bar(x, [100 * values[dataset].get(n, np.nan) for n in names], width, label=label)
    ax_share.set_xticks(np.arange(len(names)), names, rotation=20, ha="right")
    ax_share.set(title="samples whose objective never rises", ylabel="% of evaluation samples", ylim=(0, 105))
    for ax in (ax_et, ax_crate, ax_share):
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
