"""Files that prove themselves and commands that never report a non-finite result or work on a bad path
(issue 24): run-folder manifests, weights without checksums, config.json against the weights, NaN results,
empty paths, the working directory as an output, negative seeds, the divergence advice, IMDB without test."""
from __future__ import annotations

import io
import json
import random
import re
import shutil
import tarfile
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save

import unfoldformer as uf
from conftest import SMALL_TRAIN, synthetic_sentences, train_small_run
from unfoldformer import cli
from unfoldformer.contracts import NonFiniteResultError
from unfoldformer.errors import UnverifiedFileWarning
from unfoldformer.runs import MANIFEST_NAME, verify_manifest
from unfoldformer.train import evaluate_checkpoint
from unfoldformer.train.checkpoint import VOUCHED, CheckpointError
from unfoldformer.utils import file_sha256

SMALL = SMALL_TRAIN


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def run_dir(sst2_dir, tmp_path_factory) -> Path:
    return train_small_run(sst2_dir, tmp_path_factory.mktemp("files") / "run")


def _fails(capsys, argv: list, message: str) -> str:
    """Exit status 2, one line `unfoldformer CMD: error: ...` matching `message`, nothing on stdout."""
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    lines = [line.rsplit("\r", 1)[-1].lstrip() + "\n" for line in err.split("\n")[:-1]]   # after a progress bar
    warned = [line for line in lines if line.startswith(f"unfoldformer {argv[0]}: warning: ")]
    assert ("--trust-unverified" in argv) == bool(warned), err     # the one warning: a file read unverified
    (error,) = [line for line in lines if line not in warned and not re.search(r"\d+%\|", line)]   # bars aside
    assert error.startswith(f"unfoldformer {argv[0]}: error: ") and error.endswith("\n"), err
    assert re.search(message, error), err
    assert "{" not in out and "p=[" not in out, out                # no result printed
    return error


def _copy(run_dir: Path, tmp_path: Path, *, manifest: bool = True) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    if not manifest:
        (copy / MANIFEST_NAME).unlink()
    return copy


def _strip_checksums(path: Path, scale: float = 1.0) -> None:
    """Re-save a weights file without its `checksums` entry (tensors times `scale`): what a tamperer does."""
    with safe_open(str(path), framework="pt") as handle:
        metadata = dict(handle.metadata())
        tensors = {k: handle.get_tensor(k) * scale for k in handle.keys()}
    metadata.pop("checksums")
    path.write_bytes(save(tensors, metadata=metadata))


# ----------------------------------------------------------------------------- the run folder's manifest
def test_a_finished_run_pins_every_file_and_a_resume_keeps_it_whole(run_dir, tmp_path, capsys):
    manifest = json.loads((run_dir / MANIFEST_NAME).read_text())
    present = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()} - {MANIFEST_NAME}
    assert set(manifest["files"]) == present and {"best.safetensors", "config.json", "checkpoint.pt"} <= present
    assert all(file_sha256(run_dir / n) == f["sha256"] and (run_dir / n).stat().st_size == f["bytes"]
               for n, f in manifest["files"].items())
    assert manifest["command"] == "train"
    assert manifest["run_id"] == json.loads((run_dir / "config.json").read_text())["resolved"]["run_id"]
    copy = _copy(run_dir, tmp_path)
    assert cli.main(["train", "--run.out_dir", str(copy), "--resume"]) == 0      # finished: nothing to do
    capsys.readouterr()
    assert verify_manifest(copy)["run_id"] == manifest["run_id"]


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


