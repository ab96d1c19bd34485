"""Round 4, runs complete: a finished run whose final files were lost (a Ctrl-C while writing them) gets
them from a later `--resume`, which says "done" only when complete.json vouches for every file."""
from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file

from unfoldformer.runs import MANIFEST_NAME, verify_manifest
from unfoldformer.train import TrainConfig, train

TINY = ["--data.embeddings", "random", "--data.embedding_dim", "16", "--model.d_model", "16", "--model.n_heads", "2",
        "--model.depth", "1", "--model.ffn_hidden", "16", "--optim.batch_size", "8", "--run.threads", "1",
        "--run.progress", "false", "--run.tensorboard", "false", "--optim.epochs", "1"]
FINAL = ("last.safetensors", "summary.json", "loss.png", MANIFEST_NAME)


@pytest.mark.parametrize("lost", [FINAL, (MANIFEST_NAME,), ("summary.json", MANIFEST_NAME)],
                         ids=["all", "manifest", "summary"])
def test_resume_writes_lost_final_files(tmp_path, lost):
    rng = random.Random(0)
    lines = ["text,label"] + [f"{rng.choice(['good', 'bad', 'dull'])} film {i},{i % 2}" for i in range(16)]
    (tmp_path / "n.csv").write_text("\n".join(lines) + "\n")
    cfg = TrainConfig().with_overrides(["--data.train_file", str(tmp_path / "n.csv"), *TINY,
                                        "--run.out_dir", str(tmp_path / "run")])
    first = train(cfg)
    weights = load_file(tmp_path / "run" / "last.safetensors")
    for name in lost:
        (tmp_path / "run" / name).unlink()                    # killed while writing the final files
    again = train(cfg, resume=True)
    for name in FINAL:
        assert (tmp_path / "run" / name).is_file(), name
    assert verify_manifest(tmp_path / "run") is not None        # complete.json vouches for every file
    rewritten = load_file(tmp_path / "run" / "last.safetensors")
    assert rewritten.keys() == weights.keys() and all(torch.equal(rewritten[k], weights[k]) for k in weights)
    assert again["rank_weights_sha256"] == first["rank_weights_sha256"]
