"""The generated tables of README.md and the documentation's results pages, from `benchmarks/results/` (and the
pretrained models' cards, `src/unfoldformer/zoo/*/card.json`).

    python benchmarks/make_docs.py            # rewrite every generated block in place
    python benchmarks/make_docs.py --check    # exit 1 (naming the blocks) if a committed block is stale

A generated block sits between two markers in a Markdown file,

    <!-- generated: NAME (python benchmarks/make_docs.py) -->
    ...
    <!-- end: NAME -->

and NAME is one of `BLOCKS`. Everything outside the markers is prose and is left alone. The tables are
at most 8 columns wide and split by question (accuracy, descent, speed); a row exists only where its
cell was run. Definitions of the columns: docs/concepts/definitions.md.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import make_table as mt  # the accuracy table's loading and cell formatting (same folder)
from docs_common import load as _load
from docs_common import md as _md
from docs_common import threads_said as _threads
from docs_fresh import fresh, fresh_before_prior, fresh_paired, fresh_paired_more_seeds, fresh_tied_control
from docs_reports import counterexamples, pretrained_descent, probe, reproduction, rho_spread
from docs_speed import (
    compile_speed,
    energy_peak,
    energy_speed,
    inference_energies,
    inference_speed,
    inference_speed_2threads,
    profiles,
    profiles_shared_machine,
    rho_busy,
    rho_cost,
    rho_step,
    rho_threads,
    scaling,
    train_speed,
)
from unfoldformer.names import KINDS_BEFORE_0_3  # result labels (0.2.0 kind names) -> today's kinds

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FILES = ("README.md", "docs/index.md", "docs/results/index.md", "docs/results/accuracy.md", "docs/results/speed.md",
         "docs/results/rho.md", "docs/results/fit-study.md", "docs/results/peers.md", "docs/guides/custom-model.md",
         "docs/theory.md", "docs/results/reproduction.md",
         "docs/results/fresh.md", "docs/results/pretrained.md")
BEGIN = re.compile(r"<!-- generated: (?P<name>[\w-]+) "
                   r"\(python benchmarks/make_docs.py\) -->\n")


def _speed(results: Path) -> dict | None:
    s = results / "speed"
    return mt.load_speed(s / "train_speed.json", s / "train_speed_rho.json", s / "train_speed_peers_3.json")


def _name(key: mt.RowKey) -> str:
    """The row's name, its config changes in words ("optim.lr=0.003" -> "lr 3e-3")."""
    words = {"optim.lr": lambda v: f"lr {float(v):.0e}".replace("e-0", "e-"),
             "model.ffn_hidden": lambda v: f"FFN width {int(v):,}"}
    model, rho, changes = key
    said = [words[k](v) if k in words else f"{k} = {v}" for k, _, v in (c.partition("=") for c in changes)]
    return mt.row_name((model, rho, ())) + "".join(f", {s}" for s in said)


def _order(key: mt.RowKey) -> tuple:
    model, rho, changes = key
    rhos = list(mt.RHO_NAMES)
    return mt.MODELS.index(model), rhos.index(rho) if rho in rhos else len(rhos), rho, changes


def _budget_tables(by_dataset: dict, speed: dict | None, keep: Callable[[mt.RowKey], bool]) -> list[str]:
    """Per dataset, an accuracy-and-speed table and a descent table (rows only for the cells that were run)."""
    out = []
    for d in (d for d in mt.DATASET_NAMES if d in by_dataset):
        keys = sorted((k for k in by_dataset[d] if keep(k)), key=_order)
        if not keys:
            continue
        cells = {k: mt.row(k, by_dataset, [d], speed) for k in keys}
        n_acc = 6 if d == "imdb" else 4       # accuracy (+ full length for IMDB), tokens/s, speed
        head = ["model", f"{mt.DATASET_NAMES[d]} acc (%)", "safeguard on (%)"]
        if d == "imdb":
            head += ["full length (%)", "full length, safeguard on (%)"]
        head += ["training tokens/s", "speed vs standard"]
        out += [f"*{mt.DATASET_NAMES[d]}: accuracy and speed*", "", _md(head, [[_name(k)] + cells[k][:n_acc]
                                                                            for k in keys])]
        rows = [[_name(k)] + cells[k][n_acc:] for k in keys]
        rows = [r for r in rows if any(c not in ("n/a", "–") for c in r[1:])]   # models with something to descend
        if rows:
            out += [f"*{mt.DATASET_NAMES[d]}: descent*", "",
                    _md(["model", "curve never rises (%)", "never rises, safeguard on (%)", "every layer descends (%)",
                         "backtracked layer steps (%)", "safeguard inference cost"], rows)]
    return out


def accuracy_full(results: Path) -> str:
    groups = mt.group(mt.load_results(results))
    if "full" not in groups:
        return "_No full-budget results._\n"
    return "\n".join(_budget_tables(groups["full"], _speed(results), lambda k: k[1] == "exp"))


