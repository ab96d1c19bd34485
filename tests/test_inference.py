"""`unfoldformer.load` and `unfoldformer predict`: a trained classifier used without the training code,
including weights and checkpoints written by version 0.1.0."""
import json
import shutil

import pytest
import torch

import unfoldformer as uf
from conftest import FIXTURES, TINY_TRAIN, close_tol
from unfoldformer.cli import main
from unfoldformer.errors import UnverifiedFileWarning
from unfoldformer.train import TrainConfig, load_classifier, train
from unfoldformer.train.checkpoint import load_train_state, load_weights

OLD = FIXTURES / "v0.1.0"


@pytest.fixture(scope="module")
def run_dir(sst2_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("predict") / "run"
    cfg = TrainConfig().with_overrides([*TINY_TRAIN, "--data.data_dir", str(sst2_dir), "--run.out_dir", str(out),
                                        "--model.ffn_hidden", "32", "--optim.epochs", "2"])
    train(cfg)
    return out


def test_load_predicts_like_the_trained_model(run_dir):
    predictor = uf.load(run_dir)
    texts = ["a good film , great", "bad and dull", ""]
    preds = predictor(texts)
    assert [p.text for p in preds] == texts and all(len(p.probabilities) == 2 for p in preds)
    assert all(abs(sum(p.probabilities) - 1) <= close_tol(torch.float64) for p in preds)
    assert preds[2].tokens == 1                                      # an empty text reads one pad token
    assert all(len(p.energies) == 3 and p.never_rises is not None for p in preds)
    loaded = load_classifier(run_dir)                                 # the same weights, by hand
    enc = loaded.embeddings.encode(texts[:2], loaded.config.data.max_length)
    logits, _ = loaded.model(enc.ids, enc.padding_mask)
    probs = torch.softmax(logits.double(), -1)
    assert torch.allclose(probs, torch.tensor([p.probabilities for p in preds[:2]], dtype=torch.float64))
    guarded = predictor(texts[:2], safeguard=True)
    assert all(p.never_rises for p in guarded)
    with pytest.raises(TypeError, match="list of texts"):
        predictor("one string")


def test_a_minilm_model_loads_where_its_training_data_is_absent(sst2_dir, tmp_path, monkeypatch):
    """A model on the MiniLM table (a vocabulary that does not come from the data) opens and predicts on
    a machine without the data it was trained on: only data-built vocabularies need the data."""
    data = tmp_path / "data"
    shutil.copytree(sst2_dir, data)
    monkeypatch.setenv("UNFOLDFORMER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    cfg = TrainConfig().with_overrides([*TINY_TRAIN, "--data.embeddings", "minilm", "--data.data_dir", str(data),
                                        "--data.max_train_examples", "64", "--data.max_eval_examples", "16",
                                        "--model.depth", "1", "--optim.epochs", "1", "--run.out_dir", str(out)])
    train(cfg)
    before = [p.probabilities for p in uf.load(out)(["a good film", "bad and dull"])]
    shutil.rmtree(data)
    monkeypatch.delenv("UNFOLDFORMER_DATA", raising=False)
    after = [p.probabilities for p in uf.load(out)(["a good film", "bad and dull"])]
    assert after == before


