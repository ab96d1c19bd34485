"""A character tokenizer: one id per distinct character of the training text, in sorted order (as nanoGPT)."""
from __future__ import annotations

from ..errors import ConfigError

__all__ = ["CharTokenizer"]


class CharTokenizer:
    """`encode(text) -> list[int]`, `decode(ids) -> str`; the vocabulary is the sorted characters of a text."""

    def __init__(self, chars: str):
        if not chars or len(set(chars)) != len(chars):
            raise ConfigError("a character vocabulary needs at least one character, each once")
        self.chars = chars
        self.index = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        unknown = sorted(set(text) - self.index.keys())
        if unknown:
            shown = ", ".join(repr(c) for c in unknown[:5])
            raise ConfigError(f"the text has {len(unknown)} character(s) outside the model's vocabulary of "
                              f"{self.vocab_size} ({shown}{', ...' if len(unknown) > 5 else ''})")
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_dict(self) -> dict:
        return {"kind": "char", "chars": self.chars}

    @classmethod
    def from_dict(cls, data: dict) -> CharTokenizer:
        if not isinstance(data, dict) or data.get("kind") != "char" or not isinstance(data.get("chars"), str):
            raise ConfigError(f"not a character tokenizer description: {str(data)[:80]}")
        return cls(data["chars"])