def accuracy_reduced(results: Path) -> str:
    parts = []
    for budget, by_dataset in sorted(mt.group(mt.load_results(results)).items()):
        if budget != "full":
            parts += [f"**{budget.capitalize()}**", ""] + _budget_tables(by_dataset, None, lambda k: k[1] == "exp")
    return "\n".join(parts)


def rho_accuracy(results: Path) -> str:
    """Certified models per ρ: full budget (SST-2) and the reduced IMDB budget, ρ = exp first."""
    parts = []
    for budget, by_dataset in sorted(mt.group(mt.load_results(results)).items(), key=lambda kv: kv[0] != "full"):
        has_rho = {d for d, keys in by_dataset.items() if any(k[1] != "exp" for k in keys)}
        if not has_rho:
            continue
        title = "Full budget" if budget == "full" else budget.capitalize()
        sub = {d: v for d, v in by_dataset.items() if d in has_rho}
        with_rho = {k[0] for d in sub for k in sub[d] if k[1] != "exp"}     # models trained with another ρ
        parts += [f"**{title}**", ""] + _budget_tables(sub, _speed(results) if budget == "full" else None,
                                                       lambda k, m=frozenset(with_rho): k[0] in m and not k[2])
    return "\n".join(parts)


def headline(results: Path) -> str:
    """SST-2, full budget: accuracy, training speed (`train_speed.json`: one side-by-side run), unaided descent, for
    the certified models, the standard Transformer and the peers."""
    by = mt.group(mt.load_results(results))["full"]["sst2"]
    side = json.loads((results / "speed" / "train_speed.json").read_text())["step_times_s"]
    ratio = lambda m, n: statistics.median(side[n]["standard"]) / statistics.median(side[n][m])
    pct = lambda v: mt.mean_std(v).replace(" (1)", "").rsplit(" (", 1)[0] if v else "n/a"
    rows = []
    for key, name, descends in (
            (("certified-joint", "exp", ()), "certified (joint, tied)", "its energy E, by construction"),
            (("certified-joint-untied", "exp", ()), "certified-untied (joint)",
             "each layer its own E_ℓ, by construction"),
            (("certified-tied", "exp", ("optim.lr=0.003",)), "certified-alternating (tied), lr 3e-3", "its energy E"),
            (("certified-tied", "exp", ()), "certified-alternating (tied), default lr 1e-3", "its energy E"),
            (("certified-untied", "exp", ("optim.lr=0.003",)), "certified-alternating (untied), lr 3e-3",
             "each layer its own E_ℓ"),
            (("standard", "exp", ()), "standard pre-LN Transformer", "nothing"),
            (("energy-transformer", "exp", ()), "Energy Transformer (peer)", "its energy"),
            (("crate", "exp", ()), "CRATE (peer)", "its coding rate, per layer")):
        recs = by.get(key, [])
        if not recs:
            continue
        model = key[0]
        per_layer = model in ("certified-untied", "certified-joint-untied")
        if per_layer:
            unaided = mt._energy(recs, "energy", "layer_descent_share")
        else:
            unaided = (mt._energy(recs, "energy", "monotone_share") or mt._energy(recs, "peer_energy", "monotone_share")
                       or mt._energy(recs, "peer_energy", "every_layer_lowers_share"))
        guarded = mt._energy(recs, "energy_safeguard", "layer_descent_share" if per_layer else "monotone_share")
        speed = f"{ratio(model, '64'):.2f}× / {ratio(model, '256'):.2f}×" if model in side["64"] else "–"
        rows.append([name, descends, f"{pct(mt._values(recs, 'accuracy'))} ({len(recs)})", speed, pct(unaided),
                     pct(guarded)])
    return _md(["model", "descends", "SST-2 dev acc (%) (seeds)", "training step vs standard, n = 64 / 256",
                "never rises, unaided (%): tied the curve, untied every layer", "safeguard on (%)"], rows)


def study(results: Path) -> str:
    """The fit study (`benchmarks/accuracy_study.py`), one table on accuracy and fit, one on descent."""
    records = [json.loads(p.read_text()) for p in sorted((results / "study").glob("*.json"))]
    base = {(r["dataset"], r["model"], r["budget"]): r for r in records if r.get("variant") == "baseline"}
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}"
    energy = lambda r, k, f: (r.get(k) or {}).get(f)
    records.sort(key=lambda r: (r["dataset"], r["budget"] != "reduced", r["model"], r["variant"] != "baseline",
                                r["variant"], r["seed"]))
    name = lambda r: [f"{r['dataset']}, {r['budget']}", KINDS_BEFORE_0_3.get(r["model"], r["model"]),
                      f"{r['variant']}, seed {r['seed']}"]
    one_curve = lambda r: r["model"] not in mt.UNTIED
    acc, desc = [], []
    for r in records:
        b = base.get((r["dataset"], r["model"], r["budget"]))
        delta = "–" if b is None or r is b else f"{100 * (r['accuracy'] - b['accuracy']):+.1f}"
        loss = r["metrics"][-1]["train_loss"] if r.get("metrics") else None
        acc.append(name(r) + [pct(r["accuracy"]), delta, pct(r.get("accuracy_safeguard")),
                              "–" if loss is None else f"{loss:.3f}"])
        if r.get("energy"):
            desc.append(name(r) + [pct(energy(r, "energy", "layer_descent_share")),
                                   pct(energy(r, "energy", "monotone_share")) if one_curve(r) else "n/a",
                                   pct(energy(r, "energy_safeguard", "monotone_share")) if one_curve(r) else "n/a",
                                   f"{r['tokens_per_s']:,.0f}"])
    return "\n".join([
        "*Accuracy and fit*", "",
        _md(["dataset, budget", "model", "variant", "accuracy (%)", "Δ vs baseline", "safeguard on (%)",
             "train loss (last epoch's mean)"], acc),
        "*Descent and throughput*", "",
        _md(["dataset, budget", "model", "variant", "every layer descends (%)", "curve never rises (%)",
             "never rises, safeguard on (%)", "training tokens/s"], desc)])


