"""The distillation corpus: training texts on disk as word-piece windows, deduplicated, in a seeded order.

Sources (never an evaluation split): `sst2` = the SST-2 training sentences; `imdb` = the IMDB training
reviews (pos and neg) and the 50,000 unlabelled `train/unsup` reviews. Each text becomes word pieces
(the teacher's tokenizer, no special tokens); a text longer than `max_length - 2` pieces is **split into
consecutive windows** of `max_length - 2` pieces (none dropped, no overlap), and a last window shorter than
`MIN_WINDOW` pieces is dropped unless it is the whole text. Each window is wrapped as [CLS] ... [SEP].
Windows with identical pieces are kept once (the first in source order: sst2, then imdb train, then
unsup). The order is a permutation seeded by `seed`; the last `holdout` windows of that order are held
out for validation (never trained on).
"""
from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..data import load_imdb, load_sst2
from ..errors import ConfigError
from ..utils import atomic_write_bytes
from .teacher import WordPieces

__all__ = ["CORPUS_SOURCES", "MIN_WINDOW", "Corpus", "build_corpus", "corpus_texts", "windows"]

CORPUS_SOURCES = ("sst2", "imdb")
MIN_WINDOW = 8


@dataclass
class Corpus:
    """Word-piece windows: `ids` (N, max_length) int32 ([CLS] ... [SEP], then `pad_id`), `lengths` (N,)."""

    ids: np.ndarray
    lengths: np.ndarray
    info: dict

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, rows, word_pieces: WordPieces):
        """(ids (B, n) long, padding_mask (B, n) bool) of the given rows, cut to their longest."""
        import torch
        rows = list(rows)
        width = int(self.lengths[rows].max())
        ids = torch.from_numpy(self.ids[rows, :width].astype(np.int64))                       # (B, n)
        mask = torch.arange(width)[None, :] >= torch.from_numpy(self.lengths[rows].astype(np.int64))[:, None]
        return ids, mask

    def save(self, path: Path) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, ids=self.ids, lengths=self.lengths)
        atomic_write_bytes(path, buffer.getvalue())

    @classmethod
    def load(cls, path: Path, info: dict) -> Corpus:
        with np.load(path) as data:
            return cls(data["ids"], data["lengths"], info)


def corpus_texts(sources: tuple[str, ...], data_dir: str | None = None) -> list[str]:
    """The training texts of `sources`, in source order (sst2 train; imdb train pos/neg, then unsup)."""
    unknown = [s for s in sources if s not in CORPUS_SOURCES]
    if unknown or not sources:
        raise ConfigError(f"corpus sources {list(sources)!r}: choose from {', '.join(CORPUS_SOURCES)}")
    texts: list[str] = []
    if "sst2" in sources:
        texts += [e.text for e in load_sst2("train", data_dir)]
    if "imdb" in sources:
        texts += [e.text for e in load_imdb("train", data_dir, include_unsup=True)]
    return texts


def windows(pieces: list[int], width: int) -> list[list[int]]:
    """Consecutive windows of `width` pieces; a last one under MIN_WINDOW pieces dropped unless it is alone."""
    out = [pieces[i:i + width] for i in range(0, max(len(pieces), 1), width)]
    if len(out) > 1 and len(out[-1]) < MIN_WINDOW:
        out.pop()
    return [w for w in out if w]


def build_corpus(texts: list[str], word_pieces: WordPieces, max_length: int = 128, seed: int = 0,
                 chunk: int = 4096) -> Corpus:
    """The deduplicated windows of `texts` in the seeded order (module doc)."""
    if max_length < 3:
        raise ConfigError(f"max_length={max_length}: a window needs [CLS], one piece and [SEP]")
    seen: set[bytes] = set()
    kept: list[list[int]] = []
    n_texts_split = 0
    for start in range(0, len(texts), chunk):
        for pieces in word_pieces.pieces(texts[start:start + chunk]):
            parts = windows(pieces, max_length - 2)
            n_texts_split += len(parts) > 1
            for part in parts:
                key = hashlib.blake2b(np.asarray(part, dtype=np.int32).tobytes(), digest_size=16).digest()
                if key not in seen:
                    seen.add(key)
                    kept.append(word_pieces.wrap(part))
    order = np.random.default_rng([seed, 104729]).permutation(len(kept))
    ids = np.full((len(kept), max_length), word_pieces.pad_id, dtype=np.int32)
    lengths = np.zeros(len(kept), dtype=np.int32)
    for row, index in enumerate(order):
        seq = kept[index]
        ids[row, :len(seq)] = seq
        lengths[row] = len(seq)
    info = {"texts": len(texts), "windows": len(kept), "texts_split": n_texts_split,
            "pieces": int(lengths.sum()), "max_length": max_length, "seed": seed,
            "policy": f"windows of {max_length - 2} pieces + [CLS]/[SEP], last window under {MIN_WINDOW} pieces "
                      "dropped unless alone, identical windows kept once, seeded order"}
    return Corpus(ids, lengths, info)
