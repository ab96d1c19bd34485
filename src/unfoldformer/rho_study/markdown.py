"""`rho_study.md` from the study's results: a verdict per question and the numbers behind it."""
from __future__ import annotations

from .verdicts import __doc__ as CLAIM_DOC

__all__ = ["render_markdown"]

SEQUENCE_NAMES = {"model": "model layers", "anchored": "attention + anchor",
                  "anchored_unit": "attention + anchor, ρ'(0) = 1", "attention": "attention only"}
OUTCOMES = ("more distinct", "less distinct", "no clear difference")


def _f(v, digits: int = 3) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def _present(sources: dict) -> dict:
    return {label: {r: v for r, v in by_rho.items() if "missing" not in v} for label, by_rho in sources.items()}


def render_markdown(results: dict) -> str:
    s = results["settings"]
    arch = ", ".join(f"{k} {v}" for k, v in s["architecture"].items())
    lines = ["# The ρ study: what ρ does to attention", "",
             f"Mode **{s['mode']}**; ρ: {', '.join(s['rhos'])}; datasets: {', '.join(s['datasets'])}, "
             f"{s['samples']} random held-out sentences each (seed {s['seed']}), truncated at "
             f"{', '.join(f'{d} {n}' for d, n in s['max_lengths'].items())} tokens; frozen MiniLM word-piece "
             f"embeddings, the same sentences for every ρ. Models: the alternating layer, `certified-alternating` "
             f"({arch}): *random* = tied "
             "model at initialisation, identical weights for every ρ (only the kernel differs); *random-joint* = the "
             "same with the joint layer (THEORY §3.7: one step on the whole layer energy); *trained-tied* / "
             "*trained-untied* / *trained-joint* = trained models of each ρ. "
             f"Tied models are unrolled for {s['steps']} steps. "
             f"Wall time {results['wall_seconds']:.0f} s.", ""]
    lines += _missing(results)
    for dataset, data in results["datasets"].items():
        lines += _attention(dataset, data)
    lines += ["## Q2. Do tokens stay distinct over depth? (the paper's claim about log(z + 2))", "",
              " ".join(CLAIM_DOC.split("\n\n")[1].split()), "",
              "Four step sequences per model: its own layers (*model layers*); its anchored attention steps alone "
              "(*attention + anchor*), where the kernel's size ρ'(0) acts like the anchor weight λ; the same with "
              "the kernel scaled to ρ'(0) = 1 (*ρ'(0) = 1*: shapes only); the plain step on E_A without anchor "
              "(*attention only*: row normalisation leaves the shape only). Random-init models also run the "
              "attention-only sequences with the heads rescaled so that the median head distance at t = 0 is "
              "0.1 … 30: where the distances sit decides whether kernels differ at all.", ""]
    for dataset, data in results["datasets"].items():
        lines += _verdict(dataset, data) + _dynamics(dataset, data)
    lines += _energy(results) + _accuracy(results)
    lines += ["## Figures", "", "`kernel_<dataset>.png`, `maps_<dataset>_<source>.png`, "
              "`dynamics_<dataset>_<sequence>.png`, `sweep_<dataset>.png`.", ""]
    return "\n".join(lines)


def _missing(results: dict) -> list[str]:
    rows = [f"- {dataset} {label} ρ = {rho}: {res['missing']}"
            for dataset, data in results["datasets"].items()
            for label, by_rho in data["sources"].items() for rho, res in by_rho.items() if "missing" in res]
    if not rows:
        return ["Every model of every ρ is present.", ""]
    return ["**Missing rows** (these models are left out of every table below):", ""] + rows + [""]