def _seeds(values: list[float]) -> str:
    """'m ± s (v0, v1, ...)' in per cent."""
    each = ", ".join(f"{100 * v:.1f}" for v in values)
    return f"{mt.mean_std(values).rsplit(' (', 1)[0]} ({each})"


def peers_seeds(results: Path) -> str:
    """The peers against the certified and standard models at the reduced SST-2 budget, seeds 0–2."""
    recs = [json.loads(p.read_text()) for p in sorted((results / "peers").glob("sst2-*-seed*-reduced.json"))]
    by: dict = {}
    for r in recs:
        by.setdefault(r["model"], []).append(r)
    rows = []
    for model in mt.MODELS:
        rs = sorted(by.get(model, []), key=lambda r: r["seed"])
        if not rs:
            continue
        never = [(r.get("energy") or {}).get("monotone_share") or (r.get("peer_energy") or {}).get("monotone_share")
                 or (r.get("peer_energy") or {}).get("every_layer_lowers_share") for r in rs]
        rows.append([mt.NAMES[model], _seeds([r["accuracy"] for r in rs]),
                     "n/a" if all(v is None for v in never) else " / ".join(f"{100 * v:.1f}" for v in never)])
        if model == "certified-tied":
            guarded = [r["energy_safeguard"]["monotone_share"] for r in rs]
            rows.append(["certified (tied), safeguard on",
                         _seeds([r["accuracy_safeguard"] for r in rs]),
                         " / ".join(f"{100 * v:.1f}" for v in guarded)])
    return _md(["model", "SST-2 dev acc (%), mean ± std (seeds 0, 1, 2)", "objective never rises (%), per seed"],
               rows)



def _pct(v: float | None, digits: int = 1) -> str:
    return "–" if v is None else f"{100 * v:.{digits}f}"


def _never_rises(r: dict) -> float | None:
    """Share of samples whose objective never rises, safeguard off: the certified model's curve, the Energy
    Transformer's curve, CRATE's R^c in every layer."""
    e, peer = r.get("energy") or {}, r.get("peer_energy") or {}
    return next((v for v in (e.get("monotone_share"), peer.get("monotone_share"), peer.get("every_layer_lowers_share"))
                 if v is not None), None)


#: the reduced cells of the peers' page: the certified and standard ones from the fit study's baselines
_PEER_CELLS = {"certified-tied": "study/{d}-certified-tied-v_baseline-seed0-reduced.json",
               "standard": "study/{d}-standard-v_baseline-seed0-reduced.json",
               "energy-transformer": "{d}-energy-transformer-seed0-reduced.json",
               "crate": "{d}-crate-seed0-reduced.json"}
_DESCENDS = {"certified-tied": "its energy E (THEORY §3), whole layers", "standard": "nothing",
             "energy-transformer": "its energy E_att + E_Hopfield, at its trained α = 0.1",
             "crate": "its coding rate R^c_ℓ, each layer's attention step"}


