"""Figures 5–6 (energy curves, trained variants), the verdict report and the `reproduce` command (THEORY §7)."""
from __future__ import annotations

import base64
import json
import math
from html.parser import HTMLParser

import numpy as np
import pytest
import torch

from unfoldformer import ConfigError
from unfoldformer.cli import main
from unfoldformer.data import dataset_record, load_dataset, load_embeddings
from unfoldformer.data import files as data_files
from unfoldformer.paper import fig56_energy_curves as fig56
from unfoldformer.paper import fig56_plot
from unfoldformer.paper.report import report_blocks, verdict_rows
from unfoldformer.paper.report_render import to_html, to_markdown
from unfoldformer.paper.settings import FIGURE_FILES, ReproduceSettings, parse_figures
from unfoldformer.paper.tasks import Job, run_jobs
from unfoldformer.paper.trained import load_trained, recipes, train_config, train_variant
from unfoldformer.plots import box_stats, lowest_whisker

TRAINED_KEYS = {"paper/trained-as-released", "paper-as-released/trained-as-released", "paper/trained",
                "certified/trained"}


@pytest.fixture(scope="module")
def tiny(sst2_dir, tmp_path_factory):
    """Every variant on 12 synthetic dev sentences: random 16-d embeddings, the four recipes trained on
    48 synthetic sentences through `unfoldformer.train`."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("models")
    cfg = ReproduceSettings.create(quick=True, train_examples=48, trained_width=16, accuracy_samples=40,
                                   embeddings="random", data_dir=str(sst2_dir), threads=1)
    dev = load_dataset("sst2", "dev", sst2_dir)[:12]
    texts, labels = [e.text for e in dev], [e.label for e in dev]
    try:
        trained = [train_variant(spec, train_config(spec, "sst2", out / spec.name, embeddings="random",
                                                    embedding_dim=16, accuracy_examples=40, seed=0, threads=1,
                                                    data_dir=str(sst2_dir)))
                   for spec in recipes(cfg, "sst2")]
        emb = load_embeddings("random", vocab_texts=texts, dim=16, seed=0)
        stages = []
        result = fig56.compute(texts, emb, "sst2", fig56.CurveSettings(batch_tokens=20), 0, trained,
                               stages.append, labels=labels)
    finally:
        torch.set_num_threads(threads)
    result.texts, result.labels = texts, np.array(labels)         # kept for the tests below
    return result, stages, trained


def test_compute_shapes_and_finite(tiny):
    result, stages, trained = tiny
    assert len(stages) == fig56.n_stages(result.settings, len(trained)) == 8
    assert set(result.curves) == {f"{f}/{v}" for f in fig56.FORMULAS for v in fig56.RANDOM_VARIANTS} | TRAINED_KEYS
    for c in result.curves.values():
        depth = 6 if c.key == "certified/trained" else 12
        assert c.energies.shape == (12, depth + 1) and c.energies.dtype == np.float64
        assert c.attention_before.shape == c.ffn_after.shape == c.step_scales.shape == (12, depth)
        assert np.isfinite(c.energies).all() and np.isfinite(c.attention_after).all()
    assert result.curves["paper/trained"].d_model == 16 and result.curves["paper/trained-as-released"].d_model == 16
    released = result.curves["paper-as-released/trained-as-released"]
    assert released.accuracy is not None and released.accuracy_as_trained is not None
    assert all(0 <= result.curves[k].accuracy <= 1 for k in TRAINED_KEYS)


def test_trained_variants_are_run_folders_that_load(tiny):
    """Each trained variant is a run folder that `unfoldformer.load` opens; the recipes' settings are in it."""
    import unfoldformer as uf
    _, _, trained = tiny
    for variant in trained:
        cfg = json.loads((variant.run_dir / "config.json").read_text())
        assert cfg["model"]["kind"] == variant.spec.kind and cfg["optim"]["optimizer"] == variant.spec.optimizer
        assert cfg["optim"]["loss_reduction"] == variant.spec.loss_reduction
        assert cfg["model"]["input_map"] == variant.spec.input_map
        predictor = uf.load(variant.run_dir)
        assert predictor is not None
    sgd = [v for v in trained if v.spec.optimizer == "sgd"]
    assert sgd and all(v.spec.lr == 1e-2 and v.spec.batch_size == 16 and not v.spec.input_map for v in sgd)


