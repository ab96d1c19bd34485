"""`unfoldformer reproduce`: the paper's figures 1–6 with a report (THEORY §7).

`run_reproduction(settings)` runs the selected figures — 1 (Apollonius regions), 2–3
(alternating steps), 4 (κ-regions), 5 (energy curves on IMDB), 6 (energy curves on SST-2) — and
writes into `settings.out`: the PNGs, `report.md` and `report.html` (verdicts first, then the
numbers; the HTML page embeds the figures), `results.json` (every number; deterministic for one
seed and thread count), `timings.json` (wall times, kept apart so results.json files compare
equal), `config.json` (the resolved settings) and, for figures 5–6, one training run folder per
trained variant under `models/` (open one with `unfoldformer.load`). Every TrainConfig is
validated before any work. The folder is built whole or not at all (`runs.staged_output`, with
`complete.json`): a failed or killed run leaves an earlier output as it was.
The trainings and curve sets run on `settings.threads` worker processes of
one thread each (`paper.tasks`).

Everything is written below one folder, chosen in `run_reproduction` only (`_run(cfg, out)`).
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..contracts import require_finite
from ..data import DATASET_NAMES, EVAL_SPLITS, dataset_record, load_dataset, load_embeddings
from ..data.batching import seeded_subset
from ..runs import check_output_folder, staged_output
from ..utils import atomic_write_text, jsonable, torch_threads, write_json
from . import fig56_energy_curves as fig56
from . import fig56_plot
from .report import render_html, render_report
from .settings import DATASET_FIGURE, FIGURE_FILES, ReproduceSettings
from .tasks import Job, random_curves_job, run_jobs, theory_job, train_job, trained_curves_job
from .trained import recipes, record_final_location, train_config

__all__ = ["run_reproduction"]

MODELS = "models"                      # folder of the trained variants' runs, inside the output


# ----------------------------------------------------------------------------- inputs
def _load_inputs(cfg: ReproduceSettings) -> tuple[dict, object, dict]:
    """Per data set: eval texts and the accuracy examples' majority rate; the embeddings; data files."""
    inputs, files = {}, []
    for name in cfg.datasets:
        test = load_dataset(name, EVAL_SPLITS[name], cfg.data_dir)
        samples = fig56.select(test, cfg.samples, cfg.seed, 0)
        keep = seeded_subset(len(test), getattr(cfg, f"{name}_accuracy_samples"))   # the trainer's subset
        labels = np.array([test[i].label for i in (range(len(test)) if keep is None else keep)])
        inputs[name] = ([e.text for e in samples], [e.label for e in samples],
                        float(np.bincount(labels).max() / len(labels)))
        files.append(dataset_record(name, cfg.data_dir))          # path, bytes, sha256
    vocab = [t for texts, _, _ in inputs.values() for t in texts]
    emb = load_embeddings(cfg.embeddings, vocab_texts=vocab, seed=cfg.seed) if inputs else None
    return inputs, emb, files


def _train_configs(cfg: ReproduceSettings, emb, out: Path) -> dict:
    """Per data set, [(recipe, validated TrainConfig)] (a ConfigError here stops the run before any work)."""
    return {name: [(spec, train_config(spec, name, out / MODELS / f"{name}-{spec.name}", embeddings=cfg.embeddings,
                                       embedding_dim=emb.dim,
                                       accuracy_examples=getattr(cfg, f"{name}_accuracy_samples"),
                                       seed=cfg.seed, threads=1, data_dir=cfg.data_dir))
                   for spec in recipes(cfg, name)]
            for name in cfg.datasets}


# ----------------------------------------------------------------------------- figures
THEORY_FIGURES = {"1": (1,), "2-3": (2, 3), "4": (4,)}


def _theory_jobs(cfg: ReproduceSettings, out: Path) -> dict[str, Job]:
    """Figures 1–4 (THEORY §3.5, §7 items 1–4) that `cfg.figures` selects, as jobs writing their PNGs to `out`."""
    return {f"figure {key}": Job(theory_job, (key, cfg.seed, cfg.grid, cfg.half_steps, out))
            for key, numbers in THEORY_FIGURES.items() if set(numbers) & set(cfg.figures)}


