"""Run folders and the checks made before any work.

- `check_at_least`, `check_device`, `check_output_location`: settings checked before any data is
  read, each error naming the setting (an output location by creating and removing a probe file).
- `new_run_id`, `config_sha256`: what ties every file of a run to that run.
- `folder_lock`: an exclusive lock on an output folder for the life of a run (a lock file beside
  it, `.NAME.lock`, held with `flock`, so the kernel releases it when the process dies however it
  dies); a second run into the same folder fails at once, naming the holder's pid and command.
  A lock file whose process is gone is stale and taken over.
- `staged_output`: an output folder built in a temporary sibling (`.NAME.tmp-*`) and moved into
  place with `complete.json` (command, run id, config sha256, every file with its size and
  sha256) once every file is written: the folder is whole or absent, and never mixes two runs.
- `write_manifest` / `verify_manifest` / `manifest_vouches`: the same `complete.json` for folders
  written in place (training runs): written last, checked on every load (a file changed, missing
  or truncated since is an `IntegrityError` naming it); `refresh_manifest` re-pins a folder whose
  files its own command edited.
- An output folder is never the working directory or one of its parents (an empty `--out ''`
  is the working directory: refused before any work, `check_output_folder`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .contracts import check_path_given
from .errors import ConfigError, IntegrityError, OutputError
from .utils import current_umask, file_sha256, fsync_folder, jsonable, write_json

__all__ = ["MANIFEST_NAME", "check_at_least", "check_device", "check_output_folder", "check_output_location",
           "config_sha256", "folder_lock", "manifest_vouches", "new_run_id", "refresh_manifest", "resolve_device",
           "staged_output", "verify_manifest", "write_manifest"]


# ----------------------------------------------------------------------------- settings checked before work
def check_at_least(name: str, value, low: int = 1, *, optional: bool = False) -> None:
    """ConfigError unless `value` is an integer >= `low` (or None when `optional`), naming the setting."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        allowed = f"an integer >= {low}" + (" (or unset)" if optional else "")
        raise ConfigError(f"{name} must be {allowed}, got {value!r}")


def resolve_device(device: str) -> str:
    """`auto` -> cuda if torch sees a CUDA device, else mps if available, else cpu; other names unchanged."""
    import torch
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else "cpu"


def check_device(name: str, device: str) -> None:
    """ConfigError unless `device` is `auto` or names a device torch can use here (cpu, cuda, cuda:N, mps)."""
    import torch
    if device == "auto":
        return
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"{name}={device!r} is not a device name; use auto, cpu, cuda (cuda:N) or mps") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"{name}={device!r}, but this torch build sees no CUDA device "
                              f"(torch {torch.__version__}); use cpu")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"{name}={device!r}, but only {count} CUDA device(s) are visible")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{name}={device!r}, but MPS is not available here; use cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{name}={device!r} is not supported; use auto, cpu, cuda (cuda:N) or mps")


def check_output_location(name: str, path: str | Path, *, folder: bool = True) -> Path:
    """Check that `path` (a folder, or a file when `folder` is False) can be written, before any work.

    Walks up to the nearest existing folder and creates and removes a small probe file there, so a
    read-only, full or missing location fails now, naming the setting, rather than after the work.
    Creates nothing that stays. Returns the absolute path (symbolic links and `..` resolved).
    An empty path is refused (it would mean the working directory)."""
    check_path_given(name, path)
    path = Path(path).expanduser().resolve()
    if path.exists() and folder and not path.is_dir():
        raise OutputError(f"{name} {path}: exists and is a file, not a folder")
    if path.exists() and not folder and path.is_dir():
        raise OutputError(f"{name} {path}: is a folder; give a file name")
    base = path if folder else path.parent
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise OutputError(f"{name} {path}: {base} is a file, so no folder can be made under it")
    try:
        fd, probe = tempfile.mkstemp(dir=base, prefix=".unfoldformer-probe-")
        try:
            os.write(fd, b"probe")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{name} {path}: cannot write in {base} ({exc.strerror or exc})") from None
    return path