def test_paper_attention_never_raises_energy(tiny):
    """Theorem A: the corrected attention step never raises its energy term (THEORY §3.1), trained or not."""
    result, _, _ = tiny
    tol = result.tolerance
    for key in ("paper/random", "paper/random-relu", "paper/trained-as-released", "paper/trained"):
        c = result.curves[key]
        assert (c.attention_after <= c.attention_before + tol * (1 + np.abs(c.attention_before))).all(), key
        assert fig56.curve_summary(c, tol)["share_attention_steps_lowering"] == 1.0


def test_certified_model_never_rises_without_the_safeguard(tiny):
    """The certified model is the joint layer (THEORY §3.7): trained, its curves never rise with the safeguard
    off, every step at full size."""
    result, _, trained = tiny
    c = result.curves["certified/trained"]
    s = fig56.curve_summary(c, result.tolerance)
    assert next(v for v in trained if v.spec.key == "certified/trained").spec.kind == "certified"
    assert not c.safeguard and s["share_monotone"] == 1.0 and s["rising_layer_steps"] == 0
    assert np.all(c.step_scales == 1)


def test_sample_accuracy_is_the_classifiers_own(tiny):
    """The head on the pooled outputs the curves store gives the classifier's own predictions."""
    result, _, trained = tiny
    variant = next(v for v in trained if v.spec.key == "paper/trained")
    loaded = load_trained(variant.spec, variant.run_dir)
    enc = loaded.embeddings.encode(result.texts)
    with torch.no_grad():
        logits, _ = loaded.model(enc.ids, enc.padding_mask)        # (N, 2)
    c = result.curves["paper/trained"]
    assert c.sample_accuracy == pytest.approx(float((logits.argmax(-1).numpy() == result.labels).mean()))
    pooled_logits = loaded.model.head(torch.as_tensor(c.pooled)).detach()
    assert torch.equal(logits.argmax(-1), pooled_logits.argmax(-1))


def test_cross_terms_add_up_to_the_layer_change(tiny):
    """Own change of each sub-step + what it does to the other term = E(Y⁽ᵗ⁾) − E(Y⁽ᵗ⁻¹⁾), in float64."""
    result, _, _ = tiny
    for c in result.curves.values():
        on_ffn, on_attention = fig56.cross_terms(c)
        total = (c.attention_after - c.attention_before) + on_ffn + (c.ffn_after - c.ffn_before) + on_attention
        change = np.diff(c.energies, axis=1)
        scale = np.abs(c.energies).max() + np.abs(c.attention_before).max() + np.abs(c.ffn_before).max()
        np.testing.assert_allclose(total, change, rtol=0, atol=64 * np.finfo(np.float64).eps * scale)


def test_change_share_is_the_layer_change_over_the_total_descent(tiny):
    """Each monotone curve's shares are ≤ 0 and sum to −1 (the whole descent, no step rising); shares are
    free of a per-sample scale: multiplying a sample's energies by 7 leaves them unchanged."""
    result, _, _ = tiny
    for c in result.curves.values():
        share = fig56.change_share(c, result.tolerance)                   # (N, T)
        monotone = (np.diff(c.energies, axis=1) <= 0).all(axis=1)
        # float64 round-off of differences of energies of size |E|, divided by D
        tol = 64 * np.finfo(np.float64).eps * np.abs(c.energies).max() / fig56.descent_scale(c, 1e-300).min()
        np.testing.assert_allclose(share[monotone].sum(axis=1), -1.0, rtol=0, atol=c.energies.shape[1] * tol)
        scaled = fig56.VariantCurves(**{**vars(c), "energies": c.energies * 7.0})
        np.testing.assert_allclose(fig56.change_share(scaled, 0.0), fig56.change_share(c, 0.0), rtol=0, atol=tol)


