"""Training, evaluation, checkpoints, resume and DDP (tiny shapes, synthetic SST-2-format data)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import TINY_TRAIN as TINY
from conftest import assert_close, close_tol, free_port, torchrun
from unfoldformer import cli
from unfoldformer.data.batching import BucketBatchSampler, TokenizedDataset, eval_batches, shard
from unfoldformer.train import KINDS, CheckpointError, ConfigError, TrainConfig, evaluate_checkpoint, train
from unfoldformer.train.build import build_classifier, lr_factor
from unfoldformer.train.checkpoint import load_train_state, load_weights
from unfoldformer.train.distributed import distributed_run

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)      # the machine is shared; one thread is fastest for tiny shapes


def tiny_config(data_dir: Path, out_dir: Path, *extra: str) -> TrainConfig:
    cfg = TrainConfig().with_overrides(TINY + ["--data.data_dir", str(data_dir), "--run.out_dir", str(out_dir),
                                               *extra])
    if cfg.model.kind == "paper-as-released":
        return cfg.replace(model__n_heads=1)                       # one head, no hidden width
    return cfg if cfg.model.kind in ("paper", "crate") else cfg.replace(model__ffn_hidden=32)   # no hidden width


# ----------------------------------------------------------------------------- config
def test_config_round_trip_json_and_yaml(tmp_path):
    cfg = TrainConfig().with_overrides(["--model.kind", "paper", "--model.depth", "12", "--optim.lr=3e-4",
                                        "--data.max_length", "null", "--run.eval_every", "100",
                                        "--run.progress", "false", "--model.rho", "log"])
    assert (cfg.model.depth, cfg.model.rho, cfg.model.d_model) == (12, "log", None)
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.data.max_length is None and cfg.run.eval_every == 100 and cfg.run.progress is False
    for name in ("c.json", "c.yaml"):
        cfg.save(tmp_path / name, extra={"note": "ignored on load"})
        assert TrainConfig.load(tmp_path / name).to_dict() == cfg.to_dict()
    assert cfg.model_config().depth == 12 and cfg.model_config().d_model == 300   # paper preset + override


def test_yaml_file_values_are_coerced(tmp_path):
    (tmp_path / "c.yaml").write_text("model:\n  kind: standard\n  depth: 3\noptim:\n  lr: 3e-4\n  epochs: 2\n")
    cfg = TrainConfig.load(tmp_path / "c.yaml")
    assert cfg.optim.lr == 3e-4 and cfg.model_config().depth == 3 and cfg.optim.epochs == 2


@pytest.mark.parametrize("args, message", [
    (["--model.kind", "transformer"], "unknown model.kind 'transformer'"),
    (["--optim.lr", "-1e-3"], "optim.lr must be a finite number > 0"),
    (["--model.depth", "0"], "depth must be >= 1"),
    (["--optim.epochs", "0"], "optim.epochs must be >= 1"),
    (["--model.alpha_attention", "1.5"], "outside the certified range"),
    (["--model.kind", "standard", "--model.rho", "log"], "model.rho does not apply to attention 'standard'"),
    (["--data.eval_split", "test"], "not a labelled split of sst2"),
    (["--run.eval_examples", "0"], "run.eval_examples must be >= 1"),
    (["--data.embeddings", "glove:/nonexistent/vectors.txt"], "word-vector file"),
])
def test_bad_configs_fail_before_training(sst2_dir, tmp_path, args, message):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=message):
        train(tiny_config(sst2_dir, out, *args))
    assert not out.exists()


def test_unknown_keys_and_bad_values():
    with pytest.raises(ConfigError, match="optim.learning_rate: Key 'learning_rate' not in 'OptimSection'"):
        TrainConfig().with_overrides(["--optim.learning_rate", "1"])
    with pytest.raises(ConfigError, match="optim.epochs: Value 'many'.*could not be converted to Integer"):
        TrainConfig().with_overrides(["--optim.epochs", "many"])
    with pytest.raises(ConfigError, match="model.depth: Value '2.5'"):
        TrainConfig().with_overrides(["--model.depth", "2.5"])
    with pytest.raises(ConfigError, match="set by model.kind"):
        TrainConfig().with_overrides(["--model.tied", "false"]).validate(check_data=False)
    with pytest.raises(ConfigError, match="settings look like --optim.lr"):
        TrainConfig().with_overrides(["optim.lr", "1"])


def test_missing_data_fails_up_front(tmp_path, monkeypatch):
    monkeypatch.delenv("UNFOLDFORMER_DATA", raising=False)
    monkeypatch.setenv("UNFOLDFORMER_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config(tmp_path / "empty", tmp_path / "run", "--data.dataset", "imdb")
    with pytest.raises(ConfigError, match="data for data.dataset='imdb' is missing"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_cli_reports_config_errors(capsys, sst2_dir, tmp_path):
    code = cli.main(["train", "--model.kind", "nope", "--run.out_dir", str(tmp_path / "r")])
    assert code == 2 and "unknown model.kind 'nope'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- batching and schedule
def test_bucket_sampler_is_seeded_complete_and_resumable():
    lengths = np.random.default_rng(0).integers(1, 60, size=203)
    s = BucketBatchSampler(lengths, batch_size=8, seed=3, chunk_batches=5)
    first = s.batches(0)
    assert sorted(i for b in first for i in b) == list(range(203)) and len(first) == len(s)
    assert first == BucketBatchSampler(lengths, 8, 3, 5).batches(0) and first != s.batches(1)
    chunk_spread = np.mean([np.ptp(lengths[b]) for b in first])
    assert chunk_spread < np.ptp(lengths) / 2                     # bucketing keeps lengths together
    it = iter(s)
    taken = [next(it) for _ in range(4)]
    resumed = BucketBatchSampler(lengths, 8, 3, 5)
    resumed.load_state_dict(s.state_dict())
    assert taken + list(resumed) == first
    with pytest.raises(ValueError, match="seed"):
        BucketBatchSampler(lengths, 8, 4, 5).load_state_dict(s.state_dict())
    dropped = BucketBatchSampler(np.ones(17), 8, 0, 50, drop_smaller_than=2)
    assert len(dropped) == len(dropped.batches(0)) == 2
    assert shard([0, 1, 2, 3, 4], 1, 2) == [1, 3]


def test_collate_and_eval_batches():
    ds = TokenizedDataset(np.arange(1, 10, dtype=np.int32), np.array([0, 2, 2, 9]), np.array([0, 1, 1]))
    ids, mask, labels = ds.collate([0, 1, 2], max_length=4, pad_id=0)
    assert ids.tolist() == [[1, 2, 0, 0], [0, 0, 0, 0], [3, 4, 5, 6]]
    assert mask.tolist() == [[False, False, True, True], [False, True, True, True], [False] * 4]
    assert labels.tolist() == [0, 1, 1]
    batches = eval_batches(np.array([100, 3, 50, 7]), batch_size=3, max_tokens_sq=5000)
    assert batches == [[0], [2, 3], [1]]          # 5000 // 50² = 2 examples of length 50


def test_lr_schedule():
    f = [lr_factor(s, 4, 20, 0.1) for s in range(21)]
    assert f[:4] == [0.25, 0.5, 0.75, 1.0] and f[4] == 1.0
    assert all(a >= b for a, b in zip(f[4:], f[5:])) and f[20] == pytest.approx(0.1)


# ----------------------------------------------------------------------------- models
@pytest.mark.parametrize("kind", KINDS)
def test_a_few_steps_lower_the_loss(kind, sst2_dir, tmp_path):
    cfg = tiny_config(sst2_dir, tmp_path, "--model.kind", kind)
    torch.manual_seed(0)
    table = torch.randn(30, 16) / 4
    emb = type("E", (), {"table": table, "pad_id": 0})()
    model = build_classifier(cfg, emb)
    assert model.project.weight.shape == (16, 16) and not model.embedding.weight.requires_grad
    ids = torch.randint(1, 30, (16, 10))
    mask = torch.zeros(16, 10, dtype=torch.bool)
    mask[::2, 6:] = True
    labels = (ids[:, :6] < 15).sum(dim=1).gt(3).long()             # learnable from the unmasked tokens
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(40):
        loss = F.cross_entropy(model(ids, mask)[0], labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


# ----------------------------------------------------------------------------- runs
@pytest.fixture(scope="module")
def trained_run(sst2_dir, tmp_path_factory):
    # the alternating layer: the tiny recipe (d = 16, 2 epochs) and its ≥ 0.7 accuracy bar were set on it;
    # the default joint layer is trained by test_readme / test_inference
    out = tmp_path_factory.mktemp("run") / "certified"
    cfg = tiny_config(sst2_dir, out, "--optim.epochs", "2", "--run.checkpoint_every", "10",
                      "--model.kind", "certified-alternating")
    return cfg, train(cfg)


def test_run_writes_outputs_and_learns(trained_run):
    cfg, summary = trained_run
    out = Path(cfg.run.out_dir)
    for name in ("config.json", "checkpoint.pt", "best.safetensors", "best.json", "last.safetensors",
                 "metrics.jsonl", "metrics.csv", "summary.json"):
        assert (out / name).is_file(), name
    saved = json.loads((out / "config.json").read_text())
    assert saved["resolved"]["model"]["tied"] is True and saved["resolved"]["train_examples"] == 400
    # n_classes set from the data, final_norm the kind's default written out
    expected = cfg.replace(model__n_classes=2, model__final_norm="pooled")
    assert TrainConfig.from_dict(saved).to_dict() == expected.to_dict()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    table = (out / "metrics.csv").read_text().splitlines()
    assert [r["step"] for r in rows] == [25, 50]
    assert [line.split(",")[:2] for line in table if line.startswith("eval")] == [["eval", "25"], ["eval", "50"]]
    assert sum(line.startswith("step,") for line in table) == 5                         # run.log_every 10
    assert summary["best"]["eval_accuracy"] >= 0.7 and "energy_monotone_share" not in rows[-1]   # energies: evaluate
    assert not list(out.glob(".*.tmp"))                            # no temporary files left behind


def test_evaluate_reproduces_saved_accuracy(trained_run, capsys):
    cfg, summary = trained_run
    out = Path(cfg.run.out_dir)
    best = json.loads((out / "best.json").read_text())["metrics"]
    res = evaluate_checkpoint(out / "best.safetensors")
    assert res["accuracy"] == best["eval_accuracy"] and res["loss"] == pytest.approx(best["eval_loss"], rel=1e-6)
    e = res["energy"]
    assert 0.0 <= e["monotone_share"] <= 1.0 and len(e["mean_curve"]) == 3   # alternating: a measurement unaided
    guarded = evaluate_checkpoint(out / "best.safetensors", safeguard=True)["energy"]   # THEORY §3.5: certified
    assert guarded["monotone_share"] == 1.0 and guarded["layer_descent_share"] == 1.0
    assert cli.main(["evaluate", str(out), "--no-energies"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["energy"] is None and printed["safeguard"] is False


def test_in_training_eval_subset_matches_evaluate(sst2_dir, tmp_path):
    """`run.eval_examples` evaluates during training on the same fixed subset that
    `evaluate_checkpoint(max_examples=...)` uses, so the two accuracies agree exactly."""
    cfg = tiny_config(sst2_dir, tmp_path / "sub", "--data.max_train_examples", "64", "--run.eval_examples", "30")
    summary = train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "sub" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["eval_n"] == 30 for r in rows)
    res = evaluate_checkpoint(tmp_path / "sub" / "last.safetensors", max_examples=30, energies=False)
    assert res["n"] == 30 and res["accuracy"] == summary["final"]["eval_accuracy"]
    full = evaluate_checkpoint(tmp_path / "sub" / "last.safetensors", energies=False)
    assert full["n"] == 100


def test_standard_model_has_no_energy_stats(sst2_dir, tmp_path):
    cfg = tiny_config(sst2_dir, tmp_path / "std", "--model.kind", "standard", "--data.max_train_examples", "64")
    train(cfg)
    res = evaluate_checkpoint(tmp_path / "std")
    assert res["energy"] is None and res["kind"] == "standard" and res["n"] == 100


def test_existing_run_is_not_overwritten(trained_run):
    cfg, _ = trained_run
    with pytest.raises(ConfigError, match="already holds a run"):
        train(cfg)
    assert train(cfg, resume=True)["steps"] == 50                 # finished: nothing to do


def test_truncated_and_foreign_checkpoints_give_clear_errors(trained_run, tmp_path):
    cfg, _ = trained_run
    out = Path(cfg.run.out_dir)
    bad = tmp_path / "checkpoint.pt"
    bad.write_bytes((out / "checkpoint.pt").read_bytes()[:5000])
    with pytest.raises(CheckpointError, match=f"{bad}: cannot read checkpoint"):
        load_train_state(bad)
    torch.save({"weights": torch.zeros(2)}, bad)
    with pytest.raises(CheckpointError, match="not an unfoldformer training checkpoint"):
        load_train_state(bad)
    weights = tmp_path / "best.safetensors"
    weights.write_bytes((out / "best.safetensors").read_bytes()[:300])
    with pytest.raises(CheckpointError, match=f"{weights}: not a readable safetensors file"):
        load_weights(weights)
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes((out / "checkpoint.pt").read_bytes()[:5000])
    resumed = cfg.replace(run__out_dir=str(run))
    with pytest.raises(CheckpointError, match="checkpoint.pt: cannot read checkpoint"):
        train(resumed, resume=True)


def _python_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def test_resume_after_sigkill_is_bitwise_identical(sst2_dir, tmp_path):
    args = ["--optim.epochs", "2", "--optim.batch_size", "8", "--run.checkpoint_every", "2",
            "--run.eval_every", "20"]
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "unfoldformer", "train", *TINY, "--data.data_dir", str(sst2_dir),
           "--model.ffn_hidden", "32", *args]
    proc = subprocess.Popen(cmd + ["--run.out_dir", str(killed)], env=_python_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while not (killed / "checkpoint.pt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()
    step = load_train_state(killed / "checkpoint.pt")["progress"]["step"]
    assert 2 <= step < 100 and not (killed / "summary.json").exists()
    resumed = subprocess.run([sys.executable, "-m", "unfoldformer", "train", "--run.out_dir", str(killed),
                              "--resume"], env=_python_env(), capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"at step {step}" in resumed.stderr

    straight = tiny_config(sst2_dir, tmp_path / "straight", *args, "--model.ffn_hidden", "32")
    train(straight)
    a, _, _ = load_weights(killed / "last.safetensors")
    b, _, _ = load_weights(tmp_path / "straight" / "last.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    strip = lambda p: [{k: v for k, v in json.loads(line).items() if "time" not in k and "per_s" not in k
                        and k != "run_id"} for line in p.read_text().splitlines()]
    assert strip(killed / "metrics.jsonl") == strip(tmp_path / "straight" / "metrics.jsonl")
    # metrics.csv is cut back to the checkpoint on resume: its per-step rows (loss, lr, gradient norm, energy
    # statistics: no times) are those of the straight run, each step once
    steps = lambda p: [line for line in (p / "metrics.csv").read_text().splitlines() if line.startswith("step,")]  # noqa: E731
    assert steps(killed) == steps(tmp_path / "straight") and len(steps(killed)) == 10      # 100 steps, log_every 10
    # the resumed run is the same run: one run id in every row, in config.json and in the weights
    run_ids = {json.loads(line)["run_id"] for line in (killed / "metrics.jsonl").read_text().splitlines()}
    saved = json.loads((killed / "config.json").read_text())["resolved"]["run_id"]
    assert run_ids == {saved} == {load_weights(killed / "last.safetensors")[2]["run_id"]}


@pytest.mark.parametrize("fails", [False, True])
def test_distributed_run_waits_for_every_rank_then_destroys_the_group(fails, monkeypatch):
    """A clean exit: barrier (rank 0 has written its files), then the group destroyed; an exception: the group
    destroyed without a barrier (another rank may never reach it) and the exception raised. A one-process gloo
    group stands in for torchrun's."""
    import torch.distributed as dist
    calls = []
    for name in ("barrier", "destroy_process_group"):
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, _real=real, _name=name, **k: (calls.append(_name), _real(*a, **k)))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="rank failed") if fails else nullcontext():
            with distributed_run("cpu") as info:
                assert info.rank == 0 and dist.is_initialized()
                if fails:
                    raise RuntimeError("rank failed")
    finally:
        if dist.is_initialized():          # the test's own clean-up where teardown did not happen
            dist.destroy_process_group()
    assert calls == (["destroy_process_group"] if fails else ["barrier", "destroy_process_group"])
    assert not dist.is_initialized()


