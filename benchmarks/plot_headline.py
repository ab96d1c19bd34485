"""The README's figure: the certified model's energy falling layer by layer, and who descends what at what accuracy.

    python benchmarks/plot_headline.py [--results benchmarks/results] [--out docs/img/headline.png]

Reads only committed result files of the accuracy benchmark (SST-2 dev, full budget).
Left: the mean energy curve of the trained `certified` (joint) model (the recommended layer, seeds 0-2),
E(Y⁽ᵗ⁾) − E(Y⁽⁰⁾) averaged over the dev sentences (`energy.mean_curve`), no safeguard, on a symmetric log scale
(its energy is unbounded below and falls faster at every layer); the standard Transformer has no energy to draw.
Right: the share of dev sentences whose own objective never rises
(certified: its energy; Energy Transformer: its energy; CRATE: every layer's coding rate; standard: none),
with each model's dev accuracy, mean over seeds.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from unfoldformer.plots import pyplot, save_figure

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def _load(paths: list[Path]) -> list[dict]:
    return [json.loads(p.read_text()) for p in paths if p.is_file()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--out", default=str(ROOT / "docs" / "img" / "headline.png"))
    args = p.parse_args(argv)
    res = Path(args.results)
    cert = _load(sorted((res / "study").glob("sst2-certified-tied-v_lr_3e-3-seed[0-9].json")))
    joint = _load(sorted(res.glob("sst2-certified-joint-seed[0-9].json")))
    rows = [("certified (joint,\ntied), unaided", joint, lambda r: r["energy"]["monotone_share"], "accuracy"),
            ("alternating,\nsafeguard on", cert, lambda r: r["energy_safeguard"]["monotone_share"],
             "accuracy_safeguard"),
            ("alternating,\nunaided", cert, lambda r: r["energy"]["monotone_share"], "accuracy"),
            ("Energy\nTransformer", _load(sorted(res.glob("sst2-energy-transformer-seed[0-9].json"))),
             lambda r: r["peer_energy"]["monotone_share"], "accuracy"),
            ("CRATE\n(every layer)", _load(sorted(res.glob("sst2-crate-seed[0-9].json"))),
             lambda r: r["peer_energy"]["every_layer_lowers_share"], "accuracy"),
            ("standard\nTransformer", _load(sorted(res.glob("sst2-standard-seed[0-9].json"))), None, "accuracy")]
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1, 1.45]})
    for r in joint:                                                          # the unaided curve of each seed
        curve = np.array(r["energy"]["mean_curve"])                          # (depth + 1,)
        left.plot(np.arange(curve.size), curve - curve[0], "o-", ms=4, label=f"seed {r['seed']}")
    left.set_yscale("symlog", linthresh=10)
    left.set(xlabel="layer t", ylabel="mean E(Y$^{(t)}$) − E(Y$^{(0)}$)",
             title="certified (joint, tied), trained: mean energy per layer\nSST-2 dev, no safeguard")
    left.title.set_fontsize(10)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    names, shares, accs, has_energy = [], [], [], []
    for name, recs, share, acc_key in rows:
        if not recs:                                                         # no result files: no bar
            continue
        names.append(name)
        shares.append(100 * statistics.mean(share(r) for r in recs) if share else 0.0)
        accs.append(100 * statistics.mean(r[acc_key] for r in recs))
        has_energy.append(share is not None)
    x = np.arange(len(names))
    colours = ["tab:red", "tab:green", "tab:blue", "tab:orange", "tab:purple", "tab:gray"][:len(names)]
    right.bar(x, shares, color=colours)
    for i, (s, a, energy) in enumerate(zip(shares, accs, has_energy)):
        text = f"{s:.0f} %\nacc {a:.1f} %" if energy else f"nothing\nto descend\nacc {a:.1f} %"
        right.text(i, s + 2, text, ha="center", va="bottom", fontsize=8)
    right.set(xticks=x, ylim=(0, 135), ylabel="dev sentences whose objective\nnever rises (%)",
              title="who descends its own objective, at what accuracy\nSST-2 dev, full budget, mean over 3 seeds")
    right.set_xticklabels(names, fontsize=7)
    right.title.set_fontsize(10)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, Path(args.out), dpi=120)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
