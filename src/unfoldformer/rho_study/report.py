"""The ρ study report: `run_rho_study(settings)` measures every model of every ρ on every dataset and
writes, into `settings.out`:

- `kernel_<dataset>.png` (weight against distance, row entropy, self weight, share on the nearest
  tokens), `maps_<dataset>_<source>.png` (attention maps of fixed sentences, tokens on the axes),
  `dynamics_<dataset>_<sequence>.png` (cosine similarity, effective rank, spread retained and energy
  over t = 0 … T), `sweep_<dataset>.png` (random init, first dataset: spread retained against the distance scale);
- `rho_study.md`: a verdict per question with the numbers behind it; `results.json`: every number
  (repeatable: one seed fixes the sentences, the initial weights and the quick models' training).

The folder is built whole or not at all (`runs.staged_output`, with `complete.json`); the output
location is checked before any work (never `--data-dir`, `--results` or `--runs-dir`, nor holding one of
them: `contracts.check_output_apart`), and a failed or killed run leaves an earlier study as it was.
"""
from __future__ import annotations

import time
from pathlib import Path

from ..data import load_embeddings
from ..runs import check_output_apart, check_output_location, staged_output
from ..utils import atomic_write_text, environment, torch_threads, write_json
from .figures import plot_dynamics, plot_kernel, plot_maps, plot_sweep
from .markdown import render_markdown
from .models import SOURCES, is_random, random_model, trained_model
from .settings import RhoStudySettings
from .study import DYNAMICS, TIMES, load_inputs, study_model
from .verdicts import accuracy_table, compare_to_exp, speed_table

__all__ = ["run_rho_study"]


def run_rho_study(settings: RhoStudySettings, progress=None) -> dict:
    """Run the study and write its files; returns the content of `results.json`.

    `progress(description)` is called once per (dataset, model source, ρ) after it is measured."""
    start = time.perf_counter()
    out = check_output_location("--out", settings.out)
    check_output_apart("--out", out, {"--data-dir": settings.data_dir, "--results": settings.results_dir,
                                      "--runs-dir": settings.runs_dir}, replaced=True)
    with staged_output(settings.out, "rho-study", settings.to_dict()) as out:
        return _run(settings, out, start, progress)


def _run(settings: RhoStudySettings, out: Path, start: float, progress) -> dict:
    embeddings = load_embeddings("minilm")
    results: dict = {"settings": settings.to_dict(), "datasets": {}}
    with torch_threads(settings.threads):
        for dataset in settings.datasets:
            inputs = load_inputs(dataset, settings, embeddings)
            sources: dict = {label: {} for label in SOURCES}
            for label in SOURCES:
                for rho in settings.rhos:
                    source = (random_model(rho, settings, dataset, embeddings, label) if is_random(label)
                              else trained_model(label, rho, settings, dataset, out / "models"))
                    sweep = label == "random" and dataset == settings.datasets[0]   # the scale sweep: once
                    sources[label][rho] = ({"missing": source.origin} if source.missing
                                           else study_model(source, inputs, settings, sweep))
                    if progress:
                        progress(f"{dataset} {label} {rho}")
            results["datasets"][dataset] = {"sentences": len(inputs.texts), "map_tokens": inputs.map_tokens,
                                            "sources": sources,
                                            "comparisons": compare_to_exp(sources, settings.rhos, TIMES, settings.seed)}
            _figures(out, dataset, sources, settings.rhos, inputs.map_tokens)
    results["accuracy"] = accuracy_table(settings.results_dir, settings.rhos, ["sst2", "imdb"], settings.seed)
    results["speed"] = speed_table(settings.results_dir)
    results["wall_seconds"] = time.perf_counter() - start
    results["machine"] = environment()
    write_json(out / "results.json", results, indent=1)
    atomic_write_text(out / "rho_study.md", render_markdown(results))
    return results


def _figures(out: Path, dataset: str, sources: dict, rhos: list[str], tokens: list[list[str]]) -> None:
    plot_kernel(sources, rhos, out / f"kernel_{dataset}.png")
    for label, by_rho in sources.items():
        if any("missing" not in r for r in by_rho.values()):
            plot_maps(sources, rhos, tokens, label, out / f"maps_{dataset}_{label}.png")
    for kind in DYNAMICS:
        plot_dynamics(sources, rhos, kind, out / f"dynamics_{dataset}_{kind}.png")
    if any("sweep" in r for r in sources["random"].values()):
        plot_sweep(sources, rhos, TIMES, out / f"sweep_{dataset}.png")