def peers_reduced(results: Path) -> str:
    """Seed 0 at the reduced budgets: who descends what, how often, at what accuracy and training speed."""
    cell = {(m, d): _load(results, f.format(d=d)) for m, f in _PEER_CELLS.items() for d in ("sst2", "imdb")}
    side = _load(results, "speed/train_speed_peers_3.json")
    times = side["step_times_s"]
    speed = lambda m: " / ".join(f"{statistics.median(times[n]['standard']) / statistics.median(times[n][m]):.2f}×"
                                 for n in times)
    imdb = lambda r, a, f: f"{_pct(r[a])} ({_pct(r.get(f))})"
    rows = []
    for m in ("certified-tied", "standard", "energy-transformer", "crate"):
        s, i = cell[m, "sst2"], cell[m, "imdb"]
        never = [_never_rises(r) for r in (s, i)]
        said = "n/a" if all(v is None for v in never) else " / ".join(_pct(v) for v in never)
        if m == "crate":
            said += " (per layer step: " + " / ".join(_pct(r["peer_energy"]["layer_lowers_share"], 2)
                                                      for r in (s, i)) + ")"
        name = mt.NAMES[m] + (", safeguard off" if m == "certified-tied" else "")
        rows.append([name, _DESCENDS[m], _pct(s["accuracy"]), imdb(i, "accuracy", "accuracy_full_length"), said,
                     speed(m)])
        if m == "certified-tied":
            rows.append(["certified-alternating (tied), safeguard on", "the same, backtracking until it does",
                         _pct(s["accuracy_safeguard"]), imdb(i, "accuracy_safeguard", "accuracy_full_length_safeguard"),
                         " / ".join(_pct(r["energy_safeguard"]["monotone_share"]) for r in (s, i)), "(inference only)"])
    n_say = " / ".join(times)
    return ("*Seed 0, reduced budgets* (accuracy and descent: `benchmarks/results/study/{sst2,imdb}-{certified-tied,"
            "standard}-v_baseline-seed0-reduced.json` by `python benchmarks/accuracy_study.py --dataset D --model M "
            "--variants baseline`, `benchmarks/results/{sst2,imdb}-{energy-transformer,crate}-seed0-reduced.json` by "
            "`python benchmarks/accuracy.py` with the budget flags below; speed: `python benchmarks/train_speed.py "
            "--rounds 7 --variants certified-tied certified-untied standard energy-transformer crate --json "
            "benchmarks/results/speed/train_speed_peers_3.json`, "
            f"{side['rounds']} rounds, B = {side['batch_size']}, {_threads(side, 'train_speed_peers_3.json')}, "
            f"load average {' – '.join(f'{x:.1f}' for x in side['load_average'])})\n\n"
            + _md(["model", "descends", "SST-2 acc (%)", "IMDB acc (%) (full length)",
                   "samples whose objective never rises (%) SST-2 / IMDB", f"training speed vs standard, n = {n_say}"],
                  rows))


def peers_imdb_seeds(results: Path) -> str:
    """IMDB at the reduced budget: seed 0 (the first table's cells) and seed 1 (`results/peers/`)."""
    rows = []
    for m in ("certified-tied", "standard", "energy-transformer", "crate"):
        s0 = _load(results, _PEER_CELLS[m].format(d="imdb"))
        s1 = _load(results, f"peers/imdb-{m}-seed1-reduced.json")
        variants = [("accuracy", "accuracy_full_length", _never_rises, ", safeguard off")]
        if m == "certified-tied":
            variants.append(("accuracy_safeguard", "accuracy_full_length_safeguard",
                             lambda r: r["energy_safeguard"]["monotone_share"], ", safeguard on"))
        for acc, full, never, suffix in variants:
            v = never(s1)
            rows.append([mt.NAMES[m] + (suffix if m == "certified-tied" else ""),
                         f"{_pct(s0[acc])} / {_pct(s1[acc])} ({_pct((s0[acc] + s1[acc]) / 2)})", _pct(s1.get(full)),
                         "n/a" if v is None else _pct(v) + (" (every layer's R^c)" if m == "crate" else "")])
    return ("*IMDB reduced, seeds 0 and 1* (seed 0: the first table's files; seed 1: "
            "`benchmarks/results/peers/imdb-*-seed1-reduced.json` by `python benchmarks/accuracy.py --all "
            "--datasets imdb --models energy-transformer crate certified-tied standard --seeds 1 "
            "--max-train-examples 4000 --epochs 1 --max-eval-examples 500 --results benchmarks/results/peers`)\n\n"
            + _md(["model", "IMDB acc (%), seed 0 / seed 1 (mean)", "full length, seed 1 (%)",
                   "samples never rising, seed 1 (%)"], rows))