def _caption(cfg: ReproduceSettings, s: dict, emb) -> str:
    name, n = s["dataset"], s["n_samples"]
    length = cfg.imdb_max_length if name == "imdb" else None
    trunc = ("full length" if length is None else
             f"truncated to {length} tokens ({100 * s['share_untruncated']:.0f}% of them whole)")
    return (f"Embeddings: {emb.name} ({emb.dim}-d, frozen; the paper: GloVe 840B, 300-d). Inputs: {n} random "
            f"{DATASET_NAMES[name]} {EVAL_SPLITS[name]} texts, {trunc}, {s['tokens_per_sample']['mean']:.0f} "
            f"tokens on average. Energies per token: E/n, n = the text's tokens.\n12 weight-tied steps "
            f"(certified, the joint layer: 6, no safeguard). Accuracy: final weights on {s['n_accuracy']} "
            f"{EVAL_SPLITS[name]} examples (as released: at 32 tokens; AdamW: at the curves' truncation), safeguard "
            f"off; majority class "
            f"{100 * s['majority_rate']:.1f}%. A rising step: E(Y⁽ᵗ⁾) > E(Y⁽ᵗ⁻¹⁾) + 1e-6·(1 + |E(Y⁽ᵗ⁻¹⁾)|).")


def _curve_settings(cfg: ReproduceSettings, dataset: str) -> fig56.CurveSettings:
    return fig56.CurveSettings(eval_max_length=cfg.imdb_max_length if dataset == "imdb" else None)


def _jobs(cfg: ReproduceSettings, inputs: dict, configs: dict) -> dict[str, Job]:
    """Every training and curve set of figures 5–6 in priority order: the AdamW trainings (longest), the SGD
    trainings, each followed by its curve set, then the random models' curve sets (IMDB first)."""
    vocab = tuple(t for texts, _, _ in inputs.values() for t in texts)
    trainings = [(name, spec, tcfg) for name in inputs for spec, tcfg in configs[name]]
    trainings.sort(key=lambda item: item[1].optimizer != "adamw")          # stable: AdamW first
    jobs: dict[str, Job] = {}
    for name, spec, tcfg in trainings:
        texts, labels, _ = inputs[name]
        jobs[f"{name} train {spec.key}"] = Job(train_job, (spec, tcfg))
        jobs[f"{name} {spec.key}"] = Job(trained_curves_job, (texts, labels, _curve_settings(cfg, name)),
                                         after=(f"{name} train {spec.key}",))
    for name, (texts, _, _) in inputs.items():
        settings = _curve_settings(cfg, name)
        for formula in settings.formulas:
            for variant in fig56.RANDOM_VARIANTS:
                jobs[f"{name} {formula}/{variant}"] = Job(random_curves_job, (formula, variant, cfg.embeddings,
                                                                              vocab, cfg.seed, texts, settings))
    return jobs


def _figures(cfg: ReproduceSettings, inputs: dict, emb, configs: dict, out: Path, tick) -> tuple[dict, dict]:
    """Every job on `cfg.threads` workers (figures 1–4, trainings, curve sets), then per data set of
    figures 5–6 the summary and the PNG in `out`. Returns (summaries of figures 1–4, of figures 5–6)."""
    jobs = {**_theory_jobs(cfg, out), **_jobs(cfg, inputs, configs)}
    done = run_jobs(jobs, cfg.threads, tick)
    theory = {key: done[f"figure {key}"] for key in THEORY_FIGURES if f"figure {key}" in done}
    res = {}
    for name, (texts, _, majority) in inputs.items():
        settings = _curve_settings(cfg, name)
        randoms = [done[f"{name} {f}/{v}"] for f in settings.formulas for v in fig56.RANDOM_VARIANTS]
        trained = [done[f"{name} train {spec.key}"] for spec, _ in configs[name]]
        curves = [c for c, _ in randoms] + [done[f"{name} {spec.key}"] for spec, _ in configs[name]]
        r = fig56.assemble(texts, emb, name, settings, cfg.seed, curves, randoms[-1][1] if randoms else None,
                           majority)
        s = {**fig56.summary(r), "settings": jsonable(vars(settings)),
             "n_accuracy": trained[0].training["accuracy_examples"] if trained else None,
             "runs": {v.spec.key: f"{MODELS}/{v.run_dir.name}" for v in trained}}
        fig = DATASET_FIGURE[name]
        fig56_plot.plot(r, out / FIGURE_FILES[fig], caption=_caption(cfg, s, emb),
                        title=f"Figure {fig}: energy per layer, {DATASET_NAMES[name]} {EVAL_SPLITS[name]} "
                              f"({len(texts)} samples)")
        res[name] = s
    return theory, res