# ----------------------------------------------------------------------------- run identity and digests
def new_run_id() -> str:
    """A fresh run id: UTC start time plus 8 random hex digits (sortable, unique in practice)."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:8]


def config_sha256(config: Any) -> str:
    """sha256 of a config as canonical JSON (sorted keys): equal configs, equal hashes."""
    return hashlib.sha256(json.dumps(jsonable(config), sort_keys=True).encode()).hexdigest()


# ----------------------------------------------------------------------------- run folders
def _lock_path(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _describe_holder(text: str) -> str:
    try:
        h = json.loads(text)
        return f"pid {h['pid']} on {h['host']}, `unfoldformer {h['command']}`, since {h['started']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


@contextmanager
def folder_lock(folder: str | Path, command: str) -> Iterator[Path]:
    """Hold an exclusive lock on output folder `folder` for the block; yields its absolute path.

    The lock is the lock file `.NAME.lock` beside the folder, held with `flock`: the kernel releases
    it when the process ends in any way (SIGKILL included), and the file is removed on a normal exit.
    Another process that holds it makes this raise `OutputError` at once, naming its pid and command;
    a lock file left by a process that is gone is stale and is taken over (with a note on stderr)."""
    import fcntl

    folder = Path(folder).expanduser().resolve()
    folder.parent.mkdir(parents=True, exist_ok=True)
    path = _lock_path(folder)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace")
            os.close(fd)
            raise OutputError(f"{folder} is in use by another run ({_describe_holder(holder)}; lock {path}); "
                              "two runs in one folder would mix their files: wait for it or choose another "
                              "folder") from None
        try:                                                      # a releasing holder may have removed the file
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        stale = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        if stale.strip():
            pid = json.loads(stale).get("pid") if stale.lstrip().startswith("{") else None
            gone = "no longer running" if not isinstance(pid, int) or not _pid_alive(pid) else "lock released"
            print(f"note: took over the stale lock {path} ({_describe_holder(stale)}, {gone})", file=sys.stderr)
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                         "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        os.ftruncate(fd, 0)
        os.pwrite(fd, me.encode(), 0)
        os.fsync(fd)
        yield folder
    finally:
        try:
            os.unlink(path)                                       # while still holding the lock
        except FileNotFoundError:
            pass
        os.close(fd)


MANIFEST_NAME = "complete.json"


def _replaceable(folder: Path, command: str, owned: Callable[[str], bool]) -> None:
    """OutputError unless `folder` is absent, empty, an earlier output of `command`, or holds only files it writes."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise OutputError(f"{folder}: exists and is a file, not a folder")
    names = [p.name for p in folder.iterdir()]
    try:
        earlier = json.loads((folder / MANIFEST_NAME).read_text()).get("command")
    except (OSError, ValueError, AttributeError):
        earlier = None
    if earlier == command or all(owned(n) for n in names):
        return
    foreign = sorted(n for n in names if not owned(n))[:5]
    raise OutputError(f"{folder}: holds files that `unfoldformer {command}` did not write ({', '.join(foreign)}); "
                      "it replaces its whole output folder, so choose a new or empty folder")


def check_output_folder(name: str, path: str | Path, command: str,
                        owned: Callable[[str], bool] = lambda name: False) -> Path:
    """Everything `staged_output` will check, checked now, before any work: `path` given, writable
    (`check_output_location`), not the working directory or one of its parents, and replaceable
    (absent, empty, an earlier output of `command`, or only names `owned` accepts)."""
    folder = check_output_location(name, path)
    here = Path.cwd().resolve()
    if folder == here or folder in here.parents:
        raise OutputError(f"{name} {folder}: is the working directory or one above it; the command replaces its "
                          "whole output folder, so give a new folder (e.g. --out results)")
    _replaceable(folder, command, owned)
    return folder


