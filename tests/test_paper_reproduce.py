"""Figures 5–6 (energy curves) and the `reproduce` command (THEORY §7)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from unfoldformer import ConfigError
from unfoldformer.cli import main
from unfoldformer.data import TextExample, load_embeddings
from unfoldformer.data import files as data_files
from unfoldformer.paper import fig56_energy_curves as fig56
from unfoldformer.paper.settings import FIGURE_FILES, parse_figures
from unfoldformer.plots import box_stats, lowest_whisker

TEXTS = ["a good film , truly good", "bad , boring and far too long", "good acting", "the plot was bad",
         "an excellent and moving story about a family", "dull", "not good , not bad", "great fun for all"]


@pytest.fixture(scope="module")
def tiny_result():
    """Random 16-d embeddings, 8 eval texts, a few training steps."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    train = [TextExample(t, int("good" in t or "great" in t or "excellent" in t)) for t in TEXTS * 2]
    emb = load_embeddings("random", vocab_texts=TEXTS, dim=16, seed=0)
    settings = fig56.CurveSettings(train_batch_size=4, batch_tokens=20)
    stages = []
    try:
        result = fig56.compute(TEXTS, train, train[:8], emb, "tiny", settings, seed=0, progress=stages.append)
    finally:
        torch.set_num_threads(threads)
    return result, stages


def test_compute_shapes_and_finite(tiny_result):
    result, stages = tiny_result
    assert len(stages) == fig56.n_stages(result.settings) == 8
    assert set(result.curves) == {f"{f}/{v}" for f in fig56.FORMULAS for v in fig56.VARIANTS}
    for c in result.curves.values():
        assert c.energies.shape == (len(TEXTS), 13) and c.energies.dtype == np.float64
        assert c.attention_before.shape == c.ffn_after.shape == (len(TEXTS), 12)
        assert np.isfinite(c.energies).all() and np.isfinite(c.attention_after).all()
    trained = result.curves["paper-as-released/trained-relu"]
    assert trained.accuracy is not None and trained.accuracy_as_trained is not None
    assert result.curves["paper/trained-relu"].training["steps"] == 4


def test_paper_attention_never_raises_energy(tiny_result):
    """Theorem A: the corrected attention step never raises its energy term (THEORY §3.1)."""
    result, _ = tiny_result
    tol = result.tolerance
    for v in fig56.VARIANTS:
        c = result.curves[f"paper/{v}"]
        assert (c.attention_after <= c.attention_before + tol * (1 + np.abs(c.attention_before))).all()
        assert fig56.curve_summary(c, tol)["share_attention_steps_lowering"] == 1.0


def test_summary_shares_in_unit_interval(tiny_result):
    result, _ = tiny_result
    s = fig56.summary(result)
    for c in s["curves"].values():
        for key in ("share_monotone", "share_layer_steps_lowering", "share_attention_steps_lowering",
                    "share_ffn_steps_lowering"):
            assert 0.0 <= c[key] <= 1.0
        assert c["share_monotone"] <= c["share_layer_steps_lowering"]
        assert len(c["mean_energy"]) == len(c["median_energy"]) == 13
        assert all(math.isfinite(e) for e in c["mean_energy"])
    json.dumps(s)  # serialisable


def test_shares_detect_rises():
    """A curve with one rise is not monotone; shares count it (the statistic can fail)."""
    E = np.array([[3.0, 2.0, 2.5, 1.0], [3.0, 2.0, 1.0, 0.0]])                  # (2, 4)
    zeros = np.zeros((2, 3))
    c = fig56.VariantCurves("paper", "random", E, zeros, zeros + 1.0, zeros, zeros, np.ones((2, 4)))
    s = fig56.curve_summary(c, 1e-6)
    assert s["share_monotone"] == 0.5
    assert s["share_layer_steps_lowering"] == pytest.approx(5 / 6)
    assert s["share_attention_steps_lowering"] == 0.0 and s["share_ffn_steps_lowering"] == 1.0


def test_whisker_shift_makes_lowest_whisker_zero(tiny_result):
    result, _ = tiny_result
    rng = np.random.default_rng(0)
    samples = [c.energies for c in result.curves.values()] + [rng.standard_normal((50, 13)) * 5 + 100]
    samples[-1][3, 4] = -1e3                                       # a flier below the whisker
    for E in samples:
        shifted = E - lowest_whisker(E)
        lows = [box_stats(shifted[:, t])["whislo"] for t in range(E.shape[1])]
        # a shift by one of the values: exact up to the float64 round-off of the largest value
        assert min(lows) == pytest.approx(0.0, abs=64 * np.finfo(np.float64).eps * (1 + np.abs(E).max()))
    assert lowest_whisker(samples[-1]) > -1e3                     # the flier is not the whisker


def test_parse_figures():
    assert parse_figures("1-6") == [1, 2, 3, 4, 5, 6]
    assert parse_figures("1,2,5") == [1, 2, 5]
    assert parse_figures("1-3,6") == [1, 2, 3, 6]
    for bad in ("7", "0-2", "x", ""):
        with pytest.raises(ConfigError):
            parse_figures(bad)


def test_bad_arguments_exit_code_2(tmp_path, capsys):
    for bad in (["--figures", "7"], ["--samples", "0"], ["--datasets", "mnist"]):
        assert main(["reproduce", *bad, "--out", str(tmp_path / "out")]) == 2
        assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_data_exit_code_2(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("UNFOLDFORMER_DATA", raising=False)
    monkeypatch.setenv("UNFOLDFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(data_files.DATA_URLS, "SST-2.zip", (tmp_path / "nowhere.zip").as_uri())
    rc = main(["reproduce", "--figures", "6", "--out", str(tmp_path / "out"), "--data-dir", str(tmp_path),
               "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "SST-2.zip" in err and "not found" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


TINY = ["--samples", "8", "--train-examples", "32", "--accuracy-samples", "32", "--no-progress"]


@pytest.mark.slow
def test_quick_reproduction_end_to_end(tmp_path, data_dir):
    out = tmp_path / "quick"
    assert main(["reproduce", "--quick", "--out", str(out), "--data-dir", str(data_dir), *TINY]) == 0
    for name in FIGURE_FILES.values():
        assert (out / name).stat().st_size > 1000, name
    report = (out / "report.md").read_text()
    for fig in range(1, 7):
        assert f"![figure {fig}]({FIGURE_FILES[fig]})" in report
    assert "Figure 5: IMDB" in report and "Figure 6: SST-2" in report and "sha256" in report
    results = json.loads((out / "results.json").read_text())
    assert set(results["figures"]) == {"1", "2-3", "4"}
    for name in ("imdb", "sst2"):
        curves = results["energy_curves"][name]["curves"]
        assert len(curves) == 6
        for c in curves.values():
            assert all(math.isfinite(e) for e in c["mean_energy"] + c["median_energy"])
        assert all(c["share_attention_steps_lowering"] == 1.0
                   for k, c in curves.items() if k.startswith("paper/"))
    assert json.loads((out / "config.json").read_text())["mode"] == "quick"
    assert "total" in json.loads((out / "timings.json").read_text())


@pytest.mark.slow
def test_same_seed_gives_identical_results(tmp_path, data_dir):
    args = ["reproduce", "--figures", "5", "--datasets", "sst2", "--data-dir", str(data_dir), *TINY]
    texts = []
    for run in ("a", "b"):
        assert main([*args, "--out", str(tmp_path / run)]) == 0
        texts.append((tmp_path / run / "results.json").read_text())
    assert texts[0] == texts[1]
    assert list(json.loads(texts[0])["energy_curves"]) == ["sst2"]
