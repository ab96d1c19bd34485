"""What limits the certified models' fit: one factor at a time, at a reduced budget.

Each variant changes one setting of the certified presets and keeps every model inside its
certificate (THEORY §3: step sizes in their certified ranges, λ > 0, any width, depth or learning
rate), trains a certified model through `benchmarks/accuracy.py` at a reduced budget and writes
its result file under `benchmarks/results/study/` (named `<dataset>-<model>-v_<variant>-seed<k>-reduced.json`;
a run never replaces another variant's file). Budgets: IMDB 4,000 training reviews, 1 epoch, 256
tokens, 500 fixed test reviews; SST-2 8,000 training sentences, 1 epoch, all 872 dev sentences.

    python benchmarks/accuracy_study.py --dataset imdb --model certified-tied --variants baseline lambda_0.3
    python benchmarks/accuracy_study.py --table                 # the study table from the result files
    python benchmarks/accuracy.py --dataset imdb --model certified-tied --variant lr_3e-3 \
        --set optim.lr=0.003 --results benchmarks/results/study   # one variant at the full budget
    python benchmarks/layer_health.py RUN_DIR ...               # token size, spread and live ReLU units per layer

The table gives, per variant, the accuracy and its change from the baseline of the same model and
dataset, the final training loss (what "fit" means here), the energy columns (every layer
descends, curve never rises with the safeguard off and on) and the training throughput.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import accuracy  # the accuracy benchmark (same folder)

STUDY = accuracy.RESULTS / "study"

#: variant -> config changes (section.key=value), each inside the certified ranges of THEORY §3.
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "alpha_ffn_1.5": ["model.alpha_ffn=1.5"],               # F2 is certified for α ∈ (0, 2)
    "alpha_attention_0.5": ["model.alpha_attention=0.5"],   # anchored attention: α ∈ (0, 1]
    "lambda_0.3": ["model.anchor_weight=0.3"],
    "lambda_3": ["model.anchor_weight=3.0"],
    "ffn_1024": ["model.ffn_hidden=1024"],
    "heads_8": ["model.n_heads=8"],
    "depth_12": ["model.depth=12"],
    "lr_3e-3": ["optim.lr=0.003"],
    "lr_2e-3": ["optim.lr=0.002"],
    "lr_3e-4": ["optim.lr=0.0003"],
    "lr_3e-3_alpha_ffn_0.5": ["optim.lr=0.003", "model.alpha_ffn=0.5"],   # the FFN step keeps half of Y
    "warmup_0.02": ["optim.warmup=0.02"],
    "fixed_basis": ["model.learn_basis=false"],
}
BUDGETS = {"imdb": ["--max-train-examples", "4000", "--epochs", "1", "--max-eval-examples", "500"],
           "sst2": ["--max-train-examples", "8000", "--epochs", "1"]}


def run(dataset: str, model: str, variants: list[str], seed: int, extra: list[str]) -> None:
    for name in variants:
        argv = ["--dataset", dataset, "--model", model, "--seed", str(seed), "--results", str(STUDY),
                *BUDGETS[dataset], *extra]
        argv += ["--variant", name] + [x for change in VARIANTS[name] for x in ("--set", change)]
        print(f"study: {dataset} {model} {name}", file=sys.stderr)
        accuracy.main(argv)


def _energy(record: dict, key: str, field: str) -> float | None:
    value = record.get(key)
    return None if value is None else value.get(field)


def table(folder: Path = STUDY) -> str:
    """The study table (Markdown) from every result file in `folder`."""
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    base = {(r["dataset"], r["model"], r["budget"]): r for r in records if r.get("variant") == "baseline"}
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}"
    head = ["dataset", "budget", "model", "variant", "accuracy (%)", "Δ vs baseline", "accuracy, safeguard on (%)",
            "train loss (mean of the epoch)",
            "every layer descends (%)", "curve never rises (%)", "never rises, safeguard on (%)", "tokens/s"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    order = list(VARIANTS)
    records.sort(key=lambda r: (r["dataset"], r["budget"] != "reduced", r["model"],
                                order.index(r["variant"]) if r["variant"] in order else 99))
    for r in records:
        b = base.get((r["dataset"], r["model"], r["budget"]))
        delta = "–" if b is None or r is b else f"{100 * (r['accuracy'] - b['accuracy']):+.1f}"
        loss = r["metrics"][-1]["train_loss"] if r.get("metrics") else None
        lines.append("| " + " | ".join([
            r["dataset"], r["budget"], r["model"], r["variant"], pct(r["accuracy"]), delta,
            pct(r.get("accuracy_safeguard")),
            "–" if loss is None else f"{loss:.3f}",
            pct(_energy(r, "energy", "layer_descent_share")), pct(_energy(r, "energy", "monotone_share")),
            pct(_energy(r, "energy_safeguard", "monotone_share")), f"{r['tokens_per_s']:,.0f}"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=sorted(BUDGETS))
    p.add_argument("--model", choices=accuracy.RHO_MODELS, default="certified-tied")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", default="1")
    p.add_argument("--table", action="store_true", help="print the study table from the result files")
    args = p.parse_args(argv)
    if args.table:
        print(table())
        return 0
    if args.dataset is None:
        p.error("give --dataset (or --table)")
    run(args.dataset, args.model, args.variants, args.seed, ["--threads", args.threads, "--no-progress"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
