"""Trained classifiers on disk: `load_classifier` (what `uf.load` reads) and `save_predictor`.

- `load_classifier`: a run folder, weights file, `checkpoint.pt` or model folder -> the classifier
  with its embeddings, ready for inference. The checks, most specific first: the weights' checksums
  (a file without them needs its folder's manifest or `trust_unverified`), the run that wrote them
  against the run of the config.json beside them, that config against the one in the weights, then
  every file the folder's manifest pins. The embedding table is rebuilt (`rebuild`) and checked by
  the sha256 stored with the weights.
- `save_predictor`: a trained classifier as a model folder (`folder.py`): its weights in the run's
  weights format, config.json with its `TrainConfig`, the card and the manifest.
- `classifier_source`: what `uf.load` reads for a path, a zoo model's name or a Hub repo id.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from ..contracts import check_path_given
from ..errors import CheckpointError, ConfigError, PretrainedError
from ..recipe import RESUMABLE_CHANGES, TrainConfig
from ..zoo import zoo_folder
from .folder import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    check_model_destination,
    check_pinned,
    pretrained_config,
    read_folder_config,
    write_model_folder,
)
from .folder import FORMAT as PRETRAINED_FORMAT
from .hub import looks_like_repo_id, resolve_folder
from .manifest import verify_manifest
from .rebuild import build_classifier, load_embeddings_for
from .weights import load_weights, model_state, restore_model_state, table_sha256, unwrap

__all__ = ["LoadedClassifier", "check_folder_config", "check_same_run", "classifier_source", "flat_config",
           "folder_config", "load_classifier", "save_predictor", "saved_run_id"]


def flat_config(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(flat_config(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out



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
    """CheckpointError if the config.json beside `path` disagrees with the config embedded in the weights: a run's
    config, or the `train_config` a model folder's config.json describes its classifier by."""
    data = folder_config(path.parent)
    if data is not None and data.get("format") == PRETRAINED_FORMAT:
        init = data.get("init")
        data = init.get("train_config") if isinstance(init, dict) else None
    if data is None:
        return
    where = path.parent / CONFIG_FILE
    try:
        saved = TrainConfig.from_dict(data)
    except ConfigError as exc:
        raise CheckpointError(f"{where}: not a valid run config ({exc})") from None
    a, b = flat_config(saved.to_dict()), flat_config(cfg.to_dict())
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
            legacy = spec == "random" and cfg.data.random_table == "torch-randn"
            raise CheckpointError(f"{path}: the rebuilt embedding table ({cfg.data.embeddings}) differs from the "
                                  f"one the model was trained with (sha256 {sha[:12]} vs "
                                  f"{str(info.get('embedding_sha256'))[:12]})"
                                  + ("; its table was drawn with torch.randn (runs before 0.3.0), whose bits depend "
                                     "on the CPU's vector kernels: load it where it was trained, or retrain"
                                     if legacy else ""))
    restore_model_state(model, state, cfg, str(path))
    return LoadedClassifier(model.eval(), cfg, embeddings, path, info, _label_names(info, model.head.out_features))


def _label_names(info: dict, n_classes: int) -> tuple[str, ...]:
    """The label names saved with the weights; files written before they were saved: negative / positive
    for 2 classes, else the class indices."""
    names = info.get("label_names")
    if isinstance(names, list) and len(names) == n_classes:
        return tuple(str(n) for n in names)
    return ("negative", "positive") if n_classes == 2 else tuple(str(i) for i in range(n_classes))


def save_predictor(predictor: Any, folder: str | os.PathLike) -> Path:
    """A trained classifier as a model folder: its weights in the run's weights format (TrainConfig, checksums,
    the frozen embedding table by sha256 only), config.json, README.md and complete.json. A run's folder (the
    one the classifier was loaded from included) is refused (`folder.check_model_destination`, `OutputError`)."""
    check_model_destination(folder)
    if predictor.config is None:
        raise PretrainedError("this Predictor has no training config to save (build it with uf.load)")
    info = getattr(predictor, "info", None) or {}
    meta = {**{key: info[key] for key in ("run_id", "metrics") if key in info},
            "label_names": list(predictor.label_names)}
    model: nn.Module = unwrap(predictor.model)
    cfg: TrainConfig = predictor.config
    weights_info = {"config": cfg.to_dict(), "embedding_sha256": table_sha256(model.embedding.weight), **meta}
    return write_model_folder(Path(folder), "Predictor", {"train_config": cfg.to_dict()}, model_state(model, cfg),
                              weights_info, card_extra=meta)


def classifier_source(source: str | os.PathLike) -> Path:
    """What `uf.load` reads for `source`: a weights file or run folder as is; a model folder, a zoo model's name
    or a Hub repo id -> its weights file, once config.json is checked. An empty `source` is refused (Path('')
    would mean the working directory)."""
    check_path_given("the run folder or weights file", source)
    path = Path(source).expanduser()
    if not path.exists():
        zoo = zoo_folder(str(source))
        if zoo is not None:
            path = zoo
        elif looks_like_repo_id(str(source)):
            path = resolve_folder(source)
        else:
            return path
    if not path.is_dir() or pretrained_config(path) is None:
        return path
    info = read_folder_config(path)
    if info.get("class") != "Predictor":
        raise PretrainedError(f"{path}: holds a {info.get('class')}, not a trained classifier; open it with "
                              f"unfoldformer.{info.get('class')}.from_pretrained")
    check_pinned(path, info)
    return path / WEIGHTS_FILE
