"""Markdown table of the accuracy benchmark from `benchmarks/results/*.json`.

    python benchmarks/make_table.py [--results DIR] [--output FILE]

One row per (budget, model, ρ): accuracy per dataset as mean ± sample std over seeds (a single value
when there is one seed; the seed count in parentheses) of the trained function (safeguard off,
the main column) and, as an extra column, with the backtracking safeguard on; IMDB full-length
accuracy (both); training tokens/s and the throughput ratio to the standard Transformer on the
same dataset and budget; energy statistics with the safeguard off and on, the share of layer steps
the safeguard shortened, and its inference cost (safeguard-on evaluation time / plain inference).
Full-budget and reduced runs are never pooled: reduced rows go to their own table, with the
budget that was run (examples, epochs) stated. Certified models trained with another attention
penalty ρ (`accuracy.py --rho`) get their own rows after the exp row of the same model; so do the
full-budget cells of the fit study (`results/study/`, `accuracy.py --variant NAME`), named by their
config changes (e.g. "certified (tied), optim.lr=0.003").
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("certified-tied", "certified-untied", "certified-joint", "certified-joint-untied", "paper", "standard",
          "energy-transformer", "crate")
RHO_MODELS = ("certified-tied", "certified-untied")   # trained with every ρ (`accuracy.py --rho`)
#: Untied certified labels: one energy E_ℓ per layer, so no single curve: "curve never rises" does not apply.
UNTIED = ("certified-untied", "certified-joint-untied")
#: Result labels (the kind names of version 0.2.0, `accuracy.LABELS`) -> today's names in the tables.
NAMES = {"certified-tied": "certified-alternating (tied)", "certified-untied": "certified-alternating (untied)",
         "certified-joint": "certified (joint, tied)", "certified-joint-untied": "certified-untied (joint)",
         "paper": "paper preset (theory-consistent)", "standard": "standard pre-LN Transformer",
         "energy-transformer": "Energy Transformer (peer)", "crate": "CRATE (peer)"}
DATASET_NAMES = {"sst2": "SST-2 dev", "imdb": "IMDB test"}
RHO_NAMES = {"exp": "exp (softmax)", "log": "log(z + 2)", "lp": "ℓ_p (p = 1)", "truncated": "min(z, 1)",
             "linear": "z (uniform)"}


RowKey = tuple[str, str, tuple[str, ...]]


def row_key(rec: dict) -> RowKey:
    """(model, ρ, config changes of a study variant) of a result; files written before ρ was recorded are exp;
    the default settings have no changes (())."""
    return rec["model"], rec.get("rho", "exp"), tuple(rec.get("settings") or ())


def row_name(key: RowKey) -> str:
    model, rho, changes = key
    name = NAMES[model] if rho == "exp" else f"{NAMES[model]}, ρ = {RHO_NAMES.get(rho, rho)}"
    return ", ".join([name, *changes])


def speed_key(key: RowKey) -> str | None:
    """The key of a model in the side-by-side speed file (`train_speed.py`, with `--rho`); None for a
    variant that changes the model (only optimiser changes keep the step time of the default)."""
    model, rho, changes = key
    if any(not c.startswith("optim.") for c in changes):
        return None
    return model if rho == "exp" else f"{model}:{rho}"


def load_speed(*paths: Path) -> dict | None:
    """{n: {model: standard's median step time / the model's}} from the side-by-side training-speed files
    (`train_speed.json`; `train_speed_rho.json` for the ρ rows), each ratio taken within one file."""
    out: dict = {}
    for path in paths:
        if not path.is_file():
            continue
        raw = json.loads(path.read_text())
        for n, times in raw["step_times_s"].items():
            base = statistics.median(times["standard"])
            for k, v in times.items():
                out.setdefault(int(n), {}).setdefault(k, base / statistics.median(v))
    return out or None


def load_results(folder: Path) -> list[dict]:
    """The cells in `folder`, and the full-budget cells of the fit study in `folder/study` (its reduced
    cells have their own table, `accuracy_study.py --table`)."""
    study = [json.loads(p.read_text()) for p in sorted((folder / "study").glob("*.json"))]
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] + \
        [r for r in study if r["budget"] == "full"]


def mean_std(values: list[float], scale: float = 100.0, digits: int = 1) -> str:
    """'m ± s (n)' for n ≥ 2, 'v (1)' for one value, '–' for none."""
    if not values:
        return "–"
    vals = [v * scale for v in values]
    if len(vals) == 1:
        return f"{vals[0]:.{digits}f} (1)"
    return f"{statistics.mean(vals):.{digits}f} ± {statistics.stdev(vals):.{digits}f} ({len(vals)})"


def group(records: list[dict]) -> dict:
    """{budget: {dataset: {model: [records]}}}, budget = 'full' or a description of the reduced run."""
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for rec in records:
        budget = "full" if rec["budget"] == "full" else (
            f"reduced: {rec['train_examples']} train / {rec['eval_examples']} eval examples, {rec['epochs']} epoch(s)")
        out[budget][rec["dataset"]][row_key(rec)].append(rec)
    return out


def table(by_dataset: dict, speed: dict | None = None, every_rho: bool = False) -> str:
    """One budget's table; with `every_rho` the certified models get a row for every ρ of the family,
    "not run yet" where a cell has no result."""
    datasets = [d for d in DATASET_NAMES if d in by_dataset]
    head = ["model"]
    for d in datasets:
        head += [f"{DATASET_NAMES[d]} acc (%)", f"{d} acc, safeguard on (%)"]
        if d == "imdb":
            head += ["IMDB test, full length (%)", "full length, safeguard on (%)"]
        head += [f"{d} tokens/s", f"{d} speed vs standard" + (" (side by side)" if speed else "")]
    per = " (" + " / ".join(DATASET_NAMES[d].split()[0] for d in datasets) + ")"
    head += [h + per for h in ("curve never rises (%)", "curve never rises, safeguard on (%)",
                               "every layer descends (%)", "backtracked layer steps, safeguard on (%)",
                               "safeguard inference cost")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    present = {key for d in datasets for key in by_dataset[d]}
    if every_rho:
        present |= {(model, rho, ()) for model in RHO_MODELS for rho in RHO_NAMES}
    order = list(RHO_NAMES)
    for key in sorted(present, key=lambda k: (MODELS.index(k[0]), order.index(k[1]) if k[1] in order else len(order),
                                              k[1], k[2])):
        lines.append("| " + " | ".join([row_name(key)] + row(key, by_dataset, datasets, speed)) + " |")
    return "\n".join(lines)


def _values(recs: list[dict], key: str) -> list[float]:
    return [r[key] for r in recs if r.get(key) is not None]


def _energy(recs: list[dict], key: str, stat: str) -> list[float]:
    return [r[key][stat] for r in recs if r.get(key) and r[key].get(stat) is not None]


def row(key: RowKey, by_dataset: dict, datasets: list[str],
        side_by_side: dict | None = None) -> list[str]:
    cells, per_dataset = [], []
    na = lambda values, **kw: mean_std(values, **kw) if values else "n/a"
    for d in datasets:
        recs = by_dataset[d].get(key, [])
        cells += [mean_std(_values(recs, "accuracy")) if recs else "not run yet",
                  na(_values(recs, "accuracy_safeguard"))]
        if d == "imdb":
            cells += [mean_std(_values(recs, "accuracy_full_length")),
                      na(_values(recs, "accuracy_full_length_safeguard"))]
        speed = [r["tokens_per_s"] for r in recs]
        base = [r["tokens_per_s"] for r in by_dataset[d].get(("standard", "exp", ()), [])]
        cells.append(f"{statistics.mean(speed):,.0f}" if speed else "–")
        length = recs[0]["eval_max_length"] if recs else None      # the training length of the cell
        side = (side_by_side or {}).get(length)
        if side and speed_key(key) in side:
            cells.append(f"{side[speed_key(key)]:.2f}×")
        elif side:                                                 # not in the side-by-side run: no ratio of
            cells.append("–")                                      # tokens/s measured under other loads
        else:
            cells.append(f"{statistics.mean(speed) / statistics.mean(base):.2f}×" if speed and base else "–")
        per_dataset.append(recs)
    joined = lambda cell: " / ".join(cell(recs) for recs in per_dataset)   # one value per dataset
    # the Energy Transformer's curve (no safeguard) counts as "never rises, safeguard off"
    never_rises = lambda r: _energy(r, "energy", "monotone_share") or _energy(r, "peer_energy", "monotone_share")
    # CRATE's "every layer descends": every attention step lowers its coding rate R^c_ℓ
    every_layer = lambda r: (_energy(r, "energy", "layer_descent_share")
                             or _energy(r, "peer_energy", "every_layer_lowers_share"))
    one_curve = key[0] not in UNTIED
    cells += [joined(lambda r: na(never_rises(r) if one_curve else None)),
              joined(lambda r: na(_energy(r, "energy_safeguard", "monotone_share") if one_curve else None)),
              joined(lambda r: na(every_layer(r))),
              joined(lambda r: na(_energy(r, "energy_safeguard", "backtracked_layer_share"))),
              joined(lambda r: f"{statistics.mean(_values(r, 'safeguard_slowdown')):.1f}×"
                     if _values(r, "safeguard_slowdown") else "n/a")]
    return cells


def machines(records: list[dict]) -> str:
    seen = sorted({f"{r['machine'].get('processor')}, {r['machine'].get('cpu_count')} cores, "
                   f"{r['machine'].get('threads')} threads, torch {r['machine'].get('torch')}" for r in records})
    return "; ".join(seen)


def subset_notes(records: list[dict]) -> list[str]:
    """One line per (dataset, budget) whose passes ran on subsets of the eval split, with their sizes."""
    notes = set()
    for r in records:
        sizes = r.get("eval_examples_per_pass") or {}
        if len(set(sizes.values())) > 1:
            size = lambda *keys, sizes=sizes: next((f"{sizes[k]:,}" for k in keys if k in sizes), "–")
            notes.add(f"{DATASET_NAMES[r['dataset']]} ({r['budget']} budget): main accuracy on {size('plain')} "
                      f"examples; safeguard-on accuracy and energy statistics on a fixed random "
                      f"{size('safeguard_on', 'plain_energy_subset')}; full-length accuracy on a fixed random "
                      f"{size('full_length')}.")
    return sorted(notes)


def render(records: list[dict], speed: dict | None = None) -> str:
    if not records:
        return "_No benchmark results yet (run `python benchmarks/accuracy.py`)._\n"
    parts = []
    for budget, by_dataset in sorted(group(records).items(), key=lambda kv: kv[0] != "full"):
        title = "Full budget (SST-2: 3 epochs, max length 64; IMDB: 2 epochs, max length 256)" \
            if budget == "full" else budget.capitalize()
        full = budget == "full"
        parts += [f"**{title}**", "", table(by_dataset, speed if full else None, every_rho=full), ""]
    parts.append("Accuracy of the final weights, mean ± sample std over seeds (number of seeds). Width 128, "
                 "depth 6, 4 heads, FFN width 512, frozen MiniLM word-piece table + one trainable linear map, "
                 "same optimiser and token budget for all models. \"tokens/s\": training throughput of the run "
                 "itself, which shared the 2 cores with other runs for most of its time, so these rates mix machine "
                 "load into model cost. \"speed vs standard (side by side)\": the standard Transformer's median "
                 "training-step time / the model's, measured by `benchmarks/train_speed.py` with the models "
                 "stepping in turn in one process at the training length (B = 32; the peers in their own run "
                 "with the certified models and the standard one); in the reduced tables, "
                 "\"speed vs standard\" is the ratio of the runs' tokens/s. \"every layer descends\": share "
                 "of evaluation samples for which each layer lowers its own energy, E_ℓ(Y⁽ℓ⁾) ≤ E_ℓ(Y⁽ℓ⁻¹⁾); "
                 "\"curve never rises\": share "
                 "whose curve E(Y⁰) ≥ … ≥ E(Yᵀ) holds — one energy for tied models, for untied ones the curve "
                 "mixes the layers' different energies. Both allow float32 round-off (1e-6 relative). All models "
                 "are trained with the safeguard off (it acts only at evaluation), so the main accuracy column and "
                 "the energy columns without a qualifier evaluate the trained function with the safeguard off; "
                 "\"safeguard on\" evaluates the same weights with backtracking on the layer step (whole-layer "
                 "descent by construction, THEORY §3.5; for the paper preset too, whose default is off). "
                 "\"backtracked layer steps\": share of (sample, layer) steps the safeguard shortened or skipped. "
                 "\"safeguard inference cost\": evaluation time with the safeguard on / plain inference "
                 "(same examples, one thread). Energy statistics at the training length, one value per dataset.")
    parts += subset_notes(records)
    parts.append(f"Machine: {machines(records)}.")
    return "\n".join(parts) + "\n"


BEGIN = "<!-- accuracy table: generated by benchmarks/make_table.py --readme README.md -->"
END = "<!-- end of accuracy table -->"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--output", help="write the markdown here (default: stdout)")
    p.add_argument("--readme", help="replace the block between the accuracy markers of this README")
    args = p.parse_args(argv)
    # written by `benchmarks/train_speed.py --json benchmarks/results/speed/train_speed.json` (and, with
    # `--rho log lp truncated linear`, `.../train_speed_rho.json`; the peers' ratios from the run with
    # `--variants certified-tied certified-untied standard energy-transformer crate`, `train_speed_peers_3.json`)
    speed = Path(args.results) / "speed"
    text = render(load_results(Path(args.results)),
                  load_speed(speed / "train_speed.json", speed / "train_speed_rho.json",
                             speed / "train_speed_peers_3.json"))
    if args.readme:
        readme = Path(args.readme).read_text(encoding="utf-8")
        head, rest = readme.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        Path(args.readme).write_text(f"{head}{BEGIN}\n{text}{END}{tail}", encoding="utf-8")
    elif args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
