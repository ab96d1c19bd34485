"""The screening-budget check of the accuracy study (`benchmarks/accuracy_study.py --validate-budget A B`)."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import accuracy  # noqa: E402
import accuracy_study  # noqa: E402


def _write(folder: Path, name: str, value: float, examples: int | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    record = {"accuracy": value} if examples is None else {"accuracy": value, "eval_examples": examples}
    (folder / f"{name}.json").write_text(json.dumps(record))


@pytest.mark.parametrize("full_b, verdict", [(0.78, "agrees"), (0.82, "DISAGREES")])
def test_the_ranking_verdict_compares_both_budgets(tmp_path, monkeypatch, full_b, verdict):
    """A ranks above B at the screening budget (0.75 > 0.70); at the full budget the baseline is the accuracy
    benchmark's own cell (0.80, no study file of its own), and B at 0.78 keeps the ranking, at 0.82 flips it."""
    study, results = tmp_path / "study", tmp_path / "results"
    monkeypatch.setattr(accuracy, "RESULTS", results)
    _write(study, "imdb-certified-joint-v_baseline-seed0-reduced", 0.75)
    _write(study, "imdb-certified-joint-v_metric_free-seed0-reduced", 0.70)
    _write(results, "imdb-certified-joint-seed0", 0.80)
    _write(study, "imdb-certified-joint-v_metric_free-seed0", full_b)
    report = accuracy_study.budget_agreement("imdb", "certified-joint", ["baseline", "metric_free"], 0, study)
    assert f"ranking: the screening budget {verdict} with the full budget" in report
    assert "| baseline | 75.0 | 80.0 |" in report


def test_a_missing_cell_makes_the_ranking_incomplete(tmp_path, monkeypatch):
    monkeypatch.setattr(accuracy, "RESULTS", tmp_path / "results")
    _write(tmp_path / "study", "imdb-certified-joint-v_baseline-seed0-reduced", 0.75)
    report = accuracy_study.budget_agreement("imdb", "certified-joint", ["baseline", "metric_free"], 0,
                                             tmp_path / "study")
    assert "ranking: incomplete (missing cells)" in report and "| metric_free | – | – |" in report


def _cells(tmp_path, monkeypatch, screening, full, examples=(None, None)):
    study, results = tmp_path / "study", tmp_path / "results"
    monkeypatch.setattr(accuracy, "RESULTS", results)
    for name, (s, f) in zip(("baseline", "metric_free"), zip(screening, full)):
        _write(study, f"imdb-certified-joint-v_{name}-seed0-reduced", s, examples[0])
        _write(study, f"imdb-certified-joint-v_{name}-seed0", f, examples[1])
    return accuracy_study.budget_agreement("imdb", "certified-joint", ["baseline", "metric_free"], 0, study)


def test_a_tie_ranks_nothing(tmp_path, monkeypatch):
    report = _cells(tmp_path, monkeypatch, (0.794, 0.794), (0.842, 0.841))
    assert "ranking: cannot compare, the pair ties at the screening budget" in report
    assert "agrees" not in report and "DISAGREES" not in report


@pytest.mark.parametrize("m, resolved", [(500, False), (25_000, True)])
def test_differences_are_set_beside_two_standard_errors(tmp_path, monkeypatch, m, resolved):
    """0.80 vs 0.78 on m examples each: two standard errors 2√(0.8·0.2/m + 0.78·0.22/m) = 5.1 points at
    m = 500 (not resolved), 0.72 at m = 25,000 (resolved)."""
    report = _cells(tmp_path, monkeypatch, (0.80, 0.78), (0.80, 0.78), (m, m))
    two_se = 200 * math.sqrt((0.8 * 0.2 + 0.78 * 0.22) / m)
    line = f"- screening: baseline − metric_free = +2.0 points, two standard errors {two_se:.1f}"
    assert line + ("" if resolved else " (not resolved)") + "\n" in report
    assert "ranking: the screening budget agrees with the full budget" in report
    assert ("the ranking is not resolved" in report) is not resolved