@pytest.mark.slow
def test_ddp_two_cpu_processes_match_single_process(sst2_dir, tmp_path):
    args = ["--data.max_train_examples", "96", "--data.max_eval_examples", "40", "--run.checkpoint_every", "0",
            "--optim.epochs", "1"]
    ddp_out = tmp_path / "ddp"
    cmd = torchrun("-m", "unfoldformer", "train", *TINY, "--data.data_dir", str(sst2_dir), "--model.ffn_hidden", "32",
                   *args, "--run.out_dir", str(ddp_out))
    result = subprocess.run(cmd, env=_python_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((ddp_out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["ranks_identical"] and len(summary["rank_weights_sha256"]) == 2

    single_cfg = tiny_config(sst2_dir, tmp_path / "single", *args)
    single = train(single_cfg)
    assert single["steps"] == summary["steps"] == 6
    assert single["final"]["eval_accuracy"] == summary["final"]["eval_accuracy"]
    a, cfg, _ = load_weights(ddp_out / "last.safetensors")
    b, _, _ = load_weights(tmp_path / "single" / "last.safetensors")
    basis = [k for k in a if "parametrizations" in k]
    # float32 gradients summed in another order (two ranks) differ by round-off; Adam turns a relative
    # gradient change δ into an update change of about lr·δ per step, so after `steps` steps the weights
    # differ by about steps·lr·close_tol(float32) plus their own round-off
    lr, steps = cfg.optim.lr, summary["steps"]
    # The position prior's gradient (∂/∂p_k of every pair weight e^{p_i + p_j}) sums terms of both signs over all
    # pairs of the batch, and starts at p = 0 where they nearly cancel: its float32 relative round-off is
    # γ_N·Σ|terms|/|Σ terms|, not close_tol. The bound allows a relative gradient change of 2^-10 per step (a
    # condition number Σ|terms|/|Σ terms| up to ~8,000 at N ≤ 96·64 terms); measured here: 6e-5.
    prior = {k for k in a if "position_prior" in k}
    for k in a.keys() - set(basis):
        rel = 2.0 ** -10 if k in prior else close_tol(torch.float32)
        bound = steps * lr * rel + close_tol(torch.float32, a[k].abs().max())
        assert (a[k] - b[k]).abs().max() <= bound, k
    # Rotations inside one head's subspace do not change the model (isotropic heads); their gradients are
    # rounding noise that Adam amplifies, so compare the head projectors U_h U_hᵀ, not the raw parameters.
    emb = type("E", (), {"table": torch.zeros(200, 16), "pad_id": 0})()
    projectors = []
    for state in (a, b):
        model = build_classifier(cfg, emb)
        model.load_state_dict(state, strict=False)
        U = model.encoder.layers[0].attention.subspaces()        # (H, d, dh)
        projectors.append(U @ U.transpose(1, 2))
    torch.testing.assert_close(projectors[0], projectors[1], rtol=0, atol=1e-4)


# ----------------------------------------------------------------------------- optimiser, loss reduction, input map
@pytest.mark.parametrize("args, message", [
    (["--optim.optimizer", "adam"], "unknown optim.optimizer 'adam'; valid: adamw, sgd"),
    (["--optim.loss_reduction", "max"], "unknown optim.loss_reduction 'max'; valid: mean, sum"),
    (["--model.input_map", "false", "--model.d_model", "8", "--model.n_heads", "1"],
     r"model.input_map=false needs model.d_model equal to the embedding width \(random: 16\), got d_model=8"),
])
def test_bad_recipe_settings_fail_before_training(sst2_dir, tmp_path, args, message):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=message):
        train(tiny_config(sst2_dir, out, *args))
    assert not out.exists()


def test_input_map_width_check_knows_minilm_without_reading_it():
    cfg = TrainConfig().replace(model__kind="paper", model__input_map=False)
    with pytest.raises(ConfigError, match=r"\(minilm: 384\), got d_model=300"):
        cfg.validate(check_data=False)
    cfg.replace(model__d_model=384).validate(check_data=False)    # equal widths: accepted


def _first_step_expected(cfg: TrainConfig):
    """The trainer's initial weights and the gradient of the summed cross-entropy over its one batch."""
    from unfoldformer.train.build import _seed_all, load_embeddings_for, load_split
    emb = load_embeddings_for(cfg)
    ds = load_split(cfg, emb, "train", cfg.data.max_train_examples)
    _seed_all(cfg.optim.seed)
    model = build_classifier(cfg, emb)
    ids, mask, labels = ds.collate(list(range(len(ds))), cfg.data.max_length, emb.pad_id)
    F.cross_entropy(model(ids, mask)[0], labels, reduction="sum").backward()
    return {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}, \
        {k: p.grad.clone() for k, p in model.named_parameters() if p.requires_grad}, len(ds)


@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_plain_sgd_step_follows_the_loss_reduction(reduction, sst2_dir, tmp_path):
    """One SGD step on one batch of B examples: w − lr·∇Σ CE (sum) or w − lr·∇Σ CE / B (mean)."""
    lr = 0.05
    cfg = tiny_config(sst2_dir, tmp_path, "--optim.optimizer", "sgd", "--optim.loss_reduction", reduction,
                      "--optim.lr", str(lr), "--optim.warmup", "0", "--optim.min_lr_ratio", "1",
                      "--optim.weight_decay", "0", "--optim.grad_clip", "null", "--model.input_map", "false",
                      "--data.max_train_examples", "16", "--optim.batch_size", "16", "--optim.epochs", "1",
                      "--run.eval_examples", "8")
    assert cfg.model.input_map is False
    before, grads, B = _first_step_expected(cfg)
    summary = train(cfg)
    assert summary["steps"] == 1
    state, _, _ = load_weights(tmp_path / "last.safetensors")
    assert "project.weight" not in state                          # no input map: embeddings go straight in
    scale = lr if reduction == "sum" else lr / B
    for name, w0 in before.items():
        expected = w0 - scale * grads[name]
        assert not torch.equal(state[name], w0) or not grads[name].any(), name
        assert_close(state[name], expected, scale=float(w0.abs().max() + scale * B * grads[name].abs().max()))


def test_released_kind_trains_and_loads_its_own_weights(sst2_dir, tmp_path):
    from unfoldformer.released import ReleasedFFN
    from unfoldformer.train import load_classifier
    cfg = tiny_config(sst2_dir, tmp_path, "--model.kind", "paper-as-released", "--data.max_train_examples", "32",
                      "--optim.epochs", "1", "--run.eval_examples", "8")
    train(cfg)
    loaded = load_classifier(tmp_path / "last.safetensors")
    assert isinstance(loaded.model.encoder.layers[0].ffn, ReleasedFFN)
    saved, _, _ = load_weights(tmp_path / "last.safetensors")
    for name, value in loaded.model.state_dict().items():
        if name in saved:                                          # the init's normalisation is overwritten
            assert torch.equal(value, saved[name]), name