CHANGED_FILES = [
    ("metrics.jsonl appended", "metrics.jsonl", lambda p: p.write_text(p.read_text() + "{}\n"),
     r"metrics.jsonl: has \d+ bytes, \d+ when the run finished"),
    ("summary.json removed", "summary.json", Path.unlink, r"summary.json: is missing"),
    ("config.json reformatted", "config.json", lambda p: p.write_text(json.dumps(json.loads(p.read_text()), indent=8)),
     r"config.json: has \d+ bytes"),
    ("checkpoint.pt same size", "checkpoint.pt", lambda p: _flip_last_byte(p),
     r"checkpoint.pt: has other contents than when the run finished"),
    ("manifest truncated", MANIFEST_NAME, lambda p: p.write_text(p.read_text()[:40]),
     r"complete.json: the folder's manifest is unreadable"),
]


@pytest.mark.parametrize("name, change, message", [c[1:] for c in CHANGED_FILES], ids=[c[0] for c in CHANGED_FILES])
def test_a_file_changed_after_the_run_is_refused_on_load(run_dir, tmp_path, capsys, name, change, message):
    copy = _copy(run_dir, tmp_path)
    change(copy / name)
    _fails(capsys, ["evaluate", copy, "--no-energies", "--output", tmp_path / "r.json"], message)
    assert not (tmp_path / "r.json").exists()
    _fails(capsys, ["predict", copy, "--text", "good"], message)


# ----------------------------------------------------------------------------- weights without checksums
NO_CHECKSUM = r"best.safetensors: carries no checksums \(written by version 0.1.0, or stripped\) and no run-folder " \
              r"manifest vouches for it.*pass --trust-unverified"
STRIPPED_CASES = [       # id, keep the manifest, scale of the weights, command, expected message
    ("tampered, manifest kept, evaluate", True, 1e6, ["evaluate", "--safeguard"], NO_CHECKSUM),
    ("tampered, manifest kept, predict", True, 1e6, ["predict", "--text", "good film"], NO_CHECKSUM),
    ("tampered, no manifest, evaluate", False, 1e6, ["evaluate"], NO_CHECKSUM),
    ("untampered, no manifest, predict", False, 1.0, ["predict", "--text", "good"], NO_CHECKSUM),
    ("tampered, trusted, evaluate", False, 1e6, ["evaluate", "--safeguard", "--trust-unverified"],
     # the logits or the energy curve: whichever the evaluation meets non-finite first names the example
     r"example \d+ of the split: its (energy curve|logits \(so its loss\)) has (-inf|inf|nan) at \[\d+\]; "
     r"a non-finite loss or energy is not "),
    ("tampered, trusted, predict", False, 1e6, ["predict", "--text", "good film", "--trust-unverified"],
     r"text 0 \('good film'\): its class probabilities has nan at \[0\]; a non-finite prediction is not reported"),
]


@pytest.mark.parametrize("keep, scale, argv, message", [c[1:] for c in STRIPPED_CASES],
                         ids=[c[0] for c in STRIPPED_CASES])
def test_weights_without_checksums_need_a_manifest_or_trust(run_dir, tmp_path, capsys, keep, scale, argv, message):
    copy = _copy(run_dir, tmp_path, manifest=keep)
    _strip_checksums(copy / "best.safetensors", scale)
    _fails(capsys, [argv[0], copy, *argv[1:]], message)


def test_weights_without_checksums_load_when_the_manifest_vouches_or_when_trusted(run_dir, tmp_path, capsys):
    copy = _copy(run_dir, tmp_path)
    _strip_checksums(copy / "best.safetensors")
    (tmp_path / "run" / MANIFEST_NAME).write_text(                 # re-pin it: the folder now vouches for it
        json.dumps({**json.loads((copy / MANIFEST_NAME).read_text()), "files": {
            **json.loads((copy / MANIFEST_NAME).read_text())["files"],
            "best.safetensors": {"bytes": (copy / "best.safetensors").stat().st_size,
                                 "sha256": file_sha256(copy / "best.safetensors")}}}))
    reference = uf.load(run_dir)(["a good film"])[0]
    vouched = uf.load(copy)
    assert vouched.integrity == VOUCHED
    assert vouched(["a good film"])[0].probabilities == reference.probabilities
    (copy / MANIFEST_NAME).unlink()
    with pytest.raises(CheckpointError, match="no run-folder manifest vouches for it"):
        uf.load(copy)
    with pytest.warns(UnverifiedFileWarning, match="without checksums"):
        trusted = uf.load(copy, trust_unverified=True)
    assert trusted.integrity.startswith("unverified") and trusted(["a good film"])[0].label == reference.label


