"""The reproduction report: `report.md` from `results.json` (THEORY §7).

`render_report(results, timings, settings)` returns the Markdown text; `print_summary` prints the
headline numbers. No file I/O here (`paper.reproduce` writes the files).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..data import DATASET_NAMES, EVAL_SPLITS
from .settings import DATASET_FIGURE, FIGURE_FILES, RELEASED_DEFECTS, ReproduceSettings


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


def _method(s: dict, cfg: ReproduceSettings) -> list[str]:
    st = s["settings"]
    trunc = lambda n: "full length" if n is None else f"truncated to {n} tokens"
    split = f"{DATASET_NAMES[s['dataset']]} {EVAL_SPLITS[s['dataset']]}"
    acc_src = f"all of {split}" if s["n_accuracy_all"] else f"a fixed random subset (seed {cfg.seed}) of {split}"
    return [
        f"- Inputs: {s['n_samples']} random samples of the {EVAL_SPLITS[s['dataset']]} split, "
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


def render_report(results: dict, timings: dict, cfg: ReproduceSettings) -> str:
    """report.md: per figure the numbers a reader checks, inputs, wall time, released defects."""
    L = ["# Reproduction of figures 1–6 (Yang, Huang, Wipf, NeurIPS 2022)", "",
         f"Mode `{cfg.mode}`, seed {cfg.seed}, figures {cfg.figures}, data sets {cfg.datasets}, "
         f"{cfg.threads} thread(s). Wall time {timings['total']:.1f} s "
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
            shares = (f"monotone {_pct(c['share_monotone']):>6}  layer steps {_pct(c['share_layer_steps_lowering']):>6}"
                      f"  attention {_pct(c['share_attention_steps_lowering']):>6}"
                      f"  FFN {_pct(c['share_ffn_steps_lowering']):>6}")
            print(f"  {key:32s} {shares}  accuracy {_accuracy_cell(c)}")
    print(f"wrote {out / 'report.md'} and results.json; wall time {timings['total']:.1f} s")