def peers_full(results: Path) -> str:
    """SST-2 at the full budget: the certified models at lr 1e-3 and 3e-3, the standard one and the peers."""
    by = mt.group(mt.load_results(results))["full"]["sst2"]
    recs = lambda m, *changes: sorted(by.get((m, "exp", changes), []), key=lambda r: r["seed"])
    one = lambda rs, f: (f"{_pct(f(rs[0]))} (seed {rs[0]['seed']})" if len(rs) == 1 else _seeds([f(r) for r in rs])
                         if rs else "–")
    spread = lambda vals: f"{_pct(vals[0])}" if len(vals) == 1 else mt.mean_std(vals).rsplit(" (", 1)[0]
    acc = lambda r: r["accuracy"]
    rows = []
    for m, stat, words in (("certified-tied", "monotone_share", None),
                           ("certified-untied", "layer_descent_share", "every layer its own energy")):
        lo, hi = recs(m), recs(m, "optim.lr=0.003")
        if not (lo or hi):
            continue
        off = " / ".join(spread([r["energy"][stat] for r in rs]) for rs in (lo, hi) if rs)
        if words:
            said = f"{words}: {off}"
        else:
            on = " / ".join(spread([r["energy_safeguard"][stat] for r in rs]) for rs in (lo, hi) if rs)
            said = f"safeguard off {off}; on {on}"
        rows.append([f"{mt.NAMES[m]}, lr 1e-3 / lr 3e-3", f"{one(lo, acc)} / {one(hi, acc)}", said])
    std = recs("standard")
    if std:
        rows.append([mt.NAMES["standard"], one(std, acc), "n/a"])
    for m in ("energy-transformer", "crate"):
        rs = recs(m)
        if not rs:
            continue
        if m == "crate":
            said = ("every layer's R^c: " + " / ".join(_pct(r["peer_energy"]["every_layer_lowers_share"]) for r in rs)
                    + " (attention steps lowering R^c: "
                    + " / ".join(_pct(r["peer_energy"]["layer_lowers_share"], 0) for r in rs) + " %)")
        else:
            said = " / ".join(_pct(_never_rises(r)) for r in rs)
        rows.append([mt.NAMES[m], one(rs, acc), said])
    return ("*SST-2, full budget* (`benchmarks/results/sst2-*-seed*.json` by `python benchmarks/accuracy.py --all "
            "--datasets sst2 --seeds 0 1 2`; lr 3e-3: `benchmarks/results/study/sst2-*-v_lr_3e-3-seed*.json` by "
            "`python benchmarks/accuracy.py --dataset sst2 --model M --seed S --variant lr_3e-3 --set optim.lr=0.003 "
            "--results benchmarks/results/study`)\n\n"
            + _md(["model", "SST-2 dev acc (%)", "samples whose objective never rises (%)"], rows))


def layer_health(results: Path) -> str:
    """The per-layer health of the fit study's IMDB reduced runs (`benchmarks/layer_health.py --json`), with each
    run's accuracy from its result file."""
    rel = "study/health/imdb-reduced.json"
    raw = _load(results, rel)
    words = {"optim.lr": lambda v: f"lr {float(v):.0e}".replace("e-0", "e-"), "model.alpha_ffn": lambda v: f"α_FFN {v}"}
    small = lambda v: f"{v:.1e}" if v < 0.01 else f"{v:.2f}"
    sig = lambda v: f"{v:#.3g}" if v >= 1e-3 else f"{v:.1e}"
    rows = []
    for h in raw["runs"]:
        cell = _load(results, f"study/{Path(h['run']).name}.json")
        if cell["variant"] == "baseline":
            variant = f"baseline (lr {h['lr']:.0e})".replace("e-0", "e-")
        else:
            variant = ", ".join(words[k](v) if k in words else f"{k} = {v}"
                                for k, _, v in (c.partition("=") for c in cell["settings"]))
        active = [100 * layer["relu_active"] for layer in h["layers"]]
        last = h["layers"][-1]
        rows.append([h["kind"], variant, _pct(cell["accuracy"]), f"{min(active):.1f}–{max(active):.1f}",
                     f"{sig(h['input_norm'])} → {sig(last['norm_after_layer'])}",
                     f"{sig(h['input_spread'])} → {sig(last['spread_after_layer'])}", small(h["logit_std"])])
    return (f"*`python benchmarks/layer_health.py RUN_DIR ... --samples {raw['samples']} "
            f"--json benchmarks/results/{rel}`* "
            f"({raw['samples']} fixed test reviews; accuracy from each run's file in "
            "`benchmarks/results/study/`)\n\n"
            + _md(["model", "variant", "IMDB reduced acc (%)", f"ReLU units active, layers 1–{len(h['layers'])} (%)",
                   f"token norm, input → layer {len(h['layers'])}", f"token spread, input → layer {len(h['layers'])}",
                   "logit std over reviews"], rows))


def zoo(results: Path) -> str:
    """The pretrained models of `src/unfoldformer/zoo/`, from their cards (`tools/zoo_build.py`)."""
    folder = results.parent.parent / "src" / "unfoldformer" / "zoo"
    noun = {"sst2": "SST-2 sentences", "imdb": "IMDB reviews"}
    rows = []
    for card in sorted(folder.glob("*/card.json"), key=lambda p: (not p.parent.name.startswith("sst2"), p.parent.name)):
        c = json.loads(card.read_text())
        run, sub = c["run"], c["subset"]
        n = c["data"]["train_examples"]                            # None: the whole training split
        rows.append([f"`{c['name']}`", f"{c['model'].get('layer', 'alternating')}, "
                     f"{'tied' if c['model'].get('tied', True) else 'untied'}",
                     f"{n:,} {noun[c['data']['dataset']]}" if n else f"all {noun[c['data']['dataset']]}",
                     str(c["data"]["max_length"]),
                     f"{run['accuracy']:.4f} ({run['eval_examples']:,} {run['eval_split']})",
                     f"{sub['correct']} / {sub['examples']}"])
    return ("*`src/unfoldformer/zoo/*/card.json`, written by `python tools/zoo_build.py RUN_DIR NAME --commit SHA "
            "--command ...`*\n\n"
            + _md(["name", "layer", "training data", "max length", "eval accuracy", "check subset"], rows))