def _attention(dataset: str, data: dict) -> list[str]:
    lines = [f"## Q1. Which tokens does a head attend to? ({dataset}, first step)", "",
             "Row-normalised step weights P_ij = ρ'(z_ij) / Σ_j ρ'(z_ij) of every head at the encoder's input. "
             "Entropy / log n (1 = uniform); share of the row on its k nearest other tokens (in brackets: what "
             "a uniform row gives); anchor share 1/(ν d_i + 1) = the part of the update kept for the own input.", "",
             "| model | ρ | ρ'(0) | median z | entropy | self weight | nearest 1 | nearest 5 | nearest 10 | "
             "anchor share |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, by_rho in _present(data["sources"]).items():
        for rho, res in by_rho.items():
            a = res["attention"]
            near = [f"{_f(a['nearest_share'].get(k))} ({_f(a['nearest_uniform'].get(k), 2)})" for k in (1, 5, 10)]
            lines.append(f"| {label} | {rho} | {_f(res['kernel_at_zero'], 2)} | {_f(a['z_median'])} | "
                         f"{_f(a['entropy'])} | {_f(a['self_weight'])} | " + " | ".join(near)
                         + f" | {_f(a['anchor_share'])} |")
    lines.append("")
    for label, by_rho in _present(data["sources"]).items():
        if "exp" in by_rho and "log" in by_rho:
            e, g = by_rho["exp"]["attention"], by_rho["log"]["attention"]
            gap = g["entropy"] - e["entropy"]
            how = "as evenly as" if abs(gap) < 0.005 else "more evenly than" if gap > 0 else "less evenly than"
            lines.append(f"- **{label}** (median z = {_f(e['z_median'])}): log spreads each row {how} exp (entropy "
                         f"{_f(g['entropy'])} vs {_f(e['entropy'])}; share on the 5 nearest "
                         f"{_f(g['nearest_share'].get(5))} vs {_f(e['nearest_share'].get(5))}).")
    return lines + [""]


def _describe(r: dict) -> str:
    return (f"{r['outcome']} (spread retained {_f(r['rho_spread_retained'])} vs {_f(r['exp_spread_retained'])}, "
            f"difference {r['spread_retained_diff']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}])")


def _verdict(dataset: str, data: dict) -> list[str]:
    rows = [c for c in data["comparisons"] if c["rho"] == "log"]
    lines = [f"### {dataset}: log against exp", ""]
    if not rows:
        return lines + ["No log/exp pair to compare.", ""]
    counts = {k: sum(r["outcome"] == k for r in rows) for k in OUTCOMES}
    own = [r for r in rows if r["scale"] == "model scale" and r["sequence"] == "model"]
    lines += [f"**Verdict** over {len(rows)} paired comparisons: tokens under log(z + 2) stay *more* distinct than "
              f"under exp in {counts['more distinct']}, *less* distinct in {counts['less distinct']}, no clear "
              f"difference in {counts['no clear difference']}.", "",
              "- What the models do (own scale, own layers): "
              + "; ".join(f"{r['source']} t = {r['t']}: {_describe(r)}" for r in own) + "."]
    for kind in ("anchored", "anchored_unit", "attention"):
        shape = [r for r in rows if r["sequence"] == kind and r["t"] == 6]
        if shape:
            lines.append(f"- {SEQUENCE_NAMES[kind]}, t = 6: " + "; ".join(
                f"{r['source']} {r['scale']}: {r['outcome']} ({r['spread_retained_diff']:+.3f})" for r in shape) + ".")
    lines.append("")
    lines += ["| model | scale | sequence | t | spread retained log / exp | difference [95 % CI] | "
              "sentences more distinct | cosine reduction | eff. rank gain | outcome |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['source']} | {r['scale']} | {SEQUENCE_NAMES[r['sequence']]} | {r['t']} | "
                     f"{_f(r['rho_spread_retained'])} / {_f(r['exp_spread_retained'])} | "
                     f"{r['spread_retained_diff']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}] | "
                     f"{100 * r['share_of_sentences_more_distinct']:.0f} % | {r['cosine_reduction']:+.3f} | "
                     f"{r['effective_rank_gain']:+.2f} | {r['outcome']} |")
    return lines + [""]


def _dynamics(dataset: str, data: dict) -> list[str]:
    lines = [f"### {dataset}: diversity per ρ", "", "Mean over sentences; t = 0 is the encoder's input.", "",
             "| model | sequence | ρ | cosine t = 0 / 6 / 12 | effective rank t = 0 / 6 / 12 | "
             "spread retained t = 6 / 12 |", "|---|---|---|---|---|---|"]
    for label, by_rho in _present(data["sources"]).items():
        for kind in SEQUENCE_NAMES:
            for rho, res in by_rho.items():
                d = res["dynamics"][kind]
                at = lambda key, t, d=d: _f(d[key][t]) if t < len(d[key]) else "–"    # noqa: E731
                lines.append(f"| {label} | {SEQUENCE_NAMES[kind]} | {rho} | {at('cosine', 0)} / {at('cosine', 6)} / "
                             f"{at('cosine', 12)} | {at('effective_rank', 0)} / {at('effective_rank', 6)} / "
                             f"{at('effective_rank', 12)} | {at('spread_retained', 6)} / {at('spread_retained', 12)} |")
    return lines + [""]


def _energy(results: dict) -> list[str]:
    lines = ["## Q3. Energy curves", "", "Per sequence, with the energy its steps descend: the share of sentences "
             "whose energy never rises over t (1e-6 relative allowance), and the mean relative change "
             "(E(Y⁽ᵀ⁾) − E(Y⁽⁰⁾)) / |E(Y⁽⁰⁾)|.", "",
             "| dataset | model | ρ | " + " | ".join(SEQUENCE_NAMES.values()) + " |", "|---|---|---|---|---|---|---|"]
    for dataset, data in results["datasets"].items():
        for label, by_rho in _present(data["sources"]).items():
            for rho, res in by_rho.items():
                dyn = res["dynamics"]
                cells = [f"{100 * dyn[k]['energy_monotone_share']:.0f} %, {dyn[k]['relative_energy_change']:+.3f}"
                         for k in SEQUENCE_NAMES]
                lines.append(f"| {dataset} | {label} | {rho} | " + " | ".join(cells) + " |")
    return lines + [""]


def _accuracy(results: dict) -> list[str]:
    acc, speed = results["accuracy"], results["speed"]
    lines = ["## Q4. Accuracy and speed", "",
             "Accuracy of the final weights from the accuracy benchmark (`benchmarks/accuracy.py --rho`; same width, "
             "depth, heads, budget and seed as the exp rows; \"not run yet\" where the result file is missing, "
             "\"(reduced)\" for a reduced budget). Speed: training-step time of the exp model / the ρ model, side by "
             "side (`benchmarks/train_speed.py --rho`, n = 64 / 256), and of the anchored attention step alone at "
             "n = 4,096, forward + backward (`benchmarks/rho_speed.py`); above 1 = faster than exp.", "",
             "| ρ | SST-2 tied | SST-2 untied | IMDB tied | IMDB untied | training speed vs exp (tied, n = 64 / 256) | "
             "attention step vs exp (n = 4,096) |", "|---|---|---|---|---|---|---|"]
    for rho, by_dataset in acc.items():
        cells = []
        for dataset in ("sst2", "imdb"):
            for kind in ("certified-alternating", "certified-alternating-untied"):
                c = by_dataset.get(dataset, {}).get(kind)
                cells.append("not run yet" if c is None else
                             f"{100 * c['accuracy']:.1f}" + (" (reduced)" if c["budget"] != "full" else ""))
        train = speed["training"].get(rho, {}).get("certified-tied", {})     # the speed files' 0.2.0 name
        train_cell = " / ".join(f"{train[n]:.2f}×" for n in sorted(train)) if train else "–"
        if rho == "exp":
            train_cell = "1.00×"
        step = speed["attention_step"].get(rho, {}).get("anchored/forward+backward", {}).get(4096)
        step_cell = "–" if step is None else f"{step:.2f}×"
        lines.append(f"| {rho} | " + " | ".join(cells) + f" | {train_cell} | {step_cell} |")
    return lines + [""]
