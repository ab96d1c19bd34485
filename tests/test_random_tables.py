"""`random` embedding tables: the same bits on every CPU (`data.random_table="portable"`, the default since 0.3.0),
and the tables of older runs (torch.randn) refused in one line, with the reason, where they cannot be rebuilt."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import FIXTURES, REPO_ROOT
from unfoldformer.data.embeddings import random_table
from unfoldformer.recipe import TrainConfig
from unfoldformer.train import train

#: Kernels with a normal sampler unlike this machine's (AVX2-class kernels share one path, `default` another).
OTHER_KERNELS = "default" if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") else "avx2"


def _in_kernels(kernels: str, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": kernels}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO_ROOT)


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()


def test_the_portable_table_is_its_formula():
    rows, dim, seed = 300, 24, 7
    table = random_table(rows, dim, seed)
    k = np.random.Generator(np.random.PCG64(seed)).integers(0, 2 ** 24, size=(rows, dim), dtype=np.int64)
    # written out per entry with Python integers and floats: ((2k + 1) / 2^24 - 1) * sqrt(3 / dim), then float32
    scale = (3.0 / dim) ** 0.5
    expected = np.array([[np.float32(((2 * int(v) + 1) / 16777216 - 1) * scale) for v in row] for row in k])
    assert table.dtype == torch.float32 and np.array_equal(table.numpy(), expected)
    bound = np.float32(scale)
    assert (table.abs() <= bound).all()
    # variance 1/dim: the sample variance of 7,200 uniform draws is within 5 standard errors
    # (Var(x²) = 9/(5 dim²) - 1/dim² = 4/(5 dim²) for x uniform on ±sqrt(3/dim))
    var, n = float(table.double().square().mean()), rows * dim
    assert abs(var - 1 / dim) <= 5 * (0.8 / dim ** 2 / n) ** 0.5
    assert not torch.equal(table, random_table(rows, dim, seed + 1))


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512", "DEFAULT"),
                    reason="needs x86 kernels to switch between")
def test_the_portable_table_has_the_same_bits_on_other_kernels_and_torch_randn_does_not():
    code = ("import hashlib, torch; from unfoldformer.data.embeddings import random_table; "
            "print(hashlib.sha256(random_table(500, 32, 3, '{g}').numpy().tobytes()).hexdigest())")
    there = _in_kernels(OTHER_KERNELS, code.format(g="portable"))
    assert there.returncode == 0, there.stderr
    assert there.stdout.strip() == _sha(random_table(500, 32, 3))
    legacy = _in_kernels(OTHER_KERNELS, code.format(g="torch-randn"))
    assert legacy.returncode == 0, legacy.stderr
    assert legacy.stdout.strip() != _sha(random_table(500, 32, 3, "torch-randn"))   # why the old tables move


def _tiny_run(tmp_path):
    data = tmp_path / "d.csv"
    rows = ["text,label"] + [f"{w} film {i},{'pos' if w == 'good' else 'neg'}" for i in range(40)
                             for w in ("good", "bad")]
    data.write_text("\n".join(rows) + "\n", encoding="utf-8")
    cfg = TrainConfig().with_overrides([
        "--data.train_file", str(data), "--data.embeddings", "random", "--data.embedding_dim", "16",
        "--model.d_model", "16", "--model.depth", "2", "--optim.epochs", "1", "--run.out_dir", str(tmp_path / "run"),
        "--run.progress", "false", "--run.plots", "false", "--run.tensorboard", "false", "--run.threads", "1"])
    train(cfg)
    return tmp_path / "run"


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512", "DEFAULT"),
                    reason="needs x86 kernels to switch between")
def test_a_run_with_a_random_table_predicts_the_same_on_other_kernels(tmp_path):
    run = _tiny_run(tmp_path)
    assert json.loads((run / "config.json").read_text())["data"]["random_table"] == "portable"
    code = (f"import json, unfoldformer as uf; p = uf.load({str(run)!r}); "
            "print(json.dumps([q.probabilities for q in p(['good film 3', 'bad film 9'])]))")
    import unfoldformer as uf
    here = [q.probabilities for q in uf.load(run)(["good film 3", "bad film 9"])]
    there = _in_kernels(OTHER_KERNELS, code)
    assert there.returncode == 0, there.stderr
    # the same weights and table; the encoder's float32 arithmetic may round differently on other kernels:
    # probabilities of a 2-layer width-16 model agree far inside 1e-4
    assert np.allclose(json.loads(there.stdout.strip().splitlines()[-1]), here, rtol=0, atol=1e-4)


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"),
                    reason="the v0.2.0 fixtures were drawn with AVX2-class kernels")
def test_an_old_torch_randn_table_is_refused_on_other_kernels_naming_the_reason():
    run, data = FIXTURES / "v0.2.0" / "run", FIXTURES / "v0.1.0" / "data"   # the texts its vocabulary comes from
    out = _in_kernels("default", f"import unfoldformer as uf; uf.load({str(run)!r}, data_dir={str(data)!r})")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "differs from the one the model was trained with" in last and "vector kernels" in last, last
