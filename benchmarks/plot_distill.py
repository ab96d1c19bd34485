"""The distillation runs' curves: training loss and the held-out token and sentence cosines against the teacher.

    python benchmarks/plot_distill.py [--out docs/img/distill-curves.png]

Reads `benchmarks/results/pretrained/distill-{tied,untied}-metrics.csv` (copies of the runs' `metrics.csv`:
a loss row every 50 steps, the held-out measures on 512 windows every 500 steps). The figure is written
whole (temporary file, then renamed).
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

from unfoldformer.plots import pyplot, save_figure

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "pretrained"
COLOURS = {"tied": "tab:blue", "untied": "tab:orange"}


def read(kind: str) -> tuple[list[dict], list[dict]]:
    """(loss rows, held-out rows) of one run's metrics."""
    with open(RESULTS / f"distill-{kind}-metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [r for r in rows if r["loss"]], [r for r in rows if r["val_token_cosine"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "img" / "distill-curves.png")
    args = parser.parse_args()
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for kind, colour in COLOURS.items():
        loss, held = read(kind)
        axes[0].plot([int(r["step"]) for r in loss], [float(r["loss"]) for r in loss], color=colour, lw=0.8,
                     label=kind)
        for ax, key in ((axes[1], "val_sentence_cosine"), (axes[2], "val_token_cosine")):
            ax.plot([int(r["step"]) for r in held], [float(r[key]) for r in held], "o-", color=colour, label=kind)
    titles = ("training loss (MSE + sentence cosine term)", "held-out sentence cosine (512 windows)",
              "held-out token cosine (512 windows)")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step (batch 64)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("all-MiniLM-L6-v2 distilled into certified joint layers (depth 6, d = 384)", fontsize=11)
    fig.tight_layout()
    save_figure(fig, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
