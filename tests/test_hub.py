"""`save_pretrained` / `from_pretrained`: every model kind round-trips bitwise; a damaged folder is refused."""
import json

import pytest
import torch

import unfoldformer as uf
from conftest import D64, default_dtype, random_inputs, small_config
from unfoldformer import hub
from unfoldformer.config import ModelConfig


def _encoders():
    yield "certified", lambda: uf.UnfoldedTransformer(small_config("certified"))
    yield "certified-untied", lambda: uf.UnfoldedTransformer(small_config("certified", tied=False))
    yield "certified-alternating", lambda: uf.UnfoldedTransformer(small_config("certified-alternating"))
    yield "certified-alternating-untied", lambda: uf.UnfoldedTransformer(small_config("certified-alternating",
                                                                                      tied=False))
    yield "paper", lambda: uf.UnfoldedTransformer(small_config("paper"))
    yield "standard", lambda: uf.StandardTransformer(small_config("standard"))
    yield "energy-transformer", lambda: uf.EnergyTransformer(ModelConfig.preset("energy-transformer", d_model=8,
                                                                                n_heads=2, depth=3, ffn_hidden=16))
    yield "crate", lambda: uf.Crate(ModelConfig.preset("crate", d_model=8, n_heads=2, depth=3))
    yield "layer", lambda: uf.CertifiedEncoderLayer(8, 2, 16)
    yield "encoder-untied", lambda: uf.CertifiedEncoder(uf.CertifiedEncoderLayer(8, 2, 16), 3, tied=False)


ENCODERS = dict(_encoders())


def _trained_like(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Perturb every parameter, so the test cannot pass on freshly initialised values alone."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def _assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype and torch.equal(sa[key], sb[key]), key


def _outputs(model, x, pad):
    """(hidden, energy curve or None) of any encoder kind, without autograd."""
    with torch.no_grad():
        if isinstance(model, (uf.CertifiedEncoder, uf.CertifiedEncoderLayer)):
            out = model(x, src_key_padding_mask=pad, return_energies=True)
        elif isinstance(model, (uf.StandardTransformer, uf.Crate)):   # no energy curve
            out = model(x, pad)
        else:
            out = model(x, pad, return_energies=True)
    return out.hidden, out.energies


@pytest.mark.parametrize("kind", list(ENCODERS))
def test_every_encoder_round_trips_bitwise(kind, tmp_path):
    torch.manual_seed(0)
    with default_dtype(D64):
        model = _trained_like(ENCODERS[kind](), seed=1)
    again = type(model).from_pretrained(model.save_pretrained(tmp_path / kind))
    assert type(again) is type(model) and not again.training
    _assert_same_state(model, again)
    x, pad = random_inputs(B=3, n=7, d=8)
    (h, e), (h2, e2) = _outputs(model, x, pad), _outputs(again, x, pad)
    assert torch.equal(h, h2)
    if isinstance(model, (uf.StandardTransformer, uf.Crate)):
        assert e is None and e2 is None
    else:
        assert torch.equal(e, e2)
    assert type(hub.PretrainedMixin.from_pretrained(tmp_path / kind)) is type(model)   # by the folder's class


def test_the_classifier_round_trips_bitwise_with_its_embedding_table(tmp_path):
    torch.manual_seed(0)
    table = torch.randn(20, 6)
    model = _trained_like(uf.SequenceClassifier(uf.UnfoldedTransformer(small_config("certified-alternating")), table, 8,
                                                n_classes=3, pad_id=0), seed=2)
    again = uf.SequenceClassifier.from_pretrained(model.save_pretrained(tmp_path / "clf"))
    _assert_same_state(model, again)
    assert again.embedding.padding_idx == 0 and not again.embedding.weight.requires_grad
    ids = torch.randint(1, 20, (4, 9))
    pad = torch.zeros(4, 9, dtype=torch.bool)
    pad[2, 4:] = True
    with torch.no_grad():
        (a, ea), (b, eb) = model(ids, pad, return_energies=True), again(ids, pad, return_energies=True)
    assert torch.equal(a, b) and torch.equal(ea.energies, eb.energies)


def test_a_trained_predictor_round_trips_and_uf_load_opens_the_folder(tmp_path):
    predictor = uf.load("sst2-certified")                 # the zoo's model: MiniLM table, offline
    folder = predictor.save_pretrained(tmp_path / "mine")
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "complete.json", "config.json",
                                                        "model.safetensors"]
    again = uf.load(folder)
    _assert_same_state(predictor.model, again.model)
    texts = ["a gripping , beautiful film", "dull and far too long", ""]
    assert [p.to_dict() for p in predictor(texts)] == [p.to_dict() for p in again(texts)]
    assert uf.from_pretrained(folder).__class__ is uf.Predictor
    with pytest.raises(hub.PretrainedError, match="not a trained classifier"):
        uf.load(uf.UnfoldedTransformer(small_config("certified-alternating")).save_pretrained(tmp_path / "enc"))


