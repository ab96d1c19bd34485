"""Checkpoints and weights: atomic training states (`checkpoint.pt`) and safetensors weights.

- `save_train_state` / `load_train_state`: the full training state (config, model, optimiser,
  scheduler, sampler position, RNG states, progress, run id) via `torch.save`, written atomically,
  with the sha256 of every tensor and of all other values (`state_digests`) verified on load.
- `save_weights` / `load_weights`: weights as safetensors with the config, the run id and the
  sha256 of every tensor and of the metadata in its metadata, plus a JSON sidecar, verified on
  load. A frozen embedding table is not stored; its sha256 is (`table_sha256`).
- A missing, truncated, corrupt (checksum mismatch) or foreign file raises `CheckpointError`
  naming the file and what failed. A file without checksums (version 0.1.0, or stripped) is read
  only when its run folder's manifest (`complete.json`, `runs.verify_manifest`) vouches for it
  (`integrity`: "verified by the run folder's manifest") or the caller passes
  `trust_unverified=True` (`integrity: unverified`, announced by an `UnverifiedFileWarning`).
- `load_classifier`: a run folder, weights file or checkpoint -> the classifier with its
  embeddings, ready for inference (the embedding table is rebuilt and checked by sha256; weights
  and the folder's config.json must come from the same run and agree with the weights' config;
  a run folder's manifest, when it has one, must match every file it pins).
- `weights_sha256`, `_check_same_config`: what resuming and DDP runs compare.
"""
from __future__ import annotations

import hashlib
import io
import json
import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..errors import UnfoldformerError, UnverifiedFileWarning
from ..runs import manifest_vouches, verify_manifest
from ..utils import atomic_write_bytes, write_json
from .config import RESUMABLE_CHANGES, ConfigError, TrainConfig

__all__ = ["CHECKPOINT_FORMAT", "CHECKPOINT_VERSION", "CheckpointError", "LoadedClassifier", "WEIGHTS_FORMAT",
           "check_folder_config", "check_same_run", "folder_config", "load_classifier", "saved_run_id",
           "load_train_state",
           "load_weights", "model_state", "restore_model_state", "save_train_state", "save_weights",
           "state_digests", "table_sha256", "tensor_sha256", "weights_sha256"]

#: Version 2 adds checksums and the run id; version 1 (0.1.0) files are read unverified.
CHECKPOINT_FORMAT, CHECKPOINT_VERSION = "unfoldformer-train-state", 2
READABLE_VERSIONS = (1, 2)
VERIFIED, UNVERIFIED = "verified", "unverified (no checksums; read because trust_unverified was given)"
VOUCHED = "verified by the run folder's manifest (the file carries no checksums)"


class CheckpointError(UnfoldformerError, RuntimeError):
    """A checkpoint file that is missing, truncated, corrupt or not ours (the message names it)."""


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


def save_weights(path: Path, model: nn.Module, cfg: TrainConfig, meta: dict, embedding_sha: str | None = None,
                 sidecar: bool = True) -> None:
    """Weights as safetensors (config, `meta` and the checksums of every tensor and of the metadata in
    its metadata) plus (`sidecar`) a JSON sidecar `path.json`."""
    from safetensors.torch import save
    sha = embedding_sha or table_sha256(_unwrap(model).embedding.weight)
    info = {"config": cfg.to_dict(), "embedding_sha256": sha, **meta}
    state = model_state(_unwrap(model), cfg)
    text = json.dumps(info)
    checksums = {key: tensor_sha256(value) for key, value in state.items()}
    checksums["<info>"] = hashlib.sha256(text.encode()).hexdigest()
    metadata = {"format": WEIGHTS_FORMAT, "info": text, "checksums": json.dumps(checksums)}
    atomic_write_bytes(path, save(state, metadata=metadata))
    if sidecar:
        write_json(path.with_suffix(".json"), info)


def load_weights(path: str | Path, *, trust_unverified: bool = False) -> tuple[dict[str, torch.Tensor], TrainConfig,
                                                                               dict]:
    """(state dict, config, info) of a `.safetensors` weights file or a `checkpoint.pt` training state,
    checksums verified; `info["integrity"]` says how (a file without checksums: see the module doc)."""
    path = Path(path)
    if path.suffix == ".pt":
        state = load_train_state(path, trust_unverified=trust_unverified)
        info = {"embedding_sha256": state["embedding_sha256"], "run_id": state.get("run_id"),
                "integrity": state["integrity"]}
        return state["model"], TrainConfig.from_dict(state["config"]), info
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
    except (KeyError, ValueError):
        raise CheckpointError(f"{path}: corrupt: its metadata is not readable") from None
    return tensors, TrainConfig.from_dict(info["config"]), {**info, "integrity": integrity}


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
        raise CheckpointError(f"{path}: cannot read checkpoint (truncated or corrupt?): {exc}") from exc
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


def _check_same_config(saved: dict, cfg: TrainConfig, where: Path, allow: set[str] = frozenset()) -> None:
    a, b = {**_flat(TrainConfig().to_dict()), **_flat(saved)}, _flat(cfg.to_dict())   # keys added later: defaults
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


