"""The ρ study (THEORY §4): its measures against direct definitions, the weights it reports against the step
they describe, the verdict rule, settings errors, and tiny end-to-end runs (quick and from result files)."""
import json
import math

import numpy as np
import pytest
import torch

from conftest import D64, assert_close, close_tol
from unfoldformer import steps as S
from unfoldformer.cli import main
from unfoldformer.errors import ConfigError
from unfoldformer.rho import custom_rho
from unfoldformer.rho_study import RhoStudySettings, run_rho_study
from unfoldformer.rho_study import measures as M
from unfoldformer.rho_study import settings as study_settings
from unfoldformer.rho_study.verdicts import MIN_EFFECT, outcome


# ----------------------------------------------------------------------------- measures
def test_diversity_equals_its_definitions():
    g = torch.Generator().manual_seed(0)
    Y = torch.randn(2, 6, 5, generator=g, dtype=D64)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    out = M.diversity(Y, pad)
    for b, n in ((0, 6), (1, 4)):
        y = Y[b, :n]
        cos = [float(torch.dot(y[i], y[j]) / (y[i].norm() * y[j].norm())) for i in range(n) for j in range(n) if i != j]
        s = np.linalg.svd(y.numpy(), compute_uv=False)
        p = s / s.sum()
        assert out["cosine"][b].item() == pytest.approx(np.mean(cos), abs=1e-12)
        # both sides are backward-stable SVDs: |δσ_i| ≤ c u σ_max (c ≈ 64 covers n, d ≤ 6), so |δp_i| ≤ 2c u and
        # |δ e^{H(p)}| ≤ e^H Σ_i |δp_i| (1 + |log p_i|), with |log p_i| ≤ log(1/(c u)) ≈ 33 for the smallest
        # p_i, which is ~c u for the zero singular value of the rank-4 sample: ≤ e^H · n · 2c u · 34
        p = np.where(p > 0, p, 1.0)
        erank = math.exp(-(p * np.log(p)).sum())
        tol = erank * n * 2 * close_tol(D64) * (1 + math.log(1 / close_tol(D64)))
        assert out["effective_rank"][b].item() == pytest.approx(erank, abs=tol)
        assert out["spread"][b].item() == pytest.approx(float((y - y.mean(0)).norm(dim=1).mean()), abs=1e-12)
    collapsed = M.diversity(torch.ones(1, 4, 3, dtype=D64), None)
    assert collapsed["cosine"].item() == pytest.approx(1.0) and collapsed["spread"].item() == 0.0
    assert collapsed["effective_rank"].item() == pytest.approx(1.0)


@pytest.mark.parametrize("rho", ["exp", "log", "lp"])
def test_reported_weights_are_the_anchored_step(rho):
    """Y⁺ of the anchored step equals (1 − α) c + α (ν d_i Σ_j P_ij c_j + x_i) / (ν d_i + 1) with the study's
    P and the anchor share 1 / (ν d_i + 1): the study reports the weights the step applies."""
    g = torch.Generator().manual_seed(1)
    H, dh, n = 2, 3, 7
    Y, X = torch.randn(2, n, H * dh, generator=g, dtype=D64), torch.randn(2, n, H * dh, generator=g, dtype=D64)
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[0, 5:] = True
    scales, lam, alpha = torch.tensor([0.7, 1.3], dtype=D64), 0.8, 0.9
    fac = S.isotropic_factors(scales, H * dh)
    P, _ = M.row_weights(Y, fac, rho, pad)                         # (B, H, n, n)
    stats = M.AttentionStats()
    nu = lam * scales**2
    M.attention_stats(stats, Y, fac, rho, pad, nu)
    share = torch.tensor(stats.anchor_share, dtype=D64)            # real rows, order (b, h, i)
    V, Xh = S.head_values(Y, H, None), S.head_values(X, H, None)
    avg = P @ V                                                    # (B, H, n, dh)
    rows = (~pad)[:, None, :].expand(2, H, n)
    keep = torch.zeros(2, H, n, 1, dtype=D64)
    keep[rows] = share[:, None]
    target = (1 - keep) * avg + keep * Xh
    ref = torch.where(~pad[..., None], Y + alpha * S.merge_heads(target - V, None), Y)
    out = S.anchored_attention_step(Y, X, scales, lam, rho, alpha, pad)
    assert_close(out, ref, scale=float(max(Y.abs().max(), X.abs().max())))


