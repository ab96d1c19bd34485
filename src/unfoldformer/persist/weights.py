"""Weights files and training states, each carrying the checksums it is verified by.

- `write_weights_file` / `read_weights_file`: a safetensors file whose metadata holds a JSON
  description (`info`) and the sha256 of every tensor and of that description (`checksums`); read
  back, every checksum is verified. Run folders (`best.safetensors`, `last.safetensors`) and model
  folders (`model.safetensors`) store their weights this way.
- `save_weights` / `load_weights`: a trained classifier's weights (its `TrainConfig`, run id and
  metrics in `info`; a frozen embedding table is not stored, its sha256 is: `table_sha256`), and
  (`load_weights` only) a `checkpoint.pt`.
- `save_train_state` / `load_train_state`: the full training state (`torch.save`, written
  atomically, with the sha256 of every tensor and of all other values, `state_digests`).
- A missing, truncated, corrupt (checksum mismatch) or foreign file raises `CheckpointError`
  naming the file and what failed. A file without checksums (version 0.1.0, or stripped) is read
  only when its folder's manifest (`complete.json`, `manifest.manifest_vouches`) vouches for it
  (`integrity`: "verified by the run folder's manifest") or the caller passes
  `trust_unverified=True` (`integrity: unverified`, announced by an `UnverifiedFileWarning`).
"""
from __future__ import annotations

import hashlib
import io
import json
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CheckpointError, UnverifiedFileWarning
from ..recipe import TrainConfig
from ..utils import atomic_write_bytes, refusal_text, state_problem, write_json
from .manifest import manifest_vouches

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "CheckpointError", "UNVERIFIED", "VERIFIED", "VOUCHED",
           "WEIGHTS_FORMAT", "load_train_state", "load_weights", "model_state", "read_weights_file",
           "restore_model_state", "save_train_state", "save_weights", "state_digests", "table_sha256",
           "tensor_sha256", "unwrap", "write_weights_file"]

#: Version 2 adds checksums and the run id; version 1 (0.1.0) files are read unverified.
CHECKPOINT_FORMAT, CHECKPOINT_VERSION = "unfoldformer-train-state", 2
READABLE_VERSIONS = (1, 2)
VERIFIED, UNVERIFIED = "verified", "unverified (no checksums; read because trust_unverified was given)"
VOUCHED = "verified by the run folder's manifest (the file carries no checksums)"


def table_sha256(table: torch.Tensor) -> str:
    return hashlib.sha256(table.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and bytes (any dtype, bfloat16 included)."""
    t = t.detach().cpu().contiguous()
    digest = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def state_digests(state: Any) -> dict[str, str]:
    """sha256 of every tensor of a nested state (key path -> digest) and of all other values together
    (key `<values>`, their paths and reprs; lists and tuples alike, so a round trip compares equal)."""
    digests, values = {}, hashlib.sha256()

    def walk(obj: Any, path: str) -> None:
        if isinstance(obj, torch.Tensor):
            digests[path] = tensor_sha256(obj)
        elif isinstance(obj, dict):
            for key in sorted(obj, key=repr):
                walk(obj[key], f"{path}/{key}")
        elif isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj):
                walk(item, f"{path}/{i}")
        else:
            values.update(f"{path}={obj!r}\n".encode())

    walk(state, "")
    digests["<values>"] = values.hexdigest()
    return digests


def _verify(path: Path, stored: dict, actual: dict) -> None:
    """CheckpointError naming the file and the first entry whose checksum differs."""
    bad = sorted(k for k in set(stored) | set(actual) if stored.get(k) != actual.get(k))
    if bad:
        what = ", ".join(("other values" if k == "<values>" else k.lstrip("/")) for k in bad[:3])
        raise CheckpointError(f"{path}: corrupt: checksum mismatch in {what}"
                              f"{f' and {len(bad) - 3} more' if len(bad) > 3 else ''} "
                              f"({len(bad)} of {len(stored)} entries); the file changed after it was written, "
                              "so restore a copy or start the run over")


def _unverified(path: Path, trust_unverified: bool) -> str:
    """The integrity of a file without checksums: vouched for by its folder's manifest, trusted on request
    (with a warning), or refused."""
    if manifest_vouches(path):
        return VOUCHED
    if not trust_unverified:
        raise CheckpointError(f"{path}: carries no checksums (written by version 0.1.0, or stripped) and no run-folder "
                              "manifest vouches for it, so a change to it could not be detected; pass "
                              "--trust-unverified (trust_unverified=True) to read it anyway")
    warnings.warn(f"{path}: written by version 0.1.0 without checksums (or stripped of them); read without an "
                  "integrity check, as asked (trust_unverified)", UnverifiedFileWarning, stacklevel=3)
    return UNVERIFIED


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def model_state(model: nn.Module, cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """State dict on CPU, without the frozen embedding table (stored by sha256 instead)."""
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if not cfg.model.trainable_embeddings:
        state.pop("embedding.weight")
    return state


def restore_model_state(model: nn.Module, state: dict, cfg: TrainConfig, where: str) -> None:
    problem = state_problem(model, state)
    if problem is not None:
        raise CheckpointError(f"{where}: {problem}; the weights do not fit the model")
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed = set() if cfg.model.trainable_embeddings else {"embedding.weight"}
    if set(missing) - allowed or unexpected:
        raise CheckpointError(f"{where}: weights do not fit the model (missing {sorted(set(missing) - allowed)[:5]}, "
                              f"unexpected {sorted(unexpected)[:5]})")


WEIGHTS_FORMAT = "unfoldformer-weights"




def write_weights_file(path: Path, state: dict[str, torch.Tensor], info: dict) -> None:
    """`state` as safetensors, written atomically, with `info` (JSON) and the checksums of every tensor and of
    `info` in its metadata."""
    from safetensors.torch import save
    text = json.dumps(info)
    checksums = {key: tensor_sha256(value) for key, value in state.items()}
    checksums["<info>"] = hashlib.sha256(text.encode()).hexdigest()
    metadata = {"format": WEIGHTS_FORMAT, "info": text, "checksums": json.dumps(checksums)}
    atomic_write_bytes(path, save(state, metadata=metadata))


def read_weights_file(path: str | Path, *, trust_unverified: bool = False, device: str = "cpu"
                      ) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors, info) of a weights file, every checksum verified; `info["integrity"]` says how (a file
    without checksums: see the module doc). The tensors own their memory (safe to `load_state_dict(assign=True)`)."""
    from safetensors import safe_open
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such weights file")
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            metadata = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key).clone() for key in handle.keys()}   # own, aligned memory
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise CheckpointError(f"{path}: not a readable safetensors file (truncated or corrupt?): {exc}") from exc
    if metadata.get("format") != WEIGHTS_FORMAT:
        raise CheckpointError(f"{path}: not an unfoldformer weights file (no '{WEIGHTS_FORMAT}' metadata)")
    if "checksums" in metadata:
        try:
            stored = json.loads(metadata["checksums"])
        except ValueError:
            raise CheckpointError(f"{path}: corrupt: its checksum table is not readable") from None
        actual = {key: tensor_sha256(value) for key, value in tensors.items()}
        actual["<info>"] = hashlib.sha256(metadata.get("info", "").encode()).hexdigest()
        _verify(path, stored, actual)
        integrity = VERIFIED
    else:
        integrity = _unverified(path, trust_unverified)
    try:
        info = json.loads(metadata["info"])
        if not isinstance(info, dict):
            raise TypeError
    except (KeyError, ValueError, TypeError):
        raise CheckpointError(f"{path}: corrupt: its metadata is not readable") from None
    return tensors, {**info, "integrity": integrity}


