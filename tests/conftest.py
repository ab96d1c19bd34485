"""Shared fixtures and helpers (imported by test modules as `from conftest import ...`).

Tolerance policy (docs/theory.md, "Tolerances"): a comparison's tolerance follows from the dtype's
round-off and the scale of the quantity, never a bare constant on a float32-derived value:

- two computations of one quantity in `dtype`: |a − b| ≤ `close_tol(dtype, scale)` =
  64 · eps(dtype) · scale, scale = the magnitude of the quantity's inputs (64 units of round-off
  cover the accumulation of the few dozen operations behind each entry; ill-conditioned quantities
  multiply `scale` by their condition number, and say so);
- "does not rise": after ≤ before + descent_tolerance(dtype) · (1 + |before|), the library's own
  rule (`unfoldformer.descent`);
- exact constants (1e-12 …) only where every input and every operation is float64.

Hypothesis profiles: `ci` (the case counts the README states: ≥ 1,000 per theorem) when the CI
variable is set or HYPOTHESIS_PROFILE=ci; `dev` (a tenth, at least 25) otherwise, for quick local
runs. Tests take their counts from `examples(n)`.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import settings

from unfoldformer.config import ModelConfig
from unfoldformer.descent import descent_tolerance
from unfoldformer.rho import RHO_FAMILY

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

#: PyTorch's CPU normal sampler has an AVX2 path (AVX2 and AVX-512 kernels) and a portable one whose last bits
#: differ, so a `random` table drawn by torch.randn (runs before 0.3.0, `data.random_table="torch-randn"`) is
#: rebuilt bit for bit only on kernels of the class it was drawn with. The v0.2.0 fixtures were drawn with AVX2
#: kernels; `test_random_tables.py` checks the refusal elsewhere and that today's portable tables load anywhere.
FIXTURE_NORMALS = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
needs_the_fixtures_normals = pytest.mark.skipif(
    not FIXTURE_NORMALS, reason="the v0.2.0 fixtures' torch.randn table is rebuilt only on AVX2-class kernels "
    f"(here: {torch.backends.cpu.get_cpu_capability()}); test_random_tables checks the refusal")
D64 = torch.float64

# Tests never reach a model hub and never open a window.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

settings.register_profile("ci", max_examples=1000, deadline=None, derandomize=True)
settings.register_profile("dev", max_examples=100, deadline=None, derandomize=True)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
settings.load_profile(PROFILE)


def examples(n: int) -> settings:
    """Hypothesis settings with n cases under the `ci` profile, n/10 (at least 25) under `dev`."""
    return settings(max_examples=n if PROFILE == "ci" else max(25, n // 10))


# ----------------------------------------------------------------------------- process groups
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a process group's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args: str, nproc: int = 2) -> list[str]:
    """The command that runs `python -m torch.distributed.run` with `nproc` local processes, then `args`."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--nnodes", "1",
            "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *args]


# ----------------------------------------------------------------------------- tolerances
def close_tol(dtype: torch.dtype, scale: float = 1.0) -> float:
    """Absolute tolerance for two computations of one quantity of magnitude `scale` in `dtype`."""
    return 64 * torch.finfo(dtype).eps * max(float(scale), 1e-300)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, scale: float | None = None) -> None:
    """|actual − expected| ≤ close_tol(dtype, scale); scale defaults to max |expected| (at least 1)."""
    dtype = actual.dtype if actual.dtype.itemsize <= expected.dtype.itemsize else expected.dtype
    scale = max(1.0, float(expected.abs().max())) if scale is None else scale
    err = float((actual.to(D64) - expected.to(D64)).abs().max()) if actual.numel() else 0.0
    tol = close_tol(dtype, scale)
    assert err <= tol, f"max error {err:.3g} > {tol:.3g} ({dtype}, scale {scale:.3g})"


def rises(before: torch.Tensor, after: torch.Tensor, dtype: torch.dtype = D64) -> torch.Tensor:
    """Where `after` exceeds `before` beyond the round-off allowance of states stored in `dtype`."""
    return after > before + descent_tolerance(dtype) * (1.0 + before.abs())


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Build modules with parameters created (and initialised) in `dtype`."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


# ----------------------------------------------------------------------------- small models and inputs
def small_config(preset: str, **overrides) -> ModelConfig:
    """A tiny resolved config of `preset` (d = 8, depth 4) for fast model tests."""
    multi_head = preset.startswith("certified") or preset == "standard"
    base = dict(d_model=8, n_heads=2 if multi_head else 1, depth=4)
    if multi_head:
        base["ffn_hidden"] = 16
    return ModelConfig.preset(preset, **{**base, **overrides})


