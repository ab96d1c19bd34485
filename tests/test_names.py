"""Version 0.3.0's names: `certified` is the joint layer everywhere, the alternating layer is
`certified-alternating`; old names given now warn or are refused in one line; configs saved by older
versions rebuild the model they saved (tests/fixtures/v0.2.0 was written by the code of version 0.2.0,
commit 7269622, with `tests/fixtures/v0.1.0/data`; its expected.json holds that code's predictions)."""
import json
import warnings

import pytest
import torch

import unfoldformer as uf
from conftest import FIXTURES, close_tol, needs_the_fixtures_normals
from unfoldformer.config import ModelConfig
from unfoldformer.errors import ConfigError
from unfoldformer.names import KINDS_BEFORE_0_3
from unfoldformer.recipe import KIND_PRESETS
from unfoldformer.train import TrainConfig

V020 = FIXTURES / "v0.2.0"
DATA = FIXTURES / "v0.1.0" / "data"


def test_certified_is_the_joint_layer_everywhere():
    assert ModelConfig.preset("certified").layer == "joint"
    assert ModelConfig().resolved().layer == "joint"                        # the dataclass default preset
    assert TrainConfig().model.kind == "certified" and TrainConfig().model_config().layer == "joint"
    assert TrainConfig().model_config().tied is True
    assert uf.CertifiedEncoderLayer(64, 4).config.layer == "joint"
    untied = TrainConfig().with_overrides(["--model.kind", "certified-untied"]).model_config()
    assert (untied.layer, untied.tied) == ("joint", False)
    for kind, tied in (("certified-alternating", True), ("certified-alternating-untied", False)):
        cfg = TrainConfig().with_overrides(["--model.kind", kind]).model_config()
        assert (cfg.layer, cfg.tied, cfg.alpha_ffn) == ("alternating", tied, 1.0)


@pytest.mark.parametrize("old, new", [("certified-joint", "certified"), ("certified-joint-untied", "certified-untied")])
def test_the_old_joint_kinds_warn_and_give_the_same_model(old, new):
    with pytest.warns(DeprecationWarning, match=f"'{old}' is now called '{new}'"):
        cfg = TrainConfig().with_overrides(["--model.kind", old])
    assert cfg.model.kind == new
    assert cfg.model_config() == TrainConfig().with_overrides(["--model.kind", new]).model_config()


def test_the_old_joint_preset_warns_and_certified_tied_is_refused_in_one_line():
    with pytest.warns(DeprecationWarning, match="'certified-joint' is now called 'certified'"):
        assert ModelConfig.preset("certified-joint") == ModelConfig.preset("certified")
    with pytest.raises(ConfigError) as err:
        TrainConfig().with_overrides(["--model.kind", "certified-tied"])
    message = str(err.value)
    assert "\n" not in message and "'certified-alternating'" in message and "'certified' is the joint" in message


def _saved(kind: str) -> dict:
    """A complete `to_dict()` output as version 0.2.0 wrote it: every section, no `version` key."""
    data = TrainConfig().to_dict()
    data.pop("version")
    data["model"]["kind"] = kind
    return data


@pytest.mark.parametrize("old, new", sorted(KINDS_BEFORE_0_3.items()))
def test_configs_saved_before_0_3_keep_their_kind(old, new):
    expected = TrainConfig().with_overrides(["--model.kind", new]).model_config()
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                      # a saved file reads without a warning
        read = TrainConfig.from_dict(_saved(old))
    assert read.model.kind == new and read.model_config() == expected
    assert TrainConfig.from_dict({**_saved(old), "version": "0.2.0"}).model.kind == new


def test_configs_saved_now_and_hand_written_dicts_use_the_new_names():
    cfg = TrainConfig().with_overrides(["--model.kind", "certified-untied"])
    saved = cfg.to_dict()
    assert saved["version"] == "0.3.0"
    assert TrainConfig.from_dict(saved).model_config().layer == "joint"         # not read as the old untied kind
    partial = TrainConfig.from_dict({"model": {"kind": "certified-untied"}})  # not a complete saved dict
    assert partial.model_config().layer == "joint"
    with pytest.raises(ConfigError, match="config version 'x.y' is not a version number"):
        TrainConfig.from_dict({**saved, "version": "x.y"})
    assert TrainConfig.from_dict({**saved, "version": 0.3}).model_config().layer == "joint"   # YAML's 0.3
    assert set(KINDS_BEFORE_0_3.values()) <= set(KIND_PRESETS)