def test_summary_shares_and_per_token_energies(tiny):
    result, _, _ = tiny
    s = fig56.summary(result)
    for key, c in s["curves"].items():
        for name in ("share_monotone", "share_layer_steps_lowering", "share_attention_steps_lowering",
                     "share_ffn_steps_lowering", "share_backtracked_layer_steps"):
            assert 0.0 <= c[name] <= 1.0, (key, name)
        assert c["share_monotone"] <= c["share_layer_steps_lowering"]
        curve = result.curves[key]
        np.testing.assert_allclose(c["median_energy_per_token"],
                                   np.median(curve.energies / curve.lengths[:, None], axis=0), rtol=1e-12)
        assert c["rising_layer_steps"] == round((1 - c["share_layer_steps_lowering"]) * c["n_layer_steps"])
    json.dumps(s)  # serialisable


def test_shares_detect_rises():
    """A curve with one rise is not monotone; shares count it (the statistic can fail)."""
    E = np.array([[3.0, 2.0, 2.5, 1.0], [3.0, 2.0, 1.0, 0.0]])                  # (2, 4)
    zeros = np.zeros((2, 3))
    c = fig56.VariantCurves("paper/random", "x", E, zeros, zeros + 1.0, zeros, zeros, np.ones((2, 3)),
                            np.ones((2, 4)), np.array([2, 4]), 4)
    s = fig56.curve_summary(c, 1e-6)
    assert s["share_monotone"] == 0.5 and s["rising_layer_steps"] == 1
    assert s["share_layer_steps_lowering"] == pytest.approx(5 / 6)
    assert s["share_rising_per_layer"] == [0.0, 0.5, 0.0]
    assert s["share_attention_steps_lowering"] == 0.0 and s["share_ffn_steps_lowering"] == 1.0
    assert s["median_energy_per_token"][0] == pytest.approx(np.median([1.5, 0.75]))


def test_whisker_shift_makes_lowest_whisker_zero(tiny):
    result, _, _ = tiny
    rng = np.random.default_rng(0)
    samples = [c.energies for c in result.curves.values()] + [rng.standard_normal((50, 13)) * 5 + 100]
    samples[-1][3, 4] = -1e3                                       # a flier below the whisker
    for E in samples:
        shifted = E - lowest_whisker(E)
        lows = [box_stats(shifted[:, t])["whislo"] for t in range(E.shape[1])]
        # a shift by one of the values: exact up to the float64 round-off of the largest value
        assert min(lows) == pytest.approx(0.0, abs=64 * np.finfo(np.float64).eps * (1 + np.abs(E).max()))
    assert lowest_whisker(samples[-1]) > -1e3                     # the flier is not the whisker
    assert fig56.beyond_whiskers(samples[-1]) >= 1


def test_energy_figure_is_written(tiny, tmp_path):
    result, _, _ = tiny
    fig56_plot.plot(result, tmp_path / "f.png", title="t", caption="c")
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _square(x):
    return x * x


def _add(x, y):
    return x + y


def _fail(x):
    raise ConfigError(f"bad {x}")


@pytest.mark.parametrize("workers", [1, 2])
def test_jobs_run_after_their_dependencies_in_workers(workers):
    jobs = {"a": Job(_square, (3,)), "b": Job(_add, (1,), after=("a",)), "c": Job(_square, (4,))}
    finished = []
    results = run_jobs(jobs, workers, lambda key, wall, cpu: finished.append((key, wall >= 0, cpu >= 0)))
    assert results == {"a": 9, "b": 10, "c": 16}
    assert sorted(finished) == [("a", True, True), ("b", True, True), ("c", True, True)]
    assert [k for k, _, _ in finished].index("a") < [k for k, _, _ in finished].index("b")
    with pytest.raises(ConfigError, match="bad 5"):
        run_jobs({"x": Job(_fail, (5,))}, workers)
    with pytest.raises(ValueError, match="unknown jobs"):
        run_jobs({"x": Job(_square, (1,), after=("y",))}, workers)