# ----------------------------------------------------------------------------- run
def run_reproduction(cfg: ReproduceSettings) -> tuple[dict, dict]:
    """Run the selected figures and write every output into `cfg.out`; returns (results, timings) as written.

    The trainings and curve sets run on `cfg.threads` worker processes of one thread each (`paper.tasks`);
    the rest runs here on one thread."""
    check_output_folder("--out", cfg.out, "reproduce", _owned)
    with torch_threads(1), staged_output(cfg.out, "reproduce", cfg.to_dict(), owned=_owned) as out:
        return _run(cfg, out)


def _owned(name: str) -> bool:
    """Names this command writes (an earlier output made of them may be replaced)."""
    return name in {"config.json", "results.json", "timings.json", "report.md", "report.html", MODELS,
                    *FIGURE_FILES.values()}


def _n_stages(cfg: ReproduceSettings, configs: dict) -> int:
    n_theory = (1 in cfg.figures) + bool({2, 3} & set(cfg.figures)) + (4 in cfg.figures)
    return n_theory + sum(len(c) + fig56.n_stages(fig56.CurveSettings(), len(c)) for c in configs.values())


def _cpu_time() -> float:
    """CPU seconds of this process and of its finished worker processes."""
    import resource
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _run(cfg: ReproduceSettings, out: Path) -> tuple[dict, dict]:
    t0, cpu0, timings = time.perf_counter(), _cpu_time(), {}
    inputs, emb, files = _load_inputs(cfg)                        # fails fast on missing data
    configs = _train_configs(cfg, emb, out)                       # ... and on a bad training setting
    timings["load_data"] = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "config.json", cfg.to_dict())
    jobs = timings["jobs"] = {}
    with tqdm(total=_n_stages(cfg, configs), desc="reproduce", disable=not cfg.progress, file=sys.stderr) as bar:

        def tick(stage: str, wall: float, cpu: float) -> None:
            """A job finished after `wall` seconds in its worker, `cpu` of them on the CPU."""
            jobs[stage] = {"wall_s": wall, "cpu_s": cpu}
            bar.set_postfix_str(stage)
            bar.update(1)

        theory, curves = _figures(cfg, inputs, emb, configs, out, tick)
    for run in (Path(tcfg.run.out_dir) for pairs in configs.values() for _, tcfg in pairs):
        record_final_location(run, Path(cfg.out).resolve() / MODELS / run.name)   # not the staging folder
    timings["cpu_time_all_processes"] = _cpu_time() - cpu0
    timings["total"] = time.perf_counter() - t0
    require_finite(curves, "reproduce: energy curves")            # jsonable would write NaN as null
    results = jsonable({"mode": cfg.mode, "seed": cfg.seed, "threads": cfg.threads, "figures": theory,
                        "energy_curves": curves,
                        "settings": {k: v for k, v in cfg.to_dict().items() if k not in ("out", "progress")},
                        "embeddings": emb.describe() if emb is not None else None, "data_files": files})
    _write_outputs(out, results, timings, cfg)
    return results, timings


def _write_outputs(out: Path, results: dict, timings: dict, cfg: ReproduceSettings) -> None:
    """results.json, timings.json, report.md and report.html (the figures are already in `out`)."""
    write_json(out / "results.json", results, sort_keys=True)
    write_json(out / "timings.json", timings)
    atomic_write_text(out / "report.md", render_report(results, timings, cfg))
    atomic_write_text(out / "report.html", render_html(results, timings, cfg, out))
