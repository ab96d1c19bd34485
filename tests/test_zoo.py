"""The zoo: trained classifiers shipped in the package, listed by `unfoldformer zoo`, opened offline by name,
reproducing the exact count of correct predictions their cards record."""
import fnmatch
import json
import re
import tomllib

import pytest
import torch

import unfoldformer as uf
from conftest import REPO_ROOT
from unfoldformer.cli import main
from unfoldformer.data import load_dataset
from unfoldformer.data.batching import seeded_subset
from unfoldformer.train.checkpoint import table_sha256
from unfoldformer.zoo import REMOVED_MODELS, ZOO_DIR, card, names

SHIPPED = {"model.safetensors", "config.json", "README.md", "complete.json", "card.json", "card.md"}


def test_the_zoo_has_a_joint_certified_model_for_sst2_and_for_imdb():
    """'certified' is the joint layer (0.3.0): the zoo ships it, each model loading as that layer."""
    joint = {card(name)["data"]["dataset"] for name in names() if uf.load(name).model.encoder.config.layer == "joint"}
    assert {"sst2", "imdb"} <= joint


@pytest.mark.parametrize("old", sorted(REMOVED_MODELS))
def test_a_removed_zoo_models_name_is_refused_in_one_line_naming_its_replacement(old):
    assert old not in names() and REMOVED_MODELS[old] in names()
    with pytest.raises(uf.ConfigError) as err:
        uf.load(old)
    assert repr(REMOVED_MODELS[old]) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", names())
def test_each_model_is_small_holds_no_data_and_is_packaged(name):
    folder = ZOO_DIR / name
    files = {p.name for p in folder.iterdir()}
    assert files == SHIPPED                                      # weights, config, card: no data, no table
    assert sum(p.stat().st_size for p in folder.iterdir()) < 2_000_000
    patterns = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for f in files:
        assert any(fnmatch.fnmatch(f"zoo/{name}/{f}", pat) for pat in patterns["unfoldformer"]), f


@pytest.mark.parametrize("name", names())
def test_each_card_says_data_recipe_accuracy_energies_and_commit(name):
    c = card(name)
    assert re.fullmatch(r"[0-9a-f]{40}", c["commit"])
    assert c["recipe"]["command"].startswith("unfoldformer train ") and c["data"]["dataset"] in c["recipe"]["command"]
    assert 0.5 < c["run"]["accuracy"] <= 1 and c["subset"]["correct"] <= c["subset"]["examples"]
    curve = c["subset"]["energy"]["mean_per_token_curve"]
    assert len(curve) == uf.load(name).model.encoder.config.depth + 1
    md = (ZOO_DIR / name / "card.md").read_text()
    assert c["commit"] in md and f"{c['subset']['correct']} / {c['subset']['examples']}" in md


def test_the_zoo_command_lists_name_data_accuracy_and_size(capsys):
    assert main(["zoo"]) == 0
    out = capsys.readouterr().out
    for name in names():
        c = card(name)
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert c["data"]["dataset"] in line and f"{c['run']['accuracy']:.4f}" in line and "KiB" in line
    assert main(["zoo", "--json"]) == 0
    assert [c["name"] for c in json.loads(capsys.readouterr().out)] == names()


@pytest.mark.parametrize("name", names())
def test_each_model_loads_offline_with_its_table_rebuilt(name, monkeypatch):
    monkeypatch.delenv("UNFOLDFORMER_DATA", raising=False)       # a MiniLM model needs no data to load
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    predictor = uf.load(name)
    assert predictor.integrity == "verified"
    assert table_sha256(predictor.model.embedding.weight) == card(name)["data"]["embedding_sha256"]
    assert predictor(["a gripping , beautiful film"])[0].label in (0, 1)


def _slow_for(name):
    return [pytest.mark.slow] if card(name)["data"]["dataset"] == "imdb" else []


@pytest.mark.parametrize("name", [pytest.param(n, marks=_slow_for(n)) for n in names()])
def test_each_model_reproduces_its_cards_count_of_correct_predictions(name, data_dir):
    """The exact count on the card's subset. The argmax can only flip where two logits lie within the
    forward's round-off: float32 through 6 layers of n ≤ 256 tokens, |logits| = O(1), gives errors of
    order depth · n · eps32 ≈ 2e-4 at most, and the card's smallest logit gap (checked here) is larger."""
    c = card(name)
    s = c["subset"]
    assert s["min_logit_gap"] > 1e-3
    examples = load_dataset(c["data"]["dataset"], s["split"], data_dir)
    idx = seeded_subset(len(examples), s["examples"])
    assert [int(i) for i in idx[:5]] == s["indices_head"]
    subset = [examples[int(i)] for i in idx]
    with torch.inference_mode():
        preds = uf.load(name)([e.text for e in subset], energies=False)
    assert sum(p.label == e.label for p, e in zip(preds, subset)) == s["correct"]


@pytest.mark.parametrize("name", names())
def test_each_models_kind_is_read_with_the_names_of_the_version_that_wrote_it(name):
    """A card records the kind under the names of the version that built it; before 0.3.0 `certified-tied`
    was the alternating layer, and the model must still load as that layer."""
    from unfoldformer.names import KINDS_BEFORE_0_3, NAMES_VERSION
    c = card(name)
    kind = c["model"]["kind"]
    if tuple(int(v) for v in c["library_version"].split(".")[:3]) < NAMES_VERSION:
        kind = KINDS_BEFORE_0_3.get(kind, kind)
    predictor = uf.load(name)
    assert predictor.config.model.kind == kind
    joint = kind in ("certified", "certified-untied")
    assert predictor.model.encoder.config.layer == ("joint" if joint else "alternating")