def test_curves_do_not_depend_on_the_number_of_workers(tiny, sst2_dir):
    """A curve job gives bitwise the same energies in a worker process as in this one on one thread
    (as `run_reproduction` runs it), so results.json does not depend on --threads."""
    from unfoldformer.paper.tasks import random_curves_job, trained_curves_job
    from unfoldformer.utils import torch_threads
    result, _, trained = tiny
    variant = next(v for v in trained if v.spec.key == "paper/trained")
    settings = fig56.CurveSettings(batch_tokens=20)
    jobs = {"random": Job(random_curves_job, ("paper", "random-relu", "random", tuple(result.texts), 0,
                                              result.texts, settings)),
            "trained": Job(trained_curves_job, (result.texts, list(result.labels), settings, variant))}
    with torch_threads(1):
        inline = run_jobs(jobs, 1)
    spawned = run_jobs(jobs, 2)
    np.testing.assert_array_equal(inline["random"][0].energies, spawned["random"][0].energies)
    np.testing.assert_array_equal(inline["trained"].energies, spawned["trained"].energies)
    np.testing.assert_array_equal(inline["trained"].energies, result.curves["paper/trained"].energies)


# ----------------------------------------------------------------------------- verdicts and report
def _results(share_monotone=1.0, accuracy=0.85, released_monotone=0.0) -> dict:
    """A results.json as `reproduce` writes it, reduced to what the verdicts read."""
    def curve(share, acc=None, rising=0):
        return {"label": "x", "d_model": 64, "n_curves": 200, "n_layer_steps": 2400, "share_monotone": share,
                "share_layer_steps_lowering": 1 - rising / 2400, "rising_layer_steps": rising,
                "share_rising_per_layer": [0.0] * 12, "share_attention_steps_lowering": 1.0,
                "share_ffn_steps_lowering": 1.0, "accuracy": acc, "accuracy_as_trained": None}
    return {
        "figures": {
            "1": {"C": [0.7, 1.5], "area_rel_error": [5e-4, 2e-4]},
            "2-3": {"first_rise": 10, "n_rises": 94, "n_rises_after_g_step": 94, "half_steps": 200,
                    "final_log_ratio": 0.02},
            "4": {"kappas": [0.2, 0.4, 0.6, 0.8], "area_fraction": [0.9, 0.95, 0.97, 0.99]},
        },
        "energy_curves": {"sst2": {"dataset": "sst2", "majority_rate": 0.509, "curves": {
            "paper/random": curve(share_monotone, rising=0 if share_monotone == 1 else 3),
            "paper/trained": curve(1.0, accuracy),
            "paper/trained-as-released": curve(1.0, 0.509),
            "paper-as-released/random": curve(released_monotone, rising=1000),
        }}},
    }


def test_verdict_table_from_results():
    rows = verdict_rows(_results())
    assert len(rows) == 3 + 4                                      # one per figure (1, 2–3, 4) and per variant
    by_claim = {claim: (verdict, evidence) for claim, verdict, evidence in rows}
    assert all(v == "yes" for c, (v, _) in by_claim.items() if c.startswith("Figure 1") or c.startswith("Figure 4"))
    trained = next(v for c, v in by_claim.items() if "recipe that learns" in c)
    assert trained[0] == "yes" and "100.0 % of 200 curves" in trained[1] and "accuracy 85.0 %" in trained[1]
    collapsed = next(v for c, v in by_claim.items() if "trained as released (SGD), corrected" in c)
    assert collapsed[0] == "yes, but the model did not learn" and "majority class 50.9 %" in collapsed[1]
    released = next(v for c, v in by_claim.items() if "released formulas" in c)
    assert released[0] == "no (as released)" and "1,000 of 2,400 layer steps rise" in released[1]


