"""Contracts of the public functions (issue 24): step sizes, λ, τ, p and ρ inside their ranges with the
config's messages, empty batches, meta inputs, `Predictor` arguments, and strict config files."""
from __future__ import annotations

import math
import re

import pytest
import torch

from conftest import D64, assert_close, small_config
from unfoldformer import energy as E
from unfoldformer import steps as S
from unfoldformer.classifier import SequenceClassifier, build_encoder
from unfoldformer.config import ModelConfig
from unfoldformer.contracts import NonFiniteResultError, first_non_finite, require_finite
from unfoldformer.errors import ConfigError
from unfoldformer.rho import custom_rho, log_rho, lp_rho, truncated_rho
from unfoldformer.train import TrainConfig


def _state(B: int = 2, n: int = 5, d: int = 4, scale: float = 1.0):
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, n, d, generator=g, dtype=D64) * scale, torch.eye(d, dtype=D64)[None]


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


# ----------------------------------------------------------------------------- step sizes
Y, F = _state()
ONES, W1, B1 = torch.ones(1, dtype=D64), torch.randn(4, 6, dtype=D64), torch.zeros(6, dtype=D64)
att, anch = S.attention_step, S.anchored_attention_step
STEP_CASES = [
    ("attention alpha=nan", lambda: att(Y, F, alpha=math.nan), r"alpha must be a finite number > 0, got nan"),
    ("attention alpha=-5", lambda: att(Y, F, alpha=-5.0), r"alpha must be a finite number > 0, got -5.0"),
    ("attention alpha=0", lambda: att(Y, F, alpha=0.0), r"alpha must be a finite number > 0, got 0.0"),
    ("attention alpha=inf", lambda: att(Y, F, alpha=math.inf), r"alpha must be a finite number > 0"),
    ("attention alpha=50", lambda: att(Y, F, alpha=50.0),
     r"alpha=50 is outside the certified range \(0, 2\) for a PSD kernel of Theorem A \(rho=exp, THEORY §3.1\)"),
    ("attention alpha=2", lambda: att(Y, F, alpha=2.0), r"alpha=2 is outside the certified range \(0, 2\)"),
    ("attention lp alpha=1.5", lambda: att(Y, F, "lp", alpha=1.5),
     r"alpha=1.5 is outside the certified range \(0, 1\] of Theorem A \(rho=lp"),
    ("attention alpha='1'", lambda: att(Y, F, alpha="1"), r"alpha must be a number, got '1'"),
    ("anchored alpha=1.5", lambda: anch(Y, Y, ONES, alpha=1.5),
     r"alpha=1.5 is outside the certified range \(0, 1\] of anchored attention \(THEORY §3.3\)"),
    ("anchored lam=nan", lambda: anch(Y, Y, ONES, lam=math.nan), r"lam must be a finite number > 0"),
    ("anchored lam=0", lambda: anch(Y, Y, ONES, lam=0.0), r"lam must be a finite number > 0"),
    ("anchored lam=inf", lambda: anch(Y, Y, ONES, lam=math.inf), r"lam must be a finite number > 0"),
    ("tied alpha=2", lambda: S.tied_ffn_step(Y, W1, B1, alpha=2.0),
     r"alpha=2 is outside the certified range \(0, 2\) of the tied FFN \(THEORY §3.4, F2\)"),
    ("tied alpha=nan", lambda: S.tied_ffn_step(Y, W1, B1, alpha=math.nan), r"alpha must be a finite number > 0"),
    ("symmetric eta=1.5", lambda: S.symmetric_ffn_step(Y, 0.5 * torch.eye(4, dtype=D64), torch.zeros(4, dtype=D64),
                                                       eta=1.5), r"eta=1.5 is outside the certified range \(0, 1\]"),
    ("log rho c=nan", lambda: log_rho(c=math.nan), r"log rho: c must be a finite number > 0, got nan"),
    ("lp rho p=nan", lambda: lp_rho(p=math.nan), r"lp rho: p must lie in \(0, 2\], got nan"),
    ("lp rho p=3", lambda: lp_rho(p=3.0), r"lp rho: p must lie in \(0, 2\], got 3.0"),
    ("lp rho tau=nan", lambda: lp_rho(tau=math.nan), r"lp rho: the floor tau must be a finite number > 0"),
    ("truncated rho tau=nan", lambda: truncated_rho(tau=math.nan), r"truncated rho: tau must be a finite number > 0"),
    ("truncated rho tau=-1", lambda: truncated_rho(tau=-1.0), r"truncated rho: tau must be a finite number > 0"),
]


