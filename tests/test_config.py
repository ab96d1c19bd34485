"""`ModelConfig` and the preset registry: types, fields per model, ranges, certified step sizes, files."""
import json

import pytest

from conftest import FIXTURES
from unfoldformer import PRESETS, ConfigError, ModelConfig


def test_presets_resolve_to_complete_configs():
    assert set(PRESETS) == {"certified", "certified-alternating", "certified-causal", "paper", "paper-as-released",
                            "standard", "energy-transformer", "crate"}
    for name in PRESETS:
        cfg = ModelConfig.preset(name)
        assert cfg.preset_name == name and cfg.resolved() == cfg               # resolving is idempotent
        assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    paper = ModelConfig.preset("paper")
    assert (paper.d_model, paper.depth, paper.n_heads, paper.tied, paper.attention, paper.ffn) == \
        (300, 12, 1, True, "metric", "symmetric")
    assert paper.anchor_weight is None and paper.ffn_hidden is None           # fields it does not use


@pytest.mark.parametrize("preset, overrides, message", [
    ("paper-as-released", dict(rho="log"), "rho does not apply to attention 'released'"),
    ("paper-as-released", dict(n_heads=4), "released attention has one head"),
    ("paper", dict(anchor_weight=-3.0), "anchor_weight does not apply to attention 'metric'"),
    ("paper", dict(ffn_hidden=64), "ffn_hidden does not apply"),
    ("certified", dict(spectrum_method="nonsense"), "spectrum_method does not apply"),
    ("certified", dict(relu=False), "relu does not apply"),
    ("standard", dict(rho="log"), "rho does not apply"),
    ("paper", dict(spectrum_method="nonsense"), "spectrum_method must be clip or scale"),
    ("certified", dict(depth=2.5), "depth must be of type int"),
    ("certified", dict(d_model="64"), "d_model must be of type int"),
    ("certified", dict(learn_basis=1), "learn_basis must be of type bool"),
    ("certified", dict(depth=True), "depth must be of type int"),
    ("certified", dict(anchor_weight=float("nan")), "finite"),
    ("certified", dict(anchor_weight=float("inf")), "finite"),
    ("certified", dict(anchor_weight=0.0), "anchor_weight must be a finite number > 0"),
    ("certified", dict(ffn_hidden=0), "ffn_hidden must be >= 1"),
    ("certified", dict(depth=0), "depth must be >= 1"),
    ("certified", dict(d_model=10, n_heads=4), "multiple of n_heads"),
    ("certified", dict(rho="cosine"), "unknown rho 'cosine'"),
    ("standard", dict(dropout=1.0), r"dropout must lie in \[0, 1\)"),
    ("paper", dict(spectrum_bound=1.0), r"spectrum_bound must lie in \(0, 1\)"),
    ("bert", {}, "valid presets: certified"),
    ("paper", dict(basis_map="cayley"), "basis_map applies only to a learned basis"),
    ("certified", dict(learn_basis=False, basis_map="exp"), "basis_map applies only to a learned basis"),
    ("paper-as-released", dict(basis_map="exp"), "basis_map does not apply"),
    ("standard", dict(basis_map="cayley"), "basis_map does not apply"),
    ("certified", dict(basis_map="householder"), "basis_map must be one of exp, cayley"),
    ("certified", dict(layer="parallel"), "layer must be one of alternating, joint"),
    ("certified", dict(attention_norm="sqrt"), "attention_norm must be one of none, length"),
    ("certified-alternating", dict(ffn_weight=1.0), "ffn_weight does not apply"),  # alternating layer
    ("certified", dict(alpha_ffn=0.5), "alpha_ffn does not apply"),         # one step, one α
    ("certified", dict(ffn_weight=-0.1), "ffn_weight must be a finite number >= 0"),
    ("paper", dict(layer="joint"), "layer does not apply"),
    ("paper", dict(attention_norm="length"), "attention_norm does not apply"),
])
def test_invalid_configs_are_refused_naming_the_field(preset, overrides, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig.preset(preset, **overrides)


def test_unknown_fields_and_ints_for_floats():
    with pytest.raises(ConfigError, match="unknown ModelConfig field"):
        ModelConfig.preset("paper", width=3)
    assert ModelConfig.preset("certified-alternating", anchor_weight=2).anchor_weight == 2.0    # int accepted for float
    assert isinstance(ModelConfig.preset("certified-alternating", anchor_weight=2).anchor_weight, float)


def test_certified_presets_refuse_uncertified_step_sizes():
    with pytest.raises(ConfigError, match=r"\(0, 1\].*THEORY §3.3"):
        ModelConfig.preset("certified-alternating", alpha_attention=1.5)
    with pytest.raises(ConfigError, match=r"\(0, 2\).*F2"):
        ModelConfig.preset("certified-alternating", alpha_ffn=2.0)
    with pytest.raises(ConfigError, match=r"\(0, 1\].*F1"):
        ModelConfig.preset("paper", alpha_ffn=1.2)
    with pytest.raises(ConfigError, match=r"\(0, 1\].*Theorem A"):
        ModelConfig.preset("paper", rho="lp", alpha_attention=1.5)
    assert ModelConfig.preset("paper", alpha_attention=1.5).alpha_attention == 1.5  # PSD kernel: (0, 2)
    assert ModelConfig.preset("certified-alternating", certified=False, alpha_attention=1.5).alpha_attention == 1.5
    with pytest.raises(ConfigError, match="not certified"):
        ModelConfig.preset("paper-as-released", certified=True)
    with pytest.raises(ConfigError, match=r"\(0, 1\].*joint layer \(THEORY §3.7\)"):
        ModelConfig.preset("certified", alpha_attention=1.2)


def test_layer_kinds_and_attention_norm_resolve():
    joint = ModelConfig.preset("certified")
    assert (joint.layer, joint.ffn_weight, joint.attention_norm, joint.alpha_ffn) == ("joint", 1.0, "length", None)
    alternating = ModelConfig.preset("certified-alternating", attention_norm="length")
    assert (alternating.layer, alternating.ffn_weight, alternating.attention_norm) == ("alternating", None, "length")
    # γ = 0: anchored attention alone
    assert ModelConfig.preset("certified-alternating", layer="joint", ffn_weight=0).ffn_weight == 0.0
    assert ModelConfig.preset("certified", layer="alternating").alpha_ffn == 1.0
    assert ModelConfig.preset("certified-alternating").layer == "alternating"


def test_switching_the_attention_drops_the_presets_unused_fields_but_not_the_users():
    cfg = ModelConfig.preset("certified-alternating", attention="metric")     # anchored fields of the preset go
    assert cfg.anchor_weight is None and cfg.alpha_attention == 1.0 and cfg.learn_basis is True
    with pytest.raises(ConfigError, match="anchor_weight does not apply"):
        ModelConfig.preset("certified-alternating", attention="metric", anchor_weight=2.0)


def test_configs_written_by_version_0_1_0_still_load():
    legacy = {"d_model": 16, "n_heads": 2, "depth": 2, "tied": True, "rho": "exp", "attention": "anchored",
              "ffn": "tied", "ffn_hidden": 512, "relu": True, "anchor_weight": 1.0, "alpha_attention": 1.0,
              "alpha_ffn": 1.0, "spectrum_bound": 0.95, "spectrum_method": "clip", "learn_basis": True,
              "safeguard": True, "safeguard_halvings": 8, "certified": True,
              "preset_name": "certified"}                        # 0.1.0: "certified" was the alternating layer
    cfg = ModelConfig.from_dict(legacy)
    assert cfg == ModelConfig.preset("certified-alternating", d_model=16, n_heads=2, depth=2)
    saved = json.loads((FIXTURES / "v0.1.0/certified-tied/config.json").read_text())
    assert ModelConfig.from_dict(saved["resolved"]["model"]) == cfg


def test_the_safeguard_is_a_forward_option_not_an_architecture_field():
    assert "safeguard" not in ModelConfig.preset("certified-alternating").to_dict()
    with pytest.raises(ConfigError, match="unknown ModelConfig field.*safeguard"):
        ModelConfig.preset("certified-alternating", safeguard=True)


def test_basis_map_reaches_the_learned_bases_and_only_them():
    from unfoldformer import UnfoldedTransformer
    assert ModelConfig.preset("certified-alternating").basis_map == "exp"
    assert ModelConfig.preset("certified-alternating", learn_basis=False).basis_map is None
    assert ModelConfig.preset("paper").basis_map is None
    assert ModelConfig.preset("paper", learn_basis=True, basis_map="cayley").basis_map == "cayley"
    for preset, kw in (("certified", dict(tied=False)), ("paper", dict(learn_basis=True))):
        cfg = ModelConfig.preset(preset, d_model=8, n_heads=2, depth=2, basis_map="cayley", **kw)
        model = UnfoldedTransformer(cfg)
        maps = {layer.attention.basis.parametrizations.weight[0].basis_map for layer in model.layers}
        assert maps == {"cayley"} and ModelConfig.from_dict(cfg.to_dict()) == cfg