def test_kernel_statistics_of_known_kernels():
    g = torch.Generator().manual_seed(2)
    Y = torch.randn(3, 9, 4, generator=g, dtype=D64)
    fac = torch.eye(4, dtype=D64)[None]
    flat = M.AttentionStats()
    M.attention_stats(flat, Y, fac, "linear", None)               # uniform weights
    s = flat.summary()
    assert s["entropy"] == pytest.approx(1.0) and s["self_weight"] == pytest.approx(1 / 9)
    for k in (1, 5):
        assert s["nearest_share"][k] == pytest.approx(k / 9) == pytest.approx(s["nearest_uniform"][k])
    sharp = M.AttentionStats()
    M.attention_stats(sharp, 100 * Y, fac, "exp", None)            # far apart: each token attends to itself
    assert sharp.summary()["self_weight"] == pytest.approx(1.0, abs=1e-9)
    assert sharp.summary()["entropy"] == pytest.approx(0.0, abs=1e-6)
    valid = ~np.isnan(np.asarray(s["weight_by_z"]["relative_weight"], dtype=float))
    assert np.allclose(np.asarray(s["weight_by_z"]["relative_weight"], dtype=float)[valid], 1.0)


def test_dynamics_record_every_state_and_the_energy_each_step_descends():
    g = torch.Generator().manual_seed(3)
    X = torch.randn(2, 5, 4, generator=g, dtype=D64)
    dyn = M.Dynamics()
    M.run_dynamics(dyn, X, None, 3, lambda Y, t: 0.5 * Y, lambda Y, t: (Y**2).sum((1, 2)) + t)
    a = dyn.arrays()
    assert a["spread"].shape == (2, 4)
    spread0 = M.diversity(X, None)["spread"].numpy()
    assert np.allclose(a["spread"], spread0[:, None] * 0.5 ** np.arange(4))
    assert np.allclose(a["cosine"], a["cosine"][:, :1])            # scaling keeps directions
    expected = np.stack([(X**2).sum((1, 2)).numpy() * 0.25**t + min(t, 2) for t in range(4)], 1)
    assert np.allclose(a["energy"], expected)
    summary = dyn.summary((2,))
    assert summary["spread_retained"][2] == pytest.approx(0.25) and summary["at"][2]["spread_retained"] == 0.25


def test_verdict_rule_needs_an_interval_off_zero_and_a_minimum_effect():
    assert outcome(0.05, 0.02, 0.08) == "more distinct"
    assert outcome(-0.05, -0.08, -0.02) == "less distinct"
    assert outcome(0.05, -0.01, 0.1) == "no clear difference"
    assert outcome(MIN_EFFECT / 2, MIN_EFFECT / 4, MIN_EFFECT) == "no clear difference"
    mean, low, high = M.bootstrap_mean_ci(np.arange(100.0), seed=0)
    assert mean == pytest.approx(49.5) and low < mean < high and high - low < 15


# ----------------------------------------------------------------------------- settings
@pytest.mark.parametrize("kwargs, message", [
    (dict(rhos="log,lp"), "must include exp"),
    (dict(rhos="exp,cosine"), "unknown rho 'cosine'"),
    (dict(datasets="sst2,yelp"), "unknown dataset"),
    (dict(samples=2), "samples must be >= 4"),
])
def test_bad_settings_fail_in_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RhoStudySettings(**kwargs)