@pytest.mark.parametrize("call, message", [c[1:] for c in STEP_CASES], ids=[c[0] for c in STEP_CASES])
def test_functions_refuse_values_outside_their_contract(call, message):
    with pytest.raises(ConfigError) as exc:
        call()
    assert re.search(message, _one_line(exc)), str(exc.value)


@pytest.mark.parametrize("field, value, step", [
    ("alpha_attention", 1.5, lambda a: S.anchored_attention_step(Y, Y, ONES, alpha=a)),
    ("alpha_ffn", 2.5, lambda a: S.tied_ffn_step(Y, W1, B1, alpha=a)),
])
def test_the_config_and_the_step_give_one_message(field, value, step):
    """One checker (`contracts.check_step`): the config's message is the step's, with the field's name."""
    with pytest.raises(ConfigError) as from_config:
        ModelConfig.preset("certified-alternating", **{field: value})
    with pytest.raises(ConfigError) as from_step:
        step(value)
    assert str(from_config.value) == str(from_step.value).replace("alpha=", f"{field}=", 1)


def test_metric_config_and_step_share_the_psd_range():
    with pytest.raises(ConfigError) as from_config:
        ModelConfig.preset("paper", alpha_attention=2.0)
    with pytest.raises(ConfigError) as from_step:
        S.attention_step(Y, F, "exp", alpha=2.0)
    assert str(from_config.value) == str(from_step.value).replace("alpha=", "alpha_attention=", 1)
    assert ModelConfig.preset("paper", alpha_attention=1.9).alpha_attention == 1.9      # (0, 2) for exp


def test_certified_false_studies_any_finite_step_and_is_linear_in_alpha():
    """attention_step(α) = Y + α (avg − Y) with avg independent of α, so step(α) = Y + α (step(1) − Y) up to
    round-off, for α = 2.6 outside the theorem too. Tolerance (float64): both sides differ by a few roundings
    of terms of size ≤ α (|avg| + |Y|) + |Y| ≤ (2α + 1) max|Y| (avg is a convex combination of the rows of
    Y), so close_tol(float64, (2α + 1) max|Y|). The tied FFN likewise: (1 − α) Y + α H against
    Y + α (H − Y) (step(1) = H exactly), terms ≤ (α + 1) max|Y| + α max|H|."""
    one = S.attention_step(Y, F, alpha=1.0)
    far = S.attention_step(Y, F, alpha=2.6, certified=False)
    assert_close(far, Y + 2.6 * (one - Y), scale=(2 * 2.6 + 1) * float(Y.abs().max()))
    hidden = S.tied_ffn_step(Y, W1, B1, alpha=1.0)                 # H = ReLU(Y W1 + b) W1ᵀ
    tied = S.tied_ffn_step(Y, W1, B1, alpha=3.0, certified=False)
    assert_close(tied, Y + 3.0 * (hidden - Y), scale=4 * float(Y.abs().max()) + 3 * float(hidden.abs().max()))
    with pytest.raises(ConfigError, match="alpha must be a finite number > 0, got nan"):
        S.attention_step(Y, F, alpha=math.nan, certified=False)              # never non-finite


# ----------------------------------------------------------------------------- ρ
def _nan_beyond(limit: float):
    return lambda z: torch.sqrt(z + 1.0) * torch.where(z < limit, 1.0, math.nan)


RHO_CASES = [
    ("not callable", lambda: custom_rho(5), TypeError, r"custom_rho: value must be a callable .* got 5 \(int\)"),
    ("derivative not callable", lambda: custom_rho(torch.sqrt, "x"), TypeError, r"derivative must be a callable"),
    ("NaN", lambda: custom_rho(lambda z: z * math.nan), ValueError,
     r"custom rho 'custom': rho\(z\) is not finite at z = 0"),
    ("scalar", lambda: custom_rho(lambda z: z.sum()), ValueError,
     r"rho\(z\) must be a tensor of z's shape \(11,\), got \(\)"),
    ("a number", lambda: custom_rho(lambda z: 1.0), ValueError, r"must be a tensor of z's shape \(11,\), got float"),
    ("raises", lambda: custom_rho(lambda z: z.foo()), ValueError, r"custom rho 'custom': rho raised AttributeError"),
    ("convex, checked", lambda: custom_rho(lambda z: z**2, name="sq", check=True), ValueError,
     r"rho 'sq' fails the checks: not concave"),
]


@pytest.mark.parametrize("call, kind, message", [c[1:] for c in RHO_CASES], ids=[c[0] for c in RHO_CASES])
def test_custom_rho_is_checked_when_made(call, kind, message):
    with pytest.raises(kind) as exc:
        call()
    assert re.search(message, _one_line(exc)), str(exc.value)


