"""The language model: cache = full forward, generation, save/load, `unfoldformer lm` end to end and its errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import unfoldformer.lm.train as lm_train
from conftest import close_tol, torchrun
from unfoldformer.cli import main
from unfoldformer.errors import ConfigError
from unfoldformer.lm import CharTokenizer, LanguageModel
from unfoldformer.lm.train import LMTrainConfig, build_model

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n" * 12)
TINY = ["--layers", "2", "--heads", "2", "--width", "16", "--context", "8", "--batch", "4", "--warmup", "2",
        "--eval-interval", "3"]


def _model(kind: str, context: int = 8) -> tuple[LanguageModel, CharTokenizer]:
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    cfg = LMTrainConfig(model=kind, layers=2, heads=2, width=16, context=context)
    return build_model(cfg, tok), tok


@pytest.mark.parametrize("kind", ["certified", "certified-untied", "standard"])
def test_cache_logits_equal_the_full_forward(kind):
    model, tok = _model(kind)
    model.eval()
    ids = torch.tensor([tok.encode(TEXT[:8]), tok.encode(TEXT[20:28])])   # (2, 8)
    with torch.no_grad():
        full, _ = model(ids)
        h, cache = model._prefill(model.inputs(ids[:, :3]))
        rows = [model._logits(h)]
        for t in range(3, 8):
            rows.append(model._logits(model._extend(cache, model.inputs(ids[:, t: t + 1], start=t))))
    # the same sums in another order: a few float32 units of the logits' scale per layer
    tol = 64 * torch.finfo(torch.float32).eps * (1 + float(full.abs().max())) * 2
    assert (torch.cat(rows, dim=1) - full).abs().max() <= tol


@pytest.mark.parametrize("kind", ["certified", "standard"])
def test_generate_crops_past_the_context_and_round_trips(kind, tmp_path):
    model, tok = _model(kind, context=6)
    prompt = torch.tensor([tok.encode("First")])
    g = torch.Generator().manual_seed(0)
    out = model.generate(prompt, 12, temperature=0.8, top_k=5, generator=g)
    assert out.shape == (1, 17) and bool((out[:, :5] == prompt).all())
    assert int(out.max()) < tok.vocab_size
    again = LanguageModel.from_pretrained(model.save_pretrained(tmp_path / "lm"))
    same = again.generate(prompt, 12, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(0))
    assert bool((same == out).all())
    greedy = model.generate(prompt, 3, top_k=1)                    # top-1: the argmax of the full forward
    with torch.no_grad():
        assert int(greedy[0, 5]) == int(model(prompt)[0][0, -1].argmax())


def test_tokenizer():
    tok = CharTokenizer.from_text("banana")
    assert tok.chars == "abn" and tok.decode(tok.encode("nab")) == "nab"
    with pytest.raises(Exception, match="outside the model's vocabulary"):
        tok.encode("bandana!")


def test_train_generate_evaluate_end_to_end(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["lm", "train", "--out", str(run), "--data", str(data), "--iters", "6", "--no-progress", *TINY]) == 0
    assert {p.name for p in run.iterdir()} >= {"config.json", "model.safetensors", "train.json", "state.pt",
                                               "metrics.csv"}
    assert len((run / "metrics.csv").read_text().splitlines()) == 3   # header + evaluations at steps 3 and 6
    capsys.readouterr()
    assert main(["lm", "generate", str(run), "--prompt", "First", "--tokens", "20", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("First") and len(text.rstrip("\n")) >= 25 - text.count("\n")
    assert main(["lm", "evaluate", str(run), "--energies", "--json"]) == 0
    assert '"token_descent_share": 1.0' in capsys.readouterr().out


def test_resume_after_a_kill_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    args = ["--data", str(data), "--iters", "6", "--no-progress", *TINY]
    assert main(["lm", "train", "--out", str(tmp_path / "whole"), *args]) == 0
    calls = {"n": 0}
    real = lm_train.batches

    def dying(*a, **k):                                             # killed during step 5 (after the step-3 save)
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(lm_train, "batches", dying)
    assert main(["lm", "train", "--out", str(tmp_path / "cut"), *args]) == 130
    monkeypatch.setattr(lm_train, "batches", real)
    assert main(["lm", "train", "--out", str(tmp_path / "cut"), "--resume", "--no-progress"]) == 0
    a = LanguageModel.from_pretrained(tmp_path / "whole").state_dict()
    b = LanguageModel.from_pretrained(tmp_path / "cut").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("argv,message", [
    (["train", "--out", "{tmp}/r", "--data", "{tmp}/missing.txt"], "no such file"),
    (["train", "--out", "{tmp}/r", "--data", "{tmp}/latin1.txt"], "not UTF-8"),
    (["train", "--out", "{tmp}/r", "--data", "{tmp}/short.txt"], "too few"),
    (["train", "--out", "{tmp}/r", "--width", "30", "--heads", "4"], "multiple of --heads"),
    (["train", "--out", "{tmp}/r", "--lr", "0"], "--lr must be > 0"),
    (["train", "--out", "{tmp}/r", "--iters", "0"], "--iters must be an integer >= 1"),
    (["train", "--out", "{tmp}/r", "--ffn-weight", "-1"], "--ffn-weight must be a finite number >= 0"),
    (["train", "--out", "{tmp}/r", "--ffn-weight", "nan"], "--ffn-weight must be a finite number >= 0"),
    (["train", "--out", "{tmp}/r", "--resume"], "no state.pt"),
    (["evaluate", "{tmp}"], "not a language-model run folder"),
    (["generate", "{tmp}/nothing"], "not a language-model run folder"),
    ([], "choose a subcommand"),
])
def test_bad_inputs_are_one_line_errors(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("UNFOLDFORMER_DATA", str(tmp_path))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait".encode("latin-1") * 50)
    (tmp_path / "short.txt").write_text("too short", encoding="utf-8")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if "--data" not in argv and "--resume" not in argv and argv and argv[0] == "train":
        (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
        argv += ["--data", str(tmp_path / "t.txt")]
    assert main(["lm", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_generate_refuses_unknown_characters_and_bad_sampling(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    run = tmp_path / "run"
    assert main(["lm", "train", "--out", str(run), "--data", str(data), "--iters", "1", "--no-progress", *TINY]) == 0
    for extra, message in ((["--prompt", "Zebra"], "outside the model's vocabulary"),
                           (["--temperature", "0"], "temperature must be > 0"),
                           (["--top-k", "0"], "--top-k must be")):
        capsys.readouterr()
        assert main(["lm", "generate", str(run), *extra]) == 2
        assert message in capsys.readouterr().err


def test_the_energy_weights_reach_the_certified_decoder():
    from unfoldformer.lm.train import LMTrainConfig, decoder_config
    cfg = decoder_config(LMTrainConfig(model="certified", anchor_weight=4.0, ffn_weight=3.0).check())
    assert (cfg.anchor_weight, cfg.ffn_weight, cfg.causal) == (4.0, 3.0, True)
    assert decoder_config(LMTrainConfig(model="certified").check()).ffn_weight == 1.0


def test_the_defaults_are_the_recommended_decoder_and_old_settings_keep_theirs():
    """`lm train --model certified` runs free keys, no length normalisation, relative biases and lr 3e-3;
    standard runs nanoGPT's lr 1e-3; no learned head basis (`--basis learned` adds one); settings saved before
    `relative_bias` or `basis` existed rebuild a decoder without biases and with a learned basis, as trained."""
    from unfoldformer.lm.train import DEFAULT_LR, decoder_config
    for kind in ("certified", "certified-untied"):
        cfg = LMTrainConfig(model=kind).check()
        assert DEFAULT_LR[kind] == 3e-3 and (cfg.lr, cfg.min_lr) == (3e-3, 3e-3 / 10)
        model_cfg = decoder_config(cfg)
        assert (model_cfg.keys, model_cfg.metric, model_cfg.attention_norm, model_cfg.relative_bias) == (
            "free", "free", "none", 64)
        assert not model_cfg.learn_basis and decoder_config(LMTrainConfig(model=kind, basis="learned").check()
                                                            ).learn_basis
    std = LMTrainConfig(model="standard").check()
    assert (std.lr, std.min_lr) == (1e-3, 1e-3 / 10)
    assert LMTrainConfig(model="certified", lr=5e-4).check().min_lr == 5e-4 / 10   # a given lr kept, floor lr/10
    old = dict(vars(LMTrainConfig(model="certified", keys="tied", attention_norm="length").check()))
    old.pop("relative_bias")                                       # a train.json written before the fields
    old.pop("basis")
    rebuilt = decoder_config(LMTrainConfig.from_dict(old))
    assert rebuilt.relative_bias == 0 and rebuilt.learn_basis
    now = LMTrainConfig.from_dict(vars(LMTrainConfig(model="certified").check()))
    assert now.relative_bias == 64 and now.basis == "none"
    with pytest.raises(ConfigError, match="--basis must be learned or none"):
        LMTrainConfig(basis="rotated").check()


def test_batch_must_split_evenly_over_torchrun_processes(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    with pytest.raises(Exception, match="--batch 3 must be a multiple of the 2 processes"):
        lm_train.train(LMTrainConfig(data=str(data), batch=3, iters=1), tmp_path / "run")
    assert not (tmp_path / "run").exists()                         # refused before anything is written


@pytest.mark.slow
def test_ddp_two_cpu_processes_train_on_the_global_batch(tmp_path):
    """torchrun, two gloo ranks, each on half of every batch: the logged loss at the first step (the initial
    weights, before any update) is the single process's on the whole batch up to float32 round-off (another
    summation order, other matrix shapes), and rank 0 writes a complete run that resumes."""
    data = tmp_path / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    args = ["--data", str(data), "--iters", "2", "--eval-interval", "1", "--no-progress", *TINY[:10]]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parent.parent / "src"))
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    for cmd in (torchrun("-m", "unfoldformer", "lm", "train", "--out", str(ddp), *args),
                [sys.executable, "-m", "unfoldformer", "lm", "train", "--out", str(single), *args]):
        result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    rows = [[line.split(",") for line in (run / "metrics.csv").read_text().splitlines()] for run in (ddp, single)]
    assert len(rows[0]) == len(rows[1]) == 3                       # header + steps 1 and 2
    assert [r[:2] for r in rows[0]] == [r[:2] for r in rows[1]]     # steps and learning rates
    first_ddp, first_single = float(rows[0][1][2]), float(rows[1][1][2])
    assert abs(first_ddp - first_single) <= close_tol(torch.float32, first_single)
    assert json.loads((ddp / "train.json").read_text()) == json.loads((single / "train.json").read_text())
    assert main(["lm", "train", "--out", str(ddp), "--resume", "--no-progress"]) == 0   # complete: nothing to do
