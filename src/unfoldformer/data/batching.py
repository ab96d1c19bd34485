"""Tokenised data sets and a resumable, length-bucketed batch sampler.

- :class:`TokenizedDataset`: every text tokenised **once** (flat int32 ids plus
  offsets, labels), optionally cached on disk as ``.npz`` (no pickle). Truncation
  to ``max_length`` happens when a batch is collated, so one cache serves every
  maximum length (including full-length evaluation).
- :class:`BucketBatchSampler`: per epoch, a seeded permutation of the examples is
  cut into chunks of ``chunk_batches`` batches; each chunk is sorted by length and
  split into batches (little padding), and the order of all batches is shuffled.
  The order depends only on ``(seed, epoch)``, so ``state_dict()`` = seed, epoch
  and batch index is enough to resume exactly where a run stopped.
- :func:`shard`: a rank's part of a global batch (strided, so ranks see similar
  lengths); :func:`eval_batches`: length-sorted batches under a token budget;
  :func:`seeded_subset`: the fixed random subset every part of the package draws.
"""
from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..utils import atomic_write_bytes
from .embeddings import StaticEmbeddings

__all__ = ["BucketBatchSampler", "TokenizedDataset", "eval_batches", "seeded_subset", "shard", "tokenize_dataset"]

_TOKENIZE_CHUNK = 2048


@dataclass
class TokenizedDataset:
    """Token ids of N texts: ``tokens`` (T,) int32 flat, ``offsets`` (N + 1,) int64, ``labels`` (N,) int64."""

    tokens: np.ndarray
    offsets: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def lengths(self, max_length: int | None = None) -> np.ndarray:
        """(N,) token counts, capped at ``max_length`` (None: full length), at least 1."""
        lengths = np.diff(self.offsets)
        if max_length is not None:
            lengths = np.minimum(lengths, max_length)
        return np.maximum(lengths, 1)

    def collate(self, indices: Sequence[int], max_length: int | None, pad_id: int):
        """(ids (B, n) long, padding_mask (B, n) bool True = padding, labels (B,) long).

        An empty text becomes one ``pad_id`` token that is *not* masked, so no row is all padding.
        """
        rows = [self.tokens[self.offsets[i]:self.offsets[i + 1]][:max_length] for i in indices]
        width = max((max(len(r), 1) for r in rows), default=1)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.ones((len(rows), width), dtype=torch.bool)
        for b, row in enumerate(rows):
            ids[b, :len(row)] = torch.from_numpy(row.astype(np.int64))
            mask[b, :max(len(row), 1)] = False
        return ids, mask, torch.from_numpy(self.labels[np.asarray(indices, dtype=np.int64)])


def _tokenize_all(texts: list[str], embeddings: StaticEmbeddings) -> tuple[np.ndarray, np.ndarray]:
    """Flat tokens and offsets of ``texts``, tokenised in chunks."""
    pieces: list[np.ndarray] = []
    for start in range(0, len(texts), _TOKENIZE_CHUNK):
        batch = texts[start:start + _TOKENIZE_CHUNK]
        pieces.extend(np.asarray(ids, dtype=np.int32) for ids in embeddings.tokenize_many(batch))
    offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(p) for p in pieces])
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    return tokens.astype(np.int32), offsets


def _atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    atomic_write_bytes(path, buffer.getvalue())


def tokenize_dataset(texts: list[str], labels: list[int], embeddings: StaticEmbeddings,
                     cache_dir: str | Path | None = None, cache_key: str | None = None) -> TokenizedDataset:
    """Tokenise ``texts`` once (no truncation). With ``cache_dir`` and ``cache_key`` the ids are
    stored in ``cache_dir/<sha256(cache_key)>.npz`` and read from there next time; a cache file
    that does not match the texts' count is rebuilt."""
    if any(label is None for label in labels):
        raise ValueError("tokenize_dataset needs labelled examples (found label None)")
    label_arr = np.asarray(labels, dtype=np.int64)
    path = None
    if cache_dir is not None and cache_key is not None:
        path = Path(cache_dir) / (hashlib.sha256(cache_key.encode()).hexdigest()[:32] + ".npz")
        try:
            with np.load(path, allow_pickle=False) as data:
                tokens, offsets = data["tokens"], data["offsets"]
            if offsets.shape[0] == len(texts) + 1 and int(offsets[-1]) == tokens.shape[0]:
                return TokenizedDataset(tokens, offsets, label_arr)
        except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
            pass                                                    # missing or damaged: rebuild
    tokens, offsets = _tokenize_all(list(texts), embeddings)
    if path is not None:
        _atomic_save_npz(path, tokens=tokens, offsets=offsets)
    return TokenizedDataset(tokens, offsets, label_arr)