def test_cli_reports_bad_settings_as_one_line(capsys):
    assert main(["rho-study", "--rhos", "log", "--out", "unused"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["unfoldformer rho-study: error: --rhos must include exp: every comparison is against softmax "
                   "attention"]


def test_custom_rho_objects_are_registered_by_name(registry):
    sqrt = custom_rho(lambda z: torch.sqrt(z + 1.0), name="sqrt")
    assert RhoStudySettings(rhos=["exp", sqrt]).rhos == ["exp", "sqrt"]
    with pytest.raises(ConfigError, match="concave"):
        RhoStudySettings(rhos=["exp", custom_rho(lambda z: z**2, name="square")])


# ----------------------------------------------------------------------------- end to end
@pytest.fixture
def tiny(monkeypatch):
    """Tiny models in both modes (d = 16, depth 2, 16 tokens); quick models trained on 64 sentences."""
    for mode in ("quick", "full"):
        monkeypatch.setitem(study_settings.ARCHITECTURES, mode, {"d_model": 16, "n_heads": 2, "depth": 2,
                                                                  "ffn_hidden": 16})
        monkeypatch.setitem(study_settings.MODES[mode], "max_lengths", {"sst2": 16, "imdb": 16})
    monkeypatch.setitem(study_settings.QUICK_TRAINING, "train_examples", 64)
    monkeypatch.setitem(study_settings.QUICK_TRAINING, "eval_examples", 32)


def _numbers(path):
    data = json.loads(path.read_text())
    data.pop("wall_seconds"), data.pop("machine"), data["settings"].pop("out")
    return data


@pytest.mark.slow
def test_quick_study_writes_everything_repeatably_and_reads_result_files(tmp_path, sst2_dir, tiny, registry):
    """A user ρ from Python end to end: quick study (trains its models), the same numbers from the same seed,
    then the full study reading a trained model from an accuracy-benchmark result file."""
    sqrt = custom_rho(lambda z: torch.sqrt(z + 1.0), name="sqrt")
    first = tmp_path / "a"
    settings = dict(rhos=["exp", sqrt], quick=True, samples=6, data_dir=str(sst2_dir), threads=1)
    run_rho_study(RhoStudySettings(**settings, out=str(first)))
    for name in ("rho_study.md", "results.json", "kernel_sst2.png", "maps_sst2_random.png", "sweep_sst2.png",
                 "dynamics_sst2_model.png", "dynamics_sst2_attention.png"):
        assert (first / name).stat().st_size > 0, name
    results = json.loads((first / "results.json").read_text())
    sources = results["datasets"]["sst2"]["sources"]
    assert set(sources["trained-untied"]) == {"exp", "sqrt"}
    assert all("missing" not in r for by_rho in sources.values() for r in by_rho.values())
    comparisons = results["datasets"]["sst2"]["comparisons"]
    assert {c["rho"] for c in comparisons} == {"sqrt"}
    assert {c["source"] for c in comparisons} == {"random", "random-joint", "trained-tied", "trained-joint"}
    for label in ("random-joint", "trained-joint"):                # the joint layer descends by construction
        for rho in ("exp", "sqrt"):
            assert sources[label][rho]["dynamics"]["model"]["energy_monotone_share"] == 1.0, (label, rho)
    assert "Every model of every ρ is present" in (first / "rho_study.md").read_text()

    second = tmp_path / "b"                                        # models retrained from scratch, same seed
    run_rho_study(RhoStudySettings(**settings, out=str(second)))
    assert _numbers(first / "results.json") == _numbers(second / "results.json")

    results_dir = tmp_path / "results"                             # one accuracy-benchmark result file
    results_dir.mkdir()
    run = first / "models" / "sst2-certified-tied-rho_sqrt-seed0"
    (results_dir / "sst2-certified-tied-rho_sqrt-seed0.json").write_text(
        json.dumps({"run_dir": str(run), "accuracy": 0.625, "budget": "full"}))
    full = tmp_path / "full"
    run_rho_study(RhoStudySettings(rhos="exp,sqrt", samples=6, datasets="sst2", data_dir=str(sst2_dir),
                                   results_dir=str(results_dir), out=str(full)))
    res = json.loads((full / "results.json").read_text())
    src = res["datasets"]["sst2"]["sources"]
    assert "missing" not in src["trained-tied"]["sqrt"] and src["trained-tied"]["sqrt"]["accuracy"] == 0.625
    assert "not run yet" in src["trained-tied"]["exp"]["missing"]
    assert res["accuracy"]["sqrt"]["sst2"]["certified-alternating"]["accuracy"] == 0.625
    text = (full / "rho_study.md").read_text()
    assert "Missing rows" in text and "sst2 trained-untied ρ = sqrt: not run yet" in text


def test_speed_table_reads_both_speed_file_formats_and_takes_the_one_thread_times(tmp_path):
    from unfoldformer.rho_study.verdicts import speed_table
    (tmp_path / "speed").mkdir()
    cell = lambda t: {"time_s": t}                                              # noqa: E731
    one = {"anchored/forward": {"exp": cell(2.0), "log": cell(4.0)}}
    two = {"anchored/forward": {"exp": cell(1.0), "log": cell(8.0)}}
    files = {"old": {"setting": {"threads": 1}, "results": {"64": one}},
             "new": {"setting": {"threads": [1, 2]}, "results": {"64": {"1": one, "2": two}}}}
    for raw in files.values():
        (tmp_path / "speed" / "rho_speed.json").write_text(json.dumps(raw))
        step = speed_table(str(tmp_path))["attention_step"]
        assert step["log"]["anchored/forward"][64] == 0.5 and step["exp"]["anchored/forward"][64] == 1.0