_SHORT = {"certified-tied": "alternating (tied)", "certified-untied": "alternating (untied)",
          "certified-joint": "certified (joint, tied)", "certified-joint-untied": "certified-untied (joint)",
          "paper": "paper", "standard": "standard"}


def _settings(by: dict, model: str) -> list[list[dict]]:
    """A model's full-budget cells per optimiser setting (the default and `--set optim....` variants; variants that
    change the model are left out), the setting with the most seeds first, then the higher mean accuracy."""
    groups = [recs for (m, rho, changes), recs in by.items()
              if m == model and rho == "exp" and all(c.startswith("optim.") for c in changes) and recs]
    return sorted(groups, key=lambda rs: (-len(rs), -statistics.mean(r["accuracy"] for r in rs)))


def _lr(recs: list[dict]) -> str:
    return f"lr {recs[0]['config']['optim']['lr']:.0e}".replace("e-0", "e-")


def accuracy_targets(results: Path) -> str:
    """The accuracy and throughput targets against the full-budget cells; each model by its setting with the most
    seeds (the others in parentheses)."""
    full = mt.group(mt.load_results(results))["full"]
    certified = [m for m in mt.MODELS if m.startswith("certified")]
    ours = [m for m in mt.MODELS if m in _SHORT]
    mean = lambda rs: statistics.mean(r["accuracy"] for r in rs)
    used, rows = [], []
    for d, title in (("sst2", "SST-2"), ("imdb", "IMDB at 256")):
        by = full.get(d, {})
        base = _settings(by, "standard")
        if not base:
            continue
        base = base[0]
        used += base
        said, met = [], []
        for m in certified:
            sets = _settings(by, m)
            if not sets:
                continue
            used += [r for rs in sets for r in rs]
            main, rest = sets[0], sets[1:]
            diff = 100 * (mean(main) - mean(base))
            more = "".join(f"; {100 * mean(rs):.1f} at {_lr(rs)}" + (f", {len(rs)} seeds" if len(rs) > 1 else "")
                           for rs in rest)
            spread = mt.mean_std([r["accuracy"] for r in main]).rsplit(" (", 1)[0]
            said.append(f"{_SHORT[m]} {diff:+.1f}".replace("-", "−")
                        + f" ({spread}, {_lr(main)}, {len(main)} seed{'s' if len(main) > 1 else ''}{more})")
            met.append((_SHORT[m], diff >= -1.0))
        ok = [n for n, y in met if y]
        rows.append([f"certified within 1 point of the baseline's mean, {title}",
                     "; ".join(said) + f" vs {mt.mean_std([r['accuracy'] for r in base]).rsplit(' (', 1)[0]} "
                     f"({len(base)} seeds)",
                     "yes, all" if len(ok) == len(met) else "no" if not ok else "yes: " + ", ".join(ok)])
    for d, title, goal in (("sst2", "SST-2 dev ≥ 80 %", 0.80), ("imdb", "IMDB test ≥ 86 % (at 256, all 25,000 reviews)",
                                                                 0.86)):
        by = full.get(d, {})
        best = [(m, _settings(by, m)[0]) for m in ours if _settings(by, m)]
        if not best:
            continue
        n_ok = sum(mean(rs) >= goal for _, rs in best)
        rows.append([title, ", ".join(f"{_SHORT[m]} {100 * mean(rs):.1f}" for m, rs in best),
                     "yes, all" if n_ok == len(best) else "no model" if not n_ok else f"{n_ok} of {len(best)}"])
    side = _load(results, "speed/train_speed.json")
    times = side["step_times_s"]
    ratio = lambda n, m: statistics.median(times[n]["standard"]) / statistics.median(times[n][m])
    kinds = [m for m in certified if all(m in times[n] for n in times)]
    rows.append(["certified training throughput ≥ 1.0× the baseline",
                 ", ".join(f"{_SHORT[m]} " + " / ".join(f"{ratio(n, m):.2f}×" for n in times) for m in kinds)
                 + f" at n = {' / '.join(times)}, side by side",
                 "yes" if all(ratio(n, m) >= 1.0 for m in kinds for n in times) else "no"])
    commits = sorted({r["git_commit"][:7] for r in used if r.get("git_commit")})
    return ("*Full budget* (the cells of the tables above: `benchmarks/results/*.json` by "
            "`python benchmarks/accuracy.py --all --seeds 0 1 2`, lr 3e-3 in `benchmarks/results/study/`; "
            "trained at commits " + ", ".join(commits)
            + "; throughput: `python benchmarks/train_speed.py --json benchmarks/results/speed/train_speed.json`, "
            f"{_threads(side, 'train_speed.json')}. Each model is given by its setting with the most seeds, the "
            "others in parentheses; \"within 1 point\" is met when that setting's mean is at most 1 point below the "
            "baseline's)\n\n" + _md(["target", "measured", "met"], rows))


