"""Round 4, tracebacks become one-line errors (exit status 2; in Python a documented exception type):
the Predictor's texts, closed pipes, a damaged metrics.csv, a full disk, symbolic links as outputs, a
damaged zoo card, wrong-shaped or pickled weights, the layer API's arguments."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import unfoldformer as uf
from conftest import resign_model_folder
from unfoldformer import cli
from unfoldformer.errors import UnfoldformerError

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--data.embeddings", "random", "--data.embedding_dim", "16", "--model.d_model", "16", "--model.n_heads",
         "2", "--model.depth", "2", "--optim.batch_size", "16", "--run.threads", "1", "--run.progress", "false"]


def _one_line_exit_2(capsys, argv, message):
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"unfoldformer {argv[0]}: error: ") and err.count("\n") == 1, err
    assert message in err, err
    return err


# ----------------------------------------------------------------------------- the Predictor's texts
@pytest.fixture(scope="module")
def predictor():
    return uf.load("sst2-certified")


@pytest.mark.parametrize("texts, message", [([5], "item 0 is int"), (None, "got NoneType"), (b"a film", "got bytes"),
                                            (bytearray(b"x"), "got bytearray"), (["fine", None], "item 1 is NoneType"),
                                            ({"a": 1}, "got dict"), (3.5, "got float")],
                         ids=["int-item", "None", "bytes", "bytearray", "None-item", "dict", "float"])
def test_predictor_refuses_what_is_not_texts(predictor, texts, message):
    with pytest.raises(TypeError, match=message) as info:
        predictor(texts)
    assert "\n" not in str(info.value)


def test_predictor_takes_a_generator_like_a_list(predictor):
    texts = ["a fine film", "a dull film"]
    assert [p.label for p in predictor(t for t in texts)] == [p.label for p in predictor(texts)]


# ----------------------------------------------------------------------------- closed pipes
def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    env.pop("PYTHONWARNINGS", None)
    return env


@pytest.mark.parametrize("argv", [["zoo"], ["zoo", "--json"], ["presets"]], ids=" ".join)
def test_a_closed_pipe_ends_quietly(argv):
    read_end, write_end = os.pipe()
    os.close(read_end)                                         # the reader is gone: the first write fails
    try:
        done = subprocess.run([sys.executable, "-m", "unfoldformer", *argv], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, env=_env(), timeout=120)
    finally:
        os.close(write_end)
    assert done.stderr == "" and done.returncode == 141, done.stderr


def test_broken_pipe_in_process_is_quiet(monkeypatch, capsys):
    from unfoldformer.cli import presets
    monkeypatch.setattr(presets, "run", lambda args: (_ for _ in ()).throw(BrokenPipeError(errno.EPIPE, "pipe")))
    assert cli.main(["presets"]) == 141
    assert capsys.readouterr().err == ""


# ----------------------------------------------------------------------------- plot on a damaged metrics.csv
HEADER = "row,step,epoch,loss,lr,grad_norm\n"


@pytest.mark.parametrize("body, message", [
    ("step,1,0.1,0.7,0.001,1.0\nstep,2,0.2,abc,0.001,1.0\n", "row 2, column 'loss': 'abc' is not a number"),
    ("step,1,0.1,0.7,0.001,1.0,9,9\n", "row 1: damaged (its number of fields"),
    ("step,1,0.1,0.7\n", "row 1: damaged (its number of fields"),
    ("step,,0.1,0.7,0.001,1.0\n", "row 1: damaged (no step)"),
], ids=["not-a-number", "extra-fields", "missing-fields", "no-step"])
def test_plot_on_a_damaged_metrics_csv_is_one_line(tmp_path, capsys, body, message):
    (tmp_path / "metrics.csv").write_text(HEADER + body)
    _one_line_exit_2(capsys, ["plot", tmp_path], message)


def test_plot_on_metrics_csv_with_bad_bytes_is_one_line(tmp_path, capsys):
    (tmp_path / "metrics.csv").write_bytes(HEADER.encode() + b"step,1,0.1,\xff\xfe,0.001,1.0\n")
    _one_line_exit_2(capsys, ["plot", tmp_path], "metrics.csv: damaged")


def test_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    from unfoldformer.train import figures
    (tmp_path / "metrics.csv").write_text(HEADER + "step,1,0.1,0.7,0.001,1.0\neval,1,0.1,,,\n")

    def full(*args, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "loss.png"))
    monkeypatch.setattr(figures, "save_figure", full)
    _one_line_exit_2(capsys, ["plot", tmp_path], f"{tmp_path / 'loss.png'}: No space left on device")


# ----------------------------------------------------------------------------- symbolic links as outputs
def test_a_symlink_loop_as_out_dir_is_one_line(tmp_path, capsys):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    _one_line_exit_2(capsys, ["train", *SMALL, "--run.out_dir", tmp_path / "loop"], "a symbolic link that loops")


def test_a_dangling_symlink_as_out_dir_is_one_line(tmp_path, capsys):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "run")
    _one_line_exit_2(capsys, ["train", *SMALL, "--run.out_dir", tmp_path / "dangling"], "which does not exist")
    assert not (tmp_path / "nowhere").exists()


def test_plot_on_a_symlink_loop_is_one_line(tmp_path, capsys):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    _one_line_exit_2(capsys, ["plot", tmp_path / "loop"], "a symbolic link that loops")


# ----------------------------------------------------------------------------- a damaged zoo card
@pytest.mark.parametrize("card, message", [("{not json", "damaged zoo card"),
                                           (json.dumps({"name": "x", "data": {}}), "damaged zoo card (no 'dataset')"),
                                           (json.dumps([1, 2]), "damaged zoo card")], ids=["syntax", "key", "list"])
@pytest.mark.parametrize("argv", [["zoo"], ["zoo", "--json"]], ids=" ".join)
def test_a_damaged_zoo_card_is_one_line(tmp_path, capsys, monkeypatch, card, message, argv):
    import unfoldformer.zoo as zoo
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "card.json").write_text(card)
    monkeypatch.setattr(zoo, "ZOO_DIR", tmp_path)
    _one_line_exit_2(capsys, argv, message)


# ----------------------------------------------------------------------------- weights
def test_a_wrong_shaped_pretrained_tensor_is_one_line(tmp_path):
    from safetensors.torch import load_file
    folder = uf.CertifiedEncoderLayer(16, 2, 32).save_pretrained(tmp_path / "m") or tmp_path / "m"
    tensors = load_file(folder / "model.safetensors")
    name = next(k for k, v in sorted(tensors.items()) if v.ndim == 2)
    tensors[name] = torch.zeros(3, 5)
    resign_model_folder(folder, tensors)
    with pytest.raises(UnfoldformerError, match=rf"tensor '{name}' has shape \(3, 5\), the model's") as info:
        uf.CertifiedEncoderLayer.from_pretrained(folder)
    assert "\n" not in str(info.value)


class _Payload:
    """A class torch's weights-only loader refuses to rebuild."""