def random_inputs(seed: int = 0, B: int = 3, n: int = 7, d: int = 8, scale: float = 1.0, dtype=D64):
    """(x (B, n, d), padding_mask (B, n)) with the second sample padded from token 5 on."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, n, d, generator=g, dtype=dtype) * scale
    pad = torch.zeros(B, n, dtype=torch.bool)
    pad[1 % B, 5:] = True
    return x, pad


# ----------------------------------------------------------------------------- data
POS, NEG = "good great superb lovely fine".split(), "bad awful poor dull boring".split()
FILL = "the a movie film plot was is and it quite".split()


def synthetic_sentences(n: int, rng: random.Random) -> str:
    """An SST-2 style tsv (header sentence<TAB>label) of n sentences with sentiment words."""
    rows = ["sentence\tlabel"]
    for _ in range(n):
        label = rng.randint(0, 1)
        words = [rng.choice(FILL) for _ in range(rng.randint(2, 12))]
        for _ in range(rng.randint(1, 2)):
            words.insert(rng.randint(0, len(words)), rng.choice(POS if label else NEG))
        rows.append(" ".join(words) + " \t" + str(label))
    return "\n".join(rows) + "\n"


@pytest.fixture(scope="session")
def sst2_dir(tmp_path_factory) -> Path:
    """A synthetic SST-2 folder (GLUE tsv format): 400 train, 100 dev sentences with sentiment words."""
    root = tmp_path_factory.mktemp("data")
    (root / "SST-2").mkdir()
    rng = random.Random(0)
    (root / "SST-2" / "train.tsv").write_text(synthetic_sentences(400, rng))
    (root / "SST-2" / "dev.tsv").write_text(synthetic_sentences(100, rng))
    return root


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """Folder with the real data files: ``$UNFOLDFORMER_DATA`` or ``<repo>/../shared/data``
    (a relative path is taken relative to the repository root); skips if absent."""
    folder = Path(os.environ.get("UNFOLDFORMER_DATA", str(REPO_ROOT.parent / "shared" / "data")))
    if not folder.is_absolute():
        folder = REPO_ROOT / folder
    folder = folder.resolve()
    if not folder.is_dir():
        pytest.skip(f"data folder {folder} not found (set UNFOLDFORMER_DATA)")
    return folder


#: Settings of a tiny training run (random 16-d embeddings from the data, 2 layers).
TINY_TRAIN = ["--data.embeddings", "random", "--data.embedding_dim", "16", "--model.d_model", "16",
              "--model.n_heads", "2", "--model.depth", "2", "--optim.batch_size", "16", "--optim.lr", "3e-3",
              "--run.threads", "1", "--run.progress", "false"]
#: TINY_TRAIN with a narrower FFN and 48 training sentences for one epoch: the fault tests' finished run.
SMALL_TRAIN = [*TINY_TRAIN, "--model.ffn_hidden", "16", "--data.max_train_examples", "48", "--optim.epochs", "1"]


def train_small_run(sst2_dir, out):
    """A finished SMALL_TRAIN run (the default kind `certified`, random embeddings from the synthetic data) in `out`."""
    from unfoldformer.train import TrainConfig, train

    train(TrainConfig().with_overrides([*SMALL_TRAIN, "--data.data_dir", str(sst2_dir), "--run.out_dir", str(out)]))
    return out


@pytest.fixture
def registry():
    """Restores the ρ registry after a test that registers user ρ."""
    before = dict(RHO_FAMILY)
    yield
    RHO_FAMILY.clear()
    RHO_FAMILY.update(before)


def resign_model_folder(folder: Path, tensors: dict) -> None:
    """Rewrite a model folder's model.safetensors with `tensors`, its per-tensor checksums and the folder's
    manifest made to match, as a consistent forger (or a model saved after its weights went bad) would."""
    import json

    from safetensors import safe_open

    from unfoldformer.persist.folder import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE
    from unfoldformer.persist.manifest import MANIFEST_NAME, SAVED_COMMAND, folder_manifest
    from unfoldformer.persist.weights import write_weights_file
    with safe_open(str(folder / WEIGHTS_FILE), "pt") as handle:
        meta = handle.metadata()
    write_weights_file(folder / WEIGHTS_FILE, tensors, json.loads(meta["info"]))
    info = json.loads((folder / CONFIG_FILE).read_text())
    manifest = folder_manifest(folder, SAVED_COMMAND, None, {"class": info["class"], "init": info["init"]},
                               names=[WEIGHTS_FILE, CONFIG_FILE, CARD_FILE])
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))
