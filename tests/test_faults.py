"""Fault injection: concurrent runs, corrupted files, killed runs, unwritable outputs, divergence, and a
bad-input matrix over every command (exit status 2, one line naming the problem, nothing left behind)."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import SMALL_TRAIN, train_small_run
from unfoldformer import cli
from unfoldformer.runs import MANIFEST_NAME
from unfoldformer.train import TrainConfig, train
from unfoldformer.train.checkpoint import load_train_state, load_weights
from unfoldformer.utils import file_sha256

REPO = Path(__file__).resolve().parent.parent
SMALL = SMALL_TRAIN


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run_dir(sst2_dir, tmp_path_factory) -> Path:
    """A finished tiny run (the default kind `certified`, random embeddings built from the synthetic data)."""
    return train_small_run(sst2_dir, tmp_path_factory.mktemp("faults") / "run")


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO / "src"))
    for key in ("RANK", "WORLD_SIZE"):
        env.pop(key, None)
    return env


def _cli(*args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "unfoldformer", *map(str, args)], env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _leftovers(folder: Path) -> list[str]:
    """Lock files and temporary folders of runs beside `folder`."""
    if not folder.parent.is_dir():
        return []
    return sorted(p.name for p in folder.parent.iterdir()
                  if p.name.startswith(".") and (p.name.endswith(".lock") or ".tmp-" in p.name or ".old-" in p.name))


def _flip_inside(path: Path, tensor: torch.Tensor) -> None:
    """Flip one bit in the middle of `tensor`'s bytes as stored in `path` (uncompressed in both formats)."""
    data = bytearray(path.read_bytes())
    raw = tensor.contiguous().numpy().tobytes()
    at = data.find(raw)
    assert at >= 0 and data.find(raw, at + 1) < 0, "tensor bytes not found once in the file"
    data[at + len(raw) // 2] ^= 0x04
    path.write_bytes(bytes(data))


# ----------------------------------------------------------------------------- concurrent runs
def test_a_second_run_into_a_busy_folder_refuses_and_the_first_is_intact(sst2_dir, tmp_path, capsys):
    out = tmp_path / "shared"
    args = [*SMALL, "--data.data_dir", sst2_dir, "--run.out_dir", out, "--data.max_train_examples", "200"]
    first = _cli("train", *args)
    deadline = time.time() + 120
    while not (tmp_path / ".shared.lock").exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert cli.main(["train", *map(str, args)]) == 2
    err = capsys.readouterr().err
    assert f"{out} is in use by another run (pid {first.pid}" in err and err.count("\n") == 1
    _, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err
    run_id = json.loads((out / "config.json").read_text())["resolved"]["run_id"]
    assert load_train_state(out / "checkpoint.pt")["run_id"] == run_id
    for name in ("best", "last"):
        assert load_weights(out / f"{name}.safetensors")[2]["run_id"] == run_id
        assert json.loads((out / f"{name}.json").read_text())["run_id"] == run_id
    assert {json.loads(r)["run_id"] for r in (out / "metrics.jsonl").read_text().splitlines()} == {run_id}
    assert json.loads((out / "summary.json").read_text())["run_id"] == run_id
    assert _leftovers(out) == []


# ----------------------------------------------------------------------------- corrupted files
def test_bit_flip_in_a_checkpoint_refuses_resume(run_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    state = load_train_state(copy / "checkpoint.pt")
    name = "project.weight"                                        # the input map e → d_model
    _flip_inside(copy / "checkpoint.pt", state["model"][name])
    before = {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()}
    assert cli.main(["train", "--run.out_dir", str(copy), "--resume"]) == 2
    err = capsys.readouterr().err
    assert re.search(rf"checkpoint.pt: corrupt: checksum mismatch in model/{re.escape(name)} ", err), err
    assert {p.name: p.read_bytes() for p in copy.iterdir() if p.is_file()} == before      # nothing rewritten


def test_bit_flip_in_weights_is_refused_by_evaluate_predict_and_load(run_dir, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    tensors, _, info = load_weights(copy / "best.safetensors")
    assert info["integrity"] == "verified"
    name = sorted(tensors)[len(tensors) // 2]
    _flip_inside(copy / "best.safetensors", tensors[name])
    for argv in (["evaluate", str(copy)], ["predict", str(copy), "--text", "good"]):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert f"best.safetensors: corrupt: checksum mismatch in {name} (1 of " in err and err.count("\n") == 1


def test_weights_of_another_run_in_the_folder_are_refused(run_dir, sst2_dir, tmp_path, capsys):
    other = tmp_path / "other"
    train(TrainConfig().with_overrides([*SMALL, "--data.data_dir", str(sst2_dir), "--run.out_dir", str(other)]))
    mixed = tmp_path / "mixed"
    shutil.copytree(run_dir, mixed)
    for name in ("best.safetensors", "checkpoint.pt"):               # same config, another run's files
        shutil.copy(other / name, mixed / name)
    assert cli.main(["evaluate", str(mixed), "--no-energies"]) == 2
    assert "mixes the files of two runs" in capsys.readouterr().err
    assert cli.main(["train", "--run.out_dir", str(mixed), "--resume"]) == 2
    assert "the folder mixes two runs; resume refused" in capsys.readouterr().err


# ----------------------------------------------------------------------------- killed runs
def _reproduce(out: Path, *extra):
    return _cli("reproduce", "--quick", "--figures", "1", "--no-progress", "--out", out, *extra)


def _manifest_matches(out: Path) -> dict:
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    present = {p.name for p in out.iterdir()} - {MANIFEST_NAME}
    assert set(manifest["files"]) == present
    assert all(file_sha256(out / n) == f["sha256"] for n, f in manifest["files"].items())
    return manifest


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    """`pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; workers die with their parent on Linux")
def test_sigkill_of_reproduce_leaves_the_earlier_output_and_a_rerun_completes(tmp_path):
    out = tmp_path / "repro"
    first = _reproduce(out)
    assert first.wait(timeout=300) == 0, first.stderr.read()
    earlier = {p.name: p.read_bytes() for p in out.iterdir()}
    killed = _reproduce(out, "--seed", "1", "--threads", "2")                      # two worker processes
    deadline = time.time() + 120
    while (not (list(tmp_path.glob(".repro.tmp-*/config.json")) and _children(killed.pid))
           and killed.poll() is None and time.time() < deadline):
        time.sleep(0.005)
    workers = _children(killed.pid)
    assert workers, "the reproduction started no worker process"
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    deadline = time.time() + 30                                                 # its workers die with it
    while any(_alive(pid) for pid in workers) and time.time() < deadline:
        time.sleep(0.01)
    assert not any(_alive(pid) for pid in workers), "a worker outlived the killed reproduction"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == earlier           # untouched, still whole
    assert ".repro.lock" in _leftovers(out)                                     # stale lock of the dead run
    rerun = _reproduce(out, "--seed", "1")
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert f"took over the stale lock {tmp_path / '.repro.lock'}" in err and "no longer running" in err
    assert _manifest_matches(out)["config_sha256"] != json.loads(earlier[MANIFEST_NAME])["config_sha256"]
    assert json.loads((out / "config.json").read_text())["seed"] == 1 and _leftovers(out) == []


def test_a_narrower_rerun_leaves_no_file_of_the_wider_one(tmp_path, capsys):
    out = tmp_path / "repro"
    assert cli.main(["reproduce", "--quick", "--figures", "1,4", "--no-progress", "--out", str(out)]) == 0
    assert {"fig1_apollonius.png", "fig4_kappa.png"} <= {p.name for p in out.iterdir()}
    assert cli.main(["reproduce", "--quick", "--figures", "1", "--no-progress", "--out", str(out)]) == 0
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == {"fig1_apollonius.png"}
    listed = set(re.findall(r"\]\(([^)]+\.png)\)", (out / "report.md").read_text()))
    assert listed == pngs                                         # the report lists exactly the files there
    _manifest_matches(out)


# ----------------------------------------------------------------------------- divergence
def test_divergence_stops_with_the_loops_message(sst2_dir, tmp_path, capsys):
    out = tmp_path / "div"
    argv = ["train", *SMALL, "--data.data_dir", str(sst2_dir), "--run.out_dir", str(out), "--optim.lr", "1e30",
            "--run.checkpoint_every", "1", "--optim.grad_clip", "null"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    found = re.fullmatch(r"unfoldformer train: error: training diverged at step (\d+): .*; last finite training loss "
                         r"(\S+); the last checkpoint is .*checkpoint.pt \(step \d+\); lower optim.lr \(now 1e\+30\) "
                         r"or set optim.grad_clip\n", err)
    assert found, err
    assert math.isfinite(float(found[2])), err        # a number (plain or 1.125e+30), not nan / inf
    step = load_train_state(out / "checkpoint.pt")["progress"]["step"]
    assert f"(step {step})" in err and not (out / "best.safetensors").exists()


# ----------------------------------------------------------------------------- bad input
def _fails(capsys, argv: list, message: str, *absent: Path) -> None:
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"unfoldformer {argv[0]}: error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    for path in absent:
        assert not path.exists() and _leftovers(path) == [], path


TRAIN_CASES = [
    (["--optim.lr", "nan"], r"optim.lr must be a finite number > 0, got nan"),
    (["--optim.lr", "inf"], r"optim.lr must be a finite number > 0, got inf"),
    (["--optim.weight_decay", "inf"], r"optim.weight_decay must be a finite number >= 0, got inf"),
    (["--optim.weight_decay", "-0.1"], r"optim.weight_decay must be a finite number >= 0"),
    (["--optim.warmup", "nan"], r"optim.warmup must be a finite number >= 0"),
    (["--optim.grad_clip", "inf"], r"optim.grad_clip must be a finite number > 0 or null"),
    (["--optim.min_lr_ratio", "nan"], r"optim.min_lr_ratio must lie in \[0, 1\]"),
    (["--optim.epochs", "0"], r"optim.epochs must be >= 1"),
    (["--optim.batch_size", "0"], r"optim.batch_size must be >= 1"),
    (["--model.anchor_weight", "nan"], r"anchor_weight must be a finite number, got nan"),
    (["--model.anchor_weight", "inf"], r"anchor_weight must be a finite number, got inf"),
    (["--model.anchor_weight", "0"], r"anchor_weight must be a finite number > 0"),
    (["--model.ffn_hidden", "0"], r"model.ffn_hidden must be >= 1, got 0"),
    (["--model.depth", "0"], r"model.depth must be >= 1"),
    (["--model.kind", "certified-alternating", "--model.alpha_ffn", "2.5"],
     r"alpha_ffn=2.5 is outside the certified range"),
    (["--model.alpha_ffn", "0.5"], r"alpha_ffn does not apply"),                 # the default joint layer: one α
    (["--data.max_length", "0"], r"data.max_length must be >= 1 or null"),
    (["--data.embedding_dim", "0"], r"data.embedding_dim must be >= 1"),
    (["--run.eval_batch_size", "0"], r"run.eval_batch_size must be >= 1"),
    (["--data.eval_split", "test"], r"data.eval_split='test' is not a labelled split of sst2"),
    (["--run.device", "tpu"], r"run.device must be auto, cpu or cuda"),
    (["--data.data_dir", "/nonexistent/typo"], r"data folder '/nonexistent/typo' does not exist"),
    (["--optim.seed", "-1"], r"optim.seed must be an integer in \[0, 2\*\*32 - 1\], got -1"),
    (["--data.embedding_seed", "-3"], r"data.embedding_seed must be an integer in \[0, 2\*\*32 - 1\], got -3"),
    (["--optim.epochs", "2000000"], r"optim.epochs=2000000 is beyond 1,000,000 \(a typo\?\); set run.allow_large"),
    (["--optim.epochs", "100000000000000000000000"], r"optim.epochs=100000000000000000000000 is beyond 1,000,000"),
    (["--optim.epochs", "1e23"], r"optim.epochs: Value '1e23' of type 'str' could not be converted to Integer"),
    (["--optim.warmup", "1e7"], r"optim.warmup=10000000.0 is beyond 1,000,000"),
    (["--run.checkpoint_every", "9999999"], r"run.checkpoint_every=9999999 is beyond 1,000,000"),
    (["--data.data_dir", ""], r"--data.data_dir is empty; give a path"),
    (["--data.eval_split="], r"setting --data.eval_split has an empty value"),
]
if not torch.cuda.is_available():
    TRAIN_CASES.append((["--run.device", "cuda"], r"run.device='cuda', but this torch build sees no CUDA device"))


@pytest.mark.parametrize("args, message", TRAIN_CASES, ids=[" ".join(a) for a, _ in TRAIN_CASES])
def test_train_bad_input(sst2_dir, tmp_path, capsys, args, message):
    out = tmp_path / "run"
    _fails(capsys, ["train", *SMALL, "--data.data_dir", sst2_dir, "--run.out_dir", out, *args], message, out)


def test_train_empty_output_folder_is_refused(sst2_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, ["train", *SMALL, "--data.data_dir", sst2_dir, "--run.out_dir", ""], r"--run.out_dir is empty")
    assert list(tmp_path.iterdir()) == []


def test_train_unusable_output_locations(sst2_dir, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    base = ["train", *SMALL, "--data.data_dir", sst2_dir]
    _fails(capsys, [*base, "--run.out_dir", afile], r"run.out_dir .*afile: exists and is a file")
    _fails(capsys, [*base, "--run.out_dir", afile / "run"], r"afile is a file, so no folder can be made", afile / "run")
    assert afile.read_text() == "x"


def test_train_missing_data_names_the_train_option(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("UNFOLDFORMER_DATA", raising=False)
    monkeypatch.setenv("UNFOLDFORMER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    _fails(capsys, ["train", "--data.dataset", "imdb", "--run.out_dir", out],
           r"data for data.dataset='imdb' is missing: .*--data.data_dir for train.*--data.download true$", out)


EVAL_CASES = [
    (["--split", "test"], r"split 'test' of sst2 has no labels to evaluate against; labelled splits: train, dev"),
    (["--split", "nope"], r"split 'nope' of sst2 has no labels"),
    (["--device", "tpu"], r"--device='tpu' is not a device name"),
    (["--max-examples", "0"], r"--max-examples must be an integer >= 1 \(or unset\), got 0"),
    (["--max-examples", "-3"], r"--max-examples must be an integer >= 1 \(or unset\), got -3"),
    (["--max-length", "0"], r"--max-length must be an integer >= 1"),
    (["--batch-size", "0"], r"--batch-size must be an integer >= 1"),
    (["--max-length", "8", "--full-length"], r"--max-length and --full-length exclude each other"),
    (["--data-dir", "/nonexistent/typo"], r"data folder '/nonexistent/typo' does not exist"),
]
if not torch.cuda.is_available():
    EVAL_CASES.append((["--device", "cuda"], r"--device='cuda', but this torch build sees no CUDA device"))


@pytest.mark.parametrize("args, message", EVAL_CASES, ids=[" ".join(a) for a, _ in EVAL_CASES])
def test_evaluate_bad_input(run_dir, tmp_path, capsys, args, message):
    output = tmp_path / "result.json"
    _fails(capsys, ["evaluate", run_dir, *args, "--output", output], message, output)


def test_evaluate_bad_files(run_dir, tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    _fails(capsys, ["evaluate", run_dir, "--output", afile / "r.json"], r"afile is a file, so no folder")
    _fails(capsys, ["evaluate", run_dir, "--output", tmp_path], r"--output .* is a folder; give a file name")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes((run_dir / "best.safetensors").read_bytes()[:400])
    _fails(capsys, ["evaluate", cut], r"cut.safetensors: not a readable safetensors file")
    _fails(capsys, ["evaluate", tmp_path / "missing"], r"no such weights file")


@pytest.mark.parametrize("args, message", [
    (["--text", "x", "--data-dir", "/nonexistent/typo"], r"data folder '/nonexistent/typo' does not exist"),
    ([], r"no texts: pass --text"),
    (["--text", "x", "--file", "/nonexistent/texts.txt"], r"--file /nonexistent/texts.txt: cannot read it"),
])
def test_predict_bad_input(run_dir, capsys, args, message):
    _fails(capsys, ["predict", run_dir, *args], message)


DEMO_CASES = [
    (["--batch", "0"], r"--batch must be an integer >= 1 \(or unset\), got 0"),
    (["--batch", "-2"], r"--batch must be an integer >= 1"),
    (["--tokens", "0"], r"--tokens must be an integer >= 1"),
    (["--depth", "0"], r"--depth must be an integer >= 1"),
]


@pytest.mark.parametrize("args, message", DEMO_CASES, ids=[" ".join(a) for a, _ in DEMO_CASES])
def test_demo_bad_input(tmp_path, capsys, args, message):
    out = tmp_path / "demo"
    _fails(capsys, ["demo", *args, "--out", out], message, out)


def test_demo_output_folders(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    small = ["demo", "--batch", "2", "--tokens", "4", "--depth", "2"]
    _fails(capsys, [*small, "--out", afile], r"--out .*afile: exists and is a file")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    _fails(capsys, [*small, "--out", mine], r"did not write \(notes.txt\)")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    out = tmp_path / "demo"
    assert cli.main([*small, "--out", str(out)]) == 0
    assert _manifest_matches(out)["command"] == "demo"
    assert json.loads((out / "config.json").read_text())["batch"] == 2


@pytest.fixture(scope="module")
def broken_sst2(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("broken")
    (root / "SST-2").mkdir()
    (root / "SST-2" / "dev.tsv").write_text("sentence\tlabel\na fine film\t7\n")
    return root


PROBE_CASES = [
    (["--model", "/nonexistent/model"], r"model folder not found: '/nonexistent/model'"),
    (["--split", "nope"], r"split 'nope' is not a split of sst2; valid: train, dev, test"),
    (["--dataset", "imdb", "--split", "dev"], r"split 'dev' is not a split of imdb"),
    (["--samples", "0"], r"samples must be an integer >= 1, got 0"),
    (["--max-length", "0"], r"max_length must be an integer >= 1"),
    (["--batch-size", "0"], r"batch_size must be an integer >= 1"),
    (["--data-dir", "/nonexistent/typo"], r"data folder '/nonexistent/typo' does not exist"),
]


@pytest.mark.parametrize("args, message", PROBE_CASES, ids=[" ".join(a) for a, _ in PROBE_CASES])
def test_probe_bad_input(sst2_dir, tmp_path, capsys, args, message):
    out = tmp_path / "probe"
    _fails(capsys, ["probe", "--model", "minilm", "--samples", "4", "--data-dir", sst2_dir, "--out", out, *args],
           message, out)


def test_probe_failures_leave_no_folder(sst2_dir, broken_sst2, tmp_path, capsys):
    out = tmp_path / "probe"
    base = ["probe", "--samples", "4", "--max-length", "16", "--out", out]
    _fails(capsys, [*base, "--model", "minilm", "--data-dir", broken_sst2], r"dev.tsv.*line 2", out)
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    from unfoldformer.probe.hf import resolve_model_path
    shutil.copy(resolve_model_path("minilm") / "config.json", weightless / "config.json")
    _fails(capsys, [*base, "--model", weightless, "--data-dir", sst2_dir], r"cannot load the model in", out)
    afile = tmp_path / "afile"
    afile.write_text("x")
    _fails(capsys, [*base, "--model", "minilm", "--data-dir", sst2_dir, "--out", afile / "p"],
           r"afile is a file, so no folder")


REPRODUCE_CASES = [
    (["--figures", "9"], r"--figures '9' must select figures among 1-6"),
    (["--samples", "0"], r"--samples must be >= 1, got 0"),
    (["--threads", "0"], r"--threads must be >= 1, got 0"),
    (["--datasets", "mnist"], r"unknown dataset\(s\) \['mnist'\]"),
    (["--figures", "6", "--data-dir", "/nonexistent/typo"], r"data folder '/nonexistent/typo' does not exist"),
]


@pytest.mark.parametrize("args, message", REPRODUCE_CASES, ids=[" ".join(a) for a, _ in REPRODUCE_CASES])
def test_reproduce_bad_input(tmp_path, capsys, args, message):
    out = tmp_path / "repro"
    _fails(capsys, ["reproduce", "--quick", "--no-progress", "--out", out, *args], message, out)


def test_reproduce_output_folders(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    base = ["reproduce", "--quick", "--figures", "1", "--no-progress"]
    _fails(capsys, [*base, "--out", afile], r"--out .*afile: exists and is a file")
    _fails(capsys, [*base, "--out", afile / "r"], r"afile is a file, so no folder", afile / "r")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "draft.md").write_text("keep")
    _fails(capsys, [*base, "--out", mine], r"did not write \(draft.md\)")
    assert [p.name for p in mine.iterdir()] == ["draft.md"]


# ----------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("preset", ["certified", "standard"])
def test_an_input_of_another_dtype_is_refused_in_one_line(preset, dtype):
    from conftest import random_inputs, small_config
    from unfoldformer.classifier import build_encoder
    model = build_encoder(small_config(preset))                   # float32 parameters
    x, pad = random_inputs(dtype=dtype)
    with pytest.raises(TypeError, match=rf"^x has dtype {dtype} but the model's parameters are torch.float32; "
                                        r"convert one to the other first"):
        model(x, pad)


def test_the_safeguard_and_statistics_use_the_states_own_dtype(monkeypatch):
    """A float16 model's safeguard and descent statistics use the float16 tolerance, not float32's."""
    from conftest import random_inputs, small_config
    from unfoldformer import descent
    from unfoldformer import model as model_module
    from unfoldformer.model import UnfoldedTransformer
    from unfoldformer.train import evaluate as evaluate_module
    seen = []
    spy = lambda dtype: seen.append(dtype) or descent.descent_tolerance(dtype)   # noqa: E731
    monkeypatch.setattr(model_module, "descent_tolerance", spy)
    monkeypatch.setattr(evaluate_module, "descent_tolerance", spy)
    model = UnfoldedTransformer(small_config("certified-alternating")).to(torch.float16)
    x, pad = random_inputs(dtype=torch.float16)
    with torch.no_grad():
        out = model(x, pad, safeguard=True)
    sums = evaluate_module.EvalSums()
    sums.add(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), out)
    assert seen and set(seen) == {torch.float16}
    assert descent.descent_tolerance(torch.float16) > 100 * descent.descent_tolerance(torch.float32)


def test_predictions_judge_the_curve_by_the_states_dtype(run_dir, monkeypatch):
    import unfoldformer as uf
    from unfoldformer import descent
    from unfoldformer import inference as inference_module
    seen = []
    monkeypatch.setattr(inference_module, "descent_tolerance",
                        lambda dtype: seen.append(dtype) or descent.descent_tolerance(dtype))
    predictor = uf.load(run_dir)
    assert predictor.integrity == "verified"
    predictor.model.double()                                       # float64 states throughout
    (pred,) = predictor(["a good film"])
    assert seen == [torch.float64] and pred.never_rises is not None


# ----------------------------------------------------------------------------- checksums
def test_state_digests_cover_every_tensor_and_value_and_survive_a_round_trip(tmp_path):
    from unfoldformer.train.checkpoint import state_digests, tensor_sha256
    state = {"w": torch.arange(6.0).reshape(2, 3), "h": torch.ones(2, dtype=torch.bfloat16),
             "rng": (3, (1, 2), None), "steps": [1, 2.5, "x"], "nested": {"b": torch.zeros(0)}}
    digests = state_digests(state)
    assert set(digests) == {"/w", "/h", "/nested/b", "<values>"}
    path = tmp_path / "s.pt"
    torch.save(state, path)
    assert state_digests(torch.load(path, weights_only=True)) == digests
    assert state_digests({**state, "steps": [1, 2.5, "y"]})["<values>"] != digests["<values>"]
    assert tensor_sha256(torch.zeros(2)) != tensor_sha256(torch.zeros(1, 2))        # the shape counts
    assert tensor_sha256(torch.zeros(2)) != tensor_sha256(torch.zeros(2, dtype=torch.float64).float().half())


# ----------------------------------------------------------------------------- provenance
def test_runs_record_the_data_files_they_read(run_dir, sst2_dir):
    from unfoldformer.data import file_record
    from unfoldformer.train import evaluate_checkpoint
    record = file_record(sst2_dir / "SST-2")                       # the synthetic data is an extracted folder
    assert record["sha256"].startswith("tree:") and record["bytes"] == sum(
        p.stat().st_size for p in (sst2_dir / "SST-2").iterdir())
    assert json.loads((run_dir / "config.json").read_text())["resolved"]["data_files"] == [record]
    assert json.loads((run_dir / "summary.json").read_text())["data_files"] == [record]
    result = evaluate_checkpoint(run_dir, energies=False, max_examples=8)
    assert result["data_files"] == [record] and result["integrity"] == "verified" and result["n"] == 8
