"""`unfoldformer reproduce`: the paper's figures 1–6 with a report (THEORY §7).

`run_reproduction(settings)` runs the selected figures — 1 (Apollonius regions), 2–3
(alternating steps), 4 (κ-regions), 5 (energy curves on IMDB), 6 (energy curves on SST-2) — and
writes into `settings.out`: the PNGs, `report.md` (numbers, embeddings, data files with sha256,
wall time, the released-code defects), `results.json` (every number; deterministic for one
seed), `timings.json` (wall times, kept apart so results.json files compare equal) and
`config.json` (the resolved settings). Figures 5–6 run on the data sets of `settings.datasets`.
Torch and BLAS run on `settings.threads` threads. The folder is built whole or not at all
(`runs.staged_output`, with `complete.json`): a failed or killed run leaves an earlier output as it was.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from tqdm import tqdm

from ..data import DATASET_NAMES, EVAL_SPLITS, dataset_files, load_dataset, load_embeddings
from ..runs import check_output_location, staged_output
from ..utils import atomic_write_text, jsonable, torch_threads, write_json
from . import fig1_apollonius, fig4_kappa, fig23_alternating
from . import fig56_energy_curves as fig56
from .report import render_report
from .settings import DATASET_FIGURE, FIGURE_FILES, ReproduceSettings

__all__ = ["run_reproduction"]


# ----------------------------------------------------------------------------- data
def _curve_settings(cfg: ReproduceSettings, dataset: str) -> fig56.CurveSettings:
    return fig56.CurveSettings(
        eval_max_length=cfg.imdb_max_length if dataset == "imdb" else None,
        train_max_length=cfg.train_max_length, train_batch_size=cfg.train_batch_size,
        train_epochs=cfg.train_epochs, accuracy_max_length=cfg.train_max_length)


def _load_inputs(cfg: ReproduceSettings) -> tuple[dict, object, dict]:
    """Per data set: eval texts, train and accuracy examples; the embeddings; data files with sha256."""
    inputs, files = {}, {}
    d, seed = cfg.data_dir, cfg.seed
    for name in cfg.datasets:
        test = load_dataset(name, EVAL_SPLITS[name], d)
        train = fig56.select(load_dataset(name, "train", d), cfg.train_examples, seed, 1)
        acc = fig56.select(test, getattr(cfg, f"{name}_accuracy_samples"), seed, 2)
        inputs[name] = ([e.text for e in fig56.select(test, cfg.samples, seed, 0)], train, acc,
                        len(acc) == len(test))
        files.update(dataset_files(name, d))
    texts = [t for ev, tr, acc, _ in inputs.values() for t in ev + [e.text for e in tr + acc]]
    emb = load_embeddings(cfg.embeddings, vocab_texts=texts, seed=seed) if inputs else None
    return inputs, emb, files


# ----------------------------------------------------------------------------- figures
def _theory_figures(cfg: ReproduceSettings, out: Path, tick) -> dict:
    """Figures 1–4 (THEORY §3.5, §7 items 1–4): summaries, PNGs written to `out`."""
    figs, seed, res = cfg.figures, cfg.seed, {}
    if 1 in figs:
        r = fig1_apollonius.compute(seed=seed, grid=cfg.grid)
        fig1_apollonius.plot(r, out / FIGURE_FILES[1])
        res["1"] = fig1_apollonius.summary(r)
        tick("figure 1")
    if 2 in figs or 3 in figs:
        r = fig23_alternating.compute(seed=seed, half_steps=cfg.half_steps)
        fig23_alternating.plot(r, out / FIGURE_FILES[2], path_fig3=out / FIGURE_FILES[3])
        res["2-3"] = fig23_alternating.summary(r)
        tick("figures 2-3")
    if 4 in figs:
        r = fig4_kappa.compute(seed=seed, grid=cfg.grid)
        fig4_kappa.plot(r, out / FIGURE_FILES[4])
        res["4"] = fig4_kappa.summary(r)
        tick("figure 4")
    return res


def _energy_figures(cfg: ReproduceSettings, inputs: dict, emb, out: Path, tick) -> dict:
    """Figures 5–6 per data set: summaries, PNGs written to `out`."""
    res = {}
    for name, (texts, train, acc, acc_all) in inputs.items():
        r = fig56.compute(texts, train, acc, emb, name, _curve_settings(cfg, name), cfg.seed, tick)
        fig = DATASET_FIGURE[name]
        fig56.plot(r, out / FIGURE_FILES[fig],
                   title=f"Figure {fig}: energy per layer, {DATASET_NAMES[name]} "
                         f"{EVAL_SPLITS[name]} ({len(texts)} samples)")
        res[name] = {**fig56.summary(r), "n_accuracy_all": acc_all, "settings": jsonable(vars(r.settings))}
    return res


def _owned(name: str) -> bool:
    """Names this command writes (an earlier output made of them may be replaced)."""
    return name in {"config.json", "results.json", "timings.json", "report.md", *FIGURE_FILES.values()}


def run_reproduction(cfg: ReproduceSettings) -> tuple[dict, dict]:
    """Run the selected figures and write every output into `cfg.out`; returns (results, timings) as written."""
    check_output_location("--out", cfg.out)
    with torch_threads(cfg.threads), staged_output(cfg.out, "reproduce", cfg.to_dict(), owned=_owned) as out:
        return _run(cfg, out)


def _run(cfg: ReproduceSettings, out: Path) -> tuple[dict, dict]:
    t0, timings = time.perf_counter(), {}
    inputs, emb, files = _load_inputs(cfg)                        # fails fast on missing data
    timings["load_data"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", cfg.to_dict())
    n_theory = (1 in cfg.figures) + bool({2, 3} & set(cfg.figures)) + (4 in cfg.figures)
    total = n_theory + sum(fig56.n_stages(_curve_settings(cfg, n)) for n in inputs)
    with tqdm(total=total, desc="reproduce", disable=not cfg.progress, file=sys.stderr) as bar:
        last = [time.perf_counter()]

        def tick(stage: str) -> None:
            now = time.perf_counter()
            timings[stage], last[0] = now - last[0], now
            bar.set_postfix_str(stage)
            bar.update(1)

        theory = _theory_figures(cfg, out, tick)
        curves = _energy_figures(cfg, inputs, emb, out, tick)
    timings["total"] = time.perf_counter() - t0
    results = jsonable({"mode": cfg.mode, "seed": cfg.seed, "figures": theory, "energy_curves": curves,
                         "settings": {k: v for k, v in cfg.to_dict().items()
                                      if k not in ("out", "progress", "threads")},
                         "embeddings": emb.describe() if emb is not None else None, "data_files": files})
    write_json(out / "results.json", results, sort_keys=True)
    write_json(out / "timings.json", timings)
    atomic_write_text(out / "report.md", render_report(results, timings, cfg))
    return results, timings