def _clean_leftovers(folder: Path) -> None:
    """Remove the temporary siblings of a killed run; restore an earlier output caught mid-swap."""
    name = folder.name
    for old in sorted(folder.parent.glob(f".{name}.tmp-*")) + sorted(folder.parent.glob(f".{name}.old-*")):
        if old.name.startswith(f".{folder.name}.old-") and not folder.exists():
            os.replace(old, folder)
        else:
            shutil.rmtree(old, ignore_errors=True)


def _manifest(folder: Path, command: str, run_id: str, config: Any, *, config_hash: str | None = None) -> dict:
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p != folder / MANIFEST_NAME):
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        files[path.relative_to(folder).as_posix()] = {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
    return {"format": "unfoldformer-output", "command": command, "run_id": run_id,
            "config_sha256": config_hash or config_sha256(config), "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "files": files}


def write_manifest(folder: str | Path, command: str, run_id: str, config: Any) -> None:
    """Pin every file of `folder` (size and sha256) in `folder/complete.json`, written last and atomically."""
    folder = Path(folder)
    write_json(folder / MANIFEST_NAME, _manifest(folder, command, run_id, config))


def _read_manifest(folder: Path) -> dict | None:
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
    old = _read_manifest(folder)
    if old is not None:
        write_json(folder / MANIFEST_NAME, _manifest(folder, old.get("command"), old.get("run_id"), None,
                                                     config_hash=old.get("config_sha256")))


def verify_manifest(folder: str | Path, skip: tuple[str, ...] = ()) -> dict | None:
    """Check every file `folder/complete.json` lists (present, same size, same sha256); returns the manifest,
    or None when the folder has none (a run in progress, or written before manifests). A difference is an
    `IntegrityError` naming the file and what changed. `skip`: names not checked (files about to be rewritten)."""
    folder = Path(folder)
    manifest = _read_manifest(folder)
    if manifest is None:
        return None
    for name, pinned in sorted(manifest["files"].items()):
        if name in skip:
            continue
        path = folder / name
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != pinned.get("bytes"):
            problem = f"has {path.stat().st_size} bytes, {pinned.get('bytes')} when the run finished"
        elif file_sha256(path) != pinned.get("sha256"):
            problem = "has other contents than when the run finished (sha256 differs)"
        else:
            continue
        raise IntegrityError(f"{path}: {problem}; {folder / MANIFEST_NAME} pins every file of the run, so the "
                             "folder was changed afterwards: restore the file or rerun")
    return manifest


def manifest_vouches(path: str | Path) -> bool:
    """Whether the manifest of `path`'s folder lists `path` with its present size and sha256."""
    path = Path(path)
    try:
        manifest = _read_manifest(path.parent)
    except IntegrityError:
        return False
    pinned = (manifest or {}).get("files", {}).get(path.name)
    return (isinstance(pinned, dict) and path.is_file() and path.stat().st_size == pinned.get("bytes")
            and file_sha256(path) == pinned.get("sha256"))


@contextmanager
def staged_output(folder: str | Path, command: str, config: Any, *,
                  owned: Callable[[str], bool] = lambda name: False, run_id: str | None = None) -> Iterator[Path]:
    """Build the output folder `folder` of one run whole, or not at all; yields the folder to write into.

    Under `folder_lock`, the outputs go into a fresh temporary sibling `.NAME.tmp-*`; when the block
    ends normally `complete.json` (command, run id, sha256 of `config`, each file's size and sha256)
    is added and the folder is moved into place, replacing an earlier output (absent, empty, an
    earlier output of `command`, or only names `owned` accepts; anything else is refused before any
    work). An error or a kill leaves the earlier output as it was; the temporary folder is removed
    (by the next run, after a kill)."""
    folder = check_output_folder("output folder", folder, command, owned)
    with folder_lock(folder, command):
        _clean_leftovers(folder)
        _replaceable(folder, command, owned)
        stage = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.tmp-"))
        try:
            yield stage
            write_json(stage / MANIFEST_NAME, _manifest(stage, command, run_id or new_run_id(), config))
            stage.chmod(0o755 & ~current_umask())
            old = None
            if folder.exists():
                old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old-"))
                os.replace(folder, old)
            os.replace(stage, folder)
            fsync_folder(folder.parent)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
