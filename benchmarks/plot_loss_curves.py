"""Training loss and held-out accuracy per epoch of the accuracy benchmark's runs, certified next to standard.

    python benchmarks/plot_loss_curves.py [--results DIR] [--out benchmarks/results/loss_curves.png]

Reads the per-epoch `metrics` recorded in every result file (`benchmarks/accuracy.py` writes them:
training loss averaged over the epoch, held-out loss and accuracy after it). One column per
(dataset, budget): the full-budget exp runs of `benchmarks/results/` and the reduced IMDB runs of the
study (`benchmarks/results/study/`, one point per variant) and the study's full-budget variants.
Each seed is one thin line; the mean over
seeds a thick one. The figure is written whole (temporary file, then renamed).
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from unfoldformer.plots import pyplot, save_figure

RESULTS = Path(__file__).resolve().parent / "results"
COLOURS = {"standard": "tab:gray", "certified-tied": "tab:blue", "certified-untied": "tab:orange",
           "paper": "tab:green"}


def load_runs(results: Path) -> dict[str, dict[str, list[dict]]]:
    """{panel title: {line label: [result records (one per seed)]}} for the exp runs with per-epoch metrics."""
    panels: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    full = [p for p in sorted(results.glob("*.json")) if not p.name.endswith("-reduced.json")]
    for path in full:
        rec = json.loads(path.read_text())
        if rec.get("rho", "exp") == "exp" and rec.get("metrics") and not rec.get("variant"):
            panels[f"{rec['dataset'].upper()}, full budget"][rec["model"]].append(rec)
    for path in sorted((results / "study").glob("*-seed*.json")):          # the study's full-budget variants
        rec = json.loads(path.read_text())
        if rec.get("budget") == "full" and rec.get("metrics"):
            panels[f"{rec['dataset'].upper()}, full budget"][f"{rec['model']} ({rec['variant']})"].append(rec)
    for path in sorted((results / "study").glob("imdb-*-reduced.json")):
        rec = json.loads(path.read_text())
        if rec.get("metrics"):
            label = f"{rec['model']} ({rec.get('variant') or 'baseline'})"
            panels["IMDB, reduced (study: 4,000 reviews, 1 epoch)"][label].append(rec)
    return panels


def _series(records: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
    """(epochs, values (seeds, epochs)) over the epochs every seed has."""
    n = min(len(r["metrics"]) for r in records)
    epochs = np.array([m["epoch"] for m in records[0]["metrics"][:n]])
    return epochs, np.array([[m[key] for m in r["metrics"][:n]] for r in records])


METRICS = (("train_loss", "training loss (epoch mean)"), ("eval_accuracy", "held-out accuracy"))


def _curves(axes, runs: dict[str, list[dict]]) -> None:
    """Per-epoch lines: thin per seed, thick mean, one colour per label."""
    for i, (label, records) in enumerate(sorted(runs.items())):
        style = dict(color=COLOURS.get(label, f"C{(i + 3) % 10}"))         # C0-C2 and grey name the defaults
        for ax, (key, name) in zip(axes, METRICS):
            epochs, values = _series(records, key)                  # (seeds, epochs)
            for seed_values in values:
                ax.plot(epochs, seed_values, lw=0.6, alpha=0.5, marker=".", **style)
            ax.plot(epochs, values.mean(0), lw=2, marker="o",
                    label=f"{label} ({len(records)} seed{'s' if len(records) > 1 else ''})", **style)
            ax.set_ylabel(name)
            ax.set_xlabel("epoch")


def _variants(axes, runs: dict[str, list[dict]]) -> None:
    """One-epoch runs: the final value per variant (dots per seed), variants along x."""
    labels = sorted(runs, key=lambda label: (label.split(" ")[0], "(baseline)" not in label, label))
    for ax, (key, name) in zip(axes, METRICS):
        for x, label in enumerate(labels):
            values = [r["metrics"][-1][key] for r in runs[label]]
            ax.plot([x] * len(values), values, "o", color=COLOURS.get(label.split(" ")[0], "C0"))
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(name)
        ax.grid(axis="y", lw=0.3)


def plot(panels: dict, out: Path) -> None:
    plt = pyplot()
    names = sorted(panels)
    fig, axes = plt.subplots(2, len(names), figsize=(5.2 * len(names), 8.5), squeeze=False)
    for col, title in enumerate(names):
        runs = panels[title]
        one_epoch = all(len(r["metrics"]) == 1 for records in runs.values() for r in records)
        (_variants if one_epoch else _curves)(axes[:, col], runs)
        axes[0, col].set_title(title)
        if not one_epoch:
            axes[1, col].legend(fontsize=7)
    fig.suptitle("Accuracy benchmark: training loss and held-out accuracy per epoch (thick: mean over seeds)\n"
                 "held-out accuracy as evaluated during training: for certified models in result files before "
                 "0.2.0 with the safeguard on")
    fig.tight_layout()
    save_figure(fig, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=RESULTS)
    p.add_argument("--out", type=Path, default=RESULTS / "loss_curves.png")
    args = p.parse_args(argv)
    panels = load_runs(args.results)
    if not panels:
        p.error(f"no result files with per-epoch metrics in {args.results}")
    plot(panels, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
