"""One folder format (`unfoldformer.persist`): folders of release 0.2.0 still load and compute what that release
computed; today's model folders carry a card and a manifest, and a changed or half-written one is refused."""
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import unfoldformer as uf
from conftest import FIXTURES, close_tol, needs_the_fixtures_normals
from unfoldformer.errors import PretrainedError
from unfoldformer.persist.folder import CARD_FILE, CONFIG_FILE, WEIGHTS_FILE
from unfoldformer.persist.manifest import MANIFEST_NAME

OLD = FIXTURES / "v0.2.0"                   # written by release 0.2.0 (tests/fixtures/v0.2.0/make_fixtures.py)
EXPECTED = json.loads((OLD / "expected.json").read_text())


@pytest.fixture
def old(tmp_path):
    """A copy of the 0.2.0 fixtures with the data their random embedding table is built from."""
    shutil.copytree(OLD, tmp_path / "old")
    shutil.copytree(FIXTURES / "v0.1.0" / "data", tmp_path / "data")
    return tmp_path


def _logits(predictor) -> torch.Tensor:
    ids = torch.tensor(EXPECTED["ids"])
    with torch.no_grad():
        return predictor.model(ids, ids == 0)[0]


def _assert_logits_as_0_2_0(predictor) -> None:
    want = torch.tensor(EXPECTED["logits"])
    # the same float32 computation, possibly on another CPU: round-off of the logits' size
    assert (_logits(predictor) - want).abs().max() <= close_tol(torch.float32, 1 + want.abs().max())


@needs_the_fixtures_normals
@pytest.mark.parametrize("folder", ["run", "predictor"])
def test_a_0_2_0_run_or_pretrained_classifier_loads_and_predicts_as_it_did(old, folder):
    predictor = uf.load(old / "old" / folder, data_dir=old / "data")
    assert predictor.integrity == "verified" and predictor.config.model.kind == "certified-alternating"
    _assert_logits_as_0_2_0(predictor)


def test_a_0_2_0_pretrained_encoder_loads_bitwise_and_computes_as_it_did(old):
    folder = old / "old" / "encoder"
    model = uf.UnfoldedTransformer.from_pretrained(folder)
    stored = load_file(str(folder / WEIGHTS_FILE))                  # read by safetensors itself
    assert stored.keys() == model.state_dict().keys()
    assert all(torch.equal(stored[k], v) for k, v in model.state_dict().items())
    x, pad = torch.tensor(EXPECTED["x"]), torch.tensor(EXPECTED["padding_mask"])
    with torch.no_grad():
        out = model(x, pad, return_energies=True)
    want_h, want_e = torch.tensor(EXPECTED["hidden"]), torch.tensor(EXPECTED["energies"])
    assert (out.hidden - want_h).abs().max() <= close_tol(torch.float32, 1 + want_h.abs().max())
    assert (out.energies - want_e).abs().max() <= close_tol(torch.float32, 1 + want_e.abs().max())


def test_a_changed_0_2_0_folder_is_refused_as_it_was(old):
    weights = old / "old" / "encoder" / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(PretrainedError, match="corrupt: its sha256 differs from the one in config.json"):
        uf.UnfoldedTransformer.from_pretrained(weights.parent)


def test_a_folder_of_an_unknown_version_is_refused_with_an_upgrade_hint(old):
    config = old / "old" / "encoder" / CONFIG_FILE
    config.write_text(json.dumps({**json.loads(config.read_text()), "version": 3}))
    for opener in (uf.UnfoldedTransformer.from_pretrained, uf.from_pretrained):
        with pytest.raises(PretrainedError) as err:
            opener(config.parent)
        assert "\n" not in str(err.value) and "version 3" in str(err.value) and "pip install -U" in str(err.value)


def _saved(tmp_path, preset="certified", **fields):
    torch.manual_seed(0)
    cfg = uf.ModelConfig.preset(preset, d_model=8, n_heads=2, depth=2, **fields)
    model = uf.StandardTransformer(cfg) if preset == "standard" else uf.UnfoldedTransformer(cfg)
    return model.save_pretrained(tmp_path / f"my-{preset}")


def _front_matter(card: str) -> dict[str, str]:
    head = card.split("---\n")[1]                                  # between the two --- lines
    return dict(line.split(": ", 1) for line in head.splitlines() if ": " in line)


@pytest.mark.parametrize("preset, says", [
    ("certified", "curve E(Y⁽⁰⁾), …, E(Y⁽ᵀ⁾) never rises"),
    ("certified-alternating", "a whole layer can still raise it, unless `safeguard=True`"),
    ("standard", "No certified descent"),
])
def test_save_pretrained_writes_a_card_that_says_what_is_certified(tmp_path, preset, says):
    folder = _saved(tmp_path, preset)
    card = (folder / CARD_FILE).read_text()
    front = _front_matter(card)
    assert card.startswith("---\n") and front["library_name"] == "unfoldformer" and front["license"] == "mit"
    assert "- unfoldformer" in card.split("---\n")[1]               # a tag
    assert says in card and f'uf.{"Standard" if preset == "standard" else "Unfolded"}' in card
    assert f'from_pretrained("my-{preset}")' in card


def test_an_untied_joint_model_is_not_said_to_have_one_curve(tmp_path):
    card = (_saved(tmp_path, "certified", tied=False) / CARD_FILE).read_text()
    assert "E_ℓ(Y⁽ℓ⁾) ≤ E_ℓ(Y⁽ℓ⁻¹⁾)" in card and "never rises" not in card


def test_the_manifest_pins_the_card_config_and_weights(tmp_path):
    folder = _saved(tmp_path)
    pinned = json.loads((folder / MANIFEST_NAME).read_text())["files"]
    assert sorted(pinned) == [CARD_FILE, CONFIG_FILE, WEIGHTS_FILE]
    (folder / CARD_FILE).write_text((folder / CARD_FILE).read_text() + "\nedited\n")
    with pytest.raises(PretrainedError, match=r"README.md: has \d+ bytes, \d+ when it was saved"):
        uf.UnfoldedTransformer.from_pretrained(folder)


def test_a_folder_without_its_manifest_is_refused(tmp_path):
    folder = _saved(tmp_path)
    (folder / MANIFEST_NAME).unlink()                               # as a save stopped before its last file
    with pytest.raises(PretrainedError, match="no complete.json: the folder was not saved whole"):
        uf.UnfoldedTransformer.from_pretrained(folder)


@needs_the_fixtures_normals
def test_a_saved_classifier_keeps_its_label_names_and_its_card_says_its_data(old):
    predictor = uf.load(old / "old" / "run", data_dir=old / "data")
    predictor.label_names = ("bad", "good")
    folder = predictor.save_pretrained(old / "mine")
    again = uf.load(folder, data_dir=old / "data")
    assert again.label_names == ("bad", "good") and again.integrity == "verified"
    _assert_logits_as_0_2_0(again)
    card = (folder / CARD_FILE).read_text()
    assert _front_matter(card)["pipeline_tag"] == "text-classification" and "- stanfordnlp/sst2" in card
    assert 'uf.load("mine")' in card
