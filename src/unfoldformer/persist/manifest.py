"""The manifest `complete.json`: every file of a folder pinned by size and sha256, written last.

Run folders (`unfoldformer train`, and every command's staged output, `runs.staged_output`) and model
folders (`save_pretrained`) carry the same manifest and are checked by the same `verify_manifest`
on every load: a file changed, missing or truncated since is an `IntegrityError` naming it.

- `folder_manifest` / `write_manifest`: pin the files (all, or the ones named) once they are written.
- `verify_manifest`: check every pinned file; `manifest_vouches`: whether one file is pinned as it is
  (what lets a weights file without checksums of its own be read).
- `refresh_manifest`: re-pin the files of a folder whose own command edited them.
- `config_sha256`: what ties the files of a run to its config.
- `run_folder_kind`: whether a folder is a run's (a manifest of a command other than `save_pretrained`, or
  a run's checkpoint, weights or settings file), so that `save_pretrained` never writes into one.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from ..errors import IntegrityError
from ..utils import file_sha256, jsonable, write_json

__all__ = ["MANIFEST_NAME", "SAVED_COMMAND", "config_sha256", "folder_manifest", "manifest_vouches", "read_manifest",
           "refresh_manifest", "run_folder_kind", "verify_manifest", "write_manifest"]


def config_sha256(config: Any) -> str:
    """sha256 of a config as canonical JSON (sorted keys): equal configs, equal hashes."""
    return hashlib.sha256(json.dumps(jsonable(config), sort_keys=True).encode()).hexdigest()


#: The manifest's file name, in run folders and model folders alike.
MANIFEST_NAME = "complete.json"
#: The `command` a model folder's manifest names (`save_pretrained`); a run's names its command.
SAVED_COMMAND = "save_pretrained"


#: Files only a run writes: a training run (checkpoint, best / last weights, summary), a language-model run
#: (`state.pt`, `train.json`), a distillation run (`checkpoint.pt`, `summary.json`).
RUN_MARKERS = ("checkpoint.pt", "best.safetensors", "last.safetensors", "summary.json", "state.pt", "train.json")


def run_folder_kind(folder: str | Path) -> str | None:
    """What makes `folder` a run's folder (its manifest's command, or a file only a run writes), else None
    (absent, empty, a model folder, any other folder). An unreadable manifest decides nothing."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    try:
        command = json.loads((folder / MANIFEST_NAME).read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        command = None
    if command is not None and command != SAVED_COMMAND:
        return f"the output of `unfoldformer {command}` ({MANIFEST_NAME})"
    marker = next((name for name in RUN_MARKERS if (folder / name).exists()), None)
    return f"a run folder (it holds {marker})" if marker is not None else None


def folder_manifest(folder: Path, command: str, run_id: str | None, config: Any, *, config_hash: str | None = None,
                    names: list[str] | None = None) -> dict:
    """The manifest of `folder`: command, run id, the config's sha256, and the size and sha256 of every file
    (or of the files `names`), each flushed to disk first."""
    files = {}
    chosen = (folder / name for name in names) if names is not None else folder.rglob("*")
    for path in sorted(p for p in chosen if p.is_file() and p != folder / MANIFEST_NAME):
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        files[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return {"format": "unfoldformer-output", "command": command, "run_id": run_id,
            "config_sha256": config_hash or config_sha256(config), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": files}


def write_manifest(folder: str | Path, command: str, run_id: str, config: Any) -> None:
    """Pin every file of `folder` (size and sha256) in `folder/complete.json`, written last and atomically."""
    folder = Path(folder)
    write_json(folder / MANIFEST_NAME, folder_manifest(folder, command, run_id, config))


def read_manifest(folder: Path) -> dict | None:
    """`folder/complete.json` as a dict (None if absent); an unreadable one is an `IntegrityError`."""
    path = folder / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError):
        raise IntegrityError(f"{path}: the folder's manifest is unreadable (truncated or edited); it pins the "
                             "run's files, so restore it or rerun") from None
    return manifest


def refresh_manifest(folder: str | Path) -> None:
    """Re-pin the files of a folder whose own command edited them (same command, run id and config hash)."""
    folder = Path(folder)
    old = read_manifest(folder)
    if old is not None:
        write_json(folder / MANIFEST_NAME, folder_manifest(folder, old.get("command"), old.get("run_id"), None,
                                                           config_hash=old.get("config_sha256")))


def verify_manifest(folder: str | Path, skip: tuple[str, ...] = ()) -> dict | None:
    """Check every file `folder/complete.json` lists (present, same size, same sha256); returns the manifest,
    or None when the folder has none (a run in progress, or written before manifests). A difference is an
    `IntegrityError` naming the file and what changed. `skip`: names not checked (files about to be rewritten)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return None
    saved = manifest.get("command") == SAVED_COMMAND                  # a model folder, not a run's output
    when, what, redo = (("when it was saved", "the model", "save it again") if saved
                        else ("when the run finished", "the run", "rerun"))
    for name, pinned in sorted(manifest["files"].items()):
        if name in skip:
            continue
        path = folder / name
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != pinned.get("bytes"):
            problem = f"has {path.stat().st_size} bytes, {pinned.get('bytes')} {when}"
        elif file_sha256(path) != pinned.get("sha256"):
            problem = f"has other contents than {when} (sha256 differs)"
        else:
            continue
        raise IntegrityError(f"{path}: {problem}; {folder / MANIFEST_NAME} pins every file of {what}, so the "
                             f"folder was changed afterwards: restore the file or {redo}")
    return manifest


def manifest_vouches(path: str | Path) -> bool:
    """Whether the manifest of `path`'s folder lists `path` with its present size and sha256."""
    path = Path(path)
    try:
        manifest = read_manifest(path.parent)
    except IntegrityError:
        return False
    pinned = (manifest or {}).get("files", {}).get(path.name)
    return (isinstance(pinned, dict) and path.is_file() and path.stat().st_size == pinned.get("bytes")
            and file_sha256(path) == pinned.get("sha256"))