def test_the_evaluation_api_refuses_a_non_finite_result(run_dir, tmp_path):
    """The path the accuracy benchmark uses (`evaluate_checkpoint`)."""
    copy = _copy(run_dir, tmp_path, manifest=False)
    _strip_checksums(copy / "best.safetensors", 1e6)
    with pytest.warns(UnverifiedFileWarning), pytest.raises(NonFiniteResultError, match=r"^example \d+ of the split"):
        evaluate_checkpoint(copy, safeguard=True, trust_unverified=True)


# ----------------------------------------------------------------------------- config.json against the weights
def _edit_config(path: Path) -> None:
    data = json.loads(path.read_text())
    data["model"]["d_model"] = 32
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("keep", [True, False], ids=["manifest kept", "manifest removed"])
@pytest.mark.parametrize("change, message", [
    (_edit_config, r"config.json disagrees with the config embedded in .*best.safetensors \(model.d_model: 32 in "
                   r"config.json, 16 in the weights\); one of them was edited"),
    (lambda p: p.write_text(p.read_text()[:50]), r"config.json: unreadable \(truncated or not JSON\)"),
], ids=["d_model edited", "truncated"])
def test_a_config_json_that_disagrees_with_the_weights_is_refused(run_dir, tmp_path, capsys, keep, change, message):
    copy = _copy(run_dir, tmp_path, manifest=keep)
    change(copy / "config.json")
    _fails(capsys, ["evaluate", copy, "--no-energies"], message)
    with pytest.raises(CheckpointError, match=message):
        uf.load(copy)


# ----------------------------------------------------------------------------- bad paths, seeds
def test_demo_never_replaces_the_working_directory_and_checks_before_any_work(tmp_path, capsys, monkeypatch):
    small = ["demo", "--batch", "2", "--tokens", "4", "--depth", "2"]
    empty, full = tmp_path / "empty", tmp_path / "full"
    empty.mkdir(), full.mkdir()
    (full / "keep.txt").write_text("x")
    for here in (empty, full):
        monkeypatch.chdir(here)
        before = sorted(p.name for p in here.iterdir())
        _fails(capsys, [*small, "--out", ""], r"--out is empty; give a path")
        _fails(capsys, [*small, "--out", "."], r"--out .*: is the working directory or one above it")
        _fails(capsys, [*small, "--out", ".."], r"is the working directory or one above it")
        assert sorted(p.name for p in here.iterdir()) == before and here.is_dir()
    monkeypatch.chdir(tmp_path)
    _fails(capsys, [*small, "--out", tmp_path / "full"], r"did not write \(keep.txt\)")   # refused before the work


PATH_CASES = [
    (["evaluate", "RUN", "--output", ""], r"--output is empty; give a path"),
    (["evaluate", ""], r"the run folder or weights file is empty; give a path"),
    (["predict", "RUN", "--file", ""], r"--file is empty; give a file name"),
    (["predict", "", "--text", "x"], r"the run folder or weights file is empty"),
    (["demo", "--seed", "-1"], r"--seed must be an integer in \[0, 2\*\*32 - 1\], got -1"),
    (["reproduce", "--quick", "--no-progress", "--seed", "-1"], r"--seed must be an integer in \[0, 2\*\*32 - 1\]"),
    (["reproduce", "--quick", "--no-progress", "--out", ""], r"--out is empty; give a path"),
    (["reproduce", "--quick", "--no-progress", "--out", "."], r"is the working directory or one above it"),
    (["probe", "--model", "minilm", "--seed", "-1"], r"seed must be an integer in \[0, 2\*\*32 - 1\], got -1"),
    (["probe", "--model", "minilm", "--out", ""], r"out is empty; give a path"),
    (["rho-study", "--quick", "--seed", "-1"], r"seed must be an integer in \[0, 2\*\*32 - 1\], got -1"),
    (["train", "--config", ""], r"--config is empty; give a path"),           # not "the defaults"
    (["evaluate", "RUN", "--split", ""], r"split '' of sst2 has no labels"),   # not "the config's split"
    (["evaluate", "RUN", "--data-dir", ""], r"data.data_dir is empty; give a path"),
    (["probe", "--model", "minilm", "--split", ""], r"split '' is not a split of sst2"),
    (["reproduce", "--quick", "--datasets", ""], r"--datasets '' names no data set"),
    (["rho-study", "--quick", "--datasets", ""], r"--datasets is empty"),
]


