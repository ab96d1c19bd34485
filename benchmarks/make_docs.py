"""The generated tables of README.md and the documentation's results pages, from `benchmarks/results/`.

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

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FILES = ("README.md", "docs/index.md", "docs/results/index.md", "docs/results/accuracy.md", "docs/results/speed.md",
         "docs/results/rho.md", "docs/results/fit-study.md", "docs/results/peers.md")
BEGIN = re.compile(r"<!-- generated: (?P<name>[\w-]+) "
                   r"\(python benchmarks/make_docs.py\) -->\n")


def _md(head: list[str], rows: list[list[str]]) -> str:
    assert len(head) <= 8, head
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


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
    """SST-2, full budget: accuracy, training speed (one side-by-side run), unaided descent, for the
    certified models, the standard Transformer and the peers."""
    by = mt.group(mt.load_results(results))["full"]["sst2"]
    side = json.loads((results / "speed" / "train_speed_peers_3.json").read_text())["step_times_s"]
    ratio = lambda m, n: statistics.median(side[n]["standard"]) / statistics.median(side[n][m])
    pct = lambda v: mt.mean_std(v).replace(" (1)", "").rsplit(" (", 1)[0] if v else "n/a"
    rows = []
    for key, name, descends in (
            (("certified-tied", "exp", ("optim.lr=0.003",)), "certified (tied), lr 3e-3", "its energy E"),
            (("certified-tied", "exp", ()), "certified (tied), default lr 1e-3", "its energy E"),
            (("certified-untied", "exp", ("optim.lr=0.003",)), "certified (untied), lr 3e-3",
             "each layer its own E_ℓ"),
            (("standard", "exp", ()), "standard pre-LN Transformer", "nothing"),
            (("energy-transformer", "exp", ()), "Energy Transformer (peer)", "its energy"),
            (("crate", "exp", ()), "CRATE (peer)", "its coding rate, per layer")):
        recs = by.get(key, [])
        if not recs:
            continue
        model = key[0]
        if model == "certified-untied":
            unaided = mt._energy(recs, "energy", "layer_descent_share")
        else:
            unaided = (mt._energy(recs, "energy", "monotone_share") or mt._energy(recs, "peer_energy", "monotone_share")
                       or mt._energy(recs, "peer_energy", "every_layer_lowers_share"))
        guarded = mt._energy(recs, "energy_safeguard", "layer_descent_share" if model == "certified-untied"
                             else "monotone_share")
        speed = f"{ratio(model, '64'):.2f}× / {ratio(model, '256'):.2f}×" if model in side["64"] else "–"
        rows.append([name, descends, f"{pct(mt._values(recs, 'accuracy'))} ({len(recs)})", speed, pct(unaided),
                     pct(guarded)])
    return _md(["model", "descends", "SST-2 dev acc (%) (seeds)", "training step vs standard, n = 64 / 256",
                "never rises, unaided (%)", "safeguard on (%)"], rows)


def study(results: Path) -> str:
    """The fit study (`benchmarks/accuracy_study.py`), one table on accuracy and fit, one on descent."""
    records = [json.loads(p.read_text()) for p in sorted((results / "study").glob("*.json"))]
    base = {(r["dataset"], r["model"], r["budget"]): r for r in records if r.get("variant") == "baseline"}
    pct = lambda v: "–" if v is None else f"{100 * v:.1f}"
    energy = lambda r, k, f: (r.get(k) or {}).get(f)
    records.sort(key=lambda r: (r["dataset"], r["budget"] != "reduced", r["model"], r["variant"] != "baseline",
                                r["variant"], r["seed"]))
    name = lambda r: [f"{r['dataset']}, {r['budget']}", r["model"], f"{r['variant']}, seed {r['seed']}"]
    acc, desc = [], []
    for r in records:
        b = base.get((r["dataset"], r["model"], r["budget"]))
        delta = "–" if b is None or r is b else f"{100 * (r['accuracy'] - b['accuracy']):+.1f}"
        loss = r["metrics"][-1]["train_loss"] if r.get("metrics") else None
        acc.append(name(r) + [pct(r["accuracy"]), delta, pct(r.get("accuracy_safeguard")),
                              "–" if loss is None else f"{loss:.3f}"])
        if r.get("energy"):
            desc.append(name(r) + [pct(energy(r, "energy", "layer_descent_share")),
                                   pct(energy(r, "energy", "monotone_share")),
                                   pct(energy(r, "energy_safeguard", "monotone_share")), f"{r['tokens_per_s']:,.0f}"])
    return "\n".join([
        "*Accuracy and fit*", "",
        _md(["dataset, budget", "model", "variant", "accuracy (%)", "Δ vs baseline", "safeguard on (%)",
             "train loss (last epoch's mean)"], acc),
        "*Descent and throughput*", "",
        _md(["dataset, budget", "model", "variant", "every layer descends (%)", "curve never rises (%)",
             "never rises, safeguard on (%)", "training tokens/s"], desc)])


def train_speed(results: Path) -> str:
    """The side-by-side training-step times (`benchmarks/train_speed.py`), one table per run file."""
    from train_speed import variant_name
    parts = []
    for fname, title in (("train_speed.json", "The accuracy benchmark's models and two variants"),
                         ("train_speed_peers_3.json", "With the peers")):
        raw = json.loads((results / "speed" / fname).read_text())
        times = raw["step_times_s"]
        lengths = list(times)
        rows = []
        for v in times[lengths[0]]:
            cells = []
            for n in lengths:
                med = statistics.median(times[n][v])
                cells += [f"{med:.3f}", f"{statistics.median(times[n]['standard']) / med:.2f}×"]
            rows.append([variant_name(v)] + cells)
        head = ["model"] + [h for n in lengths for h in (f"n = {n}: s/step (CPU)", f"n = {n}: vs standard")]
        load = " – ".join(f"{x:.1f}" for x in raw["load_average"])
        parts += [f"*{title}* (`benchmarks/results/speed/{fname}`; {raw['rounds']} rounds, B = {raw['batch_size']}, "
                  f"{raw['threads']} thread, load average {load})", "", _md(head, rows)]
    return "\n".join(parts)


def scaling(results: Path) -> str:
    """Time and peak memory against n (`benchmarks/scaling.py`): one table each, then the fitted exponents."""
    raw = json.loads((results / "speed" / "scaling.json").read_text())
    lengths = sorted({p["n"] for pts in raw["points"].values() for p in pts})[-7:]
    out = []
    for title, cell in (("CPU time (s)", lambda p: f"{p['time_s']:.3g}"),
                        ("peak memory above the inputs (MiB)", lambda p: f"{p['peak_bytes'] / 2**20:.0f}")):
        rows = []
        for series, pts in raw["points"].items():
            by_n = {p["n"]: p for p in pts}
            rows.append([series] + [cell(by_n[n]) if n in by_n else "–" for n in lengths])
        out += [f"*{title}*", "", _md(["series"] + [f"n = {n:,}" for n in lengths], rows)]
    fmt = lambda v: "–" if v is None else f"{v:.2f}"
    out += ["*Log-log slopes over n ≥ 1,024*", "",
            _md(["series", "time exponent", "memory exponent"],
                [[s, fmt(e["time"]), fmt(e["memory"])] for s, e in raw["exponents"].items()])]
    return "\n".join(out)


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


BLOCKS: dict[str, Callable[[Path], str]] = {
    "headline": headline, "accuracy-full": accuracy_full, "accuracy-reduced": accuracy_reduced,
    "rho-accuracy": rho_accuracy, "study": study, "train-speed": train_speed, "scaling": scaling,
    "peers-seeds": peers_seeds}


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