@pytest.mark.parametrize("use", ["energy", "step", "dense step", "anchored step"])
def test_a_rho_that_is_not_finite_on_the_states_fails_at_use(use):
    """Finite on the probe grid [0, 50], NaN beyond 100: states 10 apart reach z ~ 1e3."""
    rho = custom_rho(_nan_beyond(100.0), name="capped")
    Y_far, F_far = _state(scale=30.0)
    calls = {"energy": lambda: E.attention_energy(Y_far, F_far, rho),
             "step": lambda: S.attention_step(Y_far, F_far, rho, 0.5),
             "dense step": lambda: S.attention_step(Y_far, F_far, rho, 0.5, use_sdpa=False),
             "anchored step": lambda: S.anchored_attention_step(Y_far, Y_far, ONES, rho=rho)}
    with pytest.raises(ValueError) as exc:
        calls[use]()
    assert re.search(r"custom rho 'capped': rho'?\(z\) is not finite at z = ", _one_line(exc)), str(exc.value)
    near = _state(scale=0.1)[0]                                    # z < 1: the same ρ works
    assert torch.isfinite(E.attention_energy(near, F, rho)).all()


# ----------------------------------------------------------------------------- shapes and devices
PRESETS = ["certified", "paper", "paper-as-released", "standard", "energy-transformer", "crate"]


@pytest.mark.parametrize("preset", PRESETS)
def test_an_empty_batch_gives_empty_outputs(preset):
    cfg = small_config(preset)
    encoder = build_encoder(cfg).eval()
    x, pad = torch.zeros(0, 5, cfg.d_model), torch.zeros(0, 5, dtype=torch.bool)
    with torch.no_grad():
        out = encoder(x, pad)
        assert out.hidden.shape == (0, 5, cfg.d_model)
        if preset != "standard":
            curve = encoder(x, pad, return_energies=True)
            if curve.energies is not None:                         # CRATE reports coding rates instead
                assert curve.energies.shape == (0, cfg.depth + 1) and curve.energies.dtype == D64
        clf = SequenceClassifier(encoder, torch.randn(10, cfg.d_model), cfg.d_model).eval()
        logits, _ = clf(torch.zeros(0, 5, dtype=torch.long), pad)
    assert logits.shape == (0, 2)


def test_empty_batches_through_the_energies_and_steps():
    Y0 = torch.zeros(0, 5, 4, dtype=D64)
    assert E.attention_energy(Y0, F).shape == (0,) and E.attention_energy(Y0, F, "log").shape == (0,)
    assert S.attention_step(Y0, F).shape == (0, 5, 4) and S.attention_step(Y0, F, "log").shape == (0, 5, 4)
    assert S.tied_ffn_step(Y0, W1, B1, return_energy=True)[1].shape == (0,)
    model = build_encoder(small_config("certified-alternating")).eval()
    out = model(torch.zeros(0, 5, 8), return_energies="steps", safeguard=True)
    assert out.layer_before.shape == out.attention_after.shape == out.step_scales.shape == (0, 4)


@pytest.mark.parametrize("call", [
    lambda: build_encoder(small_config("certified-alternating"))(torch.zeros(2, 5, 8, device="meta")),
    lambda: build_encoder(small_config("standard"))(torch.zeros(2, 5, 8, device="meta")),
    lambda: S.attention_step(torch.zeros(2, 5, 4, device="meta", dtype=D64), F),
    lambda: E.attention_energy(torch.zeros(2, 5, 4, device="meta", dtype=D64), F),
], ids=["certified", "standard", "attention_step", "attention_energy"])
def test_a_meta_input_is_a_one_line_error(call):
    with pytest.raises(ValueError) as exc:
        call()
    message = _one_line(exc)
    assert re.fullmatch(r"\w+ is on the meta device \(a shape without values\); build it on cpu or cuda", message)


@pytest.mark.parametrize("args, message", [
    (([5], None, 8), r"Predictor needs a trained SequenceClassifier \(use unfoldformer.load\(RUN\)\), got list"),
    ((None, None, 8), r"got NoneType"),
    (("model", None, 8), r"got str"),
])
def test_predictor_arguments_are_checked(args, message):
    from unfoldformer.inference import Predictor
    with pytest.raises(TypeError) as exc:
        Predictor(*args)
    assert re.search(message, _one_line(exc))
    encoder = build_encoder(small_config("certified-alternating"))
    with pytest.raises(TypeError, match="Predictor needs the classifier's embeddings"):
        Predictor(SequenceClassifier(encoder, torch.randn(10, 8), 8), None, 8)