def _saved(tmp_path):
    torch.manual_seed(0)
    return uf.UnfoldedTransformer(small_config("certified-alternating")).save_pretrained(tmp_path / "m")


def test_tampered_weights_are_refused(tmp_path):
    folder = _saved(tmp_path)
    weights = folder / hub.WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x01                                             # one bit of the last tensor's bytes
    weights.write_bytes(bytes(data))
    with pytest.raises(hub.PretrainedError, match=r"model.safetensors: corrupt: checksum mismatch in layers\."):
        uf.UnfoldedTransformer.from_pretrained(folder)                     # the tensor is named


def test_an_edited_config_is_refused(tmp_path):
    folder = _saved(tmp_path)
    path = folder / hub.CONFIG_FILE
    info = json.loads(path.read_text())
    info["init"]["config"]["anchor_weight"] = 0.5                # same shapes, another function
    path.write_text(json.dumps(info))
    with pytest.raises(hub.PretrainedError, match="describe different models"):
        uf.UnfoldedTransformer.from_pretrained(folder)


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / hub.CONFIG_FILE).unlink(), "no config.json"),
    (lambda f: (f / hub.WEIGHTS_FILE).unlink(), "no model.safetensors"),
    (lambda f: (f / hub.CONFIG_FILE).write_text("{"), "not readable JSON"),
    (lambda f: (f / hub.CONFIG_FILE).write_text('{"format": "other"}'), "not an unfoldformer pretrained config"),
])
def test_incomplete_or_foreign_folders_are_refused(tmp_path, damage, message):
    folder = _saved(tmp_path)
    damage(folder)
    with pytest.raises(hub.PretrainedError, match=message):
        uf.UnfoldedTransformer.from_pretrained(folder)


def test_a_folder_of_another_class_is_refused(tmp_path):
    folder = _saved(tmp_path)
    with pytest.raises(hub.PretrainedError, match="holds a UnfoldedTransformer, not a Crate"):
        uf.Crate.from_pretrained(folder)
    with pytest.raises(hub.PretrainedError, match="no such folder"):
        uf.Crate.from_pretrained(tmp_path / "missing" / "deeper" / "folder")


def test_a_repo_id_goes_through_the_hub_download(tmp_path, monkeypatch):
    import huggingface_hub
    folder = _saved(tmp_path)
    asked = []

    def fake_download(repo_id, **kwargs):
        asked.append((repo_id, kwargs["revision"]))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    model = uf.UnfoldedTransformer.from_pretrained("someone/certified-tiny", revision="v1")
    assert asked == [("someone/certified-tiny", "v1")]
    _assert_same_state(uf.UnfoldedTransformer.from_pretrained(folder), model)


def test_an_unreachable_repo_is_a_one_line_error(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(repo_id, **kwargs):
        raise LocalEntryNotFoundError("Cannot find the requested files in the disk cache\nand outgoing traffic is off")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(hub.PretrainedError) as err:
        uf.UnfoldedTransformer.from_pretrained("someone/absent")
    assert "\n" not in str(err.value) and "someone/absent" in str(err.value)