@pytest.mark.parametrize("argv, message", PATH_CASES, ids=[" ".join(a) for a, _ in PATH_CASES])
def test_bad_paths_and_seeds_are_one_line_errors(run_dir, tmp_path, capsys, monkeypatch, argv, message):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, [str(run_dir) if a == "RUN" else a for a in argv], message)
    assert list(tmp_path.iterdir()) == []                          # nothing written


def test_the_divergence_advice_names_the_clip_in_use(sst2_dir, tmp_path, capsys):
    argv = ["train", *SMALL, "--data.data_dir", sst2_dir, "--run.out_dir", tmp_path / "div", "--optim.lr", "1e30",
            "--optim.grad_clip", "0.5"]
    err = _fails(capsys, argv, r"training diverged at step \d+: .*; lower optim.lr \(now 1e\+30\) or optim.grad_clip "
                               r"\(now 0.5\)\n$")
    assert "set optim.grad_clip" not in err


# ----------------------------------------------------------------------------- IMDB without its test split
def _imdb_train_only(root: Path) -> Path:
    rng, buffer = random.Random(0), io.BytesIO()
    rows = synthetic_sentences(60, rng).splitlines()[1:]
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for i, row in enumerate(rows):
            text, label = row.rsplit("\t", 1)
            name = f"aclImdb/train/{'pos' if label == '1' else 'neg'}/{i}_{8 if label == '1' else 2}.txt"
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    (root / "aclImdb_v1.tar.gz").write_bytes(buffer.getvalue())
    return root


def test_an_imdb_archive_without_its_test_split_serves_train(tmp_path, capsys):
    data = _imdb_train_only(tmp_path)
    out = tmp_path / "run"
    argv = ["train", *SMALL, "--data.dataset", "imdb", "--data.eval_split", "train", "--data.data_dir", data,
            "--run.out_dir", out]
    # Evaluating on the training split measures nothing: refused since issue 39 (R4D), before any work.
    _fails(capsys, argv, r"data.train_split and data.eval_split are both 'train'")
    assert not out.exists()
    argv[argv.index("--data.eval_split") + 1] = "test"
    _fails(capsys, argv, r"aclImdb/test/neg/ is missing or has no reviews")


def test_probe_refuses_non_finite_energies_before_writing(sst2_dir, tmp_path, capsys, monkeypatch):
    """The wiring: a NaN per-sample energy (as a damaged model would give) stops the probe, nothing written."""
    from unfoldformer.probe import report
    real = report._per_sample

    def poisoned(result):
        values = real(result)
        values["own_in"] = values["own_in"].copy()
        values["own_in"][1, 0] = float("nan")
        return values

    monkeypatch.setattr(report, "_per_sample", poisoned)
    out = tmp_path / "probe"
    _fails(capsys, ["probe", "--model", "minilm", "--samples", "4", "--max-length", "16", "--data-dir", sst2_dir,
                    "--out", out], r"probe: per-sample energies: own_in\[1\]\[0\] is nan; a non-finite result is not")
    assert not out.exists() and list(tmp_path.iterdir()) == []