# ----------------------------------------------------------------------------- non-finite results
def test_non_finite_numbers_are_found_by_their_key_path():
    where, value = first_non_finite({"a": [1.0, 2.0], "b": {"curve": torch.tensor([[0.5, math.inf]])}})
    assert where == "b.curve[0][1]" and value == math.inf
    assert first_non_finite({"a": [1, 2.5, None, "x"], "ok": True}) is None
    with pytest.raises(NonFiniteResultError, match=r"^probe: own_in\[1\] is nan; a non-finite result is not "):
        require_finite({"own_in": [0.1, math.nan]}, "probe")


# ----------------------------------------------------------------------------- config files
FILE_CASES = [
    ("int as a string.json", '{"model": {"d_model": "8"}}',
     r"model.d_model must be an integer \(or null\), got '8' \(a string\)"),
    ("int as a float.json", '{"optim": {"epochs": 1.0}}', r"optim.epochs must be an integer, got 1.0 \(a number\)"),
    ("bool as a string.json", '{"run": {"progress": "false"}}', r"run.progress must be true or false, got 'false'"),
    ("float as a string.yaml", 'optim:\n  lr: "3e-4"\n', r"optim.lr must be a number, got '3e-4' \(a string\)"),
    ("section not a mapping.json", '{"optim": [1]}', r"section 'optim' must be a mapping of settings, got a list"),
    ("duplicate.json", '{"optim": {"epochs": 1, "epochs": 5}}', r"key 'epochs' is given twice in one mapping"),
    ("duplicate.yaml", 'optim:\n  epochs: 1\n  epochs: 5\n', r"duplicate.yaml:3:3: key 'epochs' is given twice"),
    ("duplicate section.yaml", 'model:\n  depth: 2\nmodel:\n  depth: 3\n', r":3:1: key 'model' is given twice"),
    ("syntax.yaml", 'optim:\n  lr: [1e-3\n  epochs: 2\n', r"syntax.yaml:3:9: not valid YAML: expected ',' or ']'"),
    ("syntax.json", '{"optim": {"lr": 1e-3,}}', r"syntax.json:1:23: not valid JSON: Expecting property name"),
    ("empty out_dir.json", '{"run": {"out_dir": ""}}', r"run.out_dir is empty; give a path"),
    ("huge epochs.json", '{"optim": {"epochs": 2000000}}', r"optim.epochs=2000000 is beyond 1,000,000 \(a typo\?\)"),
    ("negative seed.yaml", 'optim:\n  seed: -1\n', r"optim.seed must be an integer in \[0, 2\*\*32 - 1\], got -1"),
]


@pytest.mark.parametrize("name, text, message", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_config_files_are_read_strictly(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError) as exc:
        TrainConfig.load(path).validate(check_data=False)
    assert re.search(message, _one_line(exc)), str(exc.value)


def test_config_files_keep_what_they_mean(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("optim:\n  lr: 3e-4\n  warmup: 10\n  epochs: 2000000\nrun:\n  eval_every: 50\n"
                    "  allow_large_sizes: true\ndata:\n  max_length: null\n")
    cfg = TrainConfig.load(path)
    cfg.validate(check_data=False)                                 # the override lets the large size through
    assert (cfg.optim.lr, cfg.optim.warmup, cfg.optim.epochs) == (3e-4, 10.0, 2000000)
    assert type(cfg.optim.lr) is float and cfg.run.eval_every == 50 and cfg.data.max_length is None


def test_python_values_keep_their_type_as_in_a_file():
    with pytest.raises(ConfigError, match=r"^config: model.d_model must be an integer \(or null\), got '8'"):
        TrainConfig.from_dict({"model": {"d_model": "8"}})
    with pytest.raises(ConfigError, match=r"^TrainConfig.replace: optim.epochs must be an integer, got '3'"):
        TrainConfig().replace(optim__epochs="3")
    assert TrainConfig().replace(optim__lr=1).optim.lr == 1.0      # an int for a float field is a number


def test_a_rho_and_the_anchored_update_check_their_arguments():
    from unfoldformer.rho import Rho
    with pytest.raises(TypeError, match=r"^Rho 'bad': value must be a callable z -> tensor, got int"):
        Rho("bad", 5, torch.exp)
    C = torch.zeros(1, 3, 1, 2, dtype=D64)
    with pytest.raises(ConfigError, match=r"alpha=1.5 is outside the certified range \(0, 1\] of anchored attention"):
        S.anchored_softmax_update(C, C, ONES, torch.zeros(1, dtype=D64), torch.ones(1, 3, dtype=torch.bool), 1.5)