def test_model_config_dicts_saved_before_0_3_keep_their_preset():
    alternating = ModelConfig.preset("certified-alternating", d_model=16, n_heads=2, depth=2)
    old = alternating.to_dict()
    old["preset_name"] = "certified"                      # what 0.2.0 wrote for the alternating layer
    for key in ("positions", "metric", "max_positions", "learn_steps", "attention_norm", "ffn_bound"):
        old.pop(key)                                      # fields added during 0.2.0: filled from the old preset
    assert ModelConfig.from_dict(old) == alternating
    joint = ModelConfig.preset("certified", d_model=16, n_heads=2, depth=2)
    assert ModelConfig.from_dict(joint.to_dict()) == joint                    # a 0.3.0 dict: as written
    old_joint = {**joint.to_dict(), "preset_name": "certified-joint"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ModelConfig.from_dict(old_joint) == joint


def _assert_same_predictions(predictions, expected):
    for p, want in zip(predictions, expected, strict=True):
        # the same float32 forward (energies accumulated in float64) on the same code path: round-off of the
        # energies' size (|E| ~ 20 here) at float32 precision
        scale = 1 + max(abs(e) for e in want["energies"])
        assert max(abs(a - b) for a, b in zip(p.energies, want["energies"], strict=True)) <= close_tol(
            torch.float32, scale)
        assert max(abs(a - b) for a, b in zip(p.probabilities, want["probabilities"], strict=True)) <= close_tol(
            torch.float32)


@needs_the_fixtures_normals
@pytest.mark.parametrize("folder", ["run-certified-untied", "pretrained-certified-untied"])
def test_folders_written_by_0_2_0_rebuild_the_alternating_untied_model(folder):
    """0.2.0's `certified-untied` was the alternating layer: it loads as `certified-alternating-untied` and
    predicts what 0.2.0 predicted (not the joint untied model the name means now)."""
    expected = json.loads((V020 / "expected-names.json").read_text())
    assert expected["version"] == "0.2.0"
    predictor = uf.load(V020 / folder, data_dir=DATA)
    assert predictor.config.model.kind == "certified-alternating-untied"
    cfg = predictor.model.encoder.config
    assert (cfg.layer, cfg.tied, cfg.attention_norm) == ("alternating", False, "none")
    _assert_same_predictions(predictor(expected["texts"]), expected[folder])


def test_an_encoder_saved_by_0_2_0_rebuilds_the_alternating_layer():
    expected = json.loads((V020 / "expected-names.json").read_text())
    encoder = uf.CertifiedEncoder.from_pretrained(V020 / "encoder-untied")
    assert (encoder.config.preset_name, encoder.config.layer) == ("certified-alternating", "alternating")
    want = torch.tensor(expected["encoder-hidden"])
    with torch.no_grad():
        got = encoder(torch.tensor(expected["encoder-x"]))                # (2, 5, 8)
    assert (got - want).abs().max() <= close_tol(torch.float32, 1 + want.abs().max())


@needs_the_fixtures_normals
def test_an_untied_prediction_reports_per_layer_descent_not_one_curve():
    """An untied model has one energy per layer: `never_rises` is None (its values are not one curve: here they
    rise, -20.1 -> -19.3, while every layer descends) and `layers_descend` is E_ℓ(Y⁽ℓ⁾) ≤ E_ℓ(Y⁽ℓ⁻¹⁾) for every
    ℓ, checked against the layer modules' own steps and energies, run one by one outside the stack."""
    from unfoldformer.descent import descent_tolerance
    expected = json.loads((V020 / "expected-names.json").read_text())
    predictor = uf.load(V020 / "run-certified-untied", data_dir=DATA)
    model, encoder = predictor.model, predictor.model.encoder
    tol = descent_tolerance(torch.float32)         # the float32 states' round-off allowance, relative to 1 + |E|
    for text, pred in zip(expected["texts"], predictor(expected["texts"]), strict=True):
        assert pred.never_rises is None
        enc = predictor.embeddings.encode([text], predictor.max_length)
        with torch.no_grad():
            x = model.project(model.embedding(enc.ids))                       # (1, n, d) the anchor X = Y⁽⁰⁾
            y, descends = x, []
            for layer in range(encoder.config.depth):
                before = encoder.energy(y, x, enc.padding_mask, layer=layer)  # (1,) E_ℓ(Y⁽ℓ⁻¹⁾)
                y = encoder.layer(layer)(y, x, enc.padding_mask)              # (1, n, d) layer ℓ's own step
                after = encoder.energy(y, x, enc.padding_mask, layer=layer)   # (1,) E_ℓ(Y⁽ℓ⁾)
                descends.append(bool(after <= before + tol * (1 + before.abs())))
        assert pred.layers_descend is all(descends)
    curve = expected["run-certified-untied"][0]["energies"]
    assert curve[2] > curve[1]                                   # the reported values rise: not one energy's curve
