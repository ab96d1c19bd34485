"""The reproduction report from `results.json`: verdicts first, then deviations, then every number (THEORY §7).

`verdict_rows(results)` turns the numbers into rows "claim of the paper — reproduced? — evidence", one
per figure and per variant of figures 5–6; `report_blocks` builds the whole report as blocks that
`report_render` writes as Markdown (`render_report`) and as one self-contained HTML page
(`render_html`). `print_summary` prints the headline numbers. No file writing here.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..data import DATASET_NAMES, EVAL_SPLITS
from .report_render import to_html, to_markdown
from .settings import DATASET_FIGURE, FIGURE_FILES, RELEASED_DEFECTS, ReproduceSettings

__all__ = ["print_summary", "render_html", "render_report", "report_blocks", "verdict_rows"]

TITLE = "Reproduction of figures 1–6 of Yang, Huang, Wipf, Transformers from an Optimization Perspective (NeurIPS 2022)"
#: Variant keys of figures 5–6 in report order, with how a claim names them.
VARIANT_CLAIMS = {
    "paper/random": "random init, no ReLU, corrected formulas",
    "paper/random-relu": "random init, ReLU, corrected formulas",
    "paper/trained-as-released": "trained as released (SGD), corrected formulas",
    "paper/trained": "trained with a recipe that learns (AdamW), corrected formulas",
    "certified/trained": ("trained certified model, no safeguard (one MM step per layer: descent by "
                          "construction; not in the paper)"),
    "paper-as-released/random": "random init, no ReLU, released formulas (E_rel)",
    "paper-as-released/random-relu": "random init, ReLU, released formulas (E_rel)",
    "paper-as-released/trained-as-released": "trained as released (SGD), released formulas (E_rel)",
}
LEARNED_MARGIN = 0.05          # accuracy above the majority class that counts as "the model learned"


def _pct(v, digits: int = 1) -> str:
    return "–" if v is None else f"{100 * v:.{digits}f} %"


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return "–" if v is None else str(v)
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(_fmt(x) for x in v[:8]) + (", …" if len(v) > 8 else "") + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_fmt(x)}" for k, x in v.items()) + "}"
    return str(v)


# ----------------------------------------------------------------------------- verdicts
def _theory_verdicts(figs: dict) -> list[tuple[str, str, str]]:
    rows = []
    if "1" in figs:
        err = max(figs["1"]["area_rel_error"])
        rows.append(("Figure 1: the Apollonius region is a disc around y_f* (C < 1) or the outside of a disc "
                     "around y_h* (C > 1)", "yes" if err < 1e-2 else "no",
                     f"grid areas match the closed form to a relative {err:.1e} for C = "
                     f"{', '.join(f'{c:g}' for c in figs['1']['C'])}"))
    if "2-3" in figs:
        s = figs["2-3"]
        ok = s["first_rise"] > 1 and s["n_rises"] > 0 and s["n_rises_after_g_step"] == s["n_rises"]
        rows.append(("Figures 2–3: alternating half-steps first lower h monotonically, then follow a "
                     "saw-tooth near Y_h*", "yes" if ok else "no",
                     f"h falls for the first {s['first_rise'] - 1} half-steps, then rises on {s['n_rises']} of "
                     f"{s['half_steps']} half-steps ({s['n_rises_after_g_step']} after g-steps); final "
                     f"log h − log h_min = {s['final_log_ratio']:.2e} (a 2-cycle, not Y_h*)"))
    if "4" in figs:
        s = figs["4"]
        fr = s["area_fraction"]
        ok = all(b >= a for a, b in zip(fr, fr[1:]))
        rows.append(("Figure 4: the κ-regions {Div(x) ≥ −κ} grow with κ and cover most of the plane",
                     "yes" if ok else "no",
                     "authors' setup, share of [−5, 5]²: " + ", ".join(
                         f"κ = {k:g}: {_pct(f)}" for k, f in zip(s["kappas"], fr))))
    return rows


def _learned(c: dict, majority: float | None) -> bool:
    return majority is not None and c["accuracy"] is not None and c["accuracy"] >= majority + LEARNED_MARGIN


def _curve_verdict(key: str, c: dict, s: dict) -> tuple[str, str, str]:
    name = DATASET_NAMES[s["dataset"]]
    fig = DATASET_FIGURE[s["dataset"]]
    claim = f"Figure {fig}: energy never rises across the layers, {VARIANT_CLAIMS[key]}, {name}"
    rises, steps = c["rising_layer_steps"], c["n_layer_steps"]
    evidence = (f"{_pct(c['share_monotone'])} of {c['n_curves']} curves never rise; {rises:,} of {steps:,} layer "
                f"steps rise")
    verdict = "yes" if c["share_monotone"] == 1.0 else "no"
    if key.startswith("paper-as-released/"):
        verdict = "yes" if verdict == "yes" else "no (as released)"
        evidence += (f"; each sub-step lowers its own term (attention {_pct(c['share_attention_steps_lowering'])}, "
                     f"FFN {_pct(c['share_ffn_steps_lowering'])}) but E_rel is not the energy they descend")
    if c["accuracy"] is not None:
        evidence += f"; accuracy {_pct(c['accuracy'])} (majority class {_pct(s['majority_rate'])})"
        if not _learned(c, s["majority_rate"]):
            verdict += ", but the model did not learn"
    return claim, verdict, evidence


def verdict_rows(results: dict) -> list[tuple[str, str, str]]:
    """(claim of the paper, reproduced?, evidence) per figure and per variant of figures 5–6."""
    rows = _theory_verdicts(results.get("figures", {}))
    for s in results.get("energy_curves", {}).values():
        rows += [_curve_verdict(key, s["curves"][key], s) for key in VARIANT_CLAIMS if key in s["curves"]]
    return rows


# ----------------------------------------------------------------------------- sections
def _deviations(results: dict) -> list[str]:
    emb = results.get("embeddings") or {}
    st = results.get("settings", {})
    items = [f"**Embeddings**: the `{emb.get('name', st.get('embeddings'))}` table ({emb.get('dim', '?')}-d"
             + (", the input layer of all-MiniLM-L6-v2, word pieces" if emb.get("name") == "minilm" else "")
             + ") instead of GloVe 840B 300-d, so the untrained and as-released models have d_model = "
             f"{emb.get('dim', '?')} instead of 300."]
    if results.get("energy_curves"):
        imdb = st.get("imdb_max_length")
        items += [
            f"**Data**: {st.get('samples')} random evaluation texts per data set (seed {results.get('seed')}); "
            "the SST-2 curves use SST-2 dev sentences (the released code used IMDB test data); IMDB reviews "
            + ("at full length." if imdb is None else f"truncated to {imdb} tokens for the curves."),
            "**Recipe**: the as-released recipe sums the cross-entropy over minibatches of 16 (one lr-step per "
            "example); the classifier mean-pools over tokens into a linear head (the released code had no "
            "pooling). The *trained* variant (AdamW, warm-up, a trainable input map to a narrower d_model, more "
            "examples) and the certified (joint) model are ours, not the paper's.",
            "**Formulas**: the `paper` rows use the corrected formulas (the released-code defects are listed at "
            "the end); the released formulas are shown separately as `paper-as-released`.",
        ]
    items.append("**Random draws**: figures 1–4 use our seeded draws of the random points, matrices and "
                 "vectors, not the authors' draws.")
    return items


def _released_explanation(results: dict) -> list[str]:
    """Why E_rel rises although every sub-step lowers its own term, with the measured terms of one rising layer."""
    out = []
    for s in results.get("energy_curves", {}).values():
        c = s["curves"].get("paper-as-released/random")
        if c is None:
            continue
        layers = [t + 1 for t, share in enumerate(c["share_rising_per_layer"]) if share > 0.5]
        text = (f"{DATASET_NAMES[s['dataset']]}: with the released formulas E_rel rises at layers "
                f"t = {', '.join(map(str, layers)) or 'none'} for most samples ({_pct(c['share_monotone'])} of "
                "curves never rise), although every attention sub-step lowers its attention term "
                f"({_pct(c['share_attention_steps_lowering'])}) and every FFN sub-step its FFN term "
                f"({_pct(c['share_ffn_steps_lowering'])}). E_rel is not the energy the released steps descend "
                "together: its attention term uses the metric W Wᵀ while the step uses WᵀW, and it adds ½‖YW‖² "
                "instead of ½‖Y‖² (THEORY §7.1), so a sub-step can raise the other sub-step's term.")
        own, cross = c.get("median_own_changes_per_token"), c.get("median_cross_changes_per_token")
        if layers and own and cross:
            i = layers[0] - 1
            a_own, f_own = own["attention_step_on_attention_term"][i], own["ffn_step_on_ffn_term"][i]
            a_on_f, f_on_a = cross["attention_step_on_ffn_term"][i], cross["ffn_step_on_attention_term"][i]
            text += (f" Measured at layer {layers[0]} (medians per token): the attention step changes its term by "
                     f"{a_own:.3g} and the FFN term by {a_on_f:+.3g}; the FFN step changes its term by {f_own:.3g} "
                     f"and the attention term by {f_on_a:+.3g}.")
            worst = max((f_on_a, "the FFN step's rise of the attention term (which holds ½‖YW‖²)"),
                        (a_on_f, "the attention step's rise of the FFN term"))
            if worst[0] > -(a_own + f_own):
                text += f" So {worst[1]} outweighs what both sub-steps lower their own terms by."
        out.append(text + " The corrected `paper` formulas use one metric for both, and their curves never rise.")
    return out


def _theory_sections(results: dict) -> list[tuple]:
    names = {"1": ("Figure 1: Apollonius regions", [1]), "2-3": ("Figures 2–3: alternating steps", [2, 3]),
             "4": ("Figure 4: κ-regions", [4])}
    blocks: list[tuple] = []
    for key, s in results.get("figures", {}).items():
        title, figs = names[key]
        blocks += [("h", 2, title)] + [("img", f"figure {f}", FIGURE_FILES[f]) for f in figs]
        flat = {k: v for k, v in s.items() if not isinstance(v, dict)}
        blocks.append(("table", ["quantity", "value"], [[f"`{k}`", _fmt(v)] for k, v in flat.items()]))
        for sub, values in ((k, v) for k, v in s.items() if isinstance(v, dict)):
            blocks += [("p", f"`{sub}`:"), ("table", ["quantity", "value"],
                                              [[f"`{k}`", _fmt(v)] for k, v in values.items()])]
    return blocks


def _curve_rows(s: dict) -> list[list[str]]:
    rows = []
    for key, c in s["curves"].items():
        acc = _pct(c["accuracy"])
        if c["accuracy_as_trained"] is not None:
            acc += f" (before re-normalising: {_pct(c['accuracy_as_trained'])})"
        rows.append([f"`{key}`", c["label"], str(c["d_model"]), _pct(c["share_monotone"]),
                     _pct(c["share_layer_steps_lowering"]), _pct(c["share_attention_steps_lowering"]),
                     _pct(c["share_ffn_steps_lowering"]), f"{c['median_change_share'][0]:.3g}",
                     f"{c['median_change_share'][-1]:.2g}", _pct(c["share_backtracked_layer_steps"]),
                     f"{c['pooled_spread_ratio']:.3g}", acc, _pct(c["sample_accuracy"])])
    return rows


def _corr(s: dict, key: str) -> str:
    c = s["curves"].get(key, {}).get("length_correlation_per_token")
    return "–" if c is None else f"{c:+.2f}"


def _curve_section(s: dict) -> list[tuple]:
    name, split = s["dataset"], EVAL_SPLITS[s["dataset"]]
    fig, st, tok = DATASET_FIGURE[name], s["settings"], s["tokens_per_sample"]
    trunc = "full length" if st["eval_max_length"] is None else f"truncated to {st['eval_max_length']} tokens"
    method = [
        f"Inputs: {s['n_samples']} random {split} texts, {trunc} ({_pct(s['share_untruncated'], 0)} of them whole; "
        f"{tok['mean']:.1f} tokens on average, max {tok['max']}); frozen `{s['embeddings']}` embeddings "
        f"({s['embedding_dim']}-d).",
        f"Accuracy: final weights on {s['n_accuracy']} {split} examples (a fixed random subset, or all of them) at "
        f"each recipe's training truncation; the majority class makes up {_pct(s['majority_rate'])} of them.",
        f"A step lowers its energy when E_after ≤ E_before + tol·(1 + |E_before|), tol = {s['tolerance']:g}; a "
        "curve never rises when none of its layer steps rises.",
        "ΔE/D: a layer's change of the energy as a share of the sample's total descent D = E(Y⁽⁰⁾) − min_t "
        "E(Y⁽ᵗ⁾) (the bottom row of the figure; free of text length). The top row's per-token energies E/n still "
        "grow with length for the `paper` energy, whose attention term sums over token pairs (about −n/2 per "
        "token once tokens merge): correlation of E(Y⁽ᵀ⁾)/n with n, random init without ReLU: "
        f"{_corr(s, 'paper/random')}.",
        "Pooled spread: RMS distance of the mean-pooled outputs Y⁽ᵀ⁾ from their mean over the samples, divided by "
        f"the norm of that mean (inputs X: {s['inputs_pooled_spread_ratio']:.3g}); near 0 the output hardly "
        "depends on the input, and a linear head cannot do better than the majority class.",
        "Trained models are run folders: " + ", ".join(f"`{k}` → `{v}`" for k, v in s["runs"].items())
        + " (open one with `unfoldformer.load(folder)`).",
    ]
    head = ["variant", "label", "d_model", "curves never rise", "layer steps lowering E", "attention sub-steps",
            "FFN sub-steps", "median ΔE/D, layer 1", "median ΔE/D, last layer", "backtracked layer steps",
            "pooled spread", "accuracy", "accuracy on the figure's samples"]
    return [("h", 3, f"Figure {fig}: {DATASET_NAMES[name]}"), ("img", f"figure {fig}", FIGURE_FILES[fig]),
            ("ul", method), ("table", head, _curve_rows(s))]


def report_blocks(results: dict, timings: dict, cfg: ReproduceSettings) -> list[tuple]:
    """The whole report: verdicts, deviations, the as-released explanation, figures and their numbers."""
    total = timings.get("total", 0.0)
    blocks: list[tuple] = [
        ("h", 1, TITLE),
        ("p", f"Mode `{cfg.mode}`, seed {cfg.seed}, figures {cfg.figures}, data sets {cfg.datasets}, "
              f"{cfg.threads} thread(s); wall time {total:.1f} s."),
        ("h", 2, "Verdicts"),
        ("table", ["claim of the paper", "reproduced?", "evidence"], [list(r) for r in verdict_rows(results)]),
        ("p", "Every quantity of this report (per-token energy, the whisker shift, the change as a share of "
              "the total descent, curve never rises, backtracked layer steps) is defined in "
              "`docs/concepts/definitions.md`."),
        ("h", 2, "Deviations from the paper"), ("ul", _deviations(results)),
    ]
    explanation = _released_explanation(results)
    if explanation:
        blocks += [("h", 2, "Why the as-released curves are 0 % monotone")] + [("p", p) for p in explanation]
    blocks += _theory_sections(results)
    if results.get("energy_curves"):
        blocks += [("h", 2, "Figures 5–6: energy curves of 12-step weight-tied models")]
        for s in results["energy_curves"].values():
            blocks += _curve_section(s)
    if results.get("embeddings") is not None:
        blocks += [("h", 2, "Embeddings"), ("code", json.dumps(results["embeddings"], indent=2))]
    if results.get("data_files"):
        blocks += [("h", 2, "Data files"), ("table", ["file", "bytes", "sha256"],
                                            [[f"`{f['path']}`", f"{f['bytes']:,}", f"`{f['sha256']}`"]
                                             for f in results["data_files"]])]
    blocks += [("h", 2, "Released-code defects fixed by the corrected model (THEORY §7)"),
               ("table", ["released code", "corrected pipeline"], [list(d) for d in RELEASED_DEFECTS]),
               ("h", 2, "Wall time"),
               ("p", f"{total:.1f} s in all, {timings.get('cpu_time_all_processes', 0.0):.1f} s of CPU time over all "
                     f"processes; {cfg.threads} worker process(es) of one thread each ran the jobs below (they "
                     f"overlap); loading the data took {timings.get('load_data', 0.0):.1f} s."),
               ("table", ["job", "wall (s)", "CPU (s)"],
                [[k, f"{v['wall_s']:.1f}", f"{v['cpu_s']:.1f}"] for k, v in timings.get("jobs", {}).items()])]
    return blocks


def render_report(results: dict, timings: dict, cfg: ReproduceSettings) -> str:
    """report.md."""
    return to_markdown(report_blocks(results, timings, cfg))


def render_html(results: dict, timings: dict, cfg: ReproduceSettings, image_dir: Path) -> str:
    """report.html: the same content as report.md, with the PNGs of `image_dir` embedded."""
    return to_html(report_blocks(results, timings, cfg), TITLE, image_dir)


def print_summary(results: dict, timings: dict, out: Path) -> None:
    """The verdicts on stdout."""
    for claim, verdict, evidence in verdict_rows(results):
        print(f"{verdict:>36}  {claim}\n{'':>38}{evidence}")
    print(f"wrote {out / 'report.md'}, report.html and results.json; wall time {timings['total']:.1f} s")