@dataclass
class LoadedClassifier:
    """A trained classifier ready for inference, with what it was built from."""

    model: nn.Module            # SequenceClassifier, eval mode
    config: TrainConfig
    embeddings: Any             # data.StaticEmbeddings: table, tokenizer, pad id
    path: Path                  # the weights file read
    info: dict                  # metadata saved with the weights (metrics, embedding sha256)
    label_names: tuple[str, ...] = ("negative", "positive")    # class index -> the data's label


def folder_config(folder: Path) -> dict | None:
    """The config.json of a run folder as a dict (None if absent); unreadable or truncated is an error."""
    path = Path(folder) / "config.json"
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError
    except (OSError, ValueError, TypeError):
        raise CheckpointError(f"{path}: unreadable (truncated or not JSON); the run's weights are checked against it, "
                              "so restore it or load the weights from a folder without it") from None
    return data


def check_folder_config(path: Path, cfg: TrainConfig) -> None:
    """CheckpointError if the config.json beside `path` disagrees with the config embedded in the weights. A
    pretrained folder's config.json (`hub.py`, which pins the weights' sha256 and is checked there) is not a
    run config and is left to the hub's check."""
    from ..hub import FORMAT as PRETRAINED_FORMAT

    data = folder_config(path.parent)
    if data is None or data.get("format") == PRETRAINED_FORMAT:
        return
    where = path.parent / "config.json"
    try:
        saved = TrainConfig.from_dict(data)
    except ConfigError as exc:
        raise CheckpointError(f"{where}: not a valid run config ({exc})") from None
    a, b = _flat(saved.to_dict()), _flat(cfg.to_dict())
    diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in RESUMABLE_CHANGES)
    if diff:
        detail = ", ".join(f"{k}: {a.get(k)!r} in config.json, {b.get(k)!r} in the weights" for k in diff[:4])
        raise CheckpointError(f"{where} disagrees with the config embedded in {path} ({detail}); one of them was "
                              "edited or comes from another run")


def saved_run_id(folder: Path) -> str | None:
    """The run id in `folder/config.json` (None if absent, unreadable, or written before run ids)."""
    try:
        return json.loads((folder / "config.json").read_text()).get("resolved", {}).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def check_same_run(path: Path, run_id: str | None) -> None:
    """CheckpointError if `path` and the config.json beside it were written by different runs."""
    resolved = (folder_config(path.parent) or {}).get("resolved")
    folder_run = resolved.get("run_id") if isinstance(resolved, dict) else None
    if run_id and folder_run and run_id != folder_run:
        raise CheckpointError(f"{path}: written by run {run_id}, but {path.parent / 'config.json'} by run "
                              f"{folder_run}: the folder mixes the files of two runs")


def load_classifier(path: str | Path, data_dir: str | None = None, *, trust_unverified: bool = False
                    ) -> LoadedClassifier:
    """Load `path` (a run folder: its `best.safetensors`; a `.safetensors` file; a `checkpoint.pt`).

    The folder's manifest (if any) must match every file it pins; checksums are verified (a file
    without them needs the manifest or `trust_unverified`); the weights must come from the same run
    as the config.json beside them and agree with its config. The embedding table is rebuilt from the
    saved `data.embeddings` (from `data_dir` or the saved data folder for vocabularies built from data)
    and must match the sha256 stored with the weights.
    """
    from ..contracts import check_path_given
    from .build import build_classifier, load_embeddings_for
    check_path_given("the run folder or weights file", path)
    path = Path(path)
    if path.is_dir():
        path = path / "best.safetensors"
    state, cfg, info = load_weights(path, trust_unverified=trust_unverified)   # the most specific checks first:
    check_same_run(path, info.get("run_id"))                       # the tensor, the run, the setting that
    check_folder_config(path, cfg)                                 # differs; then every file the run pinned
    verify_manifest(path.parent)
    if data_dir is not None:
        cfg = cfg.replace(data__data_dir=str(data_dir))
    spec = cfg.data.embeddings
    cfg.validate(check_data=spec.startswith("glove:") or spec == "random")   # only data-built vocabularies read data
    embeddings = load_embeddings_for(cfg)
    model = build_classifier(cfg, embeddings)
    if not cfg.model.trainable_embeddings:
        sha = table_sha256(model.embedding.weight)
        if sha != info.get("embedding_sha256"):
            raise CheckpointError(f"{path}: the rebuilt embedding table ({cfg.data.embeddings}) differs from the "
                                  f"one the model was trained with (sha256 {sha[:12]} vs "
                                  f"{str(info.get('embedding_sha256'))[:12]})")
    restore_model_state(model, state, cfg, str(path))
    return LoadedClassifier(model.eval(), cfg, embeddings, path, info, _label_names(info, model.head.out_features))


def _label_names(info: dict, n_classes: int) -> tuple[str, ...]:
    """The label names saved with the weights; files written before they were saved: negative / positive
    for 2 classes, else the class indices."""
    names = info.get("label_names")
    if isinstance(names, list) and len(names) == n_classes:
        return tuple(str(n) for n in names)
    return ("negative", "positive") if n_classes == 2 else tuple(str(i) for i in range(n_classes))