def numerics(results: Path) -> str:
    """Float32 accuracy of the fast paths (`benchmarks/numerics_check.py --json`), one row per measure."""
    raw = _load(results, "numerics/numerics_check.json")
    rho = raw["rho_steps"]
    order = [r for r in ("exp", "log", "lp", "truncated", "linear") if r in rho]
    g = lambda v: "0" if v == 0 else f"{v:.1e}"                    # noqa: E731
    sg = raw["safeguard"]
    rows = [["plain vs traced hidden states, max relative (tied / untied, strong FFNs, bases off the identity)",
             f"{g(raw['plain_vs_traced']['tied'])} / {g(raw['plain_vs_traced']['untied'])}"],
            ["fused log S_i vs float64 pair differences (relative to max(1, \\|log S_i\\|))",
             g(raw["fused"]["log_mass"])],
            ["fused E_A vs float64 (relative)", g(raw["fused"]["energy"])],
            ["`attention_step` at a common offset of norm 1e3 vs its float64 result, relative to the output's "
             "spread: " + " / ".join(order), " / ".join(g(rho[r]) for r in order)],
            ["safeguard-accepted final layers rising under an independent float64 evaluation (beyond "
             "tol(float32) / tol(float64))",
             f"{sg['rising_beyond_tol32']} / {sg['rising_beyond_tol64']} (of {sg['accepted']:,} accepted sample "
             f"layers: {2 * raw['cases']:,} batches of ≤ 4 sequences, each on 3 models)"],
            ["safeguard's reported final energy vs that evaluation, in units of tol(float32)·(1 + \\|E\\|)",
             f"{sg['reported_gap']:.2f}"]]
    return (f"*`python benchmarks/numerics_check.py --cases {raw['cases']} --json "
            "benchmarks/results/numerics/numerics_check.json`* "
            f"(float32 on tests/strategies.py, {_threads(raw, 'numerics_check.json')})\n\n"
            + _md(["measure", "measured"], rows))


def certificate(results: Path) -> str:
    """The joint layer's certificate under its arithmetic (`benchmarks/certificate_check.py`), one row per count."""
    raw = _load(results, "numerics/certificate.json")
    rows = [["drawn models (float64 / float32)", f"{raw['models']:,} ({raw['float64_models']:,} / "
             f"{raw['float32_models']:,}), {raw['layer_steps']:,} layer steps"],
            ["reported rises (curve beyond descent_tolerance) / of them not confirmed by the long-double reference",
             f"{raw['reported_rises']} / {raw['rises_unconfirmed']}"],
            ["safeguard steps shortened (float64 and float32)", f"{raw['float64_backtracks']}"],
            ["float32 samples the safeguard kept at their state (rounding rises) / of them not real rises",
             f"{raw['float32_kept']} / {raw['float32_kept_unconfirmed']}"],
            ["accepted float32 steps rising beyond the tolerance under the reference",
             f"{raw['float32_accepted_rising']} of {raw['float32_accepted']:,}"],
            ["reported energies erring by more than the tolerance they are judged with (worst, in tolerances)",
             f"{raw['energies_beyond_tolerance']} of {raw['energies']:,} "
             f"({raw['worst_energy_error_over_tol']:.2g})"],
            ["plain and traced forwards not bit-identical", f"{raw['plain_traced_differ']}"]]
    return ("*`python benchmarks/certificate_check.py` in chunks, merged into "
            "`benchmarks/results/numerics/certificate.json`* (every ρ, isotropic and free metrics, rotary, learned "
            "steps and bases, tied and untied, λ ≥ 1e-4, γ ≥ 1e-6, tokens up to 1e3; depth-1 models judged against "
            f"explicit pair differences in long double; {raw['seconds']:.0f} s on one thread)\n\n"
            + _md(["count", "measured"], rows))


def shared_machine(results: Path) -> str:
    """`benchmarks/shared_machine.py`'s tables (torch imported first, fresh process per cell)."""
    import shared_machine as sm  # same folder
    data = _load(results, "speed/shared_machine.json")
    counts = sorted({len(c.get("process_medians", [0])) for c in data["cells"]})
    processes = " or ".join(map(str, counts))
    head = ("*`python benchmarks/shared_machine.py run`* (torch imported before unfoldformer; each cell the median "
            f"over {processes} fresh process(es), each process's value the median wall time of 7–21 repeats; busy: "
            "beside one single-thread Python loop)")
    return head + "\n\n" + sm.table(data)


