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

Capacity factors of the joint layer (THEORY §3.7–3.9), one at a time from `certified-joint` (length-normalised
attention, the preset's default); the standard Transformer takes the same position variants, so each
certified row has a standard row with the same positional scheme:

    python benchmarks/accuracy_study.py --dataset imdb --model certified-joint \
        --variants baseline positions_learned positions_sinusoidal positions_rotary metric_diagonal metric_free \
        heads_8 depth_12 learned_steps
    python benchmarks/accuracy_study.py --dataset imdb --model standard --variants baseline positions_rotary
    python benchmarks/accuracy_study.py --dataset imdb --model certified-joint \
        --validate-budget baseline metric_free    # both at the screening and at the full budget, then compare

Every variant keeps the certificate: absolute positions change only the input X, rotary attention and free
per-head metrics descend for any weights (THEORY §3.8–3.9), learned step sizes stay in α ∈ (0, α_max] and
γ ≥ 0 by their parametrisation (THEORY §3.7), and heads / depth / λ are free choices.

Validating the screening budget (`--validate-budget A B`): the two variants run at the screening budget
(`BUDGETS`) and at the benchmark's full budget (`accuracy.py` without budget flags; results named without
`-reduced`), cells with a result file are not rerun, and the report says whether the screening budget
ranks A and B as the full budget does (and by how much each differs). Use two variants whose screening
accuracies differ by more than their seed spread; a disagreement means the screening budget cannot rank
the factors and must grow (more examples or epochs) before the study is read.

The table gives, per variant, the accuracy and its change from the baseline of the same model and
dataset, the final training loss (what "fit" means here), the energy columns (every layer
descends, curve never rises with the safeguard off and on) and the training throughput.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import accuracy  # the accuracy benchmark (same folder)

STUDY = accuracy.RESULTS / "study"

#: variant -> config changes (section.key=value), each inside the certified ranges of THEORY §3.
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "final_norm": ["model.final_norm=tokens"],             # a LayerNorm on every output token, then pooling
    "pool_norm": ["model.final_norm=pooled"],              # pooling, then a LayerNorm (0.3.0's default)
    # pool_norm with a position prior of 64 ranks (the certified preset's default since it came, theory §4e)
    "position_prior": ["model.final_norm=pooled", "model.position_prior=64"],
    "alpha_ffn_1.5": ["model.alpha_ffn=1.5"],               # F2 is certified for α ∈ (0, 2)
    "alpha_attention_0.5": ["model.alpha_attention=0.5"],   # anchored attention: α ∈ (0, 1]
    "lambda_0.3": ["model.anchor_weight=0.3"],
    "lambda_3": ["model.anchor_weight=3.0"],
    "weights_16_3": ["model.anchor_weight=16.0", "model.ffn_weight=3.0"],   # the joint step near 4 : 1 : 3 (fresh.md)
    "ffn_1024": ["model.ffn_hidden=1024"],
    "heads_8": ["model.n_heads=8"],
    "depth_12": ["model.depth=12"],
    "lr_3e-3": ["optim.lr=0.003"],
    "lr_2e-3": ["optim.lr=0.002"],
    "lr_3e-4": ["optim.lr=0.0003"],
    "lr_3e-3_alpha_ffn_0.5": ["optim.lr=0.003", "model.alpha_ffn=0.5"],   # the FFN step keeps half of Y
    "warmup_0.02": ["optim.warmup=0.02"],
    "fixed_basis": ["model.learn_basis=false"],
    # capacity factors (certified-joint; the positions also for the standard model)
    "positions_learned": ["model.positions=learned", "model.max_positions=8192"],   # rows for the full-length IMDB pass
    "positions_sinusoidal": ["model.positions=sinusoidal"],
    "positions_rotary": ["model.positions=rotary"],
    "metric_diagonal": ["model.metric=diagonal"],            # per-head diagonal metric (Hyper-SET style)
    "metric_free": ["model.metric=free"],                    # free per-head map A_h, μ_h bound (THEORY §3.8)
    "learned_steps": ["model.learn_steps=true"],             # α ∈ [10⁻³α_max, α_max] and γ ≥ 0 per layer (§3.7)
    "metric_free_rotary": ["model.metric=free", "model.positions=rotary"],
    "heads_8_metric_free": ["model.n_heads=8", "model.metric=free"],
    "depth_12_metric_free": ["model.depth=12", "model.metric=free"],
}
#: Every variant but `final_norm` is measured on the classifier the study began with, without the final LayerNorm
#: (the certified kinds take it by default since 0.3.0), so its rows compare with the result files kept.
STUDY_BASE = ["model.final_norm=none"]


#: The joint models' base has no position prior either (the `certified` preset's default since theory §4e came):
#: every variant but `position_prior` keeps the meaning of its result files.
PRIOR_MODELS = ("certified-joint", "certified-joint-untied")


def changes(name: str, model: str = "") -> list[str]:
    """The variant's config changes on top of the study's base classifier (of `model`)."""
    base = [] if name in ("final_norm", "pool_norm", "position_prior") else STUDY_BASE
    prior = ["model.position_prior=0"] if model in PRIOR_MODELS and name != "position_prior" else []
    return base + prior + VARIANTS[name]


BUDGETS = {"imdb": ["--max-train-examples", "4000", "--epochs", "1", "--max-eval-examples", "500"],
           "sst2": ["--max-train-examples", "8000", "--epochs", "1"]}