class BucketBatchSampler:
    """Seeded, length-bucketed global batches with a resumable position.

    Iterating yields the remaining batches of the current epoch (lists of example indices)
    and advances ``batch_index``; :meth:`next_epoch` moves on. ``drop_smaller_than`` drops a
    final batch with fewer examples than that (DDP: every rank needs at least one).
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, seed: int, chunk_batches: int = 50,
                 drop_smaller_than: int = 1):
        if batch_size < 1 or chunk_batches < 1:
            raise ValueError(f"batch_size ({batch_size}) and chunk_batches ({chunk_batches}) must be >= 1")
        self.lengths = np.asarray(lengths)
        self.batch_size, self.seed, self.chunk_batches = batch_size, seed, chunk_batches
        self.drop_smaller_than = drop_smaller_than
        self.epoch, self.batch_index = 0, 0

    def batches(self, epoch: int) -> list[list[int]]:
        """All batches of ``epoch``, in order; a pure function of (seed, epoch)."""
        rng = np.random.default_rng([self.seed, epoch])
        perm = rng.permutation(len(self.lengths))
        chunk = self.batch_size * self.chunk_batches
        out: list[list[int]] = []
        for start in range(0, len(perm), chunk):
            part = perm[start:start + chunk]
            part = part[np.argsort(-self.lengths[part], kind="stable")]   # longest first
            out.extend(part[i:i + self.batch_size].tolist() for i in range(0, len(part), self.batch_size))
        out = [b for b in out if len(b) >= self.drop_smaller_than]
        order = rng.permutation(len(out))
        return [out[i] for i in order]

    def __len__(self) -> int:
        """Number of batches per epoch (the same for every epoch: chunk sizes do not depend on the seed)."""
        n, chunk, count = len(self.lengths), self.batch_size * self.chunk_batches, 0
        for start in range(0, n, chunk):
            size = min(chunk, n - start)
            full, rest = divmod(size, self.batch_size)
            count += full + (1 if rest and rest >= self.drop_smaller_than else 0)
        return count

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.batches(self.epoch)
        while self.batch_index < len(batches):
            batch = batches[self.batch_index]
            self.batch_index += 1
            yield batch

    def next_epoch(self) -> None:
        self.epoch, self.batch_index = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "batch_index": self.batch_index,
                "batch_size": self.batch_size, "chunk_batches": self.chunk_batches, "n": len(self.lengths)}

    def load_state_dict(self, state: dict) -> None:
        """Restore the position; refuses a state from a different data order."""
        mine = self.state_dict()
        for key in ("seed", "batch_size", "chunk_batches", "n"):
            if state.get(key) != mine[key]:
                raise ValueError(f"sampler state has {key}={state.get(key)!r} but this run has {mine[key]!r}")
        self.epoch, self.batch_index = int(state["epoch"]), int(state["batch_index"])


def shard(batch: Sequence[int], rank: int, world_size: int) -> list[int]:
    """The part of a global batch that ``rank`` reads: every ``world_size``-th example."""
    return list(batch[rank::world_size])


def eval_batches(lengths: np.ndarray, batch_size: int, max_tokens_sq: int = 1 << 22) -> list[list[int]]:
    """Length-sorted evaluation batches of at most ``batch_size`` examples whose padded
    B · n² (attention memory) stays under ``max_tokens_sq`` (at least one example each)."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    out, start = [], 0
    while start < len(order):
        n = int(lengths[order[start]])
        size = max(1, min(batch_size, max_tokens_sq // max(n * n, 1)))
        out.append(order[start:start + size].tolist())
        start += size
    return out


def seeded_subset(n: int, k: int | None, seed: int = 0, stream: int = 7919) -> np.ndarray | None:
    """Sorted indices of a seeded random subset of `k` of `n` items; None when all are kept (k None or ≥ n).

    The subset depends only on (n, k, seed, stream): distinct `stream`s give independent subsets of
    one collection (e.g. evaluation and training samples of one seed).
    """
    if k is None or k >= n:
        return None
    if k < 1:
        raise ValueError(f"a subset needs k >= 1 items, got {k}")
    return np.sort(np.random.default_rng([seed, stream]).permutation(n)[:k])