def shared_machine_orders(results: Path) -> str:
    """The smallest shape in the two import orders, and with the training step inside the library's thread region
    (`shared_machine.py --variants`: the variants alternated cell by cell in one run)."""
    import shared_machine as sm  # same folder
    data = _load(results, "speed/shared_machine_variants.json")
    names = {"torch-first": "torch first", "unfoldformer-first": "unfoldformer first",
             "step-region": "torch first, step in region"}
    variants = data["variants"]
    cells = {(c["load"], c["threads"], c["what"], c["model"], c["variant"]): c for c in data["cells"]}
    rows = []
    for load in sm.LOADS:
        for what in ("inference", "train"):
            for model in sm.MODELS:
                for threads in sm.THREADS:
                    vals = [cells.get((load, threads, what, model, v)) for v in variants]
                    rows.append([load, what, model, str(threads)]
                                + [f"{1e3 * v['median_s']:.1f}" if v else "–" for v in vals])
    steps = [c for c in data["cells"] if c["what"] != "energy"]
    counts = sorted({len(c["process_medians"]) for c in steps})
    shape = ", ".join(map(str, steps[0]["shape"]))
    head = (f"*`python benchmarks/shared_machine.py run --shapes 64,16,64 --processes 5 --no-energy --variants "
            f"{' '.join(variants)}`* ((B, n, d) = ({shape}); ms, each cell the median over "
            f"{' or '.join(map(str, counts))} fresh processes, the variants alternated cell by cell; `step in region`: "
            "torch first, the whole training step inside `free_core_threads()`, training only)")
    out = head + "\n\n" + _md(["load", "what", "model", "threads", *(names[v] + " ms" for v in variants)], rows)
    if any(c["what"] == "energy" for c in data["cells"]):
        orders = [v for v in variants if v != "step-region"]
        energy = [[load, str(threads)] + [f"{c['median_s']:.3f} s ({c['ratio']:.0f}×)" if c else "–"
                                          for c in (cells.get((load, threads, "energy", "library", v)) for v in orders)]
                  for load in sm.LOADS for threads in sm.THREADS]
        out += ("\n\nThe padded-batch energy (ratio: the pair-difference reference's time over it; one fresh process "
                "per cell, `--processes 1` without `--no-energy`):\n\n"
                + _md(["load", "threads", *(names[v] for v in orders)], energy))
    return out


def shared_machine_alternate(results: Path) -> str:
    """`shared_machine.py alternate`: the caller's 1 and 2 threads alternated call by call in one process."""
    records = _load(results, "speed/shared_machine_alternate.json")
    rows = [[r["what"], r["model"], ", ".join(map(str, r["shape"])), "busy" if r["busy"] else "idle", str(r["rounds"]),
             f"{1e3 * r['median_s']['1']:.2f}", f"{1e3 * r['median_s']['2']:.2f}",
             f"{r['median_s']['1'] / r['median_s']['2']:.2f}×"] for r in records]
    head = ("*`python benchmarks/shared_machine.py alternate --what W --model M --busy`* (one fresh process per row, "
            "torch first; the caller's thread count alternated 1, 2, 1, 2, … call by call, medians; the ratio: "
            "1-thread time over 2-thread time)")
    return head + "\n\n" + _md(["what", "model", "shape", "load", "rounds", "caller 1 thread ms",
                                 "caller 2 threads ms", "ratio"], rows)


BLOCKS: dict[str, Callable[[Path], str]] = {
    "fresh": fresh,
    "fresh-before-prior": fresh_before_prior,
    "fresh-paired": fresh_paired,
    "fresh-paired-more-seeds": fresh_paired_more_seeds,
    "fresh-tied-control": fresh_tied_control,
    "headline": headline, "accuracy-full": accuracy_full, "accuracy-reduced": accuracy_reduced,
    "rho-accuracy": rho_accuracy, "study": study, "train-speed": train_speed, "scaling": scaling,
    "peers-seeds": peers_seeds, "energy-speed": energy_speed, "rho-step": rho_step, "rho-cost": rho_cost,
    "peers-reduced": peers_reduced, "peers-imdb-seeds": peers_imdb_seeds, "peers-full": peers_full,
    "layer-health": layer_health, "zoo": zoo, "accuracy-targets": accuracy_targets,
    "energy-peak": energy_peak, "rho-busy": rho_busy, "rho-threads": rho_threads,
    "inference-speed-1thread": inference_speed, "inference-speed-2threads": inference_speed_2threads,
    "inference-energies": inference_energies, "numerics": numerics, "probe": probe, "reproduction": reproduction,
    "pretrained-descent": pretrained_descent,
    "rho-spread": rho_spread, "profiles": profiles,
    "profiles-shared-machine": profiles_shared_machine, "counterexamples": counterexamples, "compile": compile_speed,
    "certificate": certificate, "shared-machine": shared_machine, "shared-machine-orders": shared_machine_orders,
    "shared-machine-alternate": shared_machine_alternate}


def regenerate(text: str, results: Path = RESULTS) -> str:
    """`text` with every generated block rewritten from `results`."""
    out, pos = [], 0
    for m in BEGIN.finditer(text):
        name = m["name"]
        if name not in BLOCKS:
            raise SystemExit(f"make_docs: unknown block {name!r}")
        end = text.index(f"<!-- end: {name} -->", m.end())
        out += [text[pos:m.end()], BLOCKS[name](results).rstrip("\n") + "\n"]
        pos = end
    return "".join(out) + text[pos:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 if a file would change")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    stale = []
    for rel in FILES:
        path = ROOT / rel
        old = path.read_text(encoding="utf-8")
        new = regenerate(old, Path(args.results))
        if new != old:
            stale.append(rel)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print("stale generated tables: " + ", ".join(stale) + " (run python benchmarks/make_docs.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
