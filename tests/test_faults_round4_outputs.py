"""Round 4, outputs never overwrite inputs: `evaluate --output` refuses the checkpoint itself and any
path in the run folder, before any work, leaving the run's files as they were."""
from __future__ import annotations

import pytest

from unfoldformer import cli


@pytest.fixture()
def run(tmp_path):
    """A run folder's shape (its files are never read: the refusal comes first)."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "best.safetensors").write_bytes(b"weights")
    return folder


@pytest.mark.parametrize("source, target, message", [
    ("run", "run/best.safetensors", "lies in the run folder"),
    ("run/best.safetensors", "run/best.safetensors", "is the checkpoint itself"),
    ("run", "run/config.json", "lies in the run folder"),
    ("run", "run/new-result.json", "lies in the run folder"),
    ("run/best.safetensors", "run/../run/best.safetensors", "is the checkpoint itself"),
], ids=["weights", "same-file", "config", "new-file", "dotdot"])
def test_evaluate_output_never_lands_on_the_run(run, capsys, source, target, message):
    base = run.parent
    code = cli.main(["evaluate", str(base / source), "--output", str(base / target)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert (run / "best.safetensors").read_bytes() == b"weights" and (run / "config.json").read_text() == "{}"
    assert not (run / "new-result.json").exists()


def test_evaluate_output_beside_a_loose_checkpoint_is_refused_when_it_is_the_file(tmp_path, capsys):
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"weights")
    code = cli.main(["evaluate", str(weights), "--output", str(weights)])
    assert code == 2 and "is the checkpoint itself" in capsys.readouterr().err
    assert weights.read_bytes() == b"weights"