def run(dataset: str, model: str, variants: list[str], seed: int, extra: list[str]) -> None:
    for name in variants:
        argv = ["--dataset", dataset, "--model", model, "--seed", str(seed), "--results", str(STUDY),
                *BUDGETS[dataset], *extra]
        argv += ["--variant", name] + [x for change in changes(name, model) for x in ("--set", change)]
        print(f"study: {dataset} {model} {name}", file=sys.stderr)
        accuracy.main(argv)


def _cell_path(dataset: str, model: str, seed: int, variant: str, suffix: str, folder: Path = STUDY) -> Path:
    """A variant's result file; the baseline (no change) at the full budget is the accuracy benchmark's own cell
    (`benchmarks/results/<dataset>-<model>-seed<k>.json`) when the study has no file of its own."""
    path = folder / f"{accuracy.cell_name(dataset, model, seed, variant=variant)}{suffix}.json"
    if not path.exists() and variant == "baseline" and not suffix:
        own = accuracy.RESULTS / f"{accuracy.cell_name(dataset, model, seed)}.json"
        return own if own.exists() else path
    return path


def validate_budget(dataset: str, model: str, pair: list[str], seed: int, extra: list[str],
                    folder: Path = STUDY) -> str:
    """Run the two variants of `pair` at the screening and the full budget (cells with a result are kept)
    and report whether both budgets rank them alike."""
    for reduced in (True, False):
        for name in pair:
            suffix = "-reduced" if reduced else ""
            if _cell_path(dataset, model, seed, name, suffix, folder).exists():
                continue
            argv = ["--dataset", dataset, "--model", model, "--seed", str(seed), "--results", str(folder),
                    *(BUDGETS[dataset] if reduced else []), *extra, "--variant", name]
            argv += [x for change in changes(name, model) for x in ("--set", change)]
            print(f"study: {dataset} {model} {name} ({'screening' if reduced else 'full'} budget)", file=sys.stderr)
            accuracy.main(argv)
    return budget_agreement(dataset, model, pair, seed, folder)


def budget_agreement(dataset: str, model: str, pair: list[str], seed: int, folder: Path = STUDY) -> str:
    """Markdown: the pair's accuracies at both budgets and whether the screening ranking is the full one.

    With the cells' `eval_examples`, each budget's difference is set beside two standard errors of a
    difference of two independent accuracies, √Σ p(1 − p)/m (both variants see the same examples, so this is
    conservative); a difference below it is "not resolved". A tie (equal accuracies) ranks nothing."""
    acc, count = {}, {}
    for name in pair:
        for budget, suffix in (("screening", "-reduced"), ("full", "")):
            path = _cell_path(dataset, model, seed, name, suffix, folder)
            record = json.loads(path.read_text()) if path.exists() else {}
            acc[name, budget], count[name, budget] = record.get("accuracy"), record.get("eval_examples")
    lines = ["| variant | screening (%) | full (%) |", "|---|---|---|"]
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}"           # noqa: E731
    lines += [f"| {name} | {pct(acc[name, 'screening'])} | {pct(acc[name, 'full'])} |" for name in pair]
    if any(v is None for v in acc.values()):
        return "\n".join(lines + ["", "ranking: incomplete (missing cells)"]) + "\n"
    a, b = pair
    diff = {budget: acc[a, budget] - acc[b, budget] for budget in ("screening", "full")}
    notes = []
    for budget in diff:                       # resolution: 2 standard errors of the difference of two accuracies
        if count[a, budget] and count[b, budget]:
            se = math.sqrt(sum(acc[v, budget] * (1 - acc[v, budget]) / count[v, budget] for v in pair))
            notes.append(f"{budget}: {a} − {b} = {100 * diff[budget]:+.1f} points, two standard errors "
                         f"{200 * se:.1f}" + ("" if abs(diff[budget]) >= 2 * se else " (not resolved)"))
    if diff["screening"] == 0 or diff["full"] == 0:
        tied = " and ".join(budget for budget in diff if diff[budget] == 0)
        verdict = f"ranking: cannot compare, the pair ties at the {tied} budget"
    else:
        same = diff["screening"] * diff["full"] > 0
        verdict = f"ranking: the screening budget {'agrees' if same else 'DISAGREES'} with the full budget"
        if any(n.endswith("(not resolved)") for n in notes):
            verdict += " (a difference within two standard errors: the ranking is not resolved)"
    return "\n".join(lines + [""] + [f"- {n}" for n in notes] + ([""] if notes else []) + [verdict]) + "\n"


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
    p.add_argument("--model", choices=accuracy.LABELS, default="certified-tied")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", default="1")
    p.add_argument("--table", action="store_true", help="print the study table from the result files")
    p.add_argument("--validate-budget", nargs=2, metavar="VARIANT", choices=list(VARIANTS),
                   help="run two variants at the screening and the full budget and compare their ranking")
    args = p.parse_args(argv)
    if args.table:
        print(table())
        return 0
    if args.dataset is None:
        p.error("give --dataset (or --table)")
    extra = ["--threads", args.threads, "--no-progress"]
    if args.validate_budget:
        print(validate_budget(args.dataset, args.model, args.validate_budget, args.seed, extra))
        return 0
    run(args.dataset, args.model, args.variants, args.seed, extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
