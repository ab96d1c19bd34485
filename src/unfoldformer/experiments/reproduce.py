"""`unfoldformer reproduce`: the paper's figures 1–6 with a report (THEORY §7).

Runs the selected figures — 1 (Apollonius regions), 2–3 (alternating steps), 4 (κ-regions),
5 (energy curves on IMDB), 6 (energy curves on SST-2) — and writes into ``--out``:
the PNGs, ``report.md`` (numbers, embeddings, data files with sha256, wall time, the
released-code defects), ``results.json`` (every number; deterministic for one seed),
``timings.json`` (wall times, kept apart so results.json files compare equal) and
``config.json`` (the resolved arguments).

Figures 5–6 run on the data sets of ``--datasets``; by default those of the requested
figures (5 → IMDB, 6 → SST-2). ``--quick`` shrinks every setting (see `MODES`). Missing
data prints the loader's DataNotFoundError message and returns 2. Torch and BLAS run on
``--threads`` threads (default 1: on the shared two-core development machine, 2 threads made
MKL eigh and the float64 GEMMs 5–40× slower, since OpenMP threads wait on busy cores).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm import tqdm

from ..data import DataFormatError, DataNotFoundError, dataset_files, load_dataset, load_embeddings
from ..runtime import torch_threads
from . import fig1_apollonius, fig4_kappa, fig23_alternating
from . import fig56_energy_curves as fig56
from .outputs import jsonable

FIGURE_FILES = {1: "fig1_apollonius.png", 2: "fig2_alternating_pca.png", 3: "fig3_alternating_gap.png",
                4: "fig4_kappa.png", 5: "fig5_energy_imdb.png", 6: "fig6_energy_sst2.png"}
FIGURE_DATASET = {5: "imdb", 6: "sst2"}
DATASET_FIGURE = {"imdb": 5, "sst2": 6}
EVAL_SPLIT = {"imdb": "test", "sst2": "dev"}          # SST-2 test has no labels
DATASET_NAMES = {"imdb": "IMDB", "sst2": "SST-2"}

#: Defaults of the full and the quick run; command-line values override them.
MODES = {
    "full": dict(samples=200, imdb_max_length=None, train_examples=2000, train_max_length=32,
                 train_batch_size=16, train_epochs=1, imdb_accuracy_samples=2000, sst2_accuracy_samples=None,
                 grid=401, half_steps=200),
    "quick": dict(samples=32, imdb_max_length=128, train_examples=200, train_max_length=32,
                  train_batch_size=16, train_epochs=1, imdb_accuracy_samples=200, sst2_accuracy_samples=200,
                  grid=201, half_steps=100),
}

RELEASED_DEFECTS = [
    ("the energy uses the metric W Wᵀ while the attention step uses WᵀW",
     "one PSD metric AᵀA for both (`paper` preset, THEORY §3.1)"),
    ("the key-norm bias −½‖a_j‖² is computed but never applied",
     "the bias is applied (softmax with key-norm bias = the MM step of ρ = −exp(−z))"),
    ("the \"ReLU\" random-init figure is built without ReLU",
     "both random-init variants are built explicitly (`relu` flag), same weights"),
    ("the \"SST-2\" curves are computed on IMDB test data",
     "SST-2 curves use SST-2 dev sentences (test has no labels)"),
    ("the classifier has no pooling (a 2n-way softmax over per-token logits)",
     "masked mean pooling + linear head (`SequenceClassifier`)"),
    ("the FFN weight is re-squared after training, so the plotted model is not the trained one",
     "W_F is kept in [−0.95, 0.95] by an eigen-clip inside every forward; the released variant "
     "re-applies `released_normalize_()` after training and reports both accuracies"),
    ("E_rel regularises with ½‖Y W‖² instead of ½‖Y‖² (THEORY §7.1)",
     "the corrected energy is E_A + E_F with the F1 energy of §2"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--figures", default="1-6", help="figures to run: '1-6', '1,2,5' (default 1-6)")
    parser.add_argument("--datasets", default=None,
                        help="data sets of figures 5-6, e.g. 'imdb,sst2' (default: those of the figures)")
    parser.add_argument("--samples", type=int, default=None, help="evaluation samples per data set (200; quick 32)")
    parser.add_argument("--embeddings", default="minilm", help="minilm (384-d, default) | glove:PATH (e.g. glove.840B.300d.txt) | random (300-d)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/reproduce"))
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="small, fast settings (< 2 minutes)")
    parser.add_argument("--train-examples", type=int, default=None, help="training examples (2000; quick 200)")
    parser.add_argument("--train-epochs", type=int, default=None)
    parser.add_argument("--accuracy-samples", type=int, default=None,
                        help="accuracy examples per data set (SST-2: all 872 dev; IMDB: 2000 test, quick 200)")
    parser.add_argument("--threads", type=int, default=1, help="torch/BLAS threads (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")


def parse_figures(spec: str) -> list[int]:
    """'1-6' or '1,2,5' (or a mix, '1-3,5') -> sorted figure numbers in 1..6."""
    figures: set[int] = set()
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        try:
            figures.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"bad --figures {spec!r}; use e.g. '1-6' or '1,2,5'") from None
    if not figures or not figures <= set(FIGURE_FILES):
        raise ValueError(f"--figures {spec!r} must select figures among 1-6")
    return sorted(figures)


def resolve(args: argparse.Namespace) -> dict:
    """The resolved settings (mode defaults overridden by explicit arguments)."""
    figures = parse_figures(args.figures)
    mode = dict(MODES["quick" if args.quick else "full"])
    for key in ("samples", "train_examples", "train_epochs"):
        if getattr(args, key) is not None:
            mode[key] = getattr(args, key)
    if args.accuracy_samples is not None:
        mode["imdb_accuracy_samples"] = mode["sst2_accuracy_samples"] = args.accuracy_samples
    for key in ("samples", "train_examples", "train_epochs", "accuracy_samples", "threads"):
        value = getattr(args, key)
        if value is not None and value < 1:
            raise ValueError(f"--{key.replace('_', '-')} must be >= 1, got {value}")
    if args.datasets is None:
        datasets = [FIGURE_DATASET[f] for f in figures if f in FIGURE_DATASET]
    else:
        datasets = [d.strip().lower().replace("-", "") for d in args.datasets.split(",") if d.strip()]
        bad = [d for d in datasets if d not in DATASET_FIGURE]
        if bad:
            raise ValueError(f"unknown dataset(s) {bad}; valid: imdb, sst2")
        datasets = datasets if any(f in FIGURE_DATASET for f in figures) else []
    return {"figures": figures, "datasets": sorted(set(datasets), key=datasets.index),
            "mode": "quick" if args.quick else "full", **mode, "embeddings": args.embeddings,
            "seed": args.seed, "out": str(args.out), "data_dir": None if args.data_dir is None else str(args.data_dir),
            "threads": args.threads, "progress": not args.no_progress}


# ----------------------------------------------------------------------------- data
def _curve_settings(cfg: dict, dataset: str) -> fig56.CurveSettings:
    return fig56.CurveSettings(
        eval_max_length=cfg["imdb_max_length"] if dataset == "imdb" else None,
        train_max_length=cfg["train_max_length"], train_batch_size=cfg["train_batch_size"],
        train_epochs=cfg["train_epochs"], accuracy_max_length=cfg["train_max_length"])


def _load_inputs(cfg: dict) -> tuple[dict, object, dict]:
    """Per data set: eval texts, train and accuracy examples; the embeddings; data files with sha256."""
    inputs, files = {}, {}
    d, seed = cfg["data_dir"], cfg["seed"]
    for name in cfg["datasets"]:
        test = load_dataset(name, EVAL_SPLIT[name], d)
        train = fig56.select(load_dataset(name, "train", d), cfg["train_examples"], seed, 1)
        acc = fig56.select(test, cfg[f"{name}_accuracy_samples"], seed, 2)
        inputs[name] = ([e.text for e in fig56.select(test, cfg["samples"], seed, 0)], train, acc,
                        len(acc) == len(test))
        files.update(dataset_files(name, d))
    texts = [t for ev, tr, acc, _ in inputs.values() for t in ev + [e.text for e in tr + acc]]
    emb = load_embeddings(cfg["embeddings"], vocab_texts=texts, seed=seed) if inputs else None
    return inputs, emb, files


# ----------------------------------------------------------------------------- figures
def _theory_figures(cfg: dict, out: Path, tick) -> dict:
    """Figures 1–4 (THEORY §3.5, §7 items 1–4): summaries, PNGs written to `out`."""
    figs, seed, res = cfg["figures"], cfg["seed"], {}
    if 1 in figs:
        r = fig1_apollonius.compute(seed=seed, grid=cfg["grid"])
        fig1_apollonius.plot(r, out / FIGURE_FILES[1])
        res["1"] = fig1_apollonius.summary(r)
        tick("figure 1")
    if 2 in figs or 3 in figs:
        r = fig23_alternating.compute(seed=seed, half_steps=cfg["half_steps"])
        fig23_alternating.plot(r, out / FIGURE_FILES[2], path_fig3=out / FIGURE_FILES[3])
        res["2-3"] = fig23_alternating.summary(r)
        tick("figures 2-3")
    if 4 in figs:
        r = fig4_kappa.compute(seed=seed, grid=cfg["grid"])
        fig4_kappa.plot(r, out / FIGURE_FILES[4])
        res["4"] = fig4_kappa.summary(r)
        tick("figure 4")
    return res


def _energy_figures(cfg: dict, inputs: dict, emb, out: Path, tick) -> dict:
    """Figures 5–6 per data set: summaries, PNGs written to `out`."""
    res = {}
    for name, (texts, train, acc, acc_all) in inputs.items():
        r = fig56.compute(texts, train, acc, emb, name, _curve_settings(cfg, name), cfg["seed"], tick)
        fig = DATASET_FIGURE[name]
        fig56.plot(r, out / FIGURE_FILES[fig],
                   title=f"Figure {fig}: energy per layer, {DATASET_NAMES[name]} "
                         f"{EVAL_SPLIT[name]} ({len(texts)} samples)")
        res[name] = {**fig56.summary(r), "n_accuracy_all": acc_all, "settings": jsonable(vars(r.settings))}
    return res


# ----------------------------------------------------------------------------- report
def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "–" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v[:8]) + (", …" if len(v) > 8 else "") + "]"
    return str(v)


def _pct(v) -> str:
    return "–" if v is None else f"{100 * v:.1f}%"


def _kv_table(d: dict) -> list[str]:
    return ["| quantity | value |", "|---|---|"] + [f"| `{k}` | {_fmt(v)} |" for k, v in d.items()]


def _accuracy_cell(c: dict) -> str:
    if c["accuracy"] is None:
        return "–"
    if c["accuracy_as_trained"] is None:
        return _pct(c["accuracy"])
    return f"{_pct(c['accuracy'])} (as trained: {_pct(c['accuracy_as_trained'])})"


def _curve_tables(s: dict) -> list[str]:
    """Summary table (rows = formula × variant) and per-layer mean energies of one data set."""
    head = ("| formula | variant | monotone curves | lowering layer steps | lowering attention sub-steps "
            "| lowering FFN sub-steps | mean E(Y⁽⁰⁾) | mean E(Y⁽ᵀ⁾) | pooled spread | accuracy |")
    lines = [head, "|---" * 10 + "|"]
    for key, c in s["curves"].items():
        formula, variant = key.split("/")
        lines.append(f"| {formula} | {variant} | {_pct(c['share_monotone'])} | {_pct(c['share_layer_steps_lowering'])} "
                     f"| {_pct(c['share_attention_steps_lowering'])} | {_pct(c['share_ffn_steps_lowering'])} "
                     f"| {c['mean_energy'][0]:.6g} | {c['mean_energy'][-1]:.6g} | {c['pooled_spread_ratio']:.3g} "
                     f"| {_accuracy_cell(c)} |")
    keys = list(s["curves"])
    lines += ["", "Mean energy per layer (medians are in results.json):", "",
              "| t | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for t in range(len(s["curves"][keys[0]]["mean_energy"])):
        lines.append(f"| {t} | " + " | ".join(f"{s['curves'][k]['mean_energy'][t]:.6g}" for k in keys) + " |")
    return lines


def _method(s: dict, cfg: dict) -> list[str]:
    st = s["settings"]
    trunc = lambda n: "full length" if n is None else f"truncated to {n} tokens"
    split = f"{DATASET_NAMES[s['dataset']]} {EVAL_SPLIT[s['dataset']]}"
    acc_src = f"all of {split}" if s["n_accuracy_all"] else f"a fixed random subset (seed {cfg['seed']}) of {split}"
    return [
        f"- Inputs: {s['n_samples']} random samples of the {EVAL_SPLIT[s['dataset']]} split, "
        f"{trunc(st['eval_max_length'])} ({s['tokens_per_sample']['mean']:.1f} tokens on average, "
        f"max {s['tokens_per_sample']['max']}); frozen embeddings, d_model = embedding dim.",
        f"- Training (trained variant): {s['n_train']} random training examples, {trunc(st['train_max_length'])}, "
        f"plain SGD lr {st['lr']:g}, {st['train_epochs']} epoch(s), minibatches of {st['train_batch_size']} "
        "(similar lengths, random order) with the loss *summed* over the minibatch (one lr-step per example). "
        "Classifier: masked mean pooling + linear head (the released code had no pooling).",
        f"- Accuracy: {s['n_accuracy']} examples ({acc_src}), {trunc(st['accuracy_max_length'])}; "
        f"the majority class makes up {_pct(s['majority_rate'])} of them.",
        f"- A step lowers its energy when E_after ≤ E_before + tol·(1 + |E_before|), tol = {s['tolerance']:g} "
        "(`descent_tolerance(float32)`); a curve is monotone when none of its layer steps rises.",
        "- Pooled spread: RMS distance of the mean-pooled outputs Y⁽ᵀ⁾ from their mean over the samples, "
        f"divided by the norm of that mean (inputs X: {s['inputs_pooled_spread_ratio']:.3g}); near 0 the output "
        "hardly depends on the input, and a linear head cannot do better than the majority class.",
    ]


def render_report(results: dict, timings: dict, cfg: dict) -> str:
    """report.md: per figure the numbers a reader checks, inputs, wall time, released defects."""
    L = ["# Reproduction of figures 1–6 (Yang, Huang, Wipf, NeurIPS 2022)", "",
         f"Mode `{cfg['mode']}`, seed {cfg['seed']}, figures {cfg['figures']}, data sets {cfg['datasets']}, "
         f"{cfg['threads']} thread(s). Wall time {timings['total']:.1f} s "
         f"({', '.join(f'{k} {v:.1f} s' for k, v in timings.items() if k != 'total')}).", ""]
    names = {"1": ("Figure 1: Apollonius regions", [1]), "2-3": ("Figures 2–3: alternating steps", [2, 3]),
             "4": ("Figure 4: κ-regions", [4])}
    for key, summary in results["figures"].items():
        title, figs = names[key]
        L += [f"## {title}", ""] + [f"![figure {f}]({FIGURE_FILES[f]})" for f in figs] + [""]
        L += _kv_table(summary) + [""]
    if results["energy_curves"]:
        L += ["## Figures 5–6: energy curves of a 12-step weight-tied model", "",
              "Variants on the same inputs: random init without ReLU, the same weights with ReLU, and trained "
              "with ReLU; formulas: `paper` (corrected: one PSD metric AᵀA, key-norm bias, F1 FFN with spectrum "
              "clipped to ±0.95) and `paper-as-released` (THEORY §7.1, energy E_rel). The `paper` F1 energy "
              "leaves out the indicator ι_{≥0} (the input embeddings are not non-negative). For the trained "
              "released model `released_normalize_()` is applied after training, as the released code does "
              "(it squares W_f again); its accuracy is given after and before that. Box plots: 1.5·IQR "
              "whiskers (points beyond them not drawn), energies shifted by the lowest lower whisker, mean "
              "as a red line.", ""]
    for name, s in results["energy_curves"].items():
        fig = DATASET_FIGURE[name]
        L += [f"### Figure {fig}: {DATASET_NAMES[name]}", "", f"![figure {fig}]({FIGURE_FILES[fig]})", ""]
        L += _method(s, cfg) + [""] + _curve_tables(s) + [""]
    if results["embeddings"] is not None:
        L += ["## Embeddings", "", "```json", json.dumps(results["embeddings"], indent=2), "```", ""]
    if results["data_files"]:
        L += ["## Data files", "", "| file | sha256 |", "|---|---|"]
        L += [f"| `{p}` | `{h}` |" for p, h in results["data_files"].items()] + [""]
    L += ["## Released-code defects fixed by the corrected model (THEORY §7)", "",
          "| released code | corrected pipeline |", "|---|---|"]
    L += [f"| {bad} | {fix} |" for bad, fix in RELEASED_DEFECTS]
    return "\n".join(L) + "\n"


def print_summary(results: dict, timings: dict, out: Path) -> None:
    """Headline numbers on stdout."""
    for key, s in results["figures"].items():
        keys = [k for k in ("area_rel_error", "n_rises", "first_rise", "final_rel_gap", "area_fraction") if k in s]
        print(f"figure {key}: " + ", ".join(f"{k} {_fmt(s[k])}" for k in keys))
    for name, s in results["energy_curves"].items():
        print(f"figure {DATASET_FIGURE[name]} ({DATASET_NAMES[name]}, {s['n_samples']} samples):")
        for key, c in s["curves"].items():
            print(f"  {key:32s} monotone {_pct(c['share_monotone']):>6}  layer steps {_pct(c['share_layer_steps_lowering']):>6}"
                  f"  attention {_pct(c['share_attention_steps_lowering']):>6}  FFN {_pct(c['share_ffn_steps_lowering']):>6}"
                  f"  accuracy {_accuracy_cell(c)}")
    print(f"wrote {out / 'report.md'} and results.json; wall time {timings['total']:.1f} s")


# ----------------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    try:
        cfg = resolve(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        with torch_threads(cfg["threads"]):
            return _run(cfg)
    except (DataNotFoundError, DataFormatError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(cfg: dict) -> int:
    t0, timings = time.perf_counter(), {}
    out = Path(cfg["out"])
    inputs, emb, files = _load_inputs(cfg)                        # fails fast on missing data
    timings["load_data"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    n_theory = (1 in cfg["figures"]) + bool({2, 3} & set(cfg["figures"])) + (4 in cfg["figures"])
    total = n_theory + sum(fig56.n_stages(_curve_settings(cfg, n)) for n in inputs)
    with tqdm(total=total, desc="reproduce", disable=not cfg["progress"], file=sys.stderr) as bar:
        last = [time.perf_counter()]

        def tick(stage: str) -> None:
            now = time.perf_counter()
            timings[stage], last[0] = now - last[0], now
            bar.set_postfix_str(stage)
            bar.update(1)

        theory = _theory_figures(cfg, out, tick)
        curves = _energy_figures(cfg, inputs, emb, out, tick)
    timings["total"] = time.perf_counter() - t0
    results = jsonable({"mode": cfg["mode"], "seed": cfg["seed"], "figures": theory, "energy_curves": curves,
                         "settings": {k: v for k, v in cfg.items() if k not in ("out", "progress", "threads")},
                         "embeddings": emb.describe() if emb is not None else None, "data_files": files})
    (out / "results.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    (out / "timings.json").write_text(json.dumps(jsonable(timings), indent=2) + "\n")
    (out / "report.md").write_text(render_report(results, timings, cfg))
    print_summary(results, timings, out)
    return 0