def save_weights(path: Path, model: nn.Module, cfg: TrainConfig, meta: dict, embedding_sha: str | None = None,
                 sidecar: bool = True) -> None:
    """A trained classifier's weights (`write_weights_file`, with its config, `meta` and the embedding table's
    sha256 in `info`) plus (`sidecar`) `info` as a JSON sidecar `path.json`."""
    sha = embedding_sha or table_sha256(unwrap(model).embedding.weight)
    info = {"config": cfg.to_dict(), "embedding_sha256": sha, **meta}
    write_weights_file(path, model_state(unwrap(model), cfg), info)
    if sidecar:
        write_json(path.with_suffix(".json"), info)


def load_weights(path: str | Path, *, trust_unverified: bool = False) -> tuple[dict[str, torch.Tensor], TrainConfig,
                                                                               dict]:
    """(state dict, config, info) of a classifier's `.safetensors` weights file or a `checkpoint.pt` training
    state, checksums verified; `info["integrity"]` says how (a file without checksums: see the module doc)."""
    path = Path(path)
    if path.suffix == ".pt":
        state = load_train_state(path, trust_unverified=trust_unverified)
        info = {"embedding_sha256": state["embedding_sha256"], "run_id": state.get("run_id"),
                "integrity": state["integrity"]}
        return state["model"], TrainConfig.from_dict(state["config"]), info
    tensors, info = read_weights_file(path, trust_unverified=trust_unverified)
    if "config" not in info:
        raise CheckpointError(f"{path}: holds a {info.get('class', 'model')} without a training config, not a "
                              "trained classifier")
    return tensors, TrainConfig.from_dict(info["config"]), info


def save_train_state(path: Path, state: dict) -> None:
    """Atomically write a full training state with `torch.save`, with its `state_digests`."""
    buffer = io.BytesIO()
    full = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, **state}
    torch.save({**full, "checksums": state_digests(full)}, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def load_train_state(path: Path, *, trust_unverified: bool = False) -> dict:
    """Read a training state and verify its checksums; a missing, truncated, corrupt or foreign file
    raises CheckpointError naming it and what failed. `state["integrity"]` says how it was checked
    (a version-1 file has no checksums: see the module doc)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip/pickle errors of a damaged file
        raise CheckpointError(f"{path}: cannot read checkpoint ({refusal_text(exc)})") from exc
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not an unfoldformer training checkpoint (format marker missing)")
    if state.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(f"{path}: checkpoint version {state.get('version')!r} is not one of "
                              f"{READABLE_VERSIONS} (written by another unfoldformer version?)")
    if state["version"] == 1:
        return {**state, "integrity": _unverified(path, trust_unverified)}
    stored = state.pop("checksums", None)
    if not isinstance(stored, dict):
        raise CheckpointError(f"{path}: corrupt: version {state['version']} checkpoint without its checksums")
    _verify(path, stored, state_digests(state))
    return {**state, "integrity": VERIFIED}


