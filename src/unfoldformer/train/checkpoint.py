"""Checkpoints and weights: atomic training states (`checkpoint.pt`) and safetensors weights.

- `save_train_state` / `load_train_state`: the full training state (config, model, optimiser,
  scheduler, sampler position, RNG states, progress) via `torch.save`, written atomically; a
  missing, truncated or foreign file raises `CheckpointError` naming it.
- `save_weights` / `load_weights`: weights as safetensors with the config in its metadata, plus a
  JSON sidecar. A frozen embedding table is not stored; its sha256 is (`table_sha256`).
- `load_classifier`: a run folder, weights file or checkpoint -> the classifier with its
  embeddings, ready for inference (the embedding table is rebuilt and checked by sha256).
- `weights_sha256`, `_check_same_config`: what resuming and DDP runs compare.
"""
from __future__ import annotations

import hashlib
import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import UnfoldformerError
from ..utils import atomic_write_bytes, write_json
from .config import RESUMABLE_CHANGES, ConfigError, TrainConfig

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "CheckpointError", "LoadedClassifier", "WEIGHTS_FORMAT",
           "load_classifier", "load_train_state",
           "load_weights", "model_state", "restore_model_state", "save_train_state", "save_weights",
           "table_sha256", "weights_sha256"]

CHECKPOINT_FORMAT, CHECKPOINT_VERSION = "unfoldformer-train-state", 1


class CheckpointError(UnfoldformerError, RuntimeError):
    """A checkpoint file that is missing, truncated, corrupt or not ours (the message names it)."""


def table_sha256(table: torch.Tensor) -> str:
    return hashlib.sha256(table.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


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
    write_json(path.with_suffix(".json"), info)


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


@dataclass
class LoadedClassifier:
    """A trained classifier ready for inference, with what it was built from."""

    model: nn.Module            # SequenceClassifier, eval mode
    config: TrainConfig
    embeddings: Any             # data.StaticEmbeddings: table, tokenizer, pad id
    path: Path                  # the weights file read
    info: dict                  # metadata saved with the weights (metrics, embedding sha256)


def load_classifier(path: str | Path, data_dir: str | None = None) -> LoadedClassifier:
    """Load `path` (a run folder: its `best.safetensors`; a `.safetensors` file; a `checkpoint.pt`).

    The embedding table is rebuilt from the saved `data.embeddings` (from `data_dir` or the saved data
    folder for vocabularies built from data) and must match the sha256 stored with the weights.
    """
    from .build import build_classifier, load_embeddings_for
    path = Path(path)
    if path.is_dir():
        path = path / "best.safetensors"
    state, cfg, info = load_weights(path)
    if data_dir is not None:
        cfg = cfg.replace(data__data_dir=str(data_dir))
    cfg.validate()
    embeddings = load_embeddings_for(cfg)
    model = build_classifier(cfg, embeddings)
    if not cfg.model.trainable_embeddings:
        sha = table_sha256(model.embedding.weight)
        if sha != info.get("embedding_sha256"):
            raise CheckpointError(f"{path}: the rebuilt embedding table ({cfg.data.embeddings}) differs from the "
                                  f"one the model was trained with (sha256 {sha[:12]} vs "
                                  f"{str(info.get('embedding_sha256'))[:12]})")
    restore_model_state(model, state, cfg, str(path))
    return LoadedClassifier(model.eval(), cfg, embeddings, path, info)