def test_a_pickled_checkpoint_is_refused_without_unsafe_advice(tmp_path):
    from unfoldformer.train.checkpoint import load_train_state
    torch.save({"format": "x", "payload": _Payload()}, tmp_path / "train_state.pt")
    with pytest.raises(UnfoldformerError, match="Python objects beyond tensors") as info:
        load_train_state(tmp_path / "train_state.pt")
    assert "weights_only=False" not in str(info.value) and "\n" not in str(info.value)


def test_a_pickled_word_table_is_refused_without_unsafe_advice(tmp_path):
    from unfoldformer.data.embeddings import _word_table
    torch.save({"word_embeddings.weight": torch.zeros(3, 2), "payload": _Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UnfoldformerError, match="Python objects beyond tensors") as info:
        _word_table(tmp_path / "pytorch_model.bin")
    assert "weights_only=False" not in str(info.value) and "\n" not in str(info.value)


# ----------------------------------------------------------------------------- the layer API
@pytest.mark.parametrize("args", [(None, 2, 16), (16, None, 16), (16.0, 2, 16), (True, 2, 16)],
                         ids=["d_model-None", "nhead-None", "d_model-float", "d_model-bool"])
def test_layer_without_a_width_is_refused(args):
    with pytest.raises(uf.ConfigError, match="must be an integer >= 1") as info:
        uf.CertifiedEncoderLayer(*args)
    assert "\n" not in str(info.value)


def test_layer_dim_feedforward_none_is_the_documented_default():
    assert uf.CertifiedEncoderLayer(16, 2, None).config.ffn_hidden == 2048 == \
        uf.CertifiedEncoderLayer(16, 2).config.ffn_hidden
