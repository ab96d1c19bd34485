"""Text corpora for the language model: the tiny Shakespeare file or any UTF-8 text, split like nanoGPT."""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor

from ..errors import ConfigError
from ..utils import file_sha256

__all__ = ["CORPORA", "batches", "load_text", "split", "validation_windows"]

#: Named corpora under UNFOLDFORMER_DATA, with their sha256 (../shared/data/README.md).
CORPORA = {"tinyshakespeare": ("tinyshakespeare.txt",
                               "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed")}
TRAIN_SHARE = 0.9


def corpus_path(source: str) -> tuple[Path, str | None]:
    """(path, expected sha256 or None) of a named corpus (in $UNFOLDFORMER_DATA) or a text file."""
    if source in CORPORA:
        name, sha = CORPORA[source]
        root = os.environ.get("UNFOLDFORMER_DATA")
        if not root:
            raise ConfigError(f"--data {source}: set UNFOLDFORMER_DATA to the folder holding {name}")
        return Path(root) / name, sha
    return Path(source).expanduser(), None


def load_text(source: str) -> str:
    """The text of `source` (a corpus name or a UTF-8 file), checked: present, its sha256 if named, UTF-8,
    non-empty. Errors are one line (ConfigError)."""
    path, sha = corpus_path(source)
    if not path.is_file():
        raise ConfigError(f"--data {source}: no such file {path}" + (f" (named corpora: {', '.join(CORPORA)})"
                                                                     if sha is None else ""))
    if sha is not None and file_sha256(path) != sha:
        raise ConfigError(f"--data {source}: {path} has the wrong sha256 (expected {sha[:12]}…); fetch it again")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--data {source}: {path} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    if not text:
        raise ConfigError(f"--data {source}: {path} is empty")
    return text


def split(ids: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """(train, val): the first 90 % and the last 10 % of the token ids (nanoGPT); each must exceed `block`."""
    cut = int(TRAIN_SHARE * len(ids))
    train, val = ids[:cut], ids[cut:]
    if len(train) <= block or len(val) <= block:
        raise ConfigError(f"the text has {len(ids)} tokens: too few for a context of {block} in both splits "
                          f"(train {len(train)}, validation {len(val)}); use a longer text or a smaller --context")
    return train, val


def batches(ids: Tensor, block: int, batch: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random windows (inputs, next-token targets), each (batch, block), as nanoGPT's get_batch."""
    start = torch.randint(len(ids) - block, (batch,), generator=generator)
    rows = start[:, None] + torch.arange(block)[None]               # (batch, block)
    return ids[rows], ids[rows + 1]


def validation_windows(ids: Tensor, block: int) -> tuple[Tensor, Tensor]:
    """The whole split in consecutive windows: (inputs, targets), each (W, block); every target predicted once
    (the tail shorter than a window is dropped: at most block − 1 tokens)."""
    W = (len(ids) - 1) // block
    x = ids[: W * block].view(W, block)
    y = ids[1: W * block + 1].view(W, block)
    return x, y