def test_verdicts_follow_the_numbers():
    """The table can say no: one rising curve, a saw-tooth that is not there, a model that did not learn."""
    rows = {c: v for c, v, _ in verdict_rows(_results(share_monotone=0.995, accuracy=0.52))}
    assert rows[next(c for c in rows if "random init, no ReLU, corrected" in c)] == "no"
    assert rows[next(c for c in rows if "recipe that learns" in c)] == "yes, but the model did not learn"
    res = _results()
    res["figures"]["2-3"]["n_rises"] = 0
    assert next(v for c, v, _ in verdict_rows(res) if c.startswith("Figures 2–3")) == "no"


class _Page(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.links, self.tags = [], [], set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        self.links += [v for k, v in attrs.items() if k in ("href", "src") and v and not v.startswith("data:")]


def test_html_page_is_self_contained(tmp_path):
    """Every figure is embedded as a PNG data URI; no script, no link to anything outside the page."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(1, 1))
    fig.add_subplot().plot([0, 1])
    fig.savefig(tmp_path / "a.png")
    blocks = [("h", 1, "T"), ("p", "text with `code` and **bold** <b>&"), ("img", "a", "a.png"),
              ("table", ["claim", "reproduced?"], [["x", "yes"], ["y", "no (as released)"]])]
    page = to_html(blocks, "T", tmp_path)
    parser = _Page()
    parser.feed(page)
    assert len(parser.images) == 1 and parser.images[0].startswith("data:image/png;base64,")
    assert base64.b64decode(parser.images[0].split(",", 1)[1]) == (tmp_path / "a.png").read_bytes()
    assert not parser.links and "script" not in parser.tags
    assert "&lt;b&gt;&amp;" in page and "<code>code</code>" in page and "<strong>bold</strong>" in page
    assert 'class="yes"' in page and 'class="no"' in page
    md = to_markdown(blocks)
    assert "![a](a.png)" in md and "| x | yes |" in md


def test_report_opens_with_verdicts_and_lists_deviations_once():
    res = {**_results(), "embeddings": {"name": "minilm", "dim": 384}, "seed": 0,
           "settings": {"samples": 200, "imdb_max_length": 512}, "data_files": {}}
    for s in res["energy_curves"].values():
        s.update(n_samples=200, settings={"eval_max_length": None}, share_untruncated=1.0,
                 tokens_per_sample={"mean": 20.0, "max": 50}, embeddings="minilm", embedding_dim=384,
                 n_accuracy=872, tolerance=1e-6, inputs_pooled_spread_ratio=0.8, runs={})
        for c in s["curves"].values():
            c.update(median_change_share=[-1.0] * 12, share_backtracked_layer_steps=0.0,
                     pooled_spread_ratio=0.1, sample_accuracy=None)
    res["figures"]["1"].update(y_f=[0, 0])
    md = to_markdown(report_blocks(res, {"total": 1.0}, ReproduceSettings.create()))
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[:2] == ["## Verdicts", "## Deviations from the paper"]
    assert md.count("GloVe 840B 300-d") == 1 and "Why the as-released curves are 0 % monotone" in md


# ----------------------------------------------------------------------------- command
def test_parse_figures():
    assert parse_figures("1-6") == [1, 2, 3, 4, 5, 6]
    assert parse_figures("1,2,5") == [1, 2, 5]
    assert parse_figures("1-3,6") == [1, 2, 3, 6]
    for bad in ("7", "0-2", "x", ""):
        with pytest.raises(ConfigError):
            parse_figures(bad)


def test_threads_default_to_the_machines_cores():
    import os
    assert ReproduceSettings.create().threads == (os.cpu_count() or 1)
    assert ReproduceSettings.create(threads=1).threads == 1


def test_bad_arguments_exit_code_2(tmp_path, capsys):
    for bad in (["--figures", "7"], ["--samples", "0"], ["--datasets", "mnist"], ["--threads", "0"],
                ["--train-examples", "0"]):
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


TINY = ["--samples", "8", "--train-examples", "32", "--accuracy-samples", "32", "--no-progress", "--threads", "1"]


@pytest.mark.slow
def test_quick_reproduction_end_to_end(tmp_path, data_dir):
    out = tmp_path / "quick"
    assert main(["reproduce", "--quick", "--out", str(out), "--data-dir", str(data_dir), *TINY]) == 0
    for name in FIGURE_FILES.values():
        assert (out / name).stat().st_size > 1000, name
    report = (out / "report.md").read_text()
    assert report.splitlines()[4] == "## Verdicts"
    for fig in range(1, 7):
        assert f"![figure {fig}]({FIGURE_FILES[fig]})" in report
    assert "Figure 5: IMDB" in report and "Figure 6: SST-2" in report and "sha256" in report
    results = json.loads((out / "results.json").read_text())
    assert set(results["figures"]) == {"1", "2-3", "4"}
    records = [dataset_record(name, data_dir) for name in ("imdb", "sst2")]
    assert results["data_files"] == records                   # path, size and sha256 of what was read
    assert all(f"{r['bytes']:,}" in report and r["sha256"] in report for r in records)
    assert len(verdict_rows(results)) == 3 + 2 * 8
    certified_rows = [r for r in verdict_rows(results) if "certified model, no safeguard" in r[0]]
    assert len(certified_rows) == 2 and all(r[1].startswith("yes") for r in certified_rows), certified_rows
    for name in ("imdb", "sst2"):
        curves = results["energy_curves"][name]["curves"]
        assert len(curves) == 8
        for c in curves.values():
            assert all(math.isfinite(e) for e in c["mean_energy"] + c["median_energy"])
        certified = curves["certified/trained"]                  # the joint layer: no safeguard, never rises
        assert certified["safeguard"] is False and certified["share_monotone"] == 1.0
        for key, run in results["energy_curves"][name]["runs"].items():
            assert (out / run / "last.safetensors").is_file(), key
            recorded = json.loads((out / run / "config.json").read_text())["run"]["out_dir"]
            assert recorded == str((out / run).resolve()), (key, recorded)       # not the staging folder
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert json.loads((out / "config.json").read_text())["mode"] == "quick"
    assert "total" in json.loads((out / "timings.json").read_text())


@pytest.mark.slow
def test_quick_run_trained_model_beats_the_majority_class(tmp_path, data_dir):
    """The quick run's AdamW-trained paper model learns: accuracy above the majority class of its examples."""
    out = tmp_path / "quick"
    assert main(["reproduce", "--quick", "--figures", "6", "--samples", "8", "--out", str(out), "--data-dir",
                 str(data_dir), "--no-progress", "--threads", "1"]) == 0
    s = json.loads((out / "results.json").read_text())["energy_curves"]["sst2"]
    trained = s["curves"]["paper/trained"]
    assert trained["training"]["train_examples"] == 8000 and trained["d_model"] == 32
    assert trained["accuracy"] >= s["majority_rate"] + 0.1, (trained["accuracy"], s["majority_rate"])
    assert trained["share_monotone"] == 1.0


@pytest.mark.slow
def test_same_seed_gives_identical_results(tmp_path, data_dir):
    args = ["reproduce", "--figures", "5", "--datasets", "sst2", "--data-dir", str(data_dir), *TINY]
    texts = []
    for run in ("a", "b"):
        assert main([*args, "--out", str(tmp_path / run)]) == 0
        texts.append((tmp_path / run / "results.json").read_text())
    assert texts[0] == texts[1]
    assert list(json.loads(texts[0])["energy_curves"]) == ["sst2"]