def test_predict_command_prints_labels_probabilities_and_curves(run_dir, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("superb and lovely\n\nawful , boring plot\n")
    assert main(["predict", str(run_dir), "--text", "great fun", "--file", str(texts), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["text"] for r in rows] == ["great fun", "superb and lovely", "awful , boring plot"]
    assert all(r["label_name"] in ("negative", "positive") and len(r["energies"]) == 3 for r in rows)
    assert main(["predict", str(run_dir), "--text", "great fun"]) == 0
    header, line = capsys.readouterr().out.strip().splitlines()
    assert header.startswith("classes: negative, positive")
    assert line.split()[0] in ("negative", "positive") and "E/n:" in line and "great fun" in line


def test_predict_gives_a_joint_models_curve_that_never_rises(sst2_dir, tmp_path, capsys):
    """A trained certified model (THEORY §3.7): `predict` prints its curve, which never rises without the
    safeguard, and agrees with the model's own forward."""
    out = tmp_path / "joint"
    cfg = TrainConfig().with_overrides([*TINY_TRAIN, "--data.data_dir", str(sst2_dir), "--run.out_dir", str(out),
                                        "--model.kind", "certified", "--model.ffn_hidden", "32"])
    train(cfg)
    texts = ["a good film , great", "bad and dull", "an utterly , utterly boring plot"]
    preds = uf.load(out)(texts)
    assert all(p.never_rises and len(p.energies) == cfg.model.encoder_config().depth + 1 for p in preds)
    assert main(["predict", str(out), "--text", texts[0], "--json"]) == 0
    # the same text alone (padding to another batch's length changes float32 round-off on some CPUs' kernels)
    [alone] = uf.load(out)([texts[0]])
    assert json.loads(capsys.readouterr().out)[0]["energies"] == alone.energies
    assert alone.never_rises


@pytest.mark.parametrize("args, message", [
    ([], "no texts"),
    (["--file", "/nonexistent/texts.txt"], "cannot read it"),
])
def test_predict_command_bad_input(run_dir, capsys, args, message):
    assert main(["predict", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("unfoldformer predict: error:") and message in err and "Traceback" not in err


def test_predict_on_a_missing_run_is_a_one_line_error(tmp_path, capsys):
    assert main(["predict", str(tmp_path / "nothing"), "--text", "x"]) == 2
    assert "no such weights file" in capsys.readouterr().err


@pytest.mark.parametrize("folder, kind", [("certified-tied", "certified-alternating"), ("paper", "paper"),
                                          ("standard", "standard")])
def test_weights_written_by_version_0_1_0_load_and_predict_the_same(folder, kind, tmp_path):
    """Files written by the code of version 0.1.0 (tests/fixtures/v0.1.0, with the logits it computed
    on fixed ids): the weights load into today's model and give the same logits; the kind 0.1.0 called
    `certified-tied` is read as the alternating layer it was."""
    with pytest.warns(UnverifiedFileWarning, match="without checksums"):   # 0.1.0 wrote none
        state, cfg, info = load_weights(OLD / folder / "best.safetensors", trust_unverified=True)
    assert info["integrity"].startswith("unverified")
    cfg = cfg.replace(data__data_dir=str(tmp_path / "data"))
    shutil.copytree(OLD / "data", tmp_path / "data")
    with pytest.warns(UnverifiedFileWarning):
        loaded = load_classifier(OLD / folder / "best.safetensors", data_dir=tmp_path / "data", trust_unverified=True)
    assert loaded.info["integrity"].startswith("unverified")
    expected = json.loads((OLD / folder / "expected_logits.json").read_text())
    ids = torch.tensor(expected["ids"])
    with torch.no_grad():      # version 0.1.0 ran the certified preset's safeguard in eval mode
        logits, _ = loaded.model(ids, ids == 0, safeguard=kind == "certified-alternating")
    # the same float32 computation, possibly on another CPU: round-off of the logits' size
    want = torch.tensor(expected["logits"])
    assert (logits - want).abs().max() <= close_tol(torch.float32, 1 + want.abs().max())
    assert loaded.config.model.kind == kind and cfg.model_config().d_model == 16


def test_checkpoint_written_by_version_0_1_0_still_reads():
    with pytest.warns(UnverifiedFileWarning, match="checkpoint.pt: written by version 0.1.0 without checksums"):
        state = load_train_state(OLD / "certified-tied" / "checkpoint.pt", trust_unverified=True)
    assert state["integrity"].startswith("unverified")
    cfg = TrainConfig.from_dict(state["config"])
    assert cfg.model.kind == "certified-alternating" and state["progress"]["finished"] is True
    assert cfg.model_config().depth == 2
