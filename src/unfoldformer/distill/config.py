"""`DistillConfig`: every setting of a distillation run, typed, checked before any work, stored as JSON.

Student: `student` names the `ModelConfig` preset (a certified joint preset), `tied`, `depth`, `n_heads`,
`ffn_hidden` (None: the teacher's depth, heads and FFN width), ρ = `rho`; width = the teacher's.
Loss: `loss` on the last-layer token states (`mse`: mean squared error per coordinate over real tokens;
`cosine`: mean of 1 − cos per real token) + `sentence_weight` × (1 − cos) of the mean-pooled sentence
embeddings. Schedule: AdamW at `lr` (linear warm-up over `warmup` steps, or that fraction of `steps` when
< 1; cosine decay to `min_lr_ratio`·lr at `steps`), global batches of `batch_size` windows,
length-bucketed and seeded. Data: `sources`, windows of `max_length` pieces, the first `limit` windows of
the seeded order (None: all), the last `holdout` of them held out for validation.
"""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass

from ..config import PRESETS
from ..errors import ConfigError
from .corpus import CORPUS_SOURCES
from .student import READOUTS

__all__ = ["LOSSES", "RESUMABLE_CHANGES", "DistillConfig", "field_type"]

LOSSES = ("mse", "cosine")
#: Settings a resumed run may change: where it runs, how often it reports, and its length (`steps` extends it).
RESUMABLE_CHANGES = frozenset({"device", "out", "log_every", "eval_every", "checkpoint_every", "data_dir", "steps"})


def field_type(hint):
    """The type of a field hint, `X | None` unwrapped to X."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


@dataclass
class DistillConfig:
    """Settings of `unfoldformer distill` (module doc)."""

    out: str = "runs/distill"
    teacher: str = "minilm"
    student: str = "certified"
    tied: bool = True
    depth: int | None = None
    n_heads: int | None = None
    ffn_hidden: int | None = None
    rho: str = "exp"
    readout: str = "linear"
    trainable_embeddings: bool = False
    loss: str = "mse"
    sentence_weight: float = 1.0
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.05
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    batch_size: int = 32
    steps: int = 20000
    sources: tuple[str, ...] = CORPUS_SOURCES
    max_length: int = 128
    limit: int | None = None
    holdout: int = 512
    seed: int = 0
    checkpoint_every: int = 50
    log_every: int = 10
    eval_every: int = 500
    device: str = "auto"
    data_dir: str | None = None

    def __post_init__(self) -> None:
        self.sources = tuple(self.sources)
        self.check()

    def check(self) -> None:
        hints = typing.get_type_hints(DistillConfig)
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            want = hints[f.name]
            if value is None and type(None) in typing.get_args(want):
                continue
            base = field_type(want)
            origin = typing.get_origin(base) or base
            ok = (isinstance(value, origin) and not (origin is int and isinstance(value, bool))
                  or origin is float and isinstance(value, int) and not isinstance(value, bool))
            if not ok:
                raise ConfigError(f"{f.name}={value!r}: expected {base}")
        if self.student not in PRESETS or PRESETS[self.student].get("layer") != "joint":
            joint = [n for n, p in PRESETS.items() if p.get("layer") == "joint"]
            raise ConfigError(f"student={self.student!r}: a certified joint preset is required ({', '.join(joint)})")
        if self.readout not in READOUTS:
            raise ConfigError(f"readout={self.readout!r}: expected one of {', '.join(READOUTS)}")
        if self.loss not in LOSSES:
            raise ConfigError(f"loss={self.loss!r}: expected one of {', '.join(LOSSES)}")
        bad = [s for s in self.sources if s not in CORPUS_SOURCES]
        if bad or not self.sources:
            raise ConfigError(f"sources={list(self.sources)!r}: choose from {', '.join(CORPUS_SOURCES)}")
        for name in ("batch_size", "steps", "checkpoint_every", "log_every", "eval_every", "depth", "n_heads",
                     "ffn_hidden", "limit"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}={value}: must be >= 1")
        if self.holdout < 0 or self.max_length < 3:
            raise ConfigError(f"holdout={self.holdout}, max_length={self.max_length}: need holdout >= 0, "
                              "max_length >= 3")
        for name, low, high in (("lr", 0.0, None), ("sentence_weight", -1e-300, None), ("warmup", -1e-300, None),
                                ("min_lr_ratio", -1e-300, 1.0), ("weight_decay", -1e-300, None),
                                ("grad_clip", 0.0, None)):
            value = getattr(self, name)
            if not value > low or (high is not None and value > high):
                raise ConfigError(f"{name}={value}: out of range")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "sources": list(self.sources)}

    @classmethod
    def from_dict(cls, data: dict) -> DistillConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown distill settings: {', '.join(unknown)}")
        return cls(**data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def replace(self, **changes) -> DistillConfig:
        return dataclasses.replace(self, **changes)

    def changed_from(self, saved: dict) -> list[str]:
        """Names of settings that differ from a saved config, beyond those a resume may change."""
        mine = self.to_dict()
        return sorted(k for k in set(mine) | set(saved) if k not in RESUMABLE_CHANGES and mine.get(k) != saved.get(k))
