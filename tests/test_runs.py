"""Run-folder helpers: the folder lock, staged (whole-or-absent) outputs, settings checked before work."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from unfoldformer.errors import ConfigError, OutputError
from unfoldformer.runs import (
    MANIFEST_NAME,
    check_at_least,
    check_device,
    check_output_location,
    config_sha256,
    folder_lock,
    staged_output,
)
from unfoldformer.utils import file_sha256


def siblings(folder):
    """Hidden entries beside `folder` (lock files, temporary and old folders of its runs)."""
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


# ----------------------------------------------------------------------------- lock
def test_lock_excludes_a_second_holder_and_is_removed_on_exit(tmp_path):
    out = tmp_path / "run"
    with folder_lock(out, "train"):
        assert siblings(out) == [".run.lock"]
        holder = json.loads((tmp_path / ".run.lock").read_text())
        assert holder["pid"] == os.getpid() and holder["command"] == "train"
        with pytest.raises(OutputError, match=rf"in use by another run \(pid {os.getpid()} .*`unfoldformer train`"):
            with folder_lock(tmp_path / "x" / ".." / "run", "reproduce"):    # the same folder, spelled otherwise
                pass
    assert siblings(out) == [] and not (tmp_path / "x").exists()
    with folder_lock(out, "train"):                                # free again
        pass


def test_lock_held_by_another_process_and_stale_after_it_dies(tmp_path, capsys):
    out = tmp_path / "run"
    code = ("import sys, time; from unfoldformer.runs import folder_lock\n"
            f"with folder_lock({str(out)!r}, 'train'):\n    print('held', flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(OutputError, match=f"pid {proc.pid}"):
            with folder_lock(out, "train"):
                pass
    finally:
        proc.kill()
        proc.wait()
    assert siblings(out) == [".run.lock"]                            # a killed holder leaves its lock file
    with folder_lock(out, "train"):                                # ... which is stale: taken over, with a note
        pass
    assert f"stale lock {tmp_path / '.run.lock'} (pid {proc.pid}" in capsys.readouterr().err
    assert siblings(out) == []


# ----------------------------------------------------------------------------- staged outputs
def test_staged_output_is_whole_with_a_manifest(tmp_path):
    out = tmp_path / "report"
    with staged_output(out, "demo", {"seed": 1}) as stage:
        assert stage != out and not out.exists()                   # nothing visible while it is built
        (stage / "a.txt").write_text("alpha")
        (stage / "sub").mkdir()
        (stage / "sub" / "b.bin").write_bytes(b"\0\1")
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["command"] == "demo" and manifest["config_sha256"] == config_sha256({"seed": 1})
    assert manifest["files"] == {"a.txt": {"bytes": 5, "sha256": file_sha256(out / "a.txt")},
                                 "sub/b.bin": {"bytes": 2, "sha256": file_sha256(out / "sub" / "b.bin")}}
    assert siblings(out) == []


def test_a_failed_run_leaves_the_earlier_output_untouched(tmp_path):
    out = tmp_path / "report"
    with staged_output(out, "demo", {}) as stage:
        (stage / "old.txt").write_text("first run")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(RuntimeError, match="boom"):
        with staged_output(out, "demo", {}) as stage:
            (stage / "new.txt").write_text("half")
            raise RuntimeError("boom")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and siblings(out) == []
    with staged_output(out, "demo", {}) as stage:                  # a narrower rerun replaces it whole
        (stage / "new.txt").write_text("second run")
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_NAME, "new.txt"]


def test_staged_output_refuses_a_folder_of_other_files(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    with pytest.raises(OutputError, match=r"did not write \(thesis.tex\)"):
        with staged_output(out, "demo", {}, owned=lambda n: n == "demo.json"):
            raise AssertionError("not reached: refused before any work")
    assert (out / "thesis.tex").read_text() == "precious" and siblings(out) == []
    (out / "thesis.tex").unlink()
    (out / "demo.json").write_text("{}")                           # an earlier output by name: replaceable
    with staged_output(out, "demo", {}, owned=lambda n: n == "demo.json") as stage:
        (stage / "demo.json").write_text("[]")
    assert (out / "demo.json").read_text() == "[]"


def test_leftovers_of_a_killed_run_are_cleaned_and_a_mid_swap_output_restored(tmp_path):
    out = tmp_path / "report"
    (tmp_path / ".report.tmp-dead").mkdir()                        # a half-built output
    old = tmp_path / ".report.old-dead"                            # an earlier output moved aside
    old.mkdir()
    (old / "kept.txt").write_text("earlier")
    with pytest.raises(OutputError, match="did not write"):        # restored first, then judged (not ours)
        with staged_output(out, "demo", {}):
            pass
    assert (out / "kept.txt").read_text() == "earlier" and siblings(out) == []


# ----------------------------------------------------------------------------- checks before work
def test_output_location_checks(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputError, match="--out .*afile: exists and is a file"):
        check_output_location("--out", afile)
    with pytest.raises(OutputError, match="is a file, so no folder can be made under it"):
        check_output_location("--out", afile / "deeper" / "run")
    with pytest.raises(OutputError, match="is a folder; give a file name"):
        check_output_location("--output", tmp_path, folder=False)
    assert check_output_location("--out", tmp_path / "new" / "run") == tmp_path / "new" / "run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]          # the probe file is gone
    if os.geteuid() != 0:                                          # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(OutputError, match="cannot write in"):
            check_output_location("--out", ro / "run")


@pytest.mark.parametrize("value, ok", [(1, True), (7, True), (0, False), (-3, False), (True, False), (2.0, False),
                                       ("3", False)])
def test_check_at_least(value, ok):
    if ok:
        check_at_least("--batch", value)
    else:
        with pytest.raises(ConfigError, match=rf"--batch must be an integer >= 1, got {value!r}"):
            check_at_least("--batch", value)
    check_at_least("--batch", None, optional=True)


def test_check_device():
    check_device("--device", "cpu")
    with pytest.raises(ConfigError, match="--device='tpu' is not a device name"):
        check_device("--device", "tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="sees no CUDA device"):
            check_device("--device", "cuda")
    else:
        with pytest.raises(ConfigError, match="CUDA device"):
            check_device("--device", f"cuda:{torch.cuda.device_count()}")
