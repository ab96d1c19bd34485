"""The questions of the ρ study answered from its measurements: paired comparisons of every ρ with exp,
the accuracy and speed read from the benchmark files.

The claim tested: "ρ(z) = log(z + 2) leads to attention that puts more emphasis on the differences
between tokens" — measured as whether tokens stay more distinct over repeated steps. The quantity
that would confirm it: the spread retained after t steps (mean distance of the tokens to their
sequence mean, relative to t = 0) is larger under log than under exp, paired per sentence on the same
inputs, by at least `MIN_EFFECT` = 0.01 (1 % of the initial spread), with the 95 % bootstrap interval
of the mean difference above 0; below 0 in the same way contradicts it; anything else is "no clear
difference". The mean pairwise cosine similarity and the effective rank are reported beside it.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np

from .measures import bootstrap_mean_ci
from .models import cell_name

__all__ = ["accuracy_table", "compare_to_exp", "outcome", "speed_table"]


MIN_EFFECT = 0.01


def outcome(mean: float, low: float, high: float) -> str:
    """'more distinct' / 'less distinct' than exp when the interval excludes 0 and |mean| ≥ MIN_EFFECT."""
    if low > 0 and mean >= MIN_EFFECT:
        return "more distinct"
    if high < 0 and mean <= -MIN_EFFECT:
        return "less distinct"
    return "no clear difference"


def _pair(a: dict, b: dict, t: int, seed: int) -> dict | None:
    """Paired differences ρ − exp at step t of one sequence (per-sentence dicts of `study._per_sentence`)."""
    if t not in a or t not in b:
        return None
    spread = np.asarray(a[t]["spread_retained"]) - np.asarray(b[t]["spread_retained"])
    cosine = np.asarray(b[t]["cosine"]) - np.asarray(a[t]["cosine"])         # > 0: ρ less aligned than exp
    erank = np.asarray(a[t]["effective_rank"]) - np.asarray(b[t]["effective_rank"])
    mean, low, high = bootstrap_mean_ci(spread, seed)
    return {"t": t, "spread_retained_diff": mean, "ci": [low, high], "outcome": outcome(mean, low, high),
            "share_of_sentences_more_distinct": float(np.nanmean(spread > 0)),
            "rho_spread_retained": float(np.nanmean(a[t]["spread_retained"])),
            "exp_spread_retained": float(np.nanmean(b[t]["spread_retained"])),
            "cosine_reduction": float(np.nanmean(cosine)), "effective_rank_gain": float(np.nanmean(erank))}


def compare_to_exp(sources: dict, rhos: list[str], times: tuple[int, ...], seed: int) -> list[dict]:
    """Every (source, sequence, t) comparison of each ρ ≠ exp with exp, with the random-init scale sweep."""
    rows = []
    for label, by_rho in sources.items():
        base = by_rho.get("exp", {})
        if "missing" in base:
            continue
        for rho in rhos:
            mine = by_rho.get(rho, {})
            if rho == "exp" or "missing" in mine:
                continue
            settings = [("model scale", mine["per_sentence"], base["per_sentence"])]
            for z in mine.get("sweep", {}):
                settings.append((f"median z = {z}", mine["sweep"][z]["per_sentence"],
                                 base["sweep"][z]["per_sentence"]))
            for scale, a, b in settings:
                for kind in a:
                    for t in times:
                        pair = _pair(a[kind], b[kind], t, seed)
                        if pair:
                            rows.append({"source": label, "rho": rho, "scale": scale, "sequence": kind, **pair})
    return rows


def accuracy_table(results_dir: str | None, rhos: list[str], datasets: list[str], seed: int) -> dict:
    """{rho: {dataset: {kind: {accuracy, budget} | None}}} from the accuracy benchmark's result files."""
    out: dict = {}
    for rho in rhos:
        for dataset in datasets:
            for kind in ("certified-alternating", "certified-alternating-untied"):
                cell = None
                for reduced in (False, True):
                    path = Path(results_dir or "") / f"{cell_name(dataset, kind, rho, seed, reduced)}.json"
                    if results_dir and path.is_file():
                        rec = json.loads(path.read_text())
                        cell = {"accuracy": rec["accuracy"], "budget": rec.get("budget", "full"), "file": path.name}
                        break
                out.setdefault(rho, {}).setdefault(dataset, {})[kind] = cell
    return out


def speed_table(results_dir: str | None) -> dict:
    """Training-step and attention-step speed of each ρ relative to exp, from the speed files (if present):
    `speed/train_speed_rho.json` (train_speed.py --rho) and `speed/rho_speed.json` (rho_speed.py; where it holds
    several thread counts, the fewest)."""
    out: dict = {"training": {}, "attention_step": {}}
    if not results_dir:
        return out
    train_file = Path(results_dir) / "speed" / "train_speed_rho.json"
    if train_file.is_file():
        raw = json.loads(train_file.read_text())["step_times_s"]
        for n, times in raw.items():
            for key, values in times.items():
                model, _, rho = key.partition(":")
                if rho and model in times:
                    out["training"].setdefault(rho, {}).setdefault(model, {})[int(n)] = (
                        statistics.median(times[model]) / statistics.median(values))
    step_file = Path(results_dir) / "speed" / "rho_speed.json"
    if step_file.is_file():
        raw = json.loads(step_file.read_text())
        threads = raw["setting"]["threads"]
        results = raw["results"]
        if not isinstance(threads, int):                      # {n: {threads: ...}}: the one-thread measurement
            one = str(min(threads))
            results = {n: by_threads[one] for n, by_threads in results.items()}
        for n, kinds in results.items():
            for kind, by_rho in kinds.items():
                for rho, cell in by_rho.items():
                    out["attention_step"].setdefault(rho, {}).setdefault(kind, {})[int(n)] = (
                        by_rho["exp"]["time_s"] / cell["time_s"])
    return out
