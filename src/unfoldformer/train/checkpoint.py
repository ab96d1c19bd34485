"""Training checkpoints: what resuming compares and restores, over the persistence layer's files.

The files themselves (atomic training states `checkpoint.pt`, safetensors weights with checksums,
run folders and their manifest, `load_classifier`) are written and read by `unfoldformer.persist`,
the one code path that prediction shares; this module re-exports those names for the training loop
and adds what only training needs:

- `_rng_state` / `_set_rng_state`: Python, NumPy, torch and CUDA random states, saved and restored.
- `_check_same_config`: a resume with another config is refused, naming the settings that differ
  (except `RESUMABLE_CHANGES`).
- `weights_sha256`: one digest of a model's weights, what resumed and DDP runs compare.
"""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import CheckpointError
from ..persist.classifier import (
    LoadedClassifier,
    check_folder_config,
    check_same_run,
    flat_config,
    folder_config,
    load_classifier,
    saved_run_id,
)
from ..persist.weights import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_VERSION,
    VERIFIED,
    VOUCHED,
    WEIGHTS_FORMAT,
    load_train_state,
    load_weights,
    model_state,
    restore_model_state,
    save_train_state,
    save_weights,
    state_digests,
    table_sha256,
    tensor_sha256,
    unwrap,
)
from ..recipe import RESUMABLE_CHANGES, ConfigError, TrainConfig

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "CheckpointError", "LoadedClassifier", "VERIFIED", "VOUCHED",
           "WEIGHTS_FORMAT", "check_folder_config", "check_same_run", "folder_config", "load_classifier",
           "load_train_state", "load_weights", "model_state", "restore_model_state", "save_train_state",
           "save_weights", "saved_run_id", "state_digests", "table_sha256", "tensor_sha256", "weights_sha256"]

_unwrap = unwrap            # the name the training modules use


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


def _check_same_config(saved: dict, cfg: TrainConfig, where: Path, allow: set[str] = frozenset()) -> None:
    defaults = flat_config(TrainConfig().to_dict())                          # keys added later: their defaults
    a, b = {**defaults, **flat_config(saved)}, flat_config(cfg.to_dict())
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in RESUMABLE_CHANGES | allow)
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
