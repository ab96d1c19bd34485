"""The screening-budget check of the accuracy study (`benchmarks/accuracy_study.py --validate-budget A B`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import accuracy  # noqa: E402
import accuracy_study  # noqa: E402


def _write(folder: Path, name: str, value: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"accuracy": value}))


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
